"""Fixed-length rollouts of N env copies, for on-policy learners.

Off-policy collection (`collect`) keeps whole episodes; an on-policy learner
wants T steps of each of N copies, whatever the episodes, with each step's
ending spelled out so that its returns bootstrap correctly (`agents.onpolicy.gae`).
The vector env runs in gymnasium's SAME_STEP autoreset mode: the step that
ends an episode returns the next episode's first observation, and the real
final observation comes in `infos['final_obs']`; a truncated step keeps it
(as the policy would see it) in `final_observation`.

Image envs (uint8 frames) give the policy stacks of the last `frame_stack`
frames of each copy (`rollout.FrameStacker`: a new episode's stack is its
first frame repeated), kept uint8 and never normalised (the network
scales them); a truncated step's `final_observation` is the stack with
the real final frame on top.

One rollout, as arrays (T steps, N copies):

  observation        [T, N, d]  o_t as the policy saw it (after `observe`)
  action             [T, N, ...] a_t as sampled (unclipped; the env gets it
                                 clipped to the action bounds)
  log_prob           [T, N]     log pi(a_t | o_t) of the acting policy
  reward             [T, N]     r_t after `scale_reward`
  terminated         [T, N]     step t ended its episode in a terminal state
  truncated          [T, N]     step t's episode was cut off instead
  final_observation  [T, N, d]  where truncated: the real o_{t+1}; else 0
  episode_start      [T, N]     o_t is an episode's first observation
  next_observation   [N, d]     o_T, what the next rollout starts from

Episodes run on across rollouts; their undiscounted returns (raw rewards)
are reported when they finish.
"""

from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np

from rlds_reverb.acting import envs
from rlds_reverb.acting import rollout as rollout_lib

# (observations [N, d], episode starts [N]) -> (actions [N, ...],
# log-probabilities [N]); a recurrent actor resets its state where a copy's
# episode starts.
ActFn = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
# (observations [N, d], update statistics?) -> what the policy sees
ObserveFn = Callable[..., np.ndarray]
# (rewards [N], ended [N]) -> what the learner trains on
ScaleRewardFn = Callable[[np.ndarray, np.ndarray], np.ndarray]

FIELDS = ('observation', 'action', 'log_prob', 'reward', 'terminated',
          'truncated', 'final_observation', 'episode_start',
          'next_observation')


def _identity(observations: np.ndarray, update: bool = False) -> np.ndarray:
  del update
  return np.asarray(observations, np.float32)


class VectorRollouts:
  """Steps `num_envs` copies of an env `rollout_steps` at a time."""

  def __init__(self, env_id: str, *, num_envs: int, rollout_steps: int,
               seed: int = 0, observe: ObserveFn = _identity,
               scale_reward: ScaleRewardFn = lambda r, ended: r,
               frame_stack: int = 1):
    """On an image env the policy sees frame-major stacks of
    `frame_stack` frames (`observe` is then not called)."""
    if num_envs < 1 or rollout_steps < 1:
      raise ValueError(f'num_envs and rollout_steps must be >= 1, got '
                       f'{num_envs} and {rollout_steps}')
    self._envs = gym.vector.SyncVectorEnv(
        [lambda: envs.make_env(env_id)] * num_envs,
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    space = self._envs.single_action_space
    self.discrete = isinstance(space, gym.spaces.Discrete)
    if not self.discrete and not isinstance(space, gym.spaces.Box):
      raise ValueError(f'{env_id}: on-policy rollouts need a Box or Discrete '
                       f'action space, got {space}')
    if not isinstance(self._envs.single_observation_space, gym.spaces.Box):
      raise ValueError(f'{env_id}: on-policy rollouts need a flat (Box) '
                       'observation space, got '
                       f'{self._envs.single_observation_space}')
    self._stacker = None
    self._low = None if self.discrete else space.low
    self._high = None if self.discrete else space.high
    self.num_envs, self.rollout_steps = num_envs, rollout_steps
    self._observe, self._scale_reward = observe, scale_reward
    raw, _ = self._envs.reset(seed=seed)
    if frame_stack > 1 or rollout_lib.is_frame_batch(raw):
      self._stacker = rollout_lib.FrameStacker(frame_stack, raw)
      self._observation = self._stacker.stacks()
    else:
      self._observation = observe(raw, update=True)
    self._starts = np.ones(num_envs, bool)
    self._returns = np.zeros(num_envs, np.float64)
    self._lengths = np.zeros(num_envs, np.int64)
    self.env_steps = 0

  def collect(self, act: ActFn) -> tuple[dict[str, np.ndarray], list[float],
                                         list[int]]:
    """One rollout; returns it with the returns and lengths of the
    episodes that finished in it."""
    t_steps, n = self.rollout_steps, self.num_envs
    observation = np.zeros((t_steps,) + self._observation.shape,
                           self._observation.dtype)
    final_observation = np.zeros_like(observation)
    actions, log_probs = [], []
    rewards = np.zeros((t_steps, n), np.float32)
    terminated = np.zeros((t_steps, n), bool)
    truncated = np.zeros((t_steps, n), bool)
    starts = np.zeros((t_steps, n), bool)
    returns, lengths = [], []
    for t in range(t_steps):
      observation[t], starts[t] = self._observation, self._starts
      action, log_prob = act(self._observation, self._starts)
      actions.append(action)
      log_probs.append(log_prob)
      env_action = action if self.discrete else np.clip(
          action, self._low, self._high)
      raw, reward, term, trunc, infos = self._envs.step(env_action)
      term = np.asarray(term, bool)
      trunc = np.asarray(trunc, bool) & ~term  # both: terminal
      ended = term | trunc
      rewards[t] = self._scale_reward(np.asarray(reward, np.float64), ended)
      terminated[t], truncated[t] = term, trunc
      for i in np.flatnonzero(trunc):
        final_observation[t, i] = self._final_observation(
            i, infos['final_obs'][i])
      self._returns += reward
      self._lengths += 1
      for i in np.flatnonzero(ended):
        returns.append(float(self._returns[i]))
        lengths.append(int(self._lengths[i]))
      self._returns[ended], self._lengths[ended] = 0.0, 0
      self._observation = self._next_observation(raw, ended)
      self._starts = ended
    self.env_steps += t_steps * n
    rollout = {
        'observation': observation,
        'action': np.stack(actions),
        'log_prob': np.stack(log_probs).astype(np.float32),
        'reward': rewards, 'terminated': terminated, 'truncated': truncated,
        'final_observation': final_observation, 'episode_start': starts,
        'next_observation': self._observation.copy(),
    }
    return rollout, returns, lengths

  def _final_observation(self, i: int, frame: np.ndarray) -> np.ndarray:
    """What the policy would have seen after copy i's truncated step."""
    if self._stacker is None:
      return self._observe(frame[None], update=False)[0]
    return self._stacker.peek(i, frame)

  def _next_observation(self, raw: np.ndarray, ended: np.ndarray
                        ) -> np.ndarray:
    if self._stacker is None:
      return self._observe(raw, update=True)
    self._stacker.push(raw)
    for i in np.flatnonzero(ended):  # raw[i] starts copy i's next episode.
      self._stacker.start(i, raw[i])
    return self._stacker.stacks()

  def close(self) -> None:
    self._envs.close()
