"""Online collection: a numpy actor steps gymnasium envs into a Reverb table.

Episodes are stepped and kept by `rollout` (the loop and episode buffer that
`recording` uses too: RLDS layout, T + 1 steps, the last holding the final
observation) and written with the project's own `push_rlds_to_table`, so
online data goes through exactly the conversion and writer that offline
datasets do, terminal-discount fix on.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import reverb
import rlds
import tensorflow as tf
import tree

from rlds_reverb.storage import push
from rlds_reverb.acting import envs
from rlds_reverb.acting import rollout

# (observations [n, ...] (a dict of them for goal envs), rng)
#   -> (actions [n, ...], log-probs [n])
ActFn = Callable[[Any, np.random.Generator], tuple[np.ndarray, np.ndarray]]


@dataclasses.dataclass
class CollectStats:
  """Totals since the collector was made."""
  env_steps: int = 0
  episodes: int = 0
  items_written: int = 0
  last_returns: list[float] = dataclasses.field(default_factory=list)
  # Goal envs: info['is_success'] at the end of the last finished episodes.
  last_successes: list[float] = dataclasses.field(default_factory=list)


class Collector:
  """Steps `num_envs` copies of an env; pushes whole episodes to Reverb.

  Episodes still running when `collect` returns carry over to the next call;
  only finished episodes are written (a partial episode is not valid RLDS).
  Items go in at `priority()` (1.0 by default; an episode table for the
  learners' in-memory feed takes whole episodes, `sequence_length=None`, at
  priority 0, unread). For streaming tables: `priority_fn(steps)` sets a
  whole episode's priority from its length (`her.make_table`), and
  `on_episodes` sees each batch of finished episodes.
  """

  def __init__(self, env_id: str, client: reverb.Client, table: str, *,
               num_envs: int = 1, seed: int = 0,
               priority: Callable[[], float] = lambda: 1.0,
               sequence_length: int | None = 2,
               priority_fn: Callable[[int], float] | None = None,
               on_episodes: Callable[[list[dict]], None] | None = None,
               frame_stack: int = 1):
    self._client, self._table = client, table
    self._priority = priority
    self._sequence_length, self._priority_fn = sequence_length, priority_fn
    self._on_episodes = on_episodes
    self._envs = gym.vector.SyncVectorEnv(
        [lambda: envs.make_env(env_id)] * num_envs,
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    self._rng = np.random.default_rng(seed)
    # Image envs: the policy acts on frame stacks, the episodes keep frames.
    self._rollout = rollout.Rollout(self._envs, rollout.layout_of(self._envs),
                                    seed=seed, frame_stack=frame_stack)
    self.stats = CollectStats()

  @property
  def rng(self) -> np.random.Generator:
    return self._rng

  def collect(self, num_steps: int, act: ActFn) -> list[float]:
    """Takes `num_steps` env steps in all; returns the finished returns."""
    finished: list[rollout.Episode] = []
    taken = self._rollout.run(lambda obs: act(obs, self._rng),
                              finished.append, num_steps=num_steps)
    self.stats.env_steps += taken
    returns = [episode.episode_return for episode in finished]
    if finished:
      steps = [episode.steps for episode in finished]
      self._write(steps)
      if self._on_episodes is not None:
        self._on_episodes(steps)
      self.stats.episodes += len(finished)
      self.stats.last_returns = returns
      self.stats.last_successes = [episode.success for episode in finished
                                   if episode.success is not None]
    return returns

  def _write(self, episodes: list[dict[str, Any]]) -> None:
    self.stats.items_written += write_episodes(
        self._client, self._table, episodes,
        sequence_length=self._sequence_length, priority=self._priority(),
        priority_fn=self._priority_fn)

  def close(self) -> None:
    self._envs.close()


def write_episodes(client: reverb.Client, table: str,
                   episodes: list[dict[str, Any]], *,
                   sequence_length: int | None, priority: float,
                   priority_fn: Callable[[int], float] | None = None) -> int:
  """Writes finished RLDS episodes (dicts of step arrays) to `table` with
  terminal discounts fixed, as every actor does; returns the items written."""
  rlds_data = None
  for steps in episodes:
    one = tf.data.Dataset.from_tensors(
        {rlds.STEPS: tf.data.Dataset.from_tensor_slices(steps)})
    rlds_data = one if rlds_data is None else rlds_data.concatenate(one)
  stats = push.PushStats()
  push.push_rlds_to_table(rlds_data, client, table,
                          sequence_length=sequence_length, priority=priority,
                          priority_fn=priority_fn,
                          zero_terminal_discount=True, stats=stats)
  return stats.items


def random_act(action_low: np.ndarray, action_high: np.ndarray) -> ActFn:
  """Uniform actions: the initial collection (integers for Discrete)."""
  def act(observations: Any, rng: np.random.Generator):
    n = len(tree.flatten(observations)[0])
    if np.issubdtype(np.asarray(action_low).dtype, np.integer):
      count = int(action_high) - int(action_low) + 1
      return (rng.integers(action_low, action_high + 1, n).astype(np.int64),
              np.full(n, -np.log(count)))
    return (rng.uniform(action_low, action_high,
                        (n,) + action_low.shape).astype(np.float32),
            np.zeros(n))
  return act


def policy_act(policy: Any, noise_std: float = 0.1) -> ActFn:
  """Explores with a `NumpyPolicy`: samples (SAC) or adds noise (TD3)."""
  return lambda obs, rng: policy.sample(obs, rng, noise_std=noise_std)


def with_random_actions(act: ActFn, probability: float,
                        action_low: np.ndarray, action_high: np.ndarray
                        ) -> ActFn:
  """Replaces each action by a uniform one with `probability` (OpenAI
  baselines' HER explores with 0.3: the gripper must find the block)."""
  if probability <= 0:
    return act
  uniform = random_act(action_low, action_high)

  def mixed(observations: Any, rng: np.random.Generator):
    actions, log_probs = act(observations, rng)
    random_actions, _ = uniform(observations, rng)
    pick = rng.random(len(actions)) < probability
    # The behaviour is now a mixture; its log-prob is not recorded exactly.
    return np.where(pick[:, None], random_actions, actions), log_probs
  return mixed


def epsilon_greedy_act(policy: Any, epsilon: float) -> ActFn:
  """Explores with a 'q_argmax' `NumpyPolicy` (DQN)."""
  return lambda obs, rng: policy.epsilon_greedy(obs, rng, epsilon)
