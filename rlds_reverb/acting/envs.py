"""Gymnasium environments: making them, TF-Agents specs, the D4RL score scale.

Nothing here steps a TF-Agents environment (acting is numpy, see
`numpy_policy` and `rollout`), but TF-Agents agents are built from specs;
these come from the gymnasium spaces: float32 observations and Box actions,
as the agents compute, and int64 actions for Discrete spaces (DQN).
"""

from __future__ import annotations

import dataclasses
import warnings

import gymnasium as gym
import numpy as np
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from rlds_reverb.acting import atari
from rlds_reverb.replay import her
from rlds_reverb.replay import memory

# D4RL's reference returns (d4rl/infos.py): a random and an expert policy.
D4RL_REFERENCE = {
    'halfcheetah': (-280.178953, 12135.0),
    'hopper': (-20.272305, 3234.3),
    'walker2d': (1.629008, 4592.3),
    'ant': (-325.6, 3879.7),
}


@dataclasses.dataclass(frozen=True)
class EnvSpecs:
  """What an agent is built from, and what data must match."""
  env_id: str
  observation_shape: tuple[int, ...]
  action_low: np.ndarray
  action_high: np.ndarray
  time_step_spec: ts.TimeStep
  action_spec: tensor_spec.BoundedTensorSpec
  # Goal envs (dict observations): (observation size, goal size); the
  # agent's observation is their concatenation (`her`).
  goal_sizes: tuple[int, int] | None = None
  max_episode_steps: int | None = None
  # Image observations: the agent sees stacks of this many frames
  # (`time_step_spec`), the data holds one frame per step
  # (`observation_shape`).
  frame_stack: int = 1

  @property
  def discrete(self) -> bool:
    return not self.action_spec.dtype.is_floating

  @property
  def goal_conditioned(self) -> bool:
    return self.goal_sizes is not None

  @property
  def image(self) -> bool:
    """Observations are uint8 frames."""
    return self.time_step_spec.observation.dtype == tf.uint8


# Frames per stack where a run does not say (the Nature DQN's 4).
DEFAULT_FRAME_STACK = 4


def _agent_observation_spec(env_id: str, obs_space: gym.spaces.Box,
                            frame_stack: int) -> tuple[tf.TensorSpec, int]:
  """The agent's observation spec and the frames per stack (0: default)."""
  image = obs_space.dtype == np.uint8 and len(obs_space.shape) in (2, 3)
  if not image:
    if frame_stack > 1:
      raise ValueError(f'env {env_id!r}: frame_stack {frame_stack} needs '
                       'image observations (uint8 [H, W] or [H, W, C]), got '
                       f'{obs_space}')
    return tf.TensorSpec(obs_space.shape, tf.float32,
                         name='observation'), 1
  frame_stack = frame_stack or DEFAULT_FRAME_STACK
  shape = memory.stacked_shape(obs_space.shape, frame_stack)
  return tf.TensorSpec(shape, tf.uint8, name='observation'), frame_stack


# CartPole with its velocities hidden (cart position and pole angle only):
# a policy must remember the last observations to act, the recurrent
# policies' test bed (sb3-contrib's CartPoleNoVel).
PARTIAL_CARTPOLE = 'CartPoleNoVelocity-v1'


class HideVelocities(gym.ObservationWrapper):
  """CartPole's observation without the cart's and the pole's velocities."""

  _KEPT = np.array([0, 2])

  def __init__(self, env: gym.Env):
    super().__init__(env)
    space = env.observation_space
    self.observation_space = gym.spaces.Box(
        space.low[self._KEPT], space.high[self._KEPT], dtype=space.dtype)

  def observation(self, observation: np.ndarray) -> np.ndarray:
    return observation[self._KEPT]


def make_partial_cartpole(**kwargs) -> gym.Env:
  """The entry point of PARTIAL_CARTPOLE."""
  from gymnasium.envs.classic_control import cartpole  # pylint: disable=g-import-not-at-top
  return HideVelocities(cartpole.CartPoleEnv(**kwargs))


if PARTIAL_CARTPOLE not in gym.registry:
  gym.register(id=PARTIAL_CARTPOLE,
               entry_point='rlds_reverb.acting.envs:make_partial_cartpole',
               max_episode_steps=500, reward_threshold=475.0)


def register_robotics_envs(env_id: str) -> None:
  """Registers Gymnasium-Robotics (Fetch...) on first use of one of its ids."""
  if env_id in gym.registry:
    return
  try:
    with warnings.catch_warnings():
      warnings.simplefilter('ignore')  # its import warns about Adroit envs
      import gymnasium_robotics  # pylint: disable=g-import-not-at-top
  except ImportError:
    return
  gym.register_envs(gymnasium_robotics)


def make_env(env_id: str, **kwargs) -> gym.Env:
  """gym.make with a one-line error for unknown or broken env ids.

  Atari ids (`ALE/...`, `...NoFrameskip-v4`) come preprocessed
  (`atari.make_atari`).
  """
  if atari.is_atari(env_id):
    return atari.make_atari(env_id, **kwargs)
  register_robotics_envs(env_id)
  try:
    return gym.make(env_id, **kwargs)
  except gym.error.Error as e:
    raise ValueError(f'cannot make env {env_id!r}: {e}') from None


GOAL_KEYS = her.GOAL_KEYS


def _goal_sizes(obs_space: gym.spaces.Dict, env_id: str) -> tuple[int, int]:
  missing = [k for k in GOAL_KEYS if k not in obs_space.spaces]
  shapes = {k: obs_space[k].shape for k in GOAL_KEYS if k not in missing}
  if missing or any(len(shape) != 1 for shape in shapes.values()):
    raise ValueError(
        f'env {env_id!r}: a dict observation space must hold the vectors '
        f'{", ".join(GOAL_KEYS)} (a goal env), got {obs_space}')
  if shapes['achieved_goal'] != shapes['desired_goal']:
    raise ValueError(f'env {env_id!r}: achieved_goal and desired_goal differ '
                     f'in shape: {obs_space}')
  return shapes['observation'][0], shapes['desired_goal'][0]


def env_specs(env_id: str, frame_stack: int = 0) -> EnvSpecs:
  """Reads an env's spaces into TF-Agents specs.

  A goal env (dict observation with observation / achieved_goal /
  desired_goal) gets the agent's view: one vector, observation + goal.
  Image frames (uint8) stay uint8 and the agent sees stacks of
  `frame_stack` of them (0: DEFAULT_FRAME_STACK for images, 1 otherwise).

  Raises:
    ValueError: unknown env, an observation space that is neither a Box nor
      a goal dict, or an action space that is neither a bounded Box nor
      Discrete.
  """
  env = make_env(env_id)
  try:
    obs_space, act_space = env.observation_space, env.action_space
    max_episode_steps = env.spec.max_episode_steps if env.spec else None
  finally:
    env.close()
  goal_sizes = None
  if isinstance(obs_space, gym.spaces.Dict):
    goal_sizes = _goal_sizes(obs_space, env_id)
    obs_space = gym.spaces.Box(-np.inf, np.inf, (sum(goal_sizes),))
  if not isinstance(obs_space, gym.spaces.Box):
    raise ValueError(f'env {env_id!r}: observation space must be a Box, got '
                     f'{obs_space}')
  # Image frames stay uint8 (the networks scale them); vectors are float32.
  obs_spec, frame_stack = _agent_observation_spec(env_id, obs_space,
                                                  frame_stack)
  if isinstance(act_space, gym.spaces.Discrete):
    low, high = int(act_space.start), int(act_space.start + act_space.n - 1)
    return EnvSpecs(
        env_id=env_id, observation_shape=tuple(obs_space.shape),
        action_low=np.asarray(low, np.int64),
        action_high=np.asarray(high, np.int64),
        time_step_spec=ts.time_step_spec(obs_spec),
        action_spec=tensor_spec.BoundedTensorSpec(
            (), tf.int64, minimum=low, maximum=high, name='action'),
        goal_sizes=goal_sizes, max_episode_steps=max_episode_steps,
        frame_stack=frame_stack)
  if not (isinstance(act_space, gym.spaces.Box) and
          np.all(np.isfinite(act_space.low)) and
          np.all(np.isfinite(act_space.high))):
    raise ValueError(f'env {env_id!r}: action space must be a bounded Box '
                     f'or Discrete, got {act_space}')
  action_spec = tensor_spec.BoundedTensorSpec(
      act_space.shape, tf.float32, minimum=act_space.low.astype(np.float32),
      maximum=act_space.high.astype(np.float32), name='action')
  return EnvSpecs(env_id=env_id, observation_shape=tuple(obs_space.shape),
                  action_low=act_space.low.astype(np.float32),
                  action_high=act_space.high.astype(np.float32),
                  time_step_spec=ts.time_step_spec(obs_spec),
                  action_spec=action_spec, goal_sizes=goal_sizes,
                  max_episode_steps=max_episode_steps,
                  frame_stack=frame_stack)


def reference_returns(env_id: str) -> tuple[float, float] | None:
  """D4RL's (random, expert) returns for the env's task, if D4RL has it."""
  task = env_id.split('-')[0].lower()
  return D4RL_REFERENCE.get(task)


def normalized_score(env_id: str, average_return: float) -> float | None:
  """D4RL's normalised score: 100 * (R - random) / (expert - random)."""
  reference = reference_returns(env_id)
  if reference is None:
    return None
  low, high = reference
  return 100.0 * (average_return - low) / (high - low)
