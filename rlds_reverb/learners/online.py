"""Online training: an actor fills a Reverb table, a learner samples from it.

The loop alternates `train_every` env steps of collection (numpy actor,
episodes written with `push_rlds_to_table`) with `train_every * utd`
gradient steps on batches sampled from the table, SpinningUp's
`update_every` scheme. Everything needed to resume is checkpointed together:
the agent (Learner) and the Reverb table (Reverb's own checkpointer).

With `replay='prioritized'` the table samples by priority (`rlds_reverb.per`):
the collector inserts at the running maximum priority, and each learner step
weights its loss by importance weights and sends the new priorities back.
DQN (discrete actions) explores epsilon-greedy, epsilon falling linearly from
1 to `epsilon_final` over the first `exploration_fraction` of the run.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import numpy as np
import reverb
import tensorflow as tf
import tqdm
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from rlds_reverb import her
from rlds_reverb import per
from rlds_reverb import sampling
from rlds_reverb import tables
from rlds_reverb.acting import collect
from rlds_reverb.acting import envs
from rlds_reverb.acting import evaluation
from rlds_reverb.acting import numpy_policy
from rlds_reverb.learners import agents
from rlds_reverb.learners import dqn
from rlds_reverb.learners import export
from rlds_reverb.learners import loop
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from rlds_reverb.replay import follow
from rlds_reverb.replay import hindsight
from rlds_reverb.replay import memory as memory_lib

ONLINE_TABLE = 'online'
FEEDS = ('memory', 'stream')
# How collectors write for the in-memory feed: whole episodes, unread.
EPISODE_ITEMS = {'sequence_length': None,
                 'priority': lambda: episode_table.UNREAD}
REVERB_CHECKPOINTS = 'reverb'
POLICY_SNAPSHOTS = 'policies'


@dataclasses.dataclass
class OnlineConfig:
  """An online run; each field is the `pipelines.train` flag of that name."""
  env: str
  root_dir: str
  agent: str = 'sac'
  env_steps: int = 300_000
  initial_collect_steps: int = 10_000
  batch_size: int = 256
  train_every: int = 1000
  utd: float = 1.0  # gradient steps per env step
  eval_interval: int = 10_000
  eval_episodes: int = 10
  checkpoint_interval: int = 20_000
  snapshot_interval: int = 0  # save a numpy policy every N env steps; 0: off
  replay_size: int = 1_000_000
  exploration_noise: float = 0.1  # TD3-style agents only
  # Continuous actions: share of actions replaced by uniform ones.
  random_action_probability: float = 0.0
  epsilon_final: float = 0.04  # DQN only
  exploration_fraction: float = 0.16  # DQN: share of env_steps to decay over
  replay: str = 'uniform'  # or 'prioritized'
  # None: per.PerConfig defaults, beta annealed over all gradient steps.
  per_config: per.PerConfig | None = None
  # Goal envs: hindsight relabelling of an episode table (None: off).
  her_config: her.HerConfig | None = None
  # Running obs/goal normalisation (the HER paper's); used with her only.
  her_normalize: bool = True
  # 'memory': episodes reach the learner through an episode table and are
  # sampled in-graph from its memory; 'stream': items sampled from Reverb.
  feed: str = 'memory'
  n_step: int = 1  # memory feed, uniform or prioritized: n-step returns
  seed: int = 0
  agent_config: agents.AgentConfig = dataclasses.field(
      default_factory=agents.AgentConfig)


def trajectory_spec(specs: envs.EnvSpecs) -> trajectory.Trajectory:
  """The per-step spec of what the collector writes (float32 RLDS steps)."""
  if specs.goal_conditioned:
    return her.goal_data_spec(*specs.goal_sizes, specs.action_spec)
  obs = tf.TensorSpec(specs.observation_shape, tf.float32)
  step_spec = ts.time_step_spec(obs, tf.TensorSpec((), tf.float32))
  action = policy_step.PolicyStep(
      tf.TensorSpec(specs.action_spec.shape, specs.action_spec.dtype))
  return trajectory.from_transition(step_spec, action, step_spec)


def _check(config: OnlineConfig) -> None:
  for name in ('env_steps', 'batch_size', 'train_every', 'eval_interval',
               'eval_episodes', 'checkpoint_interval', 'replay_size'):
    if getattr(config, name) < 1:
      raise ValueError(f'{name} must be >= 1, got {getattr(config, name)}')
  if config.initial_collect_steps < 0 or config.utd <= 0:
    raise ValueError('initial_collect_steps must be >= 0 and utd > 0')
  if config.agent not in agents.ONLINE_AGENTS:
    raise ValueError(f'agent {config.agent!r} does not train online; one of: '
                     f'{", ".join(agents.ONLINE_AGENTS)}')
  if config.replay not in per.REPLAYS:
    raise ValueError(f'replay must be one of {", ".join(per.REPLAYS)}, got '
                     f'{config.replay!r}')
  if not 0 <= config.random_action_probability <= 1:
    raise ValueError('random_action_probability must be in [0, 1], got '
                     f'{config.random_action_probability}')
  if not 0 <= config.epsilon_final <= 1 or not (
      0 <= config.exploration_fraction <= 1):
    raise ValueError('epsilon_final and exploration_fraction must be in '
                     '[0, 1]')
  if config.feed not in FEEDS:
    raise ValueError(f'feed must be one of {", ".join(FEEDS)}, got '
                     f'{config.feed!r}')
  if config.n_step < 1 or (config.n_step > 1 and (
      config.feed != 'memory' or config.her_config is not None)):
    raise ValueError(f'n_step must be >= 1, and > 1 needs the memory feed '
                     f'without her; got n_step={config.n_step}')
  if config.her_config is not None and config.replay != 'uniform':
    raise ValueError('HER samples its own episode table; replay must be '
                     f'uniform with her, got {config.replay!r}')


def check_her_fits_env(config: OnlineConfig, specs: envs.EnvSpecs) -> None:
  """HER needs a goal env, and a goal env needs HER's episode table."""
  if config.her_config is not None and not specs.goal_conditioned:
    raise ValueError(f'HER needs a goal env (dict observation with '
                     f'{", ".join(envs.GOAL_KEYS)}); {specs.env_id} has a '
                     'flat observation')
  if config.her_config is None and specs.goal_conditioned:
    raise ValueError(f'env {specs.env_id} is a goal env (dict observations): '
                     'train it with her (--her future)')


def check_agent_fits_env(kind: str, specs: envs.EnvSpecs) -> None:
  """Raises ValueError when a discrete agent meets continuous actions or back."""
  if specs.discrete and kind not in agents.DISCRETE_AGENTS:
    raise ValueError(f'env {specs.env_id} has discrete actions; agent {kind} '
                     f'needs continuous ones: use '
                     f'{", ".join(agents.DISCRETE_AGENTS)}')
  if not specs.discrete and kind in agents.DISCRETE_AGENTS:
    raise ValueError(f'agent {kind} needs discrete actions; env '
                     f'{specs.env_id} has continuous ones: use sac or td3')


def per_config_for(config: OnlineConfig) -> per.PerConfig:
  """The run's PER settings; by default beta reaches 1 at the last step."""
  if config.per_config is not None:
    return config.per_config
  learning_steps = max(config.env_steps - config.initial_collect_steps, 1)
  return per.PerConfig(beta_steps=max(int(learning_steps * config.utd), 1))


def export_policy(agent: Any, kind: str, specs: envs.EnvSpecs,
                  **metadata: Any) -> numpy_policy.NumpyPolicy:
  metadata = {'env': specs.env_id, 'agent': kind, **metadata}
  if kind in agents.DISCRETE_AGENTS:
    return dqn.export_q_policy(agent, specs.action_spec, metadata)
  return export.from_network(
      agents.actor_network(agent), agents.HEAD[kind], specs.action_spec,
      metadata=metadata)


def sync_policy(policy: numpy_policy.NumpyPolicy, agent: Any,
                kind: str) -> None:
  """Copies the learner's current weights into the actor's numpy policy."""
  if kind in agents.DISCRETE_AGENTS:
    policy.kernels, policy.biases = dqn.q_layers(agent._q_network)  # pylint: disable=protected-access
  else:
    export.update_weights(policy, agents.actor_network(agent))


def explore_act(policy: numpy_policy.NumpyPolicy, config: OnlineConfig,
                specs: envs.EnvSpecs, env_steps: int,
                flatten: Callable[[Any], np.ndarray] | None = None
                ) -> collect.ActFn:
  """How the actor picks actions after `env_steps` steps.

  `flatten` turns a goal env's observation dicts into the agent's vectors.
  """
  act = _explore_act(policy, config, specs, env_steps)
  if flatten is None:
    return act
  return lambda obs, rng: act(flatten(obs), rng)


def _explore_act(policy: numpy_policy.NumpyPolicy, config: OnlineConfig,
                 specs: envs.EnvSpecs, env_steps: int) -> collect.ActFn:
  if env_steps < config.initial_collect_steps:
    return collect.random_act(specs.action_low, specs.action_high)
  if specs.discrete:
    decay_steps = int(config.exploration_fraction * config.env_steps)
    return collect.epsilon_greedy_act(
        policy, dqn.epsilon(env_steps, decay_steps, config.epsilon_final))
  return collect.with_random_actions(
      collect.policy_act(policy, config.exploration_noise),
      config.random_action_probability, specs.action_low, specs.action_high)


class _StreamReplay:
  """Learner batches sampled item by item from the Reverb table."""

  def __init__(self, config: OnlineConfig, specs: envs.EnvSpecs,
               data_spec: Any, per_config: per.PerConfig):
    self.config, self.specs, self.data_spec = config, specs, data_spec
    self.goal = specs.goal_conditioned
    self.prioritized = config.replay == 'prioritized'
    self.per_config = per_config
    self._iterator = None
    self._address = None

  def tables(self) -> list[reverb.Table]:
    config = self.config
    if self.goal:
      return [her.make_table(ONLINE_TABLE, self.data_spec,
                             max_episodes=episode_capacity(config,
                                                           self.specs))]
    if self.prioritized:
      return [per.make_table(ONLINE_TABLE, self.data_spec,
                             max_size=config.replay_size,
                             alpha=self.per_config.alpha,
                             min_size_to_sample=config.batch_size)]
    return [tables.make_table(ONLINE_TABLE, self.data_spec,
                              max_size=config.replay_size,
                              min_size_to_sample=config.batch_size)]

  def start(self, address: str, client: reverb.Client, agent: Any,
            max_priority: per.MaxPriority, normalizer: Any, reward_env: Any,
            resumed: bool) -> Any:
    del client, resumed
    self._address, self._normalizer = address, normalizer
    self._reward_env = reward_env
    if self.prioritized:
      return per.PrioritizedTrainStep(
          agent, per.PriorityUpdater(address, ONLINE_TABLE), self.per_config,
          max_priority)
    return None

  def collector_kwargs(self, max_priority: per.MaxPriority) -> dict:
    if self.goal:
      return {'sequence_length': None,
              'priority_fn': her.transition_priority,
              'on_episodes': (None if self._normalizer is None else
                              lambda episodes: her.update_normalizer(
                                  self._normalizer, episodes))}
    return {'priority': max_priority if self.prioritized else
            (lambda: 1.0)}

  def ready(self, collector: collect.Collector) -> bool:
    # A goal env's table takes whole episodes: none may be finished yet.
    return not self.goal or collector.stats.episodes > 0

  def source(self) -> Any:
    if self._iterator is None:
      self._iterator = iter(_dataset(self.config, self._address,
                                     self.data_spec, self._reward_env,
                                     self._normalizer))
    return self._iterator

  def checkpoint(self) -> None:
    pass


class _MemoryReplay:
  """Episodes reach the learner's memory through the episode table; the
  learner draws its batches in-graph."""

  def __init__(self, config: OnlineConfig, specs: envs.EnvSpecs,
               data_spec: Any, per_config: per.PerConfig):
    self.config, self.specs, self.data_spec = config, specs, data_spec
    self.goal = specs.goal_conditioned
    self.prioritized = config.replay == 'prioritized'
    self.per_config = per_config
    self.feed = None

  def tables(self) -> list[reverb.Table]:
    table_list = [episode_table.make_table(
        ONLINE_TABLE, self.data_spec,
        max_episodes=episode_capacity(self.config, self.specs))]
    if self.prioritized:
      table_list.append(feeds.make_priority_table(ONLINE_TABLE))
    return table_list

  def start(self, address: str, client: reverb.Client, agent: Any,
            max_priority: per.MaxPriority, normalizer: Any, reward_env: Any,
            resumed: bool) -> Any:
    del address
    config, specs = self.config, self.specs
    self._client = client
    memory = memory_lib.TransitionMemory(
        self.data_spec, config.replay_size + (specs.max_episode_steps or 1000),
        with_episode_bounds=self.goal)
    gamma = config.agent_config.gamma
    if self.goal:
      self.feed = hindsight.HindsightFeed(
          memory, config.batch_size, her.reward_fn_for(reward_env),
          config=config.her_config,
          terminated_fn=her.terminated_fn_for(reward_env),
          normalizer=normalizer)
    elif self.prioritized:
      self.feed = feeds.PrioritizedFeed(
          memory, config.batch_size, self.per_config, n_step=config.n_step,
          gamma=gamma, max_priority=max_priority)
    else:
      self.feed = feeds.UniformFeed(memory, config.batch_size,
                                    n_step=config.n_step, gamma=gamma)
    on_added = getattr(self.feed, 'on_added', None)
    on_episodes = None
    if normalizer is not None:
      on_episodes = lambda episodes: _update_goal_normalizer(normalizer,
                                                             episodes)
    self.follower = follow.TableFollower(client, ONLINE_TABLE, memory,
                                         on_added=on_added,
                                         on_episodes=on_episodes)
    if resumed:
      self.follower.catch_up()
      if self.prioritized:
        feeds.restore_priorities(client, ONLINE_TABLE, self.feed)
    return self.feed.train_step(agent) if self.prioritized else None

  def collector_kwargs(self, max_priority: per.MaxPriority) -> dict:
    del max_priority
    return dict(EPISODE_ITEMS)

  def ready(self, collector: collect.Collector) -> bool:
    del collector
    self.follower.poll()
    return int(self.follower.memory.num_transitions) > 0

  def source(self) -> Any:
    return self.feed

  def checkpoint(self) -> None:
    if self.prioritized:
      feeds.write_priorities(self._client, ONLINE_TABLE, self.feed)


def _update_goal_normalizer(normalizer: her.GoalNormalizer,
                            episodes: list[Any]) -> None:
  """Observations and both goals of stored episodes (converted steps)."""
  for episode in episodes:
    observation = episode.observation
    normalizer.update(observation[her.OBSERVATION],
                      np.concatenate([observation[her.DESIRED_GOAL],
                                      observation[her.ACHIEVED_GOAL]]))


def train_online(config: OnlineConfig, *, show_progress: bool = True,
                 on_eval: Callable[[dict], None] | None = None) -> dict:
  """Trains `config.agent` online in `config.env`; resumes from root_dir.

  Returns:
    The last evaluation record (average return, normalised score, steps).
  """
  _check(config)
  tf.random.set_seed(config.seed)
  specs = envs.env_specs(config.env)
  check_agent_fits_env(config.agent, specs)
  check_her_fits_env(config, specs)
  goal = specs.goal_conditioned
  per_config = per_config_for(config)
  data_spec = trajectory_spec(specs)
  os.makedirs(config.root_dir, exist_ok=True)
  replay = (_MemoryReplay if config.feed == 'memory' else _StreamReplay)(
      config, specs, data_spec, per_config)
  server = tables.start_server(
      replay.tables(),
      checkpoint_dir=os.path.join(config.root_dir, REVERB_CHECKPOINTS))
  address = f'localhost:{server.port}'
  collector = None
  reward_env = envs.make_env(config.env) if goal else None
  try:
    client = server.localhost_client()
    agent = agents.make_agent(config.agent, specs.time_step_spec,
                              specs.action_spec, config.agent_config)
    max_priority = per.MaxPriority()
    normalizer = (her.GoalNormalizer(*specs.goal_sizes)
                  if goal and config.her_normalize else None)
    extra_state = {'normalizer': normalizer} if normalizer is not None else {}
    # The train step is made before the restore, the memory filled after.
    learner = loop.Learner(agent, config.root_dir,
                           max_priority=max_priority.variable, **extra_state)
    resumed = learner.restore()
    train_step_fn = replay.start(address, client, agent, max_priority,
                                 normalizer, reward_env, resumed)
    if train_step_fn is not None:
      learner.set_train_step(train_step_fn)
    start = int(learner.env_steps.numpy())
    flatten = her.ObservationFlattener(normalizer) if goal else None
    # A resumed run reseeds from its step count: it does not replay the
    # episodes it already collected.
    collector = collect.Collector(
        config.env, client, ONLINE_TABLE,
        seed=config.seed * 1_000_003 + start,
        **replay.collector_kwargs(max_priority))
    policy = export_policy(agent, config.agent, specs)
    greedy = (policy.greedy if flatten is None else
              lambda obs: policy.greedy(flatten(obs)))
    record = {}
    how = (f'HER {config.her_config.strategy} k={config.her_config.k:g}'
           if goal else f'{config.replay} replay')
    title = f'{config.agent} online, {how}, {config.env}, seed {config.seed}'
    metric = 'success_rate' if goal else 'average_return'
    with tqdm.tqdm(total=config.env_steps, initial=start, unit='env step',
                   desc=f'{config.agent} {config.env}', smoothing=0.05,
                   disable=not show_progress) as bar:
      if resumed:
        bar.write(f'resumed at {start} env steps, {learner.train_step} '
                  'gradient steps')
      while int(learner.env_steps.numpy()) < config.env_steps:
        steps_before = int(learner.env_steps.numpy())
        act = explore_act(policy, config, specs, steps_before, flatten)
        returns = collector.collect(config.train_every, act)
        learner.env_steps.assign_add(config.train_every)
        env_steps = int(learner.env_steps.numpy())
        if (env_steps >= config.initial_collect_steps
            and replay.ready(collector)):
          learner.train(replay.source(), int(config.train_every * config.utd))
          sync_policy(policy, agent, config.agent)
          if flatten is not None:
            flatten.refresh()
        if returns:
          successes = collector.stats.last_successes
          learner.write_scalars(
              {'return': float(np.mean(returns)),
               'success_rate': (float(np.mean(successes)) if successes
                                else None)}, env_steps, 'collect')
          bar.set_postfix(ret=f'{np.mean(returns):.0f}',
                          grad_steps=learner.train_step)
        bar.update(env_steps - steps_before)
        if crossed(steps_before, env_steps, config.eval_interval):
          result = evaluation.evaluate(greedy, config.env,
                                       config.eval_episodes,
                                       seed=10_000 + config.seed)
          record = learner.log_eval(result.to_dict(), x='env_steps',
                                    title=title, y=metric)
          success = ('' if result.success_rate is None else
                     f', success rate {result.success_rate:.2f}')
          bar.write(f'eval at {env_steps} env steps: return '
                    f'{result.average_return:.1f} +- {result.std_return:.1f}'
                    f'{success}')
          if on_eval is not None:
            on_eval(record)
        if config.snapshot_interval and crossed(
            steps_before, env_steps, config.snapshot_interval):
          snapshot = her.with_normalizer(export_policy(
              agent, config.agent, specs, env_steps=env_steps,
              train_step=learner.train_step, seed=config.seed,
              eval=record if record.get('env_steps') == env_steps else None),
                                         normalizer)
          snapshot.save(os.path.join(config.root_dir, POLICY_SNAPSHOTS,
                                     f'step_{env_steps:08d}.npz'))
        if (crossed(steps_before, env_steps, config.checkpoint_interval)
            or env_steps >= config.env_steps):
          learner.save()
          replay.checkpoint()
          tables.checkpoint(client)
    her.with_normalizer(export_policy(
        agent, config.agent, specs, env_steps=config.env_steps,
        seed=config.seed), normalizer).save(
            os.path.join(config.root_dir, 'policy.npz'))
    return record
  finally:
    if collector is not None:
      collector.close()
    if reward_env is not None:
      reward_env.close()
    server.stop()


def _dataset(config: OnlineConfig, address: str, data_spec: Any,
             reward_env: Any, normalizer: her.GoalNormalizer | None
             ) -> tf.data.Dataset:
  """The learner's batches: relabelled (goal envs) or plain transitions."""
  if reward_env is not None:
    return her.dataset(address, ONLINE_TABLE, data_spec, config.batch_size,
                       her.reward_fn_for(reward_env),
                       config=config.her_config,
                       terminated_fn=her.terminated_fn_for(reward_env),
                       normalizer=normalizer)
  return sampling.transition_dataset(
      address, ONLINE_TABLE, data_spec, config.batch_size,
      with_info=config.replay == 'prioritized')


def episode_capacity(config: OnlineConfig, specs: envs.EnvSpecs) -> int:
  """Episodes an episode table keeps for `replay_size` transitions."""
  return max(1, config.replay_size // (specs.max_episode_steps or 1000))


def crossed(before: int, after: int, interval: int) -> bool:
  """Whether a multiple of `interval` lies in (before, after]."""
  return after // interval > before // interval
