"""The rollout loop and the episode buffer that everything acting shares.

Recording (`rlds_reverb.data.recording`), online collection (`collect`) and
evaluation (`evaluation`) all step a gymnasium vector env with a batch
policy and keep finished episodes in RLDS layout. One episode of T env steps
is T + 1 RLDS steps:

  step t (0 <= t < T): o_t, a_t, r_t, discount 1.0
  step T (is_last):    o_T (the final observation), zero action and reward,
                       is_terminal = whether the env terminated

`is_first` is set on step 0 only and `is_last` on step T only; an episode
cut off by a time limit (truncated) is is_last without is_terminal.
Discount is 1.0 on every step, as in the D4RL datasets; consumers derive
terminal discounts from `is_terminal` (DESIGN.md). Dict observations (goal
envs) keep their keys. Step infos, where a caller keeps them, go under
`infos` as float64 (D4RL's): those of an action (its log-probability) are
zero on step T, those of an observation (a MuJoCo state) are on every step.

On an image env the policy sees each sub-env's last `frame_stack` frames
as one frame-major stack ([k, H, W] or [k, H, W, C]; a frame alone is a
stack of one), the first frame of an episode repeated before it, exactly
as the learner's memory stacks the stored frames (`replay.memory`); the
episodes keep one frame per step.

The vector env runs in gymnasium's NEXT_STEP autoreset mode: after a sub-env
reports `terminated or truncated`, its next `step` ignores the action and
returns the first observation of a new episode with reward 0. Those reset
steps are not transitions and are never kept.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import gymnasium as gym
import numpy as np
import tree

# observations [n, ...] (a dict of batches for goal envs)
#   -> (actions [n, ...], their log-probabilities [n] or None)
ActFn = Callable[[Any], tuple[np.ndarray, Optional[np.ndarray]]]
# Sub-env index -> infos of the observation that sub-env just returned.
ObservationInfosFn = Callable[[int], dict[str, np.ndarray]]
# The key of the action log-probabilities in `infos` (D4RL's name).
ACTION_LOG_PROBS = 'action_log_probs'


@dataclasses.dataclass(frozen=True)
class StepLayout:
  """Shapes and dtypes of the steps an `EpisodeBuffer` emits.

  Attributes:
    action_shape: shape of one action.
    action_dtype: dtype of `action`.
    observation_dtype: dtype of `observation` (of each key of a dict one).
  """

  action_shape: tuple[int, ...]
  action_dtype: np.dtype = np.dtype(np.float32)
  observation_dtype: np.dtype = np.dtype(np.float32)


def layout_of(envs: gym.vector.VectorEnv) -> StepLayout:
  """The agents' view of `envs`: float32 observations (uint8 image frames
  stay uint8), int64 actions for a Discrete action space and float32 ones
  otherwise."""
  space = envs.single_action_space
  discrete = isinstance(space, gym.spaces.Discrete)
  obs_space = envs.single_observation_space
  image = (isinstance(obs_space, gym.spaces.Box)
           and obs_space.dtype == np.uint8 and len(obs_space.shape) in (2, 3))
  return StepLayout(action_shape=tuple(space.shape),
                    action_dtype=np.dtype(np.int64 if discrete
                                          else np.float32),
                    observation_dtype=np.dtype(np.uint8 if image
                                               else np.float32))


class EpisodeBuffer:
  """Accumulates one episode's steps and emits them in RLDS layout."""

  def __init__(self, layout: StepLayout, first_observation: Any,
               observation_infos: dict[str, Any] | None = None):
    """Starts the episode at o_0 (and the infos of o_0, if kept)."""
    self._layout = layout
    self._observations = [first_observation]
    self._actions: list[Any] = []
    self._rewards: list[float] = []
    self._action_infos: list[dict[str, Any]] = []
    self._observation_infos = ([] if observation_infos is None
                               else [observation_infos])
    self.episode_return = 0.0

  @property
  def num_steps(self) -> int:
    """Env steps (transitions) so far."""
    return len(self._actions)

  def add(self, action: Any, reward: float, observation: Any, *,
          action_infos: dict[str, Any] | None = None,
          observation_infos: dict[str, Any] | None = None) -> None:
    """Adds a_t and r_t for the last observation, then o_{t+1}."""
    self._actions.append(action)
    self._rewards.append(reward)
    self.episode_return += reward
    self._observations.append(observation)
    if action_infos is not None:
      self._action_infos.append(action_infos)
    if observation_infos is not None:
      self._observation_infos.append(observation_infos)

  def finish(self, terminated: bool) -> dict[str, Any]:
    """Returns the RLDS steps; the last observation is the is_last step."""
    layout, n = self._layout, len(self._observations)
    steps = {
        'observation': tree.map_structure(
            lambda *steps: np.asarray(steps, dtype=layout.observation_dtype),
            *self._observations),
        'action': np.concatenate([
            np.asarray(self._actions, dtype=layout.action_dtype).reshape(
                (n - 1,) + layout.action_shape),
            np.zeros((1,) + layout.action_shape, dtype=layout.action_dtype)]),
        'reward': np.asarray(self._rewards + [0.0], dtype=np.float32),
        'discount': np.ones((n,), dtype=np.float32),
        'is_first': np.arange(n) == 0,
        'is_last': np.arange(n) == n - 1,
        'is_terminal': (np.arange(n) == n - 1) & bool(terminated),
    }
    infos = {}
    for key in (self._action_infos[0] if self._action_infos else ()):
      values = [np.asarray(i[key], np.float64) for i in self._action_infos]
      infos[key] = np.stack(values + [np.zeros_like(values[0])])
    for key in (self._observation_infos[0] if self._observation_infos
                else ()):
      infos[key] = np.asarray([i[key] for i in self._observation_infos],
                              dtype=np.float64)
    if infos:
      steps['infos'] = infos
    return steps


@dataclasses.dataclass(frozen=True)
class Episode:
  """A finished episode.

  Attributes:
    number: its place in the order episodes started (from 0 per `Rollout`).
    steps: its RLDS steps, T + 1 of each field.
    episode_return: the undiscounted return (a float64 sum of the rewards).
    terminated: ended by the env rather than cut off.
    success: info['is_success'] at the last step (goal envs), else None.
  """

  number: int
  steps: dict[str, Any]
  episode_return: float
  terminated: bool
  success: float | None = None

  @property
  def num_steps(self) -> int:
    """Env steps (transitions): one fewer than RLDS steps."""
    return len(self.steps['reward']) - 1


def is_frame_batch(observations: Any) -> bool:
  """A batch of image frames (uint8 [n, H, W] or [n, H, W, C])."""
  return (isinstance(observations, np.ndarray)
          and observations.dtype == np.uint8 and observations.ndim in (3, 4))


class FrameStacker:
  """Each sub-env's last `k` frames, stacked as the memory stacks them:
  frame-major, [k, H, W] or [k, H, W, C], oldest first."""

  def __init__(self, k: int, frames: np.ndarray):
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
      raise ValueError(f'frame_stack must be a positive integer, got {k!r}')
    frames = np.asarray(frames)
    if frames.ndim not in (3, 4):
      raise ValueError('frame stacking needs image observations [H, W] or '
                       f'[H, W, C] per sub-env, got a batch of shape '
                       f'{frames.shape}')
    self.k = int(k)
    self._stacks = np.repeat(frames[:, None], self.k, axis=1)  # [n, k, ...]

  def start(self, i: int, frame: np.ndarray) -> None:
    """Sub-env i starts an episode at `frame`: it fills the whole stack."""
    self._stacks[i] = frame[None]

  def push(self, frames: np.ndarray) -> None:
    """Every sub-env's newest frame goes on top of its stack."""
    self._stacks[:, :-1] = self._stacks[:, 1:]
    self._stacks[:, -1] = frames

  def stacks(self) -> np.ndarray:
    """[n, k, ...]: a copy, as the stacks change with the next push."""
    return self._stacks.copy()

  def peek(self, i: int, frame: np.ndarray) -> np.ndarray:
    """Sub-env i's stack were `frame` pushed (a truncated episode's real
    final observation), leaving the stacks as they are."""
    return np.concatenate([self._stacks[i, 1:], np.asarray(frame)[None]])


def _row(observations: Any, i: int) -> Any:
  """Sub-env i's observation (each field of a dict observation)."""
  return tree.map_structure(lambda x: x[i], observations)


class Rollout:
  """Steps a vector env with a batch policy, one episode buffer per sub-env.

  Episodes still running when a call returns carry over to the next call;
  finished ones go to the caller's `on_episode`. With `max_episodes`,
  sub-envs that would start an episode beyond it idle (they are stepped,
  nothing is kept), so the episodes kept are the first ones to start, not
  the first ones to finish (which would favour short episodes). With
  `max_env_steps`, a sub-env starts an episode only while the steps kept
  plus `episode_steps_bound` for each episode still running stay under
  it: whole episodes, at least `max_env_steps` steps once `done`, and
  exactly the episode count a step budget of whole time-limited episodes
  asks for (10 of 1,000 steps for 10,000), however many sub-envs run.
  """

  def __init__(self, envs: gym.vector.VectorEnv, layout: StepLayout, *,
               seed: int | list[int] | None = None,
               max_episodes: int | None = None,
               max_env_steps: int | None = None,
               episode_steps_bound: int = 1,
               keep_log_probs: bool = False,
               observation_infos: ObservationInfosFn | None = None,
               frame_stack: int = 1):
    """Resets `envs` and starts an episode in each sub-env.

    Args:
      envs: a vector env in NEXT_STEP autoreset mode.
      layout: dtypes and shapes of the emitted steps.
      seed: passed to `envs.reset` (an int gives sub-env i seed + i).
      max_episodes: start no more episodes than this; None for no limit.
      max_env_steps: start no episode once the steps kept plus
        `episode_steps_bound` per running episode reach this; None for no
        limit.
      episode_steps_bound: the most steps an episode can take (its time
        limit); what each running episode reserves of `max_env_steps`.
      keep_log_probs: keep the policy's log-probabilities as
        `infos/action_log_probs`.
      observation_infos: called with a sub-env's index after each of its
        observations; what it returns is kept under `infos`.
      frame_stack: the policy sees stacks of this many image frames
        (image envs only).
    """
    self._envs, self._layout = envs, layout
    self._max_episodes = max_episodes
    self._max_env_steps = max_env_steps
    self._episode_steps_bound = episode_steps_bound
    self._keep_log_probs = keep_log_probs
    self._observation_infos = observation_infos
    num_envs = envs.num_envs
    self._buffers: list[EpisodeBuffer | None] = [None] * num_envs
    self._numbers = [-1] * num_envs
    self.started = 0
    self.finished = 0
    self.env_steps = 0  # Kept env steps (transitions), idle sub-envs aside.
    self._obs, _ = envs.reset(seed=seed)
    self._stacker = (FrameStacker(frame_stack, self._obs)
                     if frame_stack != 1 or is_frame_batch(self._obs)
                     else None)
    for i in range(num_envs):
      self._start(i)
    self._resetting = np.zeros(num_envs, dtype=bool)

  def _infos_of_observation(self, i: int) -> dict[str, Any] | None:
    if self._observation_infos is None:
      return None
    return self._observation_infos(i)

  def _start(self, i: int) -> None:
    """Starts an episode at sub-env i's current observation, if allowed."""
    self._buffers[i] = None
    if self._stacker is not None:  # Idle or not, the policy acts on it.
      self._stacker.start(i, self._obs[i])
    if self._max_episodes is not None and self.started >= self._max_episodes:
      return
    if self._max_env_steps is not None and (
        self.env_steps + self.running * self._episode_steps_bound >=
        self._max_env_steps):
      return
    self._buffers[i] = EpisodeBuffer(self._layout, _row(self._obs, i),
                                     self._infos_of_observation(i))
    self._numbers[i] = self.started
    self.started += 1

  @property
  def running(self) -> int:
    """Episodes started and not yet finished."""
    return self.started - self.finished

  @property
  def done(self) -> bool:
    """No episode runs and none may start (`max_episodes` or
    `max_env_steps` reached); False without a limit."""
    if self.running:
      return False
    if self._max_episodes is not None and self.started >= self._max_episodes:
      return True
    return (self._max_env_steps is not None and
            self.env_steps >= self._max_env_steps)

  def step(self, act: ActFn, on_episode: Callable[[Episode], None]) -> int:
    """Steps every sub-env once; returns the env steps kept."""
    actions, log_probs = act(self._obs if self._stacker is None
                             else self._stacker.stacks())
    obs, rewards, terminated, truncated, infos = self._envs.step(actions)
    self._obs = obs
    if self._stacker is not None:
      self._stacker.push(obs)  # Sub-envs that reset refill theirs below.
    kept = 0
    for i in range(self._envs.num_envs):
      if self._resetting[i]:  # This step reset sub-env i; obs[i] starts one.
        self._start(i)
        continue
      buffer = self._buffers[i]
      if buffer is None:
        continue
      buffer.add(actions[i], float(rewards[i]), _row(obs, i),
                 action_infos=({ACTION_LOG_PROBS: float(log_probs[i])}
                               if self._keep_log_probs else None),
                 observation_infos=self._infos_of_observation(i))
      kept += 1
      self.env_steps += 1
      if terminated[i] or truncated[i]:
        self._buffers[i] = None
        self.finished += 1
        on_episode(Episode(
            number=self._numbers[i],
            steps=buffer.finish(bool(terminated[i])),
            episode_return=buffer.episode_return,
            terminated=bool(terminated[i]),
            success=(float(infos['is_success'][i]) if 'is_success' in infos
                     else None)))
    self._resetting = np.logical_or(terminated, truncated)
    return kept

  def run(self, act: ActFn, on_episode: Callable[[Episode], None], *,
          num_steps: int | None = None,
          num_episodes: int | None = None) -> int:
    """Steps until `num_steps` more env steps are kept, or until
    `num_episodes` episodes have finished since the reset; returns the env
    steps kept.

    Raises:
      ValueError: neither or both limits given, or `num_episodes` beyond
        `max_episodes` (the loop would never end).
    """
    if (num_steps is None) == (num_episodes is None):
      raise ValueError('give one of num_steps and num_episodes')
    if (num_episodes is not None and self._max_episodes is not None and
        num_episodes > self._max_episodes):
      raise ValueError(f'num_episodes {num_episodes} > max_episodes '
                       f'{self._max_episodes}: the rollout would not end')
    kept = 0
    while (kept < num_steps if num_steps is not None
           else self.finished < num_episodes):
      kept += self.step(act, on_episode)
    return kept
