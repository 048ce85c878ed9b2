"""Evaluates a numpy policy in the real environment, as D4RL papers report it.

Greedy actions (the policy's mode), full episodes with the env's own time
limit, average undiscounted return and D4RL's normalised score.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import gymnasium as gym
import numpy as np

from rlds_reverb.acting import envs
from rlds_reverb.acting import rollout

# batch of obs (a dict of batches for goal envs) -> batch of actions
ActFn = Callable[[Any], np.ndarray]


@dataclasses.dataclass(frozen=True)
class EvalResult:
  """Returns of the evaluation episodes and what they sum up to."""
  returns: list[float]
  lengths: list[int]
  average_return: float
  std_return: float
  normalized_score: float | None  # None for envs D4RL has no reference for
  # Share of episodes whose last step reported info['is_success'] (goal
  # envs, as OpenAI baselines' HER counts it); None where the env has none.
  success_rate: float | None = None

  def to_dict(self) -> dict:
    record = {'average_return': self.average_return,
              'std_return': self.std_return,
              'normalized_score': self.normalized_score,
              'episodes': len(self.returns)}
    if self.success_rate is not None:
      record['success_rate'] = self.success_rate
    return record


def evaluate(act: ActFn, env_id: str, num_episodes: int = 10,
             seed: int = 0, frame_stack: int = 1,
             env_kwargs: dict[str, Any] | None = None) -> EvalResult:
  """Runs `num_episodes` episodes of `act` in vector envs of `env_id`.

  Episode i runs in a sub-env seeded with seed + i; the episodes run side by
  side, so the policy sees a batch of observations per step (stacks of
  `frame_stack` image frames, as the learner's memory reads them).
  `env_kwargs` go to `envs.make_env` (e.g. Atari's sticky actions off).

  Raises:
    ValueError: num_episodes < 1, or an unknown env id.
  """
  if num_episodes < 1:
    raise ValueError(f'num_episodes must be >= 1, got {num_episodes}')
  vector = gym.vector.SyncVectorEnv(
      [lambda: envs.make_env(env_id, **(env_kwargs or {}))] * num_episodes,
      autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
  episodes: list[rollout.Episode] = []
  try:
    # One episode per sub-env: the n episodes start at the reset.
    rollout.Rollout(
        vector, rollout.layout_of(vector),
        seed=[seed + i for i in range(num_episodes)],
        max_episodes=num_episodes, frame_stack=frame_stack).run(
            lambda obs: (act(obs), None), episodes.append,
            num_episodes=num_episodes)
  finally:
    vector.close()
  episodes.sort(key=lambda episode: episode.number)
  returns = [episode.episode_return for episode in episodes]
  successes = [episode.success for episode in episodes]
  average = float(np.mean(returns))
  return EvalResult(returns=returns,
                    lengths=[episode.num_steps for episode in episodes],
                    average_return=average, std_return=float(np.std(returns)),
                    normalized_score=envs.normalized_score(env_id, average),
                    success_rate=(None if None in successes
                                  else float(np.mean(successes))))
