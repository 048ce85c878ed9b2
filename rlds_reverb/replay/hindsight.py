"""Hindsight goal relabelling of transitions drawn from a `TransitionMemory`.

Stable-Baselines3's `HerReplayBuffer` semantics, in-graph: every transition
of a batch is its own uniform draw over all stored transitions
(`memory.sample_rows`), however the episode lengths differ. With
probability 1/(k+1) it keeps the goal it was collected with; otherwise its
goal becomes the achieved goal stored at a row picked by the strategy, from
the episode bounds the memory keeps per row:

  transition t = rows (t, t + 1) of an episode stored at rows first..last
    future   uniform in t+1 .. last     (after a later step of the episode)
    final    last                       (after the episode's final step)
    episode  uniform in first+1 .. last (after any step of the episode)
    random   t' + 1 for another uniform draw t' (after any stored step)

Rows t and t + 1 and the goal rows are read in one gather per field; the
rewards of the whole batch come from one call of the environment's
vectorised reward function (`her.goal_batch`), so a batch is exactly what
`her.relabel` makes from Reverb episodes.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

import tensorflow as tf

from rlds_reverb.replay import her
from rlds_reverb.replay import memory as memory_lib


def _uniform_below(n: tf.Tensor) -> tf.Tensor:
  """Integers uniform in [0, n) for an int32 tensor n >= 1 (per element)."""
  draw = tf.floor(tf.random.uniform(tf.shape(n)) * tf.cast(n, tf.float32))
  # float32 rounding can give n itself for very large n; keep it below.
  return tf.minimum(tf.cast(draw, tf.int32), n - 1)


class HindsightFeed:
  """Batches of goal-relabelled transitions, called in the train step.

  Returns `Trajectory` batches [B, 2, ...] whose one-step spec is
  `her.learner_spec(memory.data_spec)`: observation = concat(observation,
  goal) (or the normaliser's), floats float32; where a goal was relabelled
  the reward is recomputed, and with `terminated_fn` the discount is
  1 - terminated.
  """

  def __init__(self, memory: memory_lib.TransitionMemory, batch_size: int,
               reward_fn: her.RewardFn, *,
               config: her.HerConfig = her.HerConfig(),
               terminated_fn: her.TerminatedFn | None = None,
               normalizer: her.GoalNormalizer | None = None):
    """Args as in `her.dataset` (`reward_fn_for(env)`, `terminated_fn_for`);
    `config.episodes_per_draw` and `batches_per_draw` do not apply here.

    Raises:
      ValueError: a memory made without `with_episode_bounds` (goals come
        from each row's episode), observations that are not goal dicts
        (`her.check_goal_spec`), or a batch_size that is not a positive
        integer.
    """
    if not getattr(memory, 'with_episode_bounds', False):
      raise ValueError(
          'HindsightFeed draws goals from episode bounds: make the memory '
          'with TransitionMemory(..., with_episode_bounds=True)')
    her.check_goal_spec(memory.data_spec)
    if (isinstance(batch_size, bool) or
        not isinstance(batch_size, numbers.Integral) or batch_size < 1):
      raise ValueError(f'batch_size must be a positive integer, got '
                       f'{batch_size!r}')
    self.memory, self.batch_size = memory, int(batch_size)
    self.config = config
    self._reward_fn, self._terminated_fn = reward_fn, terminated_fn
    self._normalizer = normalizer

  def __call__(self) -> Any:
    return self._sample()[0]

  def sample_with_info(self) -> tuple[Any, dict[str, tf.Tensor]]:
    """A batch and its draw: 'row' (t), 'goal_row', 'relabelled', 'goal',
    'next_achieved_goal' (row t + 1's), for tests and diagnostics."""
    return self._sample()

  def on_added(self, added: memory_lib.Added) -> None:
    del added  # Bounds live in the memory; nothing of ours to update.

  def train_step(self, agent: Any) -> Callable[[Any], tf.Tensor]:
    return lambda batch: agent.train(batch).loss

  def _goal_rows(self, rows: tf.Tensor) -> tf.Tensor:
    strategy = self.config.strategy
    if strategy == 'random':
      return self.memory.sample_rows(self.batch_size) + 1
    last = tf.gather(self.memory.episode_last, rows)
    if strategy == 'future':  # last - t >= 1: t + 1 is in t's episode.
      return rows + 1 + _uniform_below(last - rows)
    if strategy == 'final':
      return last
    first = tf.gather(self.memory.episode_first, rows)
    return first + 1 + _uniform_below(last - first)  # episode

  def _sample(self) -> tuple[Any, dict[str, tf.Tensor]]:
    size = self.batch_size
    rows = self.memory.sample_rows(size)
    goal_rows = self._goal_rows(rows)
    steps = self.memory.read(tf.stack([rows, rows + 1, goal_rows], axis=1))
    cur, nxt, at_goal = (tf.nest.map_structure(lambda x, i=i: x[:, i], steps)
                         for i in range(3))
    relabelled = (tf.random.uniform([size]) <
                  self.config.relabel_probability)
    goal = tf.cast(tf.where(relabelled[:, None],
                            at_goal.observation[her.ACHIEVED_GOAL],
                            cur.observation[her.DESIRED_GOAL]), tf.float32)
    batch = her.goal_batch(cur, nxt, goal, relabelled, size, self._reward_fn,
                           self._terminated_fn, self._normalizer)
    return batch, {
        'row': rows, 'goal_row': goal_rows, 'relabelled': relabelled,
        'goal': goal, 'next_achieved_goal': tf.cast(
            nxt.observation[her.ACHIEVED_GOAL], tf.float32)}
