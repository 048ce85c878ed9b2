"""Running observation normalisation and reward scaling, as VecNormalize does.

Observations are normalised by the running mean and std of every
observation seen in collection, then clipped; rewards are divided by the
running std of the discounted return (not of the reward: the return is what
the critic fits), then clipped. Both update in numpy on the actor's side,
where the data arrives; `Normalization.variables` mirrors them into
`tf.Variable`s so they go into the run's checkpoint, and the observation
statistics go into the exported policy (its obs_mean, obs_std, obs_clip).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import tensorflow as tf

EPSILON = 1e-8


class RunningMeanStd:
  """Mean and variance of a stream of batches (Chan et al.'s merge)."""

  def __init__(self, shape: tuple[int, ...] = (), count: float = 1e-4):
    self.mean = np.zeros(shape, np.float64)
    self.var = np.ones(shape, np.float64)
    # Baselines' start, 1e-4: the first batch dominates at once. A tally of
    # what was added (count 0) starts empty.
    self.count = float(count)

  def update(self, batch: np.ndarray) -> None:
    """Adds a batch [B, *shape] of samples."""
    batch = np.asarray(batch, np.float64)
    if batch.shape[0]:
      self.merge(batch.mean(axis=0), batch.var(axis=0), batch.shape[0])

  def merge(self, mean: np.ndarray, var: np.ndarray, count: float) -> None:
    """Adds the moments of `count` samples kept elsewhere (an actor
    process's), as if they had been added one batch at a time."""
    if count <= 0:
      return
    total = self.count + count
    delta = np.asarray(mean, np.float64) - self.mean
    self.mean = self.mean + delta * count / total
    self.var = (self.var * self.count + np.asarray(var, np.float64) * count +
                delta**2 * self.count * count / total) / total
    self.count = total

  @property
  def std(self) -> np.ndarray:
    return np.sqrt(self.var + EPSILON)


class ReturnScaler:
  """Divides each step's rewards by the running std of the discounted
  return (VecNormalize's `ret_rms`): each env copy carries its return,
  restarted after its episode ends, and every step's N returns update the
  statistics before they scale that step."""

  def __init__(self, num_envs: int, gamma: float, clip: float = 0.0):
    self.returns = RunningMeanStd(())
    # What was added since the tally was last taken (`Normalization`).
    self.added = RunningMeanStd((), count=0.0)
    self.running_return = np.zeros(num_envs, np.float64)
    self.gamma, self.clip = float(gamma), float(clip)

  def __call__(self, rewards: np.ndarray, ended: np.ndarray) -> np.ndarray:
    """Scaled float64 rewards [N] of one vector step; clipped to +-clip
    when clip > 0."""
    rewards = np.asarray(rewards, np.float64)
    self.running_return = self.running_return * self.gamma + rewards
    self.returns.update(self.running_return)
    self.added.update(self.running_return)
    self.running_return[np.asarray(ended, bool)] = 0.0
    scaled = rewards / self.returns.std
    return np.clip(scaled, -self.clip, self.clip) if self.clip > 0 else scaled


class Normalization:
  """The run's observation statistics and reward scale, with their clips.

  `observation_clip` or `reward_clip` 0 turns that part off (the statistics
  are then neither kept nor applied).
  """

  def __init__(self, observation_shape: tuple[int, ...], num_envs: int, *,
               gamma: float, observation_clip: float = 10.0,
               reward_clip: float = 10.0):
    self.observation_clip = float(observation_clip)
    self.reward_clip = float(reward_clip)
    self.gamma = float(gamma)
    self.observations = RunningMeanStd(tuple(observation_shape))
    self._added_observations = RunningMeanStd(tuple(observation_shape),
                                              count=0.0)
    # GAIL freezes the statistics once its discriminator has warmed up
    # (the seed's `envs.venv.eval()`): its input space must hold still.
    self.update_observations = True
    self._return_scaler = ReturnScaler(num_envs, gamma, reward_clip)
    self.returns = self._return_scaler.returns
    # The checkpoint's mirror of the statistics (`save` / `load`).
    self.variables = tf.Module()
    with self.variables.name_scope:
      self.variables.obs_mean = tf.Variable(self.observations.mean)
      self.variables.obs_var = tf.Variable(self.observations.var)
      self.variables.obs_count = tf.Variable(self.observations.count,
                                             dtype=tf.float64)
      self.variables.ret_mean = tf.Variable(self.returns.mean)
      self.variables.ret_var = tf.Variable(self.returns.var)
      self.variables.ret_count = tf.Variable(self.returns.count,
                                             dtype=tf.float64)

  @property
  def normalizes_observations(self) -> bool:
    return self.observation_clip > 0

  @property
  def scales_rewards(self) -> bool:
    return self.reward_clip > 0

  def observation(self, observations: np.ndarray, *,
                  update: bool = False) -> np.ndarray:
    """Normalised, clipped float32 observations [B, ...]; `update` first
    adds them to the statistics (collection does, evaluation does not)."""
    observations = np.asarray(observations, np.float32)
    if not self.normalizes_observations:
      return observations
    if update and self.update_observations:
      self.observations.update(observations)
      self._added_observations.update(observations)
    normalised = (observations - self.observations.mean) / (
        self.observations.std)
    return np.clip(normalised, -self.observation_clip,
                   self.observation_clip).astype(np.float32)

  def reward(self, rewards: np.ndarray, ended: np.ndarray) -> np.ndarray:
    """Scaled, clipped float32 rewards [N] of one vector step; `ended`
    [N] restarts each finished copy's discounted return."""
    if not self.scales_rewards:
      return np.asarray(rewards, np.float32)
    return self._return_scaler(rewards, ended).astype(np.float32)

  def statistics(self) -> tuple[np.ndarray, np.ndarray] | None:
    """(obs_mean, obs_std) as float32 for an exported policy, or None."""
    if not self.normalizes_observations:
      return None
    return (self.observations.mean.astype(np.float32),
            self.observations.std.astype(np.float32))

  def state(self) -> dict[str, np.ndarray]:
    """The statistics as arrays: what a checkpoint keeps and what a
    learner publishes to its actor processes."""
    return _moments('obs', self.observations) | _moments('ret', self.returns)

  def set_state(self, state: Mapping[str, Any]) -> None:
    """Takes the statistics of `state` (from `state()`)."""
    for prefix, stats in (('obs', self.observations), ('ret', self.returns)):
      stats.mean = np.asarray(state[f'{prefix}_mean'], np.float64)
      stats.var = np.asarray(state[f'{prefix}_var'], np.float64)
      stats.count = float(np.asarray(state[f'{prefix}_count']))

  def take_added(self) -> dict[str, np.ndarray]:
    """The moments of the observations and returns added since the last
    call (same keys as `state()`), and starts a new tally: an actor
    process sends them with its rollout and the learner `merge`s them, so
    its statistics cover what every actor saw."""
    added = self._added_observations, self._return_scaler.added
    shapes = self.observations.mean.shape, ()
    self._added_observations = RunningMeanStd(shapes[0], count=0.0)
    self._return_scaler.added = RunningMeanStd(shapes[1], count=0.0)
    return _moments('obs', added[0]) | _moments('ret', added[1])

  def merge(self, added: Mapping[str, Any]) -> None:
    """Adds an actor's tally (`take_added`) to the statistics."""
    for prefix, stats in (('obs', self.observations), ('ret', self.returns)):
      stats.merge(added[f'{prefix}_mean'], added[f'{prefix}_var'],
                  float(np.asarray(added[f'{prefix}_count'])))

  def save(self) -> None:
    """Copies the statistics into `variables` (before a checkpoint)."""
    for name, value in self.state().items():
      getattr(self.variables, name).assign(value)

  def load(self) -> None:
    """Takes the statistics from `variables` (after a restore)."""
    self.set_state({name: getattr(self.variables, name).numpy()
                    for name in STATE_KEYS})


STATE_KEYS = tuple(f'{prefix}_{part}' for prefix in ('obs', 'ret')
                   for part in ('mean', 'var', 'count'))


def _moments(prefix: str, stats: RunningMeanStd) -> dict[str, np.ndarray]:
  return {f'{prefix}_mean': np.asarray(stats.mean, np.float64),
          f'{prefix}_var': np.asarray(stats.var, np.float64),
          f'{prefix}_count': np.asarray(stats.count, np.float64)}
