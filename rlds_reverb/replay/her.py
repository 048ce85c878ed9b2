"""Hindsight experience replay on Reverb: goals relabelled when sampled.

Goal-conditioned episodes (observation dicts with `observation`,
`achieved_goal`, `desired_goal`) are stored whole, one Reverb item per
episode (`push_rlds_to_table(..., sequence_length=None)`), at a priority
equal to their number of transitions in a table that samples by priority
with exponent 1: an episode is drawn in proportion to its transitions, and a
uniform step within it makes every stored transition equally likely, however
the episode lengths differ.

`dataset` turns those episodes into the batches TF-Agents' SAC/TD3 take
(`Trajectory` fields [B, 2, ...]), relabelling as rlkit's
`ObsDictRelabelingBuffer` and SB3's `HerReplayBuffer` do, at sample time:
with probability 1/(k+1) a transition keeps the goal it was collected with,
otherwise it gets a goal by `strategy`:
  future   the achieved goal after a uniformly drawn later step of the same
           episode (steps t+1..T for the transition t -> t+1)
  final    the achieved goal at the episode's last observation
  episode  the achieved goal after any step of the same episode
  random   the achieved goal after any step of any stored episode (another
           row of the same batch: each row is a fresh draw from the table)
Rewards of the whole batch are recomputed in one vectorised call of the
environment's function; the learner sees `concat(observation, goal)`.

This module's `dataset` is the streaming sampler (the pipelines relabel in
memory: `rlds_reverb.replay.hindsight`). Reverb's cost is per sampled item
(every column's chunk is unpacked), so each draw of `episodes_per_draw`
episodes is relabelled once, vectorised, into `batches_per_draw` batches: row
i of the draw's transitions comes from episode i mod E, so a batch of 256
from a draw of 64 episodes holds 4 transitions of each, and the default 8
batches per draw take 32 transitions of each episode over 8 consecutive
batches. SB3 draws an episode per transition; here Reverb fetches 32x fewer
items for 64 different episodes per batch (see bench/her.py for the trade).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, NamedTuple

import gin
import numpy as np
import reverb
import tensorflow as tf
import tree
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

from rlds_reverb import settings
from rlds_reverb.replay import per
from rlds_reverb.storage import tables

STRATEGIES = ('future', 'final', 'episode', 'random')
OBSERVATION, ACHIEVED_GOAL, DESIRED_GOAL = (
    'observation', 'achieved_goal', 'desired_goal')
GOAL_KEYS = (OBSERVATION, ACHIEVED_GOAL, DESIRED_GOAL)
_PREFETCH_BATCHES = 2


@gin.configurable
@dataclasses.dataclass(frozen=True)
class HerConfig:
  """How goals are relabelled; `k` relabelled per original (k=4: 80%).

  Bind any field from a gin file or `--gin_bindings` as `HerConfig.<field>`.
  """
  strategy: str = settings.setting('future', flag='her',
                                   choices=STRATEGIES, switch=True)
  """Hindsight relabelling with this goal strategy (giving it turns HER on;
  goal envs with dict observations, e.g. FetchReach-v4): future, an
  achieved goal of a later step of the same episode; final, its last one;
  episode, any of its steps; random, any stored episode. Episodes are
  stored whole; goals are relabelled when batches are sampled."""
  k: float = settings.setting(4.0, flag='k', lower=0)
  """Relabelled goals per original one: a transition keeps its own goal with
  probability 1/(k+1) (k=4, as the HER paper and OpenAI baselines use)."""
  episodes_per_draw: int = settings.setting(64, lower=1)
  """Episodes Reverb samples per draw. Each sampled episode gives
  batches_per_draw * batch_size / episodes_per_draw transitions, spread over
  the draw's batches: more episodes, less correlated batches."""
  batches_per_draw: int = settings.setting(8, lower=1)
  """Batches made, in one vectorised relabelling call, from one draw of
  episodes."""

  def __post_init__(self):
    if self.strategy not in STRATEGIES:
      raise ValueError(f'HER strategy must be one of {", ".join(STRATEGIES)}, '
                       f'got {self.strategy!r}')
    if not (isinstance(self.k, numbers.Real) and self.k >= 0):
      raise ValueError(f'HER k must be a number >= 0 (relabelled goals per '
                       f'original one), got {self.k!r}')
    for name in ('episodes_per_draw', 'batches_per_draw'):
      value = getattr(self, name)
      if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
          or value < 1):
        raise ValueError(f'{name} must be a positive integer, got {value!r}')

  @property
  def relabel_probability(self) -> float:
    return self.k / (self.k + 1.0)


class GoalTransitions(NamedTuple):
  """What a reward function is given: one batch, goals already relabelled.

  Both observation dicts carry the new goal as `desired_goal`.
  """
  observation: dict[str, np.ndarray]
  action: np.ndarray
  next_observation: dict[str, np.ndarray]


RewardFn = Callable[[GoalTransitions], np.ndarray]
TerminatedFn = Callable[[np.ndarray, np.ndarray], np.ndarray]


def from_compute_reward(compute_reward: Callable[..., Any]) -> RewardFn:
  """Gymnasium-Robotics GoalEnv: `compute_reward(achieved, desired, info)`,
  vectorised over the leading axis; reward of the achieved goal *after* the
  step, as the env computes it in `step`."""
  def reward(batch: GoalTransitions) -> np.ndarray:
    return compute_reward(batch.next_observation[ACHIEVED_GOAL],
                          batch.next_observation[DESIRED_GOAL], {})
  return reward


def from_compute_rewards(compute_rewards: Callable[..., Any]) -> RewardFn:
  """multiworld MultitaskEnv: `compute_rewards(obs, action, next_obs)` on
  dicts of batched arrays."""
  def reward(batch: GoalTransitions) -> np.ndarray:
    return compute_rewards(batch.observation, batch.action,
                           batch.next_observation)
  return reward


def from_goal_function(fn: Callable[[np.ndarray, np.ndarray], Any]
                       ) -> RewardFn:
  """A plain `fn(achieved_goal, desired_goal) -> rewards`."""
  def reward(batch: GoalTransitions) -> np.ndarray:
    return fn(batch.next_observation[ACHIEVED_GOAL],
              batch.next_observation[DESIRED_GOAL])
  return reward


def reward_fn_for(source: Any) -> RewardFn:
  """The reward function of an env (either interface) or a plain function.

  An env (or its wrappers) with `compute_reward` is taken as a GoalEnv, one
  with `compute_rewards` as a MultitaskEnv; a callable without either as
  `fn(achieved_goal, desired_goal)`.
  """
  env = getattr(source, 'unwrapped', source)
  if hasattr(env, 'compute_reward'):
    return from_compute_reward(env.compute_reward)
  if hasattr(env, 'compute_rewards'):
    return from_compute_rewards(env.compute_rewards)
  if callable(source):
    return from_goal_function(source)
  raise ValueError(
      f'{source!r} has neither compute_reward(achieved_goal, desired_goal, '
      'info) (GoalEnv) nor compute_rewards(obs, action, next_obs) '
      '(MultitaskEnv), and is not a function (achieved_goal, desired_goal) '
      '-> reward')


def terminated_fn_for(env: Any) -> TerminatedFn | None:
  """A GoalEnv's `compute_terminated(achieved, desired, info)`, if it has one.

  Where success ends an episode this makes a relabelled success terminal
  (discount 0); Fetch's is constant False, so its discounts stay 1.
  """
  env = getattr(env, 'unwrapped', env)
  compute_terminated = getattr(env, 'compute_terminated', None)
  if compute_terminated is None:
    return None
  return lambda achieved, desired: compute_terminated(achieved, desired, {})


def transition_priority(steps: int) -> float:
  """Priority of an episode item of `steps` RLDS steps: its transitions."""
  return float(max(steps - 1, 0))


def make_table(name: str, data_spec: Any, *, max_episodes: int,
               min_episodes_to_sample: int = 1) -> reverb.Table:
  """A table of whole episodes, sampled in proportion to their transitions.

  Write with `push_rlds_to_table(..., sequence_length=None,
  priority_fn=transition_priority)`; an episode of one step (no transition)
  gets priority 0 and is never sampled. FIFO eviction.
  """
  return tables.make_table(name, data_spec, max_size=max_episodes,
                           sequence_length=None, sampler='prioritized',
                           alpha=1.0,
                           min_size_to_sample=min_episodes_to_sample)


def check_table(client: reverb.Client, table: str) -> None:
  """Fails unless `table` samples by priority with exponent 1.

  Raises:
    ValueError: a uniform (or other) sampler, or another exponent: episodes
      would not be drawn in proportion to their transitions.
  """
  alpha = per.sampler_alpha(client, table)
  if alpha is None or abs(alpha - 1.0) > 1e-9:
    kind = ('prioritized with alpha %g' % alpha if alpha is not None else
            tables.get_table_info(client, table).sampler_options.WhichOneof(
                'distribution'))
    raise ValueError(
        f'table {table!r} samples {kind}; the HER sampler needs episodes '
        'drawn in proportion to their transitions: a table from '
        'her.make_table (prioritized, alpha 1), written with '
        'priority_fn=her.transition_priority')


def check_goal_spec(data_spec: Any) -> None:
  """Raises ValueError unless the observation is a goal dict of vectors."""
  observation = getattr(data_spec, 'observation', None)
  if not isinstance(observation, dict) or any(
      key not in observation for key in GOAL_KEYS):
    raise ValueError(
        'HER needs dict observations with keys '
        f'{", ".join(GOAL_KEYS)}; the data has observation spec '
        f'{observation!r}')
  for key in GOAL_KEYS:
    if observation[key].shape.rank != 1:
      raise ValueError(f'observation[{key!r}] must be a vector, got shape '
                       f'{observation[key].shape}')
  if observation[ACHIEVED_GOAL].shape != observation[DESIRED_GOAL].shape:
    raise ValueError(
        'achieved_goal and desired_goal must have the same shape, got '
        f'{observation[ACHIEVED_GOAL].shape} and '
        f'{observation[DESIRED_GOAL].shape}')


def goal_observation_size(data_spec: Any) -> int:
  """Size of what the learner sees: observation and goal, concatenated."""
  observation = data_spec.observation
  return int(observation[OBSERVATION].shape[0] +
             observation[DESIRED_GOAL].shape[0])


def learner_spec(data_spec: Any) -> Any:
  """Spec of one transition step as `dataset` yields it (flat float32 obs)."""
  def as_float32(spec):
    return (tf.TensorSpec(spec.shape, tf.float32) if spec.dtype.is_floating
            else tf.TensorSpec(spec.shape, spec.dtype))
  flat_obs = tf.TensorSpec([goal_observation_size(data_spec)], tf.float32)
  return tree.map_structure(as_float32, data_spec)._replace(
      observation=flat_obs)


class GoalNormalizer(tf.Module):
  """Running mean/std of observations and goals, clipped as in HER.

  Inputs are clipped to +-`clip_observation` before the statistics, the
  normalised values to +-`clip_range`, the std floored at `eps` (OpenAI
  baselines' 200, 5 and 0.01). Sums are float64 variables, so the state
  checkpoints with the agent and the sampler's graph reads it live.
  """

  def __init__(self, observation_size: int, goal_size: int, *,
               clip_observation: float = 200.0, clip_range: float = 5.0,
               eps: float = 0.01, name: str = 'goal_normalizer'):
    super().__init__(name=name)
    self.clip_observation, self.clip_range, self.eps = (
        float(clip_observation), float(clip_range), float(eps))
    f64 = tf.float64
    self.count = tf.Variable(0.0, dtype=f64, trainable=False)
    self.observation_sum = tf.Variable(tf.zeros(observation_size, f64),
                                       trainable=False)
    self.observation_sumsq = tf.Variable(tf.zeros(observation_size, f64),
                                         trainable=False)
    self.goal_count = tf.Variable(0.0, dtype=f64, trainable=False)
    self.goal_sum = tf.Variable(tf.zeros(goal_size, f64), trainable=False)
    self.goal_sumsq = tf.Variable(tf.zeros(goal_size, f64), trainable=False)

  def update(self, observations: np.ndarray, goals: np.ndarray) -> None:
    """Adds a batch of observation vectors and a batch of goals."""
    obs = np.clip(np.asarray(observations, np.float64).reshape(
        -1, self.observation_sum.shape[0]), -self.clip_observation,
                  self.clip_observation)
    goal = np.clip(np.asarray(goals, np.float64).reshape(
        -1, self.goal_sum.shape[0]), -self.clip_observation,
                   self.clip_observation)
    self.count.assign_add(len(obs))
    self.observation_sum.assign_add(obs.sum(0))
    self.observation_sumsq.assign_add(np.square(obs).sum(0))
    self.goal_count.assign_add(len(goal))
    self.goal_sum.assign_add(goal.sum(0))
    self.goal_sumsq.assign_add(np.square(goal).sum(0))

  def _moments(self, total, total_sq, count):
    count = tf.maximum(count, 1.0)
    mean = total / count
    var = tf.maximum(total_sq / count - tf.square(mean), 0.0)
    std = tf.maximum(tf.sqrt(var), self.eps)
    return tf.cast(mean, tf.float32), tf.cast(std, tf.float32)

  def _apply(self, x, mean, std):
    x = tf.clip_by_value(tf.cast(x, tf.float32), -self.clip_observation,
                         self.clip_observation)
    return tf.clip_by_value((x - mean) / std, -self.clip_range,
                            self.clip_range)

  def __call__(self, observation: tf.Tensor, goal: tf.Tensor) -> tf.Tensor:
    """concat(normalised observation, normalised goal) on the last axis."""
    obs_mean, obs_std = self._moments(self.observation_sum,
                                      self.observation_sumsq, self.count)
    goal_mean, goal_std = self._moments(self.goal_sum, self.goal_sumsq,
                                        self.goal_count)
    return tf.concat([self._apply(observation, obs_mean, obs_std),
                      self._apply(goal, goal_mean, goal_std)], axis=-1)

  def statistics(self) -> tuple[np.ndarray, ...]:
    """(observation mean, std, goal mean, std) of now, as numpy."""
    return tuple(t.numpy() for t in (
        *self._moments(self.observation_sum, self.observation_sumsq,
                       self.count),
        *self._moments(self.goal_sum, self.goal_sumsq, self.goal_count)))

  def numpy_fn(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """The same map in numpy, with the statistics of now (for the actor)."""
    obs_mean, obs_std, goal_mean, goal_std = self.statistics()
    c, r = self.clip_observation, self.clip_range

    def normalize(observation, goal):
      return np.concatenate([
          np.clip((np.clip(observation, -c, c) - obs_mean) / obs_std, -r, r),
          np.clip((np.clip(goal, -c, c) - goal_mean) / goal_std, -r, r)],
                            axis=-1).astype(np.float32)
    return normalize


def with_normalizer(policy: Any, normalizer: GoalNormalizer | None) -> Any:
  """A saved policy that takes concat(observation, desired_goal) raw.

  The normaliser's statistics of now become the policy's obs_mean/obs_std
  and its clip range obs_clip (the +-200 input clip is left out: Fetch
  observations never come near it).
  """
  if normalizer is None:
    return policy
  obs_mean, obs_std, goal_mean, goal_std = normalizer.statistics()
  policy.obs_mean = np.concatenate([obs_mean, goal_mean])
  policy.obs_std = np.concatenate([obs_std, goal_std])
  policy.obs_clip = normalizer.clip_range
  policy.metadata = {**policy.metadata,
                     'observation': 'concat(observation, desired_goal)'}
  return policy


class ObservationFlattener:
  """The actor's view of an env's observation dicts; `refresh` after the
  normaliser changes (the statistics are frozen in between, cheaply)."""

  def __init__(self, normalizer: GoalNormalizer | None = None):
    self._normalizer = normalizer
    self._normalize = None
    self.refresh()

  def refresh(self) -> None:
    if self._normalizer is not None:
      self._normalize = self._normalizer.numpy_fn()

  def __call__(self, observation: dict[str, np.ndarray]) -> np.ndarray:
    if self._normalize is not None:
      return self._normalize(observation[OBSERVATION],
                             observation[DESIRED_GOAL])
    return np.concatenate([observation[OBSERVATION],
                           observation[DESIRED_GOAL]], axis=-1).astype(
                               np.float32)


def update_normalizer(normalizer: GoalNormalizer, episodes: list[Any]) -> None:
  """Adds episodes' observations, and both their desired and achieved goals
  (the goals relabelling will use), to the statistics. An episode is RLDS
  steps (a dict) or converted trajectories (a `Trajectory`)."""
  for steps in episodes:
    observation = (steps['observation'] if isinstance(steps, dict)
                   else steps.observation)
    normalizer.update(observation[OBSERVATION],
                      np.concatenate([observation[DESIRED_GOAL],
                                      observation[ACHIEVED_GOAL]]))


def _call_reward(reward_fn: RewardFn, terminated_fn: TerminatedFn | None,
                 keys: list[str], batch_size: int):
  """The numpy side of the one reward call per batch."""
  n = len(keys)

  def call(*arrays):
    obs = dict(zip(keys, arrays[:n]))
    next_obs = dict(zip(keys, arrays[n:2 * n]))
    action, goal = arrays[2 * n], arrays[2 * n + 1]
    obs[DESIRED_GOAL] = goal
    next_obs[DESIRED_GOAL] = goal
    rewards = np.asarray(
        reward_fn(GoalTransitions(obs, action, next_obs)), np.float32)
    if rewards.shape != (batch_size,):
      raise ValueError(
          f'the reward function returned shape {rewards.shape} for a batch of '
          f'{batch_size} transitions: it must be vectorised over the leading '
          f'axis and return one reward per transition')
    if terminated_fn is None:
      terminated = np.zeros(batch_size, bool)
    else:
      terminated = np.broadcast_to(np.asarray(terminated_fn(
          next_obs[ACHIEVED_GOAL], goal), bool), (batch_size,))
    return rewards, np.array(terminated)
  return call


def goal_batch(cur: Any, nxt: Any, goal: tf.Tensor, relabelled: tf.Tensor,
               batch_size: int, reward_fn: RewardFn,
               terminated_fn: TerminatedFn | None = None,
               normalizer: GoalNormalizer | None = None) -> Any:
  """The learner's batch of transitions cur -> nxt pursuing `goal`.

  Shared by every sampler that picks its own rows and goals: rewards of the
  whole batch come from one vectorised call, and replace the stored ones
  (discounts too, with `terminated_fn`) only where `relabelled`.

  Args:
    cur, nxt: `Trajectory` steps [B, ...] (dict observation) of each
      transition's start and end.
    goal: [B, goal] float32, the goal each transition pursues.
    relabelled: [B] bool, where `goal` is not the stored desired goal.
    batch_size: B, as a Python int (the reward call checks it).
    reward_fn, terminated_fn, normalizer: see `relabel`.

  Returns:
    A `Trajectory` of [B, 2, ...] fields, observation = concat(obs, goal)
    (or the normaliser's), floats float32.
  """
  keys = sorted(cur.observation)
  call = _call_reward(reward_fn, terminated_fn, keys, batch_size)
  inputs = ([cur.observation[k] for k in keys] +
            [nxt.observation[k] for k in keys] + [cur.action, goal])
  new_reward, terminated = tf.numpy_function(
      call, inputs, [tf.float32, tf.bool], stateful=False)
  new_reward = tf.ensure_shape(new_reward, [batch_size])
  terminated = tf.ensure_shape(terminated, [batch_size])
  reward = tf.where(relabelled, new_reward, tf.cast(cur.reward, tf.float32))
  discount = tf.cast(cur.discount, tf.float32)
  if terminated_fn is not None:
    discount = tf.where(relabelled, 1.0 - tf.cast(terminated, tf.float32),
                        discount)

  def flat(observation):
    if normalizer is not None:
      return normalizer(observation[OBSERVATION], goal)
    return tf.concat([tf.cast(observation[OBSERVATION], tf.float32), goal],
                     axis=-1)

  def pair(a, b):
    if a.dtype.is_floating:
      a, b = tf.cast(a, tf.float32), tf.cast(b, tf.float32)
    return tf.stack([a, b], axis=1)

  cur = cur._replace(observation=flat(cur.observation), reward=reward,
                     discount=discount)
  nxt = nxt._replace(observation=flat(nxt.observation),
                     reward=tf.cast(nxt.reward, tf.float32),
                     discount=tf.cast(nxt.discount, tf.float32))
  return tf.nest.map_structure(pair, cur, nxt)


def relabel(episodes: Any, lengths: tf.Tensor, batch_size: int,
            config: HerConfig, reward_fn: RewardFn,
            terminated_fn: TerminatedFn | None = None,
            normalizer: GoalNormalizer | None = None,
            with_info: bool = False) -> Any:
  """B relabelled transitions from a padded batch of E episodes.

  Args:
    episodes: `Trajectory` of [E, L, ...] fields (padded), dict observation.
    lengths: [E] RLDS steps of each episode (transitions + 1).
    batch_size: transitions B to draw; row i comes from episode i % E.
    config: strategy and k.
    reward_fn: recomputes the batch's rewards in one call.
    terminated_fn: where success is terminal, (achieved, goal) -> terminal;
      None keeps the stored discounts (only true terminals are 0, timeouts
      never are).
    normalizer: optional; the learner's observation is then normalised.
    with_info: also return a dict of the draw (episode row, step, goal
      step, goal row, relabelled) for tests and diagnostics.

  Returns:
    A `Trajectory` of [B, 2, ...] fields, observation = concat(obs, goal).
  """
  num_episodes = tf.shape(lengths)[0]
  rows = tf.range(batch_size) % num_episodes
  transitions = tf.gather(lengths, rows) - 1  # T_i >= 1 for sampled rows.
  t_float = tf.cast(transitions, tf.float32)

  def uniform_below(n):  # integers in [0, n) for float n >= 1
    draw = tf.floor(tf.random.uniform([batch_size]) * n)
    return tf.minimum(tf.cast(draw, tf.int32), tf.cast(n, tf.int32) - 1)

  step = tf.maximum(uniform_below(t_float), 0)
  relabelled = tf.random.uniform([batch_size]) < config.relabel_probability
  goal_row = rows
  if config.strategy == 'future':  # achieved goal at t+1..T
    goal_step = step + 1 + uniform_below(t_float - tf.cast(step, tf.float32))
  elif config.strategy == 'final':
    goal_step = transitions
  elif config.strategy == 'episode':  # after any step: 1..T
    goal_step = 1 + uniform_below(t_float)
  else:  # random: any row of the batch, i.e. a fresh draw from the table
    goal_row = tf.random.uniform([batch_size], 0, num_episodes, tf.int32)
    goal_step = 1 + uniform_below(
        tf.cast(tf.gather(lengths, goal_row) - 1, tf.float32))

  cur_index = tf.stack([rows, step], axis=1)
  next_index = tf.stack([rows, step + 1], axis=1)
  cur = tf.nest.map_structure(lambda x: tf.gather_nd(x, cur_index), episodes)
  nxt = tf.nest.map_structure(lambda x: tf.gather_nd(x, next_index), episodes)
  nxt_achieved = tf.cast(nxt.observation[ACHIEVED_GOAL], tf.float32)
  achieved = episodes.observation[ACHIEVED_GOAL]
  new_goal = tf.gather_nd(achieved, tf.stack([goal_row, goal_step], axis=1))
  goal = tf.where(relabelled[:, None], new_goal,
                  cur.observation[DESIRED_GOAL])
  goal = tf.cast(goal, tf.float32)

  batch = goal_batch(cur, nxt, goal, relabelled, batch_size, reward_fn,
                     terminated_fn, normalizer)
  if not with_info:
    return batch
  return batch, {'episode_row': rows, 'step': step, 'goal_row': goal_row,
                 'goal_step': goal_step, 'relabelled': relabelled,
                 'goal': goal,
                 'next_achieved_goal': nxt_achieved}


def dataset(server_address: str, table: str, data_spec: Any, batch_size: int,
            reward_fn: RewardFn, *, config: HerConfig = HerConfig(),
            terminated_fn: TerminatedFn | None = None,
            normalizer: GoalNormalizer | None = None,
            rate_limiter_timeout_ms: int = -1, validate: bool = True,
            with_info: bool = False) -> tf.data.Dataset:
  """Endless batches of relabelled transitions from a table of episodes.

  Args:
    server_address: 'host:port' of the Reverb server.
    table: a table of whole goal-conditioned episodes (`make_table`).
    data_spec: per-step `Trajectory` spec of the stored episodes (dict
      observation), e.g. `create_trajectory_data_spec(rlds_data)`.
    batch_size: transitions per batch.
    reward_fn: `reward_fn_for(env)` (either interface) or your own.
    config: strategy, k, episodes per batch.
    terminated_fn: see `relabel`; `terminated_fn_for(env)`.
    normalizer: optional running normalisation of observation and goal.
    rate_limiter_timeout_ms: how long to wait for the table's minimum size;
      -1 waits for ever.
    validate: check the table (exists, signature, sampler) now.
    with_info: yield `(batch, draw info)` (see `relabel`).

  Returns:
    A dataset of `Trajectory` batches, fields [batch_size, 2, ...],
    observation [batch_size, 2, obs + goal] float32; the spec of one step is
    `learner_spec(data_spec)`.

  Raises:
    ValueError: bad arguments, a non-goal observation spec, or (with
      `validate`) a missing table, another signature, or a table that does
      not sample by transitions (`check_table`).
  """
  check_goal_spec(data_spec)
  if isinstance(batch_size, bool) or not isinstance(
      batch_size, numbers.Integral) or batch_size < 1:
    raise ValueError(f'batch_size must be a positive integer, got '
                     f'{batch_size!r}')
  batch_size = int(batch_size)
  if validate:
    client = tables.connect(server_address)
    tables.check_signature(client, table, data_spec)
    check_table(client, table)
  dtypes = tree.map_structure(lambda s: tf.as_dtype(s.dtype), data_spec)
  shapes = tree.map_structure(
      lambda s: tf.TensorShape([None]).concatenate(s.shape), data_spec)
  samples = reverb.TrajectoryDataset(
      server_address, table, dtypes, shapes,
      max_in_flight_samples_per_worker=2 * config.episodes_per_draw,
      num_workers_per_iterator=1,
      rate_limiter_timeout_ms=int(rate_limiter_timeout_ms))
  episodes = samples.map(
      lambda sample: (sample.data, tf.shape(sample.data.step_type)[0]))
  episodes = episodes.padded_batch(config.episodes_per_draw,
                                   drop_remainder=True)
  draws = config.batches_per_draw

  def relabel_draw(data, lengths):
    """One vectorised relabelling for the whole draw, cut into batches."""
    out = relabel(data, lengths, draws * batch_size, config, reward_fn,
                  terminated_fn, normalizer, with_info)
    return tf.nest.map_structure(
        lambda x: tf.reshape(x, [draws, batch_size] + x.shape[1:].as_list()),
        out)

  def one_element(*parts):  # (batch,) or (batch, info)
    return parts if len(parts) > 1 else parts[0]

  batches = episodes.map(relabel_draw)
  if draws > 1:
    batches = batches.flat_map(
        lambda *x: tf.data.Dataset.from_tensor_slices(one_element(*x)))
  else:
    batches = batches.map(lambda *x: tf.nest.map_structure(
        lambda t: t[0], one_element(*x)))
  options = tf.data.Options()
  options.deterministic = False
  return batches.prefetch(_PREFETCH_BATCHES).with_options(options)


def goal_data_spec(observation_size: int, goal_size: int,
                   action_spec: tf.TensorSpec) -> trajectory_lib.Trajectory:
  """Per-step spec of what the collector writes for a goal env (float32)."""
  obs = {OBSERVATION: tf.TensorSpec([observation_size], tf.float32),
         ACHIEVED_GOAL: tf.TensorSpec([goal_size], tf.float32),
         DESIRED_GOAL: tf.TensorSpec([goal_size], tf.float32)}
  step_spec = ts.time_step_spec(obs, tf.TensorSpec((), tf.float32))
  action = policy_step.PolicyStep(
      tf.TensorSpec(action_spec.shape, action_spec.dtype))
  return trajectory_lib.from_transition(step_spec, action, step_spec)
