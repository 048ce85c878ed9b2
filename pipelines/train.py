r"""Trains a TF-Agents agent from Reverb: online in an env, or offline from data.

Examples:

  # Online SAC on HalfCheetah (actor -> Reverb table -> learner).
  python -m pipelines.train --agent sac --env HalfCheetah-v5 --steps 300000

  # Offline from a dataset (pushed into an embedded Reverb table first).
  python -m pipelines.train --agent td3_bc --dataset data/halfcheetah_medium

  # ... then 50k env steps of offline-to-online fine-tuning.
  python -m pipelines.train --agent td3_bc --dataset DIR \
      --online_finetune_steps 50000

  # Offline from an episode table that another process serves
  # (pipelines.push --feed_table --serve, or pipelines.serve --feed_table).
  python -m pipelines.train --agent bc --reverb_address localhost:8000

  # DQN with prioritized replay (Double DQN targets, dueling Q-network).
  python -m pipelines.train --agent dqn --env CartPole-v1 \
      --replay prioritized --double --dueling

  # Goal env with hindsight relabelling (episode table, HER sampler).
  python -m pipelines.train --agent td3 --env FetchReach-v4 --her future

  # ... offline, from goal-conditioned RLDS data (pipelines.generate).
  python -m pipelines.train --agent td3_bc --env FetchReach-v4 \
      --dataset data/fetchreach_random --her future

  # A published setting from configs/, and single bindings of the config
  # dataclasses' fields (a flag given on the command line beats both).
  python -m pipelines.train --agent td3_bc --dataset DIR \
      --gin_file configs/td3_bc_d4rl.gin \
      --gin_bindings 'AgentConfig.actor_layers = (64, 64)'

  # From a table another process serves; wait up to 5 minutes for that
  # server if it goes away (the default: fail within seconds).
  python -m pipelines.train --agent td3_bc --reverb_address localhost:8000 \
      --reconnect --reconnect_timeout_s 300

Everything of a run goes to --root_dir: checkpoints (agent and Reverb
tables), TensorBoard summaries, eval.jsonl, learning_curve.png and
config.json (the config the run got, written once training starts).
Running the same command again resumes from there; a command whose settings
differ from the recorded ones (agent, env, dataset and its content, table,
replay, feed, seed, hyper-parameters; not the budget or the schedules) is
refused. The last stdout line is a JSON summary. Bad input, a training
failure or a lost server ends the run with one line on stderr, exit code 1
(2 for bad flags, 130 for Ctrl-C); a run that fails before training starts
leaves nothing in --root_dir.
"""

# Before anything imports tensorflow: quiets the C++ start-up logs.
from pipelines import cli  # pylint: disable=g-bad-import-order

import json  # pylint: disable=g-import-not-at-top,wrong-import-order
import os
import signal
import socket
import sys
import threading
import time
import tokenize
from typing import Any, NoReturn

from absl import app
from absl import flags
import gin
import tensorflow as tf

from pipelines import common_flags
from pipelines import onpolicy_flags
from rlds_reverb.data import datasets
from rlds_reverb.replay import her
from rlds_reverb.replay import per
from rlds_reverb.acting import envs
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.experiments import offline
from rlds_reverb.experiments import online
from rlds_reverb.experiments import onpolicy
from rlds_reverb.agents.onpolicy import ppo
from rlds_reverb.experiments import run

_PROG = 'train'

_AGENT = flags.DEFINE_enum(
    'agent', None, list(registry.AGENTS),
    'Agent to train. Online (--env only): sac, td3 (continuous actions), dqn '
    '(discrete actions); on-policy: ppo, a2c (either kind, rollouts through '
    'a Reverb queue). Offline (--dataset or --reverb_address): bc, td3_bc, '
    'cql_sac (TF-Agents\' own), iql, awac, rebrac, sac_n, edac, cal_ql '
    '(this toolkit\'s TF-Agents agents, CORL\'s settings; per-dataset '
    'settings in configs/<agent>_halfcheetah_<kind>.gin; see '
    'docs/offline_rl.md). Required.')
_ENV = flags.DEFINE_string(
    'env', 'HalfCheetah-v5', 'gymnasium env id: where online agents act and '
    'where every agent is evaluated. Its spaces must match the dataset.')
_PUSH_FLAGS = common_flags.define_push_flags()
flags.adopt_module_key_flags(common_flags)
flags.adopt_module_key_flags(onpolicy_flags)
_DATASET = common_flags.DATASET
_REVERB_ADDRESS = _PUSH_FLAGS.reverb_address
_GIN_FILE = flags.DEFINE_multi_string(
    'gin_file', [], 'Gin file of config bindings, e.g. '
    'configs/td3_bc_d4rl.gin (one file per published setting); repeat the '
    'flag for several, later files win. Bindings name the config '
    'dataclasses by class and field: AgentConfig.actor_layers, '
    'OfflineConfig.train_steps, OnlineConfig.env_steps, PerConfig.alpha, '
    'HerConfig.k (the field docstrings say what each is). A flag given on '
    'the command line beats a binding of the same setting; a binding beats '
    "the flags' defaults (dqn's and online HER's own defaults too). An "
    'unknown class or field is an error.')
_GIN_BINDINGS = flags.DEFINE_multi_string(
    'gin_bindings', [], 'One gin binding, e.g. '
    '"AgentConfig.actor_layers = (64, 64)"; repeat the flag for several. '
    'Applied after --gin_file, with the same precedence.')
_ROOT_DIR = flags.DEFINE_string(
    'root_dir', None, 'Run directory: checkpoints (agent and Reverb tables), '
    'TensorBoard summaries, eval.jsonl, learning_curve.png and exported '
    'numpy policies. An existing run there is resumed. Default: '
    'runs/<agent>_<env or dataset>_seed<seed>.')
_STEPS = flags.DEFINE_integer(
    'steps', None, 'Budget: gradient steps offline (default 300000), env '
    'steps online (default 300000; dqn 50000; ppo and a2c 1000000, on '
    'discrete actions ppo 100000 and a2c 500000).', lower_bound=1)
_SEED = flags.DEFINE_integer('seed', 0, 'Seed of TensorFlow, the envs and '
                             'the exploration.', lower_bound=0)
_BATCH_SIZE = flags.DEFINE_integer(
    'batch_size', None, 'Transitions per gradient step (default: the '
    "agent's published one: 256; rebrac 1024, dqn 64).", lower_bound=1)
_ACTOR_LR = flags.DEFINE_float(
    'actor_learning_rate', None, 'Actor Adam learning rate (default: the '
    "agent's published one: 3e-4; bc 1e-3).", lower_bound=0)
_CRITIC_LR = flags.DEFINE_float(
    'critic_learning_rate', None, 'Critic Adam learning rate (iql: also of '
    "the value function). Default: the agent's published one: 3e-4; rebrac "
    '1e-3.', lower_bound=0)
_ALPHA_LR = flags.DEFINE_float(
    'alpha_learning_rate', None, 'Entropy temperature learning rate of sac, '
    "cql_sac, sac_n, edac and cal_ql. Default: the agent's published one: "
    '3e-4; cal_ql 3e-5.', lower_bound=0)
_TD3_BC_ALPHA = flags.DEFINE_float(
    'td3_bc_alpha', 2.5, 'TD3+BC: weight of the Q term against the BC term '
    '(Fujimoto & Gu 2021 use 2.5).', lower_bound=0)
_CQL_ALPHA = flags.DEFINE_float(
    'cql_alpha', 0.1, "CQL-SAC: weight of the CQL regulariser (TF-Agents' "
    'D4RL MuJoCo medium config: 0.1).', lower_bound=0)
_CQL_BC_STEPS = flags.DEFINE_integer(
    'cql_bc_steps', 10_000, 'CQL-SAC: first N gradient steps train the actor '
    "by behaviour cloning (TF-Agents' D4RL config: 10000 of 1M; scale it "
    'down with a smaller --steps).', lower_bound=0)
_NORMALIZE = flags.DEFINE_enum(
    'normalize_observations', 'auto', ['auto', 'true', 'false'],
    'Normalise observations with the dataset mean/std (auto: td3_bc, iql '
    'and cal_ql, as their papers / CORL configs do).')
_NORMALIZE_REWARDS = flags.DEFINE_enum(
    'normalize_rewards', 'auto', ['auto', 'true', 'false'],
    'Scale rewards by 1000 / (max - min episode return) of the dataset '
    '(auto: iql only, as its paper does on locomotion). Offline agents '
    'iql, awac, rebrac, sac_n, edac, cal_ql with the memory feed.')
_EVAL_INTERVAL = flags.DEFINE_integer(
    'eval_interval', 10_000, 'Evaluate every N gradient steps (offline) or '
    'env steps (online; dqn default: 1000).', lower_bound=1)
_EVAL_EPISODES = flags.DEFINE_integer(
    'eval_episodes', 10, 'Episodes per evaluation (greedy policy).',
    lower_bound=1)
_CHECKPOINT_INTERVAL = flags.DEFINE_integer(
    'checkpoint_interval', 10_000, 'Checkpoint every N gradient steps '
    '(offline) or env steps (online).', lower_bound=1)
_INITIAL_COLLECT = flags.DEFINE_integer(
    'initial_collect_steps', 10_000, 'Online: uniform random env steps before '
    'learning starts (dqn default: 1000).', lower_bound=0)
_TRAIN_EVERY = flags.DEFINE_integer(
    'train_every', 1000, 'Online: env steps collected between learner '
    'phases; each phase takes --utd times as many gradient steps (dqn '
    'default: 256).', lower_bound=1)
_REPLAY_SIZE = flags.DEFINE_integer(
    'replay_size', 1_000_000, 'Online: replay table size (transitions; dqn '
    'default: 100000).', lower_bound=1)
_SNAPSHOT_INTERVAL = flags.DEFINE_integer(
    'snapshot_interval', 0, 'Online: save a numpy policy snapshot every N '
    'env steps under root_dir/policies (behaviour policies); 0: off.',
    lower_bound=0)
_UTD = flags.DEFINE_float(
    'utd', 1.0, 'Online: gradient steps per env step (update-to-data '
    'ratio); each learner phase takes --train_every * --utd steps. dqn '
    'default: 0.5.', lower_bound=0)
_REPLAY = flags.DEFINE_enum(
    'replay', 'uniform', list(per.REPLAYS), 'How the learner samples the '
    'replay table: uniform, or prioritized (proportional PER, Schaul et al. '
    '2015: new items at the largest priority so far, priorities |TD error| '
    '+ --per_eps after each step, importance weights in the loss). Online '
    'runs and the offline phase (not bc).')
_FEED = flags.DEFINE_enum(
    'feed', 'memory', ['memory', 'stream'], 'How the learner gets its '
    'batches. memory: the table holds whole episodes (at --reverb_address: '
    'an episode table, pipelines.serve --feed_table filled by '
    'pipelines.push --feed_table), which the learner '
    'reads into its own memory (offline data once, online episodes as the '
    'actors finish them) and samples in the same graph as its train step. '
    'stream: every batch is sampled item by item from the Reverb table of '
    '2-step items (a remote table too big for the learner\'s memory, or one '
    'made by pipelines.push with its default items). Offline --her takes '
    'the memory feed only.')
_N_STEP = flags.DEFINE_integer(
    'n_step', 1, 'With --feed memory (not --her): n-step returns; they stop '
    'at terminal steps and bootstrap at truncated endings. 1 is one-step TD.')
_PER_ALPHA = flags.DEFINE_float(
    'per_alpha', per.DEFAULT_ALPHA, 'Prioritized replay: priority exponent '
    '(0 is uniform).', lower_bound=0)
_PER_BETA0 = flags.DEFINE_float(
    'per_beta0', per.DEFAULT_BETA0, 'Prioritized replay: importance-weight '
    'exponent at the first gradient step; it rises linearly to 1.',
    lower_bound=0, upper_bound=1)
_PER_BETA_STEPS = flags.DEFINE_integer(
    'per_beta_steps', 0, 'Prioritized replay: gradient steps over which '
    'beta reaches 1; 0: all gradient steps of the run.', lower_bound=0)
_PER_EPS = flags.DEFINE_float(
    'per_eps', per.DEFAULT_EPS, 'Prioritized replay: added to |TD error| so '
    'that no item gets priority 0.', lower_bound=0)
_PER_PRIORITY_CAP = flags.DEFINE_float(
    'per_priority_cap', per.DEFAULT_PRIORITY_CAP, 'Prioritized replay: '
    'largest priority an item can get.', lower_bound=0)
_DOUBLE = flags.DEFINE_bool(
    'double', False, 'dqn: Double DQN targets (the online network picks the '
    'next action, the target network values it).')
_DUELING = flags.DEFINE_bool(
    'dueling', False, 'dqn: dueling Q-network, Q = V + A - mean(A).')
_DQN_LR = flags.DEFINE_float(
    'dqn_learning_rate', 2.3e-3, 'dqn: Adam learning rate of the Q-network '
    "(RL Zoo's CartPole-v1 setting).", lower_bound=0)
_TARGET_UPDATE_PERIOD = flags.DEFINE_integer(
    'target_update_period', 128, 'dqn: gradient steps between copies of the '
    'Q-network into the target network.', lower_bound=1)
_EPSILON_FINAL = flags.DEFINE_float(
    'epsilon_final', 0.04, 'dqn: exploration epsilon after the decay; it '
    'falls linearly from 1.', lower_bound=0, upper_bound=1)
_EXPLORATION_FRACTION = flags.DEFINE_float(
    'exploration_fraction', 0.16, 'dqn: share of --steps over which epsilon '
    'falls to --epsilon_final.', lower_bound=0, upper_bound=1)
_HER = flags.DEFINE_enum(
    'her', None, list(her.STRATEGIES), 'Goal envs (dict observations, e.g. '
    'FetchReach-v4): hindsight experience replay with this goal strategy. '
    'future: an achieved goal from a later step of the same episode; final: '
    'its last one; episode: any of its steps; random: any stored episode. '
    'Episodes are stored whole; goals are relabelled when batches are '
    'sampled. Defaults for online HER runs unless given: --steps 10000, '
    '--initial_collect_steps 1000, --train_every 100, --eval_interval 500, '
    '--eval_episodes 100, --replay_size 1000000.')
_K = flags.DEFINE_float(
    'k', 4.0, 'HER: relabelled goals per original one; a transition keeps '
    'its own goal with probability 1/(k+1) (k=4: 80 percent relabelled).',
    lower_bound=0)
_HER_NORMALIZE = flags.DEFINE_bool(
    'her_normalize', True, 'HER: normalise observations and goals with '
    'running statistics, clipped to +-5 (as the HER paper does); '
    '--noher_normalize feeds them raw.')
_EXPLORATION_NOISE = flags.DEFINE_float(
    'exploration_noise', 0.1, 'Online td3 (and fine-tuning): std of the '
    'Gaussian noise added to the actor\'s actions, in action units.',
    lower_bound=0)
_RANDOM_ACTIONS = flags.DEFINE_float(
    'random_action_probability', 0.0, 'Online sac/td3: share of actions '
    'replaced by uniform random ones (OpenAI baselines\' HER uses 0.3 on '
    'Fetch).', lower_bound=0, upper_bound=1)
_FINETUNE = flags.DEFINE_integer(
    'online_finetune_steps', 0, 'Offline agents: after the offline phase, '
    'this many env steps online; batches are half offline, half online.',
    lower_bound=0)
_NUM_ACTORS = flags.DEFINE_integer(
    'num_actors', 1, 'Online: 1, this process acts and learns; 0, actors are '
    'other processes (pipelines.act) writing episodes into the episode table '
    'of the server at --reverb_address (pipelines.serve --env): the learner '
    'reads them on the single-process schedule (--utd gradient steps per '
    'env step read, from --initial_collect_steps on) and publishes its '
    'weights there. See docs/distributed.md.', lower_bound=0, upper_bound=1)
_PUBLISH_EVERY = flags.DEFINE_integer(
    'publish_every', 1000, 'With --num_actors 0: gradient steps between '
    "publications of the learner's weights to the actors.", lower_bound=1)
_RECONNECT = flags.DEFINE_bool(
    'reconnect', False, 'With --reverb_address: when the server stops '
    'answering, wait up to --reconnect_timeout_s for it to come back '
    '(saying so on stderr, and on its return what the table holds now '
    'against before), then go on. Without it, a lost server ends the run '
    'with one line within seconds.')
_RECONNECT_TIMEOUT = flags.DEFINE_float(
    'reconnect_timeout_s', 300.0, 'With --reconnect: seconds to wait for a '
    'lost server.', lower_bound=1.0)


# Online HER's defaults (goal envs like FetchReach: 50-step episodes).
_HER_DEFAULTS = {'steps': 10_000, 'initial_collect_steps': 1000,
                 'train_every': 100, 'eval_interval': 500,
                 'eval_episodes': 100}


def _value(flag: flags.FlagHolder) -> Any:
  """The flag's value; the agent's own default (registry) or online HER's
  unless given."""
  if flags.FLAGS[flag.name].present:
    return flag.value
  agent = registry.get(_AGENT.value)
  if agent.run_defaults:
    return agent.run_default(flag.name, flag.value)
  if _HER.value and not (_DATASET.value or _REVERB_ADDRESS.value):
    return _HER_DEFAULTS.get(flag.name, flag.value)
  return flag.value


# Config fields that flags of other names set; any other field is set by
# the flag of its own name, if there is one.
_FLAGS_OF_FIELD = {
    'OfflineConfig.dataset': ('dataset', 'reverb_address'),
    'OfflineConfig.train_steps': ('steps',),
    'OnlineConfig.env_steps': ('steps',),
    'OnPolicyConfig.env_steps': ('steps',),
    'AgentConfig.double_dqn': ('double',),
    'AgentConfig.train_steps': ('steps',),
    'PerConfig.alpha': ('per_alpha',),
    'PerConfig.beta0': ('per_beta0',),
    'PerConfig.beta_steps': ('per_beta_steps',),
    'PerConfig.eps': ('per_eps',),
    'PerConfig.priority_cap': ('per_priority_cap',),
    'HerConfig.strategy': ('her',),
}


def _flag_given(cls: type, field: str) -> bool:
  """Whether a flag that sets `cls.field` is on the command line."""
  names = _FLAGS_OF_FIELD.get(f'{cls.__name__}.{field}', (field,))
  return any(name in flags.FLAGS and flags.FLAGS[name].present
             for name in names)


def _gin_bound(cls: type, field: str) -> bool:
  try:
    gin.query_parameter(f'{cls.__name__}.{field}')
  except ValueError:  # Unbound (or a class gin does not know).
    return False
  return True


def _setting(cls: type, field: str, value: Any) -> Any:
  """What `cls.field` will be: `value` unless gin binds it and no flag for
  it is on the command line (then gin's value)."""
  if not _flag_given(cls, field) and _gin_bound(cls, field):
    return gin.query_parameter(f'{cls.__name__}.{field}')
  return value


def _make(cls: type, **values: Any) -> Any:
  """`cls(**values)` less the fields that gin binds and no given flag sets.

  gin fills those in, so a setting comes from the command line if given
  there, else from gin, else from `values` (the flag's default, or the
  pipeline's own default for the mode), else from the dataclass.
  """
  return cls(**{field: value for field, value in values.items()
                if _flag_given(cls, field) or not _gin_bound(cls, field)})


def _her_config() -> her.HerConfig | None:
  if _HER.value is None:
    return None
  return _make(her.HerConfig, strategy=_HER.value, k=_K.value)


def _per_config(default_beta_steps: int) -> per.PerConfig:
  return _make(
      per.PerConfig, alpha=_PER_ALPHA.value, beta0=_PER_BETA0.value,
      beta_steps=_PER_BETA_STEPS.value or max(default_beta_steps, 1),
      eps=_PER_EPS.value, priority_cap=_PER_PRIORITY_CAP.value)


def _root_dir(cls: type, source: str) -> str:
  if _ROOT_DIR.value:
    return _ROOT_DIR.value
  slug = ''.join(c if c.isalnum() else '_' for c in source.lower()).strip('_')
  replay = ('_per' if _setting(cls, 'replay', _REPLAY.value) == 'prioritized'
            else '')
  replay += f'_her_{_HER.value}' if _HER.value else ''
  seed = _setting(cls, 'seed', _SEED.value)
  return os.path.join('runs', f'{_AGENT.value}{replay}_{slug}_seed{seed}')


def _agent_config(train_steps: int | None = None) -> factory.AgentConfig:
  return _make(
      factory.AgentConfig, actor_learning_rate=_ACTOR_LR.value,
      critic_learning_rate=_CRITIC_LR.value,
      alpha_learning_rate=_ALPHA_LR.value, td3_bc_alpha=_TD3_BC_ALPHA.value,
      cql_alpha=_CQL_ALPHA.value, cql_bc_steps=_CQL_BC_STEPS.value,
      dqn_learning_rate=_DQN_LR.value, double_dqn=_DOUBLE.value,
      dueling=_DUELING.value,
      target_update_period=_TARGET_UPDATE_PERIOD.value, seed=_SEED.value,
      train_steps=train_steps)


def _usage_error(message: str) -> None:
  cli.fail(_PROG, ValueError(message), code=2)


def _offline_config() -> offline.OfflineConfig:
  if _HER.value and not registry.get(_AGENT.value).trains(
      registry.OFFLINE, her=True):
    _usage_error(f'--agent {_AGENT.value} does not train offline with --her;'
                 ' pick one of: '
                 + ', '.join(registry.names(registry.OFFLINE, her=True)))
  if not _HER.value and not registry.get(_AGENT.value).trains(
      registry.OFFLINE):
    _usage_error(f'--agent {_AGENT.value} trains online; drop --dataset / '
                 '--reverb_address, or pick one of: '
                 + ', '.join(registry.names(registry.OFFLINE)))
  cls = offline.OfflineConfig
  choice = {'auto': None, 'true': True, 'false': False}
  normalize = choice[_NORMALIZE.value]
  table = common_flags.TABLE.value
  source = _DATASET.value or f'{_REVERB_ADDRESS.value}_{table}'
  train_steps = _setting(cls, 'train_steps', _STEPS.value or 300_000)
  return _make(
      cls, agent=_AGENT.value,
      dataset=_DATASET.value or _REVERB_ADDRESS.value,
      root_dir=_root_dir(cls, os.path.basename(source.rstrip('/')) or source),
      env=_ENV.value, split=common_flags.SPLIT.value,
      data_dir=common_flags.DATA_DIR.value,
      download=common_flags.DOWNLOAD.value,
      max_episodes=_PUSH_FLAGS.max_episodes.value,
      reverb_address=_REVERB_ADDRESS.value, table=table,
      train_steps=train_steps,
      batch_size=(_BATCH_SIZE.value or
                  registry.get(_AGENT.value).published.batch_size),
      eval_interval=_EVAL_INTERVAL.value, eval_episodes=_EVAL_EPISODES.value,
      checkpoint_interval=_CHECKPOINT_INTERVAL.value,
      normalize_observations=normalize,
      normalize_rewards=choice[_NORMALIZE_REWARDS.value],
      online_finetune_steps=_FINETUNE.value, train_every=_TRAIN_EVERY.value,
      replay=_REPLAY.value, per_config=_per_config(train_steps),
      feed=_FEED.value, n_step=_N_STEP.value,
      her_config=_her_config(), her_normalize=_HER_NORMALIZE.value,
      exploration_noise=_EXPLORATION_NOISE.value,
      reconnect_timeout_s=(_RECONNECT_TIMEOUT.value if _RECONNECT.value
                           else 0.0),
      seed=_SEED.value, agent_config=_agent_config(train_steps))


def _online_config() -> online.OnlineConfig:
  agent = registry.get(_AGENT.value)
  if agent.trains(registry.OFFLINE) and not agent.trains(registry.ONLINE):
    finetune = (f' ({_AGENT.value} trains online only as fine-tuning after '
                'the offline phase: --online_finetune_steps)'
                if agent.trains(registry.FINETUNE) else '')
    _usage_error(f'--agent {_AGENT.value} needs offline data: pass --dataset '
                 f'or --reverb_address{finetune}')
  if _FINETUNE.value:
    _usage_error('--online_finetune_steps continues an offline run: pass '
                 '--dataset')
  remote_actors = _NUM_ACTORS.value == 0
  cls = online.OnlineConfig
  env_steps = _setting(cls, 'env_steps', _value(_STEPS) or 300_000)
  initial_collect_steps = _setting(cls, 'initial_collect_steps',
                                   _value(_INITIAL_COLLECT))
  utd = _setting(cls, 'utd', _value(_UTD))
  if utd <= 0:
    _usage_error('--utd must be > 0')
  return _make(
      cls, env=_ENV.value,
      root_dir=_root_dir(cls, _setting(cls, 'env', _ENV.value)),
      agent=_AGENT.value, env_steps=env_steps,
      initial_collect_steps=initial_collect_steps,
      batch_size=_value(_BATCH_SIZE) or 256, train_every=_value(_TRAIN_EVERY),
      utd=utd, eval_interval=_value(_EVAL_INTERVAL),
      eval_episodes=_value(_EVAL_EPISODES),
      checkpoint_interval=_CHECKPOINT_INTERVAL.value,
      snapshot_interval=_SNAPSHOT_INTERVAL.value,
      replay_size=_value(_REPLAY_SIZE), epsilon_final=_EPSILON_FINAL.value,
      exploration_fraction=_EXPLORATION_FRACTION.value, replay=_REPLAY.value,
      per_config=_per_config(
          int(max(env_steps - initial_collect_steps, 1) * utd)),
      her_config=_her_config(), her_normalize=_HER_NORMALIZE.value,
      feed=_FEED.value, n_step=_N_STEP.value,
      exploration_noise=_EXPLORATION_NOISE.value,
      random_action_probability=_RANDOM_ACTIONS.value,
      num_actors=_NUM_ACTORS.value,
      reverb_address=_REVERB_ADDRESS.value if remote_actors else '',
      table=(common_flags.TABLE.value if common_flags.TABLE.present
             else online.ONLINE_TABLE),
      publish_every=_PUBLISH_EVERY.value,
      seed=_SEED.value, agent_config=_agent_config())


# Flags of the off-policy agents that ppo and a2c refuse rather than ignore.
_OFF_POLICY_FLAGS = (
    _HER, _REPLAY, _FINETUNE, _BATCH_SIZE, _UTD, _TRAIN_EVERY,
    _INITIAL_COLLECT, _REPLAY_SIZE, _SNAPSHOT_INTERVAL, _FEED, _N_STEP,
    _NUM_ACTORS, _EXPLORATION_NOISE, _RANDOM_ACTIONS)


def _onpolicy_config() -> onpolicy.OnPolicyConfig:
  agent = _AGENT.value
  if _DATASET.value or _REVERB_ADDRESS.value:
    _usage_error(f'--agent {agent} learns from its own rollouts in --env; '
                 'drop --dataset / --reverb_address')
  off_policy = sorted(f'--{flag.name}' for flag in _OFF_POLICY_FLAGS
                      if flags.FLAGS[flag.name].present)
  if off_policy:
    _usage_error(f'--agent {agent} is on-policy: {", ".join(off_policy)} '
                 'are for the off-policy agents')
  ppo_only = sorted(f'--{flag.name}' for flag in onpolicy_flags.PPO_ONLY
                    if flags.FLAGS[flag.name].present)
  if ppo_only and not registry.get(agent).minibatch_epochs:
    _usage_error(f'{", ".join(ppo_only)}: for --agent '
                 f'{", ".join(a for a in registry.names(registry.ONPOLICY) if registry.get(a).minibatch_epochs)} only '
                 f'({agent} takes one step per rollout)')
  gail_given = onpolicy_flags.given(onpolicy_flags.GAIL_FLAGS)
  if gail_given and not gail_given.get('gail_dataset'):
    _usage_error(', '.join(sorted(f'--{name}' for name in gail_given)) +
                 ': GAIL needs its demonstrations: pass --gail_dataset')
  cls = onpolicy.OnPolicyConfig
  env = _setting(cls, 'env', _ENV.value)
  specs = envs.env_specs(env)
  onpolicy.check_env(specs)
  values = {**ppo.env_defaults(agent, specs.discrete),
            **onpolicy_flags.given()}
  if values.get('recurrent') and 'minibatches' not in onpolicy_flags.given():
    values['minibatches'] = ppo.sequence_minibatches(values)
  agent_config = _make(ppo.PpoConfig, algorithm=agent, **values)
  ppo.check(agent_config)
  present = lambda flag: flags.FLAGS[flag.name].present  # pylint: disable=unnecessary-lambda-assignment
  return _make(
      cls, env=_ENV.value, root_dir=_root_dir(cls, env), agent=agent,
      env_steps=_STEPS.value or registry.get(agent).run_default(
          'steps', 1_000_000, specs.discrete),
      eval_interval=(_EVAL_INTERVAL.value if present(_EVAL_INTERVAL) else
                     registry.get(agent).run_default(
                         'eval_interval', 10_000, specs.discrete)),
      eval_episodes=_EVAL_EPISODES.value,
      checkpoint_interval=(_CHECKPOINT_INTERVAL.value
                           if present(_CHECKPOINT_INTERVAL) else 50_000),
      seed=_SEED.value, ppo_config=agent_config, **gail_given)


def _parse_gin() -> None:
  """Applies --gin_file and --gin_bindings; a bad one is a usage error."""
  for path in _GIN_FILE.value:
    if not os.path.isfile(path):  # Before gin, which logs the miss too.
      _usage_error(f'--gin_file {path}: no such file')
  try:
    gin.parse_config_files_and_bindings(
        _GIN_FILE.value, _GIN_BINDINGS.value, skip_unknown=False)
  except (ValueError, SyntaxError, OSError, ImportError,
          tokenize.TokenError) as e:
    _usage_error(f'gin: {cli.one_line(e)}')


def _exit_now(line: str, code: int) -> NoReturn:
  # On a line of its own: the progress bar, never closed, is mid-line.
  cli.exit_now(line, code, fresh_line=True)


def _interrupted_line(root_dir: str) -> str:
  return f'interrupted; rerun the same command to resume from {root_dir}'


class _InterruptGuard:
  """Ctrl-C ends train even while the main thread is blocked in C++.

  Python runs its SIGINT handler (KeyboardInterrupt) in the main thread,
  between bytecodes: a main thread waiting inside Reverb's C++ sampler on a
  dead server never gets there. The C-level handler still writes the signal
  number to the wakeup fd: a thread reads it and, if the main thread has not
  reached its KeyboardInterrupt handler `grace_s` later, prints the
  interrupted line and exits 130 itself.
  """

  def __init__(self, message: str, grace_s: float = 5.0):
    self.handled = False
    self._message, self._grace_s = message, grace_s
    # A background job inherits SIGINT ignored; Ctrl-C must work anyway.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    self._read, write = socket.socketpair()
    write.setblocking(False)
    self._write = write  # Kept open for the process's lifetime.
    signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
    threading.Thread(target=self._watch, name='interrupt guard',
                     daemon=True).start()

  def _watch(self) -> None:
    while True:
      data = self._read.recv(64)
      if not data:
        return
      if signal.SIGINT in data:
        time.sleep(self._grace_s)
        if not self.handled:
          _exit_now(f'{_PROG}: error: {self._message}', 130)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    _usage_error(f'unexpected arguments: {" ".join(argv[1:])}')
  if _AGENT.value is None:
    _usage_error('--agent is required')
  if _DATASET.value and _REVERB_ADDRESS.value:
    _usage_error('pass --dataset or --reverb_address, not both')
  cli.quiet_logging()
  _parse_gin()
  if (_RECONNECT.value or flags.FLAGS['reconnect_timeout_s'].present) and (
      not _REVERB_ADDRESS.value):
    _usage_error('--reconnect and --reconnect_timeout_s are for a remote '
                 'table: pass --reverb_address')
  if _NUM_ACTORS.value == 0 and (_DATASET.value or
                                 not _REVERB_ADDRESS.value):
    _usage_error('--num_actors 0 learns from actor processes: pass '
                 '--reverb_address of their server (pipelines.serve --env), '
                 'and no --dataset')
  if _NUM_ACTORS.value == 0 and _RECONNECT.value:
    _usage_error('--reconnect is for offline learners on a remote table; a '
                 'learner of actor processes (--num_actors 0) fails within '
                 'its deadline and resumes from its checkpoint when rerun')
  if _PUBLISH_EVERY.present and _NUM_ACTORS.value != 0:
    _usage_error('--publish_every is for --num_actors 0')
  onpolicy_run = registry.get(_AGENT.value).trains(registry.ONPOLICY)
  given = sorted(f'--{name}' for name in {
      **onpolicy_flags.given(),
      **onpolicy_flags.given(onpolicy_flags.GAIL_FLAGS)})
  if given and not onpolicy_run:
    _usage_error(f'{", ".join(given)}: for --agent ppo or a2c only')
  offline_run = bool(_DATASET.value or _REVERB_ADDRESS.value) and (
      _NUM_ACTORS.value != 0) and not onpolicy_run
  try:
    if onpolicy_run:
      config = _onpolicy_config()
    else:
      config = _offline_config() if offline_run else _online_config()
  except ValueError as e:  # A config field's own check, e.g. a bound value.
    _usage_error(str(e))
  interrupted = _interrupted_line(config.root_dir)
  guard = _InterruptGuard(interrupted)
  try:
    if offline_run:
      summary = offline.train_offline(
          config, on_server_lost=lambda e: _exit_now(
              f'{_PROG}: error: {cli.one_line(e)}', 1))
    elif onpolicy_run:
      record = onpolicy.train_onpolicy(config)
      summary = {'agent': config.agent, 'env': config.env,
                 'seed': config.seed, **record}
    else:
      record = online.train_online(config)
      summary = {'agent': config.agent, 'env': config.env,
                 'seed': config.seed, **record}
  except (datasets.DatasetNotFoundError,
          datasets.DatasetNotAvailableError) as e:
    cli.fail(_PROG, e)
  except tf.errors.OpError as e:  # Before training (in it: TrainingError).
    kind = ('offline' if offline_run else
            'on-policy' if onpolicy_run else 'online')
    cli.fail(_PROG, RuntimeError(
        f'{kind} run failed before '
        f'training: {run.op_error_summary(e)}'))
  except cli.USER_ERRORS as e:
    cli.fail(_PROG, e)
  except KeyboardInterrupt:
    guard.handled = True
    cli.fail(_PROG, RuntimeError(interrupted), code=130)
  summary['root_dir'] = config.root_dir
  print(json.dumps(summary), flush=True)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser(_PROG))
