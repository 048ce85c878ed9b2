"""The run configs: every setting of a run, each stated once.

`RunConfig` holds what every mode has (agent, env, run directory, seed,
schedules); `OffPolicyConfig` adds what offline and online runs share
(batches, replay, HER); the leaves, `OfflineConfig`, `OnlineConfig` and
`OnPolicyConfig`, add their own. A field's default, docstring and metadata
(`settings.setting`) are the only statement of a setting: the command-line
flags (`pipelines.config_flags`), gin bindings (`OfflineConfig.batch_size =
512`) and what a resumed run may change are all derived from them. Where an
agent starts from other values (DQN's RL Zoo schedule, on-policy CartPole
budgets, ReBRAC's batches) its registry record says so; `make` applies the
order of precedence once: given > gin > the agent's or mode's defaults >
the field's default.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

import gin

from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.agents.onpolicy import ppo
from rlds_reverb import settings
from rlds_reverb.acting import atari
from rlds_reverb.acting import envs
from rlds_reverb.replay import her
from rlds_reverb.replay import per
from rlds_reverb.storage import tables

setting = settings.setting

OFFLINE_TABLE = tables.DEFAULT_TABLE
ONLINE_TABLE = 'online'
FEEDS = ('memory', 'stream')
# Online runs with hindsight relabelling (goal envs like FetchReach, 50-step
# episodes) start from these unless told otherwise.
ONLINE_HER_DEFAULTS = {
    'env_steps': 10_000, 'initial_collect_steps': 1000, 'train_every': 100,
    'eval_interval': 500, 'eval_episodes': 100}


@dataclasses.dataclass(kw_only=True)
class RunConfig:
  """What every run has."""
  agent: str
  """An agent kind of the registry that trains in this mode
  (`registry.names(mode)`)."""
  env: str = 'HalfCheetah-v5'
  """Gymnasium env id: where online agents act and every agent is evaluated;
  its spaces must match the data."""
  root_dir: str = setting(may_change=True)
  """Checkpoints (agent and Reverb tables), TensorBoard summaries,
  eval.jsonl, learning_curve.png, config.json and exported policies go
  here; running again resumes from it."""
  seed: int = setting(0, lower=0)
  """Seed of TensorFlow, the envs, the exploration and the evaluation
  episodes."""
  eval_interval: int = setting(10_000, lower=1, may_change=True)
  """Steps between greedy evaluations: gradient steps offline, env steps
  online and on-policy."""
  eval_episodes: int = setting(10, lower=1, may_change=True)
  """Episodes per evaluation (greedy policy)."""
  checkpoint_interval: int = setting(10_000, lower=1, may_change=True)
  """Steps between checkpoints (and one at the end), counted as
  eval_interval is."""
  frame_stack: int = setting(0, lower=0)
  """Image observations (Atari): the agent sees stacks of this many
  frames, built at sample and act time from one stored frame per step; 0:
  4 for image observations, 1 otherwise."""
  reverb_address: str = setting('', may_change=True)
  """host:port of a running Reverb server: offline, the table to read
  instead of pushing a dataset; online and on-policy with num_actors 0, the
  server of the actor processes (pipelines.serve --env; with --rollouts for
  ppo and a2c)."""


@dataclasses.dataclass(kw_only=True)
class ActorsConfig:
  """What online and on-policy runs share: who collects."""
  num_actors: int = setting(1, lower=0, upper=1)
  """1: this process acts and learns; 0: actors are other processes
  (pipelines.act) writing episodes (off-policy agents) or rollouts (ppo,
  a2c) into the tables of the server at reverb_address; the learner reads
  them as one process would and publishes its weights there
  (docs/distributed.md)."""
  actor_wait_s: float = setting(600.0, lower=0, may_change=True)
  """num_actors 0: seconds the learner waits for a new episode or rollout,
  with nothing left to train, before it stops with an error (actors all
  gone); 0: waits for ever."""


@dataclasses.dataclass(kw_only=True)
class OffPolicyConfig(RunConfig):
  """What offline and online (replay) runs share."""
  batch_size: int = setting(256, lower=1)
  """Transitions per gradient step."""
  train_every: int = setting(1000, lower=1)
  """Online and fine-tuning: env steps collected between learner phases;
  each phase takes train_every x utd gradient steps (fine-tuning: utd 1)."""
  exploration_noise: float = setting(0.1, lower=0)
  """Online td3 and fine-tuning: std of the Gaussian noise added to the
  actor's actions, in action units (SAC samples its policy)."""
  replay: str = setting('uniform', choices=per.REPLAYS)
  """How the learner samples: uniform, or prioritized (proportional PER,
  Schaul et al. 2015: new items at the largest priority so far, priorities
  |TD error| + per_eps after each step, importance weights in the loss).
  Agents with TD errors; offline, the offline phase only."""
  feed: str = setting('memory', choices=FEEDS)
  """How the learner gets its batches. memory: the table holds whole
  episodes, which the learner reads into its own memory (offline data once,
  online episodes as they finish) and samples in the same graph as its
  train step. stream (offline only): every batch is sampled item by item
  from a Reverb table of 2-step items (a remote table too big for the
  learner's memory, or one pipelines.push made with its default items)."""
  n_step: int = setting(1, lower=1)
  """Memory feed without HER: n-step returns; they stop at terminal steps
  and bootstrap at truncated endings. 1 is one-step TD."""
  per_config: per.PerConfig | None = setting(None, flag_prefix='per_')
  """Prioritized replay's settings; None: defaults, beta annealed over all
  gradient steps of the run."""
  her_config: her.HerConfig | None = setting(None, flag_prefix='her_')
  """Goal envs (dict observations, e.g. FetchReach-v4): hindsight experience
  replay; None: off."""
  her_normalize: bool = True
  """HER: normalise observations and goals with running statistics,
  clipped to +-5 (as the HER paper does); off: fed raw."""
  agent_config: factory.AgentConfig = setting(
      default_factory=factory.AgentConfig, flag_prefix='')
  """The agent's hyper-parameters."""

  @property
  def prioritized(self) -> bool:
    return self.replay == 'prioritized'

  @property
  def gradient_steps(self) -> int:
    """Gradient steps of the whole run (PER anneals beta over them)."""
    raise NotImplementedError

  @property
  def per_settings(self) -> per.PerConfig:
    """PER's settings with beta_steps resolved."""
    config = self.per_config or per.PerConfig()
    if config.beta_steps is None:
      config = dataclasses.replace(config,
                                   beta_steps=max(self.gradient_steps, 1))
    return config


@gin.configurable
@dataclasses.dataclass(kw_only=True)
class OfflineConfig(OffPolicyConfig):
  """An offline run (and its offline-to-online fine-tuning)."""
  dataset: str
  """TFDS name[/config], local directory or minari:ID of the RLDS data (or a
  label for the run when reverb_address names the table)."""
  split: str = 'train'
  """TFDS split of the dataset, slicing allowed: train[:10%]."""
  data_dir: str | None = setting(None, may_change=True)
  """TFDS data_dir for a dataset given by name."""
  download: bool = setting(True, may_change=True)
  """Let TFDS download a named dataset that is not prepared yet."""
  max_episodes: int = setting(0, lower=0)
  """Use only the first N episodes; 0: all."""
  table: str = OFFLINE_TABLE
  """The offline table's name."""
  train_steps: int = setting(300_000, flag='steps', lower=1, may_change=True)
  """Gradient steps of the offline phase."""
  normalize_observations: bool | None = None
  """Normalise observations with the data's mean and std; auto (None): the
  agent's record says (on for td3_bc, iql, awac and cal_ql, as their papers
  and CORL's configs do)."""
  bootstrap_through_terminals: bool = False
  """Measurement only: read every termination as a time limit, so TD targets
  bootstrap through it, as a loader that drops terminal discounts does
  (docs/datasets.md#terminations-and-d4rls-encodings)."""
  normalize_rewards: bool | None = None
  """Scale rewards by 1000 / (max - min episode return) of the data; auto
  (None): the agent's record says (on for iql, its paper's locomotion
  setting). Agents with ensemble critics, memory feed."""
  online_finetune_steps: int = setting(0, lower=0, may_change=True)
  """After the offline phase, this many env steps online; every batch is
  half offline, half online (symmetric sampling, as RLPD does)."""
  reconnect_timeout_s: float = setting(0.0, lower=0, may_change=True)
  """reverb_address: seconds to wait for a lost server to come back (then
  go on, saying what the table holds now); 0: fail within the calls'
  deadline."""
  method_settings: dict = setting(default_factory=dict,
                                  flag=settings.NO_FLAG)
  """Recorded, not set: the gin-bound settings of iql, awac, rebrac, sac_n,
  edac or cal_ql (`registry.method_settings`)."""

  @property
  def gradient_steps(self) -> int:
    return self.train_steps

  @property
  def normalizes(self) -> bool:
    if self.her_config is not None:
      return False  # HER normalises with its own running statistics.
    if self.normalize_observations is None:
      return registry.get(self.agent).normalizes_observations
    return self.normalize_observations

  @property
  def scales_rewards(self) -> bool:
    if self.normalize_rewards is None:
      return registry.get(self.agent).scales_rewards
    return self.normalize_rewards


@gin.configurable
@dataclasses.dataclass(kw_only=True)
class OnlineConfig(OffPolicyConfig, ActorsConfig):
  """An online run: actors fill an episode table, the learner its memory."""
  agent: str = 'sac'
  env_steps: int = setting(300_000, flag='steps', lower=1, may_change=True)
  """Env steps of the whole run."""
  initial_collect_steps: int = setting(10_000, lower=0)
  """Uniform random actions before learning starts."""
  utd: float = setting(1.0, lower=0)
  """Gradient steps per env step (update-to-data ratio); each learner phase
  takes train_every x utd steps. Must be > 0."""
  snapshot_interval: int = setting(0, lower=0, may_change=True)
  """Save a numpy policy every N env steps under root_dir/policies
  (behaviour policies); 0: off."""
  replay_size: int = setting(1_000_000, lower=1)
  """Transitions the learner's memory keeps (oldest episodes evicted)."""
  random_action_probability: float = setting(0.0, lower=0, upper=1)
  """Continuous actions: share replaced by uniform random ones (OpenAI
  baselines' HER uses 0.3 on Fetch)."""
  epsilon_final: float = setting(0.04, lower=0, upper=1)
  """dqn: exploration epsilon after its linear decay from 1."""
  exploration_fraction: float = setting(0.16, lower=0, upper=1)
  """dqn: share of env_steps over which epsilon falls to epsilon_final."""
  table: str = ONLINE_TABLE
  """The episode table the actors write into."""
  publish_every: int = setting(10, lower=1, may_change=True)
  """num_actors 0: gradient steps between publications of the learner's
  weights to the actors, inside a phase too (actors that collect while the
  learner trains act with weights at most this old)."""

  @property
  def gradient_steps(self) -> int:
    learning_steps = max(self.env_steps - self.initial_collect_steps, 1)
    return int(learning_steps * self.utd)


@gin.configurable
@dataclasses.dataclass(kw_only=True)
class OnPolicyConfig(RunConfig, ActorsConfig):
  """An on-policy run: rollouts through a queue table, each read once."""
  agent: str = 'ppo'
  env_steps: int = setting(1_000_000, flag='steps', lower=1, may_change=True)
  """Env steps of the whole run (all env copies together)."""
  ppo_config: ppo.PpoConfig | None = setting(None, flag_prefix='')
  """The agent's settings; None: `ppo.defaults_for(agent, discrete)`."""
  gail_dataset: str = ''
  """GAIL from these RLDS demonstrations (a TFDS name or a directory, e.g.
  the --out of pipelines.generate): a discriminator learns the expert's
  (observation, action) pairs and its reward replaces the env's.
  Continuous actions only. '': no GAIL."""
  gail_trajectories: int = setting(4, lower=1)
  """GAIL: expert episodes used, the dataset's first."""
  gail_subsample: int = setting(20, lower=1)
  """GAIL: every k-th step of each expert episode, from a random start."""
  gail_batch_size: int = setting(128, lower=1)
  """GAIL: pairs per discriminator minibatch (expert and policy each)."""
  gail_epochs: int = setting(5, lower=1)
  """GAIL: discriminator epochs per update after the warm-up."""
  gail_warmup_updates: int = setting(10, lower=0)
  """GAIL: updates of the warm-up; the observation statistics freeze at its
  end."""
  gail_warmup_epochs: int = setting(100, lower=1)
  """GAIL: discriminator epochs per update during the warm-up."""


# On-policy runs in image envs (Atari): the seed codebase's budget scale.
ONPOLICY_IMAGE_DEFAULTS = {'env_steps': 10_000_000, 'eval_interval': 100_000,
                           'checkpoint_interval': 100_000}

MODES = {registry.OFFLINE: OfflineConfig, registry.ONLINE: OnlineConfig,
         registry.ONPOLICY: OnPolicyConfig}


def defaults(cls: type, agent: str, *, discrete: bool = False,
             her_run: bool = False, image: bool = False) -> dict[str, Any]:
  """{path: value} where this agent's runs of `cls` start from other values
  than the fields' own: the registry record's, online HER's, on-policy's
  per-env-kind settings."""
  found: dict[str, Any] = {}
  if cls is OnlineConfig and her_run:
    found.update(ONLINE_HER_DEFAULTS)
  found.update(registry.get(agent).run_defaults_for(discrete, image))
  if cls is OnPolicyConfig:
    if image:
      found.update(ONPOLICY_IMAGE_DEFAULTS)
    found.update({f'ppo_config.{name}': value for name, value in
                  ppo.env_defaults(agent, discrete, image).items()})
  return found


def default_root_dir(config: RunConfig) -> str:
  """runs/<agent>[_per][_her_<strategy>]_<env or dataset>_seed<seed>."""
  source = config.env
  if isinstance(config, OfflineConfig):
    source = (f'{config.reverb_address}_{config.table}'
              if config.reverb_address else config.dataset)
  name = os.path.basename(source.rstrip('/')) or source
  slug = ''.join(c if c.isalnum() else '_' for c in name.lower()).strip('_')
  extra = ('_per' if isinstance(config, OffPolicyConfig) and
           config.prioritized else '')
  her_config = getattr(config, 'her_config', None)
  extra += f'_her_{her_config.strategy}' if her_config else ''
  return os.path.join('runs', f'{config.agent}{extra}_{slug}_seed{config.seed}')


def default(cls: type, agent: str, path: str, *,
            discrete: bool = False) -> Any:
  """What `path` of an agent's run of `cls` starts from, gin aside."""
  found = defaults(cls, agent, discrete=discrete)
  if path in found:
    return found[path]
  return next(s.default for s in settings.fields(cls) if s.path == path)


def make(cls: type, agent: str, given: Mapping[str, Any], *,
         discrete: bool | None = None) -> Any:
  """The run config of `cls` for `agent`, with the settings in `given`
  ({dotted path: value}, e.g. {'per_config.alpha': 0.7}); every other
  field comes from gin's binding, else the agent's or mode's default
  (`defaults`), else the field's own default. Nested configs are always
  made (a recorded run holds them whole); her_config only when its
  strategy is given, per_config's beta_steps spans the run's gradient
  steps and agent_config takes the run's seed and offline budget unless
  set. `discrete` (on-policy defaults): None reads the env's action
  space; offline and online runs on an Atari env (ALE/...,
  ...NoFrameskip-v4) take its image defaults."""
  her_run = 'her_config.strategy' in given
  image = False
  if discrete is None:  # On-policy defaults follow the env's actions.
    discrete = False
    if cls is OnPolicyConfig:
      top = settings.build(cls, {**settings.top(given), 'agent': agent})
      specs = envs.env_specs(top.env, frame_stack=top.frame_stack)
      discrete, image = specs.discrete, specs.image
    elif cls in (OfflineConfig, OnlineConfig):  # Atari: frames, discrete.
      top = settings.build(cls, {**settings.top(given), 'agent': agent})
      discrete = image = atari.is_atari(top.env)
  preset = defaults(cls, agent, discrete=discrete, her_run=her_run,
                    image=image)
  config = settings.build(cls, {**settings.top(given), 'agent': agent},
                          settings.top(preset))
  nested = {}
  if issubclass(cls, OffPolicyConfig):
    agent_preset = {'seed': config.seed, **settings.split(preset,
                                                          'agent_config')}
    if cls is OfflineConfig:
      agent_preset['train_steps'] = config.train_steps
    nested['agent_config'] = settings.build(
        factory.AgentConfig, settings.split(given, 'agent_config'),
        agent_preset)
    chosen = settings.build(per.PerConfig, settings.split(given, 'per_config'))
    nested['per_config'] = dataclasses.replace(
        config, per_config=chosen).per_settings  # beta_steps resolved.
    if her_run:
      nested['her_config'] = settings.build(
          her.HerConfig, settings.split(given, 'her_config'))
  if cls is OnPolicyConfig:
    values = {**settings.split(preset, 'ppo_config'),
              **settings.split(given, 'ppo_config')}
    ppo_given = settings.split(given, 'ppo_config')
    if values.get('recurrent') and 'minibatches' not in ppo_given:
      ppo_given['minibatches'] = ppo.sequence_minibatches(values)
    nested['ppo_config'] = settings.build(
        ppo.PpoConfig, {**ppo_given, 'algorithm': agent},
        settings.split(preset, 'ppo_config'))
    ppo.check(nested['ppo_config'])
  return dataclasses.replace(config, **nested)
