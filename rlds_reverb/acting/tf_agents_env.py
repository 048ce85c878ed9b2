"""A gymnasium env as a TF-Agents `PyEnvironment`.

TF-Agents' `suite_gym` wraps the old gym API (reset -> obs, step -> 4
values); the toolkit's envs are gymnasium 1.x. `GymnasiumEnvironment` gives
TF-Agents' drivers, `tf_agents.train.Actor` and `TFPyEnvironment` a
gymnasium env with float32 observations (what the agents and the episode
tables hold) and the time-limit contract: a termination ends the episode
with discount 0, a truncation with discount 1 (the bootstrap goes on).
"""

from __future__ import annotations

from typing import Any, Optional

import gymnasium as gym
import numpy as np
from tf_agents.environments import py_environment
from tf_agents.specs import array_spec
from tf_agents.trajectories import time_step as ts

from rlds_reverb.acting import envs


def _float32(value: Any) -> Any:
  if isinstance(value, dict):
    return {k: _float32(v) for k, v in value.items()}
  value = np.asarray(value)
  return value.astype(np.float32) if value.dtype.kind == 'f' else value


def _observation_spec(space: gym.Space) -> Any:
  if isinstance(space, gym.spaces.Dict):
    return {k: _observation_spec(s) for k, s in space.spaces.items()}
  dtype = np.float32 if np.dtype(space.dtype).kind == 'f' else space.dtype
  return array_spec.ArraySpec(space.shape, dtype, 'observation')


class GymnasiumEnvironment(py_environment.PyEnvironment):
  """One gymnasium env (by id or instance) for TF-Agents."""

  def __init__(self, env: str | gym.Env, *, seed: Optional[int] = None):
    super().__init__(handle_auto_reset=True)
    self._env = envs.make_env(env) if isinstance(env, str) else env
    self._seed = seed
    space = self._env.action_space
    if isinstance(space, gym.spaces.Discrete):
      self._action_spec = array_spec.BoundedArraySpec(
          (), np.int64, int(space.start), int(space.start + space.n - 1),
          'action')
    else:
      self._action_spec = array_spec.BoundedArraySpec(
          space.shape, np.float32, space.low.astype(np.float32),
          space.high.astype(np.float32), 'action')
    self._observation_spec = _observation_spec(self._env.observation_space)

  @property
  def gym(self) -> gym.Env:
    return self._env

  def observation_spec(self) -> Any:
    return self._observation_spec

  def action_spec(self) -> Any:
    return self._action_spec

  def _reset(self) -> ts.TimeStep:
    observation, _ = self._env.reset(seed=self._seed)
    self._seed = None  # Seeded once; later resets continue its stream.
    return ts.restart(_float32(observation))

  def _step(self, action: Any) -> ts.TimeStep:
    observation, reward, terminated, truncated, _ = self._env.step(
        np.asarray(action))
    observation = _float32(observation)
    reward = np.float32(reward)
    if terminated:
      return ts.termination(observation, reward)
    if truncated:
      return ts.truncation(observation, reward)
    return ts.transition(observation, reward)

  def close(self) -> None:
    self._env.close()
