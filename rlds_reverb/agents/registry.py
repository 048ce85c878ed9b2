"""The agent registry: one record per agent kind.

Everything the toolkit knows about an agent by its name is here: how it is
built, which of the run modes it trains in, how its actor is exported, the
kind of actions it takes, whether it reports TD errors (prioritized replay)
and trains with hindsight relabelling, what its offline runs normalise, and
its published settings with their source. This is the only module that
looks agents up by name; experiments and pipelines ask a record.

    record = registry.get('td3_bc')
    record.check_mode(registry.FINETUNE)       # or ValueError, one line
    agent = registry.make_agent('td3_bc', time_step_spec, action_spec,
                                factory.AgentConfig(seed=0))

Imports point one way: this module imports the agents' modules, which know
nothing of it. A method's own settings (`IqlConfig`, `RebracConfig`, ...)
are passed to `make_agent`; only when none is passed is its dataclass made
here (with whatever gin binds to it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import tensorflow as tf

from rlds_reverb.agents import dqn
from rlds_reverb.agents import factory
from rlds_reverb.agents.offline import awac
from rlds_reverb.agents.offline import cal_ql
from rlds_reverb.agents.offline import discrete
from rlds_reverb.agents.offline import ensemble
from rlds_reverb.agents.offline import iql
from rlds_reverb.agents.offline import rebrac
from rlds_reverb.agents.offline import sac_n

# The run modes. FINETUNE: online after an offline phase (offline-to-
# online); ONPOLICY: rollouts through a queue table, each read once.
OFFLINE, ONLINE, FINETUNE, ONPOLICY = 'offline', 'online', 'finetune', 'onpolicy'
MODES = (OFFLINE, ONLINE, FINETUNE, ONPOLICY)
_MODE_WORDS = {OFFLINE: 'offline', ONLINE: 'online from scratch',
               FINETUNE: 'online after its offline phase (fine-tuning)',
               ONPOLICY: 'on-policy'}
CONTINUOUS, DISCRETE, BOTH = 'continuous', 'discrete', 'both'
_TWO, _THREE = (256, 256), (256, 256, 256)
# Offline discrete learners on Atari frame stacks: batch 32 and, for CQL, a
# target network copied every 2,000 gradient steps (8,000 agent steps at one
# update per 4), the DQN settings of Agarwal et al. 2020's offline Atari
# runs, which Kumar et al. 2020 train CQL with; Adam at 1e-4 (RL Zoo's Atari
# DQN rate; Dopamine's 5e-5 is for runs of millions of steps).
_ATARI_OFFLINE = (('batch_size', 32),
                  ('agent_config.dqn_learning_rate', 1e-4))
# Online DQN on Atari: RL Zoo's Atari DQN (10M agent steps, 100k random
# ones first, one update of 32 per 4 steps, a target copied every 1,000
# agent steps = 250 updates, epsilon to 0.01 over the first 10 %, Adam
# 1e-4). Two departures: a memory of 100k steps (RL Zoo keeps 10k to save
# memory; ours stores each frame once), and updates taken 250 at a time
# after each 1,000 steps (the same ratio, fewer learner phases).
_ATARI_ONLINE_DQN = (
    ('env_steps', 10_000_000), ('batch_size', 32),
    ('initial_collect_steps', 100_000), ('train_every', 1000), ('utd', 0.25),
    ('replay_size', 100_000), ('epsilon_final', 0.01),
    ('exploration_fraction', 0.1), ('eval_interval', 100_000),
    ('checkpoint_interval', 100_000),
    ('agent_config.dqn_learning_rate', 1e-4),
    ('agent_config.target_update_period', 250))


@dataclasses.dataclass(frozen=True)
class Published:
  """An agent's published settings: what `AgentConfig`'s None stands for."""
  source: str
  """Where the settings come from (paper, example or config file)."""
  actor_learning_rate: Optional[float] = None
  critic_learning_rate: Optional[float] = None
  alpha_learning_rate: Optional[float] = None
  actor_layers: Optional[tuple[int, ...]] = None
  critic_layers: Optional[tuple[int, ...]] = None
  reward_scale_factor: float = 1.0
  train_steps: int = 1_000_000
  """Length of learning-rate schedules: the published runs' length."""


@dataclasses.dataclass(frozen=True)
class AgentRecord:
  """What the toolkit knows about one agent kind."""
  name: str
  modes: tuple[str, ...]
  """The run modes it trains in (`MODES`)."""
  published: Published
  make: Optional[Callable[..., Any]] = None
  """(time_step_spec, action_spec, resolved AgentConfig, train_step,
  method_config) -> an initialised TF-Agents agent; None for the on-policy
  agents, which `experiments.onpolicy` builds from `PpoConfig`."""
  head: Optional[str] = None
  """The numpy head that exports its actor (`acting.numpy_policy.HEADS`);
  None where the head follows the env (the on-policy actor-critics). An
  actor that a method config swaps (IQL's and AWAC's 'gaussian') exports
  with the head its network needs (`export.network_head`)."""
  actions: str = CONTINUOUS
  """CONTINUOUS, DISCRETE or BOTH."""
  td_errors: bool = False
  """Its train step reports per-item TD errors: prioritized replay works."""
  her_modes: tuple[str, ...] = ()
  """The modes in which it trains with hindsight goal relabelling."""
  normalizes_observations: bool = False
  """Offline runs normalise observations by the data's mean and std by
  default (the method's paper or CORL's config does)."""
  scales_rewards: bool = False
  """Offline runs scale rewards by 1000 / (max - min episode return)."""
  ensemble_critics: bool = False
  """Its critics are `ensemble.EnsembleMlp`s: `critic_dtype` applies, and
  reward scaling can read the episode returns."""
  one_step: bool = False
  """Reads each item's next action or return-to-go: one-step transitions
  only (no n-step returns)."""
  returns_to_go: bool = False
  """Reads each transition's return-to-go from the memory feed (uniform)."""
  method_config: Optional[type] = None
  """The dataclass of the method's own settings, passed to `make`."""
  run_defaults: tuple[tuple[str, Any], ...] = ()
  """(run config field path, value) pairs where this agent's runs start
  from other values than the fields' own (DQN's RL Zoo CartPole schedule,
  ReBRAC's batches, on-policy checkpoint intervals)."""
  discrete_run_defaults: tuple[tuple[str, Any], ...] = ()
  """The same for envs with discrete actions (on-policy CartPole budgets)."""
  image_run_defaults: tuple[tuple[str, Any], ...] = ()
  """The same for image observations, over the discrete ones (DQN and the
  offline learners on Atari: a CNN takes another step size and batch than
  an MLP on CartPole, online DQN another exploration schedule)."""
  minibatch_epochs: bool = False
  """Several epochs of clipped minibatch updates per rollout (PPO): the
  epochs, minibatches and clipping settings apply to it."""
  kfac_step: bool = False
  """Steps with K-FAC's natural gradient (ACKTR): the kfac settings apply
  to it."""

  def run_defaults_for(self, discrete: bool = False, image: bool = False
                       ) -> dict[str, Any]:
    """{run config field path: value} of this agent's own defaults."""
    defaults = dict(self.run_defaults)
    if discrete:
      defaults.update(self.discrete_run_defaults)
    if image:
      defaults.update(self.image_run_defaults)
    return defaults

  def trains(self, mode: str, her: bool = False) -> bool:
    return mode in (self.her_modes if her else self.modes)

  def check_mode(self, mode: str, her: bool = False) -> None:
    """Raises ValueError, one line, when the agent does not train in `mode`."""
    if mode not in MODES:
      raise ValueError(f'unknown mode {mode!r}; one of: {", ".join(MODES)}')
    if self.trains(mode, her):
      return
    words = _MODE_WORDS[mode] + (' with HER' if her else '')
    modes = self.her_modes if her else self.modes
    its = (', '.join(_MODE_WORDS[m] for m in modes) if modes else 'nothing')
    how = (' with online_finetune_steps' if mode == ONLINE and
           self.trains(FINETUNE) else '')
    raise ValueError(
        f'agent {self.name!r} does not train {words} (it trains: {its}'
        f'{how}); agents that do: {", ".join(names(mode, her=her)) or "none"}')


_RECORDS = (
    AgentRecord(
        'sac', (ONLINE,), Published(
            "TF-Agents' SAC example (haarnoja18)", 3e-4, 3e-4, 3e-4, _TWO,
            _TWO, 0.1), make=factory.make_sac, head='tanh_normal',
        td_errors=True, her_modes=(OFFLINE, ONLINE)),
    AgentRecord(
        'td3', (ONLINE,), Published(
            'Fujimoto et al. 2018', 3e-4, 3e-4, None, _TWO, _TWO),
        make=factory.make_td3, head='deterministic', td_errors=True,
        her_modes=(OFFLINE, ONLINE)),
    AgentRecord(
        'bc', (OFFLINE,), Published(
            'behaviour cloning, CORL', 1e-3, None, None, _TWO, None),
        make=factory.make_bc, head='deterministic'),
    AgentRecord(
        'td3_bc', (OFFLINE, FINETUNE), Published(
            'Fujimoto & Gu 2021', 3e-4, 3e-4, None, _TWO, _TWO),
        make=factory.make_td3_bc, head='deterministic', td_errors=True,
        her_modes=(OFFLINE,), normalizes_observations=True),
    AgentRecord(
        'cql_sac', (OFFLINE, FINETUNE), Published(
            "TF-Agents' CQL-SAC D4RL MuJoCo configs (kumar20)", 3e-4, 3e-4,
            3e-4, _TWO, _THREE, 0.1),
        make=factory.make_cql_sac, head='tanh_normal', td_errors=True),
    AgentRecord(
        'dqn', (ONLINE,), Published(
            "RL Zoo's DQN CartPole-v1", None, None, None, _TWO, None),
        make=dqn.make_dqn_agent, head='q_argmax', actions=DISCRETE,
        td_errors=True, run_defaults=(
            ('env_steps', 50_000), ('batch_size', 64),
            ('initial_collect_steps', 1000), ('train_every', 256),
            ('utd', 0.5), ('eval_interval', 1000), ('replay_size', 100_000)),
        image_run_defaults=_ATARI_ONLINE_DQN),
    AgentRecord(
        'iql', (OFFLINE, FINETUNE), Published(
            "CORL's halfcheetah configs", 3e-4, 3e-4, None, _TWO, _TWO),
        make=iql.make_iql, head='tanh_normal', td_errors=True,
        normalizes_observations=True, scales_rewards=True,
        ensemble_critics=True, method_config=iql.IqlConfig),
    AgentRecord(
        'awac', (OFFLINE, FINETUNE), Published(
            "CORL's halfcheetah configs", 3e-4, 3e-4, None, _THREE, _THREE),
        make=awac.make_awac, head='tanh_normal', td_errors=True,
        normalizes_observations=True, ensemble_critics=True,
        method_config=awac.AwacConfig),
    AgentRecord(
        'rebrac', (OFFLINE, FINETUNE), Published(
            "CORL's halfcheetah configs", 1e-3, 1e-3, None, _THREE, _THREE),
        run_defaults=(('batch_size', 1024),), make=rebrac.make_rebrac,
        head='deterministic', td_errors=True,
        ensemble_critics=True, one_step=True,
        method_config=rebrac.RebracConfig),
    AgentRecord(
        'sac_n', (OFFLINE, FINETUNE), Published(
            "CORL's halfcheetah configs", 3e-4, 3e-4, 3e-4, _THREE, _THREE),
        make=sac_n.make_sac_n, head='tanh_normal', td_errors=True,
        ensemble_critics=True, method_config=sac_n.SacNConfig),
    AgentRecord(
        'edac', (OFFLINE, FINETUNE), Published(
            "CORL's halfcheetah configs", 3e-4, 3e-4, 3e-4, _THREE, _THREE),
        make=sac_n.make_edac, head='tanh_normal', td_errors=True,
        ensemble_critics=True, method_config=sac_n.SacNConfig),
    AgentRecord(
        'cal_ql', (OFFLINE, FINETUNE), Published(
            "CORL's halfcheetah configs", 3e-5, 3e-4, 3e-5, _THREE, _THREE),
        make=cal_ql.make_cal_ql, head='tanh_normal', td_errors=True,
        normalizes_observations=True, ensemble_critics=True, one_step=True,
        returns_to_go=True, method_config=cal_ql.CalQlConfig),
    AgentRecord(
        'discrete_bc', (OFFLINE,), Published(
            'behaviour cloning, discrete actions (RL Unplugged Atari)'),
        make=discrete.make_discrete_bc, head='q_argmax', actions=DISCRETE,
        image_run_defaults=_ATARI_OFFLINE),
    AgentRecord(
        'discrete_cql', (OFFLINE,), Published(
            'Kumar et al. 2020, CQL(H) on DQN'),
        make=discrete.make_discrete_cql, head='q_argmax', actions=DISCRETE,
        method_config=discrete.DiscreteCqlConfig,
        image_run_defaults=(*_ATARI_OFFLINE,
                            ('agent_config.target_update_period', 2000))),
    AgentRecord(
        'ppo', (ONPOLICY,), Published(
            'the seed A2C/PPO codebase (PPO, Schulman et al. 2017)'),
        actions=BOTH, minibatch_epochs=True,
        run_defaults=(('checkpoint_interval', 50_000),),
        discrete_run_defaults=(('env_steps', 100_000),
                               ('eval_interval', 5_000))),
    AgentRecord(
        'a2c', (ONPOLICY,), Published(
            'the seed A2C/PPO codebase (A2C, Mnih et al. 2016)'),
        actions=BOTH, run_defaults=(('checkpoint_interval', 50_000),),
        discrete_run_defaults=(('env_steps', 500_000),)),
    AgentRecord(
        'acktr', (ONPOLICY,), Published(
            'the seed A2C/PPO codebase and OpenAI baselines (ACKTR, Wu et '
            'al. 2017)'),
        actions=BOTH, kfac_step=True,
        run_defaults=(('checkpoint_interval', 50_000),),
        discrete_run_defaults=(('env_steps', 500_000),)),
)
RECORDS: dict[str, AgentRecord] = {r.name: r for r in _RECORDS}
AGENTS = tuple(RECORDS)


def get(name: str) -> AgentRecord:
  """The record of agent `name`; ValueError naming the known agents."""
  try:
    return RECORDS[name]
  except (KeyError, TypeError):
    raise ValueError(f'unknown agent {name!r}; one of: '
                     f'{", ".join(AGENTS)}') from None


def names(mode: Optional[str] = None, *, her: bool = False,
          discrete: Optional[bool] = None) -> tuple[str, ...]:
  """The agents that train in `mode` (any mode: None), with HER if `her`,
  and take discrete (True) or continuous (False) actions if given."""
  found = []
  for record in _RECORDS:
    if mode is not None and not record.trains(mode, her):
      continue
    if discrete is not None and record.actions != BOTH and (
        (record.actions == DISCRETE) != discrete):
      continue
    found.append(record.name)
  return tuple(found)


def resolve(name: str, config: factory.AgentConfig) -> factory.AgentConfig:
  """`config` with each None replaced by agent `name`'s published value."""
  published = get(name).published
  values = {field: getattr(published, field) for field in (
      'actor_learning_rate', 'critic_learning_rate', 'alpha_learning_rate',
      'actor_layers', 'critic_layers', 'reward_scale_factor', 'train_steps')}
  return dataclasses.replace(config, **{
      field: value for field, value in values.items()
      if getattr(config, field) is None and value is not None})


def default_method_config(name: str) -> Any:
  """A fresh method config of agent `name` (its dataclass' defaults and
  whatever gin binds to it), or None for an agent without one."""
  method_config = get(name).method_config
  return method_config() if method_config is not None else None


def method_settings(method_config: Any) -> dict:
  """What a run records of a method config ({} for none)."""
  return {} if method_config is None else dataclasses.asdict(method_config)


def make_agent(name: str, time_step_spec: Any, action_spec: Any,
               config: factory.AgentConfig | None = None,
               train_step: tf.Variable | None = None,
               method_config: Any = None) -> Any:
  """Builds and initialises agent `name` with `config` resolved.

  Args:
    name: One of `AGENTS` with a `make` (the off-policy agents).
    time_step_spec, action_spec: The env's TF-Agents specs.
    config: The shared hyper-parameters; None fields take the published
      values.
    train_step: The step counter (a new one if None).
    method_config: The method's own settings (`record.method_config`);
      None: its dataclass' defaults, as gin binds them.

  Raises:
    ValueError: unknown `name`, an on-policy one; a critic_dtype other than
      float32 for an agent without ensemble critics, or an unknown one; a
      method_config for an agent without one, or of another class.
  """
  record = get(name)
  if record.make is None:
    raise ValueError(f'agent {name!r} is built by the on-policy runner '
                     '(experiments.onpolicy), not make_agent')
  config = config or factory.AgentConfig()
  ensemble.hidden_dtype(config.critic_dtype)
  if config.critic_dtype != 'float32' and not record.ensemble_critics:
    raise ValueError(
        f'AgentConfig.critic_dtype={config.critic_dtype!r} applies to the '
        f'ensemble critics of {", ".join(names_with_ensemble_critics())}; '
        f'{name} computes in float32')
  ensemble.warn_if_emulated(config.critic_dtype)
  train_step = (train_step if train_step is not None
                else tf.Variable(0, dtype=tf.int64, name='train_step'))
  if method_config is not None and (
      record.method_config is None or
      not isinstance(method_config, record.method_config)):
    wanted = (record.method_config.__name__ if record.method_config
              else 'none')
    raise ValueError(f'agent {name!r} takes method_config {wanted}, got '
                     f'{type(method_config).__name__}')
  if record.method_config is not None and method_config is None:
    method_config = record.method_config()
  kwargs = {} if record.method_config is None else {
      'method_config': method_config}
  return record.make(time_step_spec, action_spec, resolve(name, config),
                     train_step, **kwargs)


def names_with_ensemble_critics() -> tuple[str, ...]:
  return tuple(r.name for r in _RECORDS if r.ensemble_critics)
