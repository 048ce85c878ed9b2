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

import numpy as np
import tensorflow as tf

EPSILON = 1e-8


class RunningMeanStd:
  """Mean and variance of a stream of batches (Chan et al.'s merge)."""

  def __init__(self, shape: tuple[int, ...] = ()):
    self.mean = np.zeros(shape, np.float64)
    self.var = np.ones(shape, np.float64)
    self.count = 1e-4  # Baselines' start: the first batch dominates at once.

  def update(self, batch: np.ndarray) -> None:
    """Adds a batch [B, *shape] of samples."""
    batch = np.asarray(batch, np.float64)
    n = batch.shape[0]
    if n == 0:
      return
    mean, var = batch.mean(axis=0), batch.var(axis=0)
    total = self.count + n
    delta = mean - self.mean
    self.mean = self.mean + delta * n / total
    self.var = (self.var * self.count + var * n +
                delta**2 * self.count * n / total) / total
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
    self.running_return = np.zeros(num_envs, np.float64)
    self.gamma, self.clip = float(gamma), float(clip)

  def __call__(self, rewards: np.ndarray, ended: np.ndarray) -> np.ndarray:
    """Scaled float64 rewards [N] of one vector step; clipped to +-clip
    when clip > 0."""
    rewards = np.asarray(rewards, np.float64)
    self.running_return = self.running_return * self.gamma + rewards
    self.returns.update(self.running_return)
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

  def save(self) -> None:
    """Copies the statistics into `variables` (before a checkpoint)."""
    v = self.variables
    v.obs_mean.assign(self.observations.mean)
    v.obs_var.assign(self.observations.var)
    v.obs_count.assign(self.observations.count)
    v.ret_mean.assign(self.returns.mean)
    v.ret_var.assign(self.returns.var)
    v.ret_count.assign(self.returns.count)

  def load(self) -> None:
    """Takes the statistics from `variables` (after a restore)."""
    v = self.variables
    self.observations.mean = v.obs_mean.numpy()
    self.observations.var = v.obs_var.numpy()
    self.observations.count = float(v.obs_count.numpy())
    self.returns.mean = v.ret_mean.numpy()
    self.returns.var = v.ret_var.numpy()
    self.returns.count = float(v.ret_count.numpy())
