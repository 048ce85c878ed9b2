"""Generalised advantage estimation that knows a time limit from an ending.

A rollout holds T steps of N env copies. Step t of copy i took action a_t at
o_t and got r_t; then the episode either went on (o_{t+1} is the next row),
ended in a terminal state, or was cut off by a time limit (truncated). With
gymnasium's vector envs the row after an ending already belongs to the next
episode, so a truncated step carries the real final observation separately,
and its value is what the return bootstraps on:

  next value of step t = 0                     terminated (no future)
                         V(final observation)  truncated (the future exists)
                         V(o_{t+1})            otherwise (o_T: the observation
                                               after the rollout)
  delta_t = r_t + gamma * next value - V(o_t)
  A_t     = delta_t + gamma * lambda * A_{t+1}, the sum stopped at any ending
  return_t = A_t + V(o_t)                      (the critic's target)

An episode running past the rollout's end bootstraps on V(o_T) and goes on
in the next rollout. With `proper_time_limits` off a truncation counts as a
terminal (no bootstrap), which is what a learner that ignores time limits
computes; it is there to compare against.
"""

from __future__ import annotations

import numpy as np


def advantages(rewards: np.ndarray, values: np.ndarray,
               next_values: np.ndarray, terminated: np.ndarray,
               truncated: np.ndarray, *, gamma: float, lam: float,
               final_values: np.ndarray | None = None,
               proper_time_limits: bool = True
               ) -> tuple[np.ndarray, np.ndarray]:
  """GAE(gamma, lambda) advantages and returns of one rollout.

  Args:
    rewards: [T, N] r_t.
    values: [T, N] V(o_t).
    next_values: [N] V(o_T), the observation after the rollout's last step.
    terminated: [T, N] step t ended its episode in a terminal state.
    truncated: [T, N] step t's episode was cut off (not terminated).
    gamma: discount.
    lam: GAE's lambda (1: Monte-Carlo returns bootstrapped at the end; 0:
      one-step TD).
    final_values: [T, N] V(real final observation) where `truncated` (other
      entries are ignored); needed when a step is truncated and
      `proper_time_limits`.
    proper_time_limits: bootstrap truncated steps on `final_values`; off:
      treat them as terminal.

  Returns:
    (advantages [T, N], returns [T, N]) as float32.

  Raises:
    ValueError: shapes that do not match, or truncated steps with no
      `final_values` while `proper_time_limits`.
  """
  rewards = np.asarray(rewards, np.float64)
  values = np.asarray(values, np.float64)
  terminated = np.asarray(terminated, bool)
  truncated = np.asarray(truncated, bool) & ~terminated
  if rewards.ndim != 2:
    raise ValueError(f'rewards must be [T, N], got shape {rewards.shape}')
  for name, array in (('values', values), ('terminated', terminated),
                      ('truncated', truncated)):
    if array.shape != rewards.shape:
      raise ValueError(f'{name} has shape {array.shape}, rewards '
                       f'{rewards.shape}: both must be [T, N]')
  next_values = np.asarray(next_values, np.float64)
  if next_values.shape != rewards.shape[1:]:
    raise ValueError(f'next_values must be [N] = {rewards.shape[1:]}, got '
                     f'{next_values.shape}')
  bootstrap_truncated = proper_time_limits and truncated.any()
  if bootstrap_truncated:
    if final_values is None:
      raise ValueError('truncated steps need final_values (the value of the '
                       'real final observation) with proper_time_limits')
    final_values = np.asarray(final_values, np.float64)
    if final_values.shape != rewards.shape:
      raise ValueError(f'final_values has shape {final_values.shape}, '
                       f'rewards {rewards.shape}')
  num_steps = rewards.shape[0]
  following = np.concatenate([values[1:], next_values[None]], axis=0)
  ended = terminated | truncated
  future = np.where(ended, 0.0, following)
  if bootstrap_truncated:
    future = np.where(truncated, final_values, future)
  deltas = rewards + gamma * future - values
  advantage = np.zeros_like(rewards)
  running = np.zeros(rewards.shape[1], np.float64)
  for t in reversed(range(num_steps)):
    running = deltas[t] + gamma * lam * np.where(ended[t], 0.0, running)
    advantage[t] = running
  return (advantage.astype(np.float32),
          (advantage + values).astype(np.float32))
