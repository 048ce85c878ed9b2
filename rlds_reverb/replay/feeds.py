"""What a learner's train step calls for its next batch: in-graph feeds.

A feed is called inside the learner's `tf.function`, once per gradient step,
and returns the batch the train step takes; `train_step(agent)` gives the
step that goes with it (prioritized replay weights the loss and writes the
new priorities back into its sum tree in the same graph). Feeds read a
`TransitionMemory`; `on_added` keeps per-row state in step with its adds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import numpy as np
import reverb
import tensorflow as tf

from rlds_reverb.replay import per
from rlds_reverb.replay import memory as memory_lib
from rlds_reverb.replay import sum_tree as sum_tree_lib

Transform = Callable[[Any], Any]


def _identity(batch: Any) -> Any:
  return batch


class UniformFeed:
  """Transitions drawn uniformly over all stored ones, `n_step` returns."""

  def __init__(self, memory: memory_lib.TransitionMemory, batch_size: int, *,
               n_step: int = 1, gamma: float = 0.99,
               transform: Optional[Transform] = None):
    _check(batch_size, n_step, gamma)
    self.memory, self.batch_size = memory, int(batch_size)
    self.n_step, self.gamma = int(n_step), float(gamma)
    self._transform = transform or _identity

  def __call__(self) -> Any:
    return self._transform(self.memory.sample(
        self.batch_size, n_step=self.n_step, gamma=self.gamma))

  def on_added(self, added: memory_lib.Added) -> None:
    del added  # The memory's own index is all a uniform draw needs.

  def train_step(self, agent: Any) -> Callable[[Any], tf.Tensor]:
    return lambda batch: agent.train(batch).loss


class MixedFeed:
  """One batch from each feed per step, concatenated (symmetric sampling,
  as RLPD: half offline, half online)."""

  def __init__(self, *feeds: UniformFeed):
    if not feeds:
      raise ValueError('MixedFeed needs at least one feed')
    self.feeds = feeds

  def __call__(self) -> Any:
    batches = [feed() for feed in self.feeds]
    return tf.nest.map_structure(lambda *x: tf.concat(x, axis=0), *batches)

  def train_step(self, agent: Any) -> Callable[[Any], tf.Tensor]:
    # The parts draw alike, so the first one's step fits the whole batch.
    return self.feeds[0].train_step(agent)


class ReturnToGoFeed(UniformFeed):
  """Uniform transitions, each with its Monte-Carlo return-to-go.

  Cal-QL bounds its conservative Q from below by the discounted return the
  data actually got from each state on: G_t = r_t + gamma * d_t * G_{t+1}
  within the episode (0 after its last transition; an episode cut by its
  time limit is not bootstrapped, as Cal-QL's authors compute it). The
  returns live in a variable beside the memory, kept in step with its adds.
  A batch is (trajectory [B, 2], return [B]); `train_step` passes the
  returns to the agent as `mc_return`.
  """

  def __init__(self, memory: memory_lib.TransitionMemory, batch_size: int, *,
               gamma: float = 0.99, reward_scale: float = 1.0,
               transform: Optional[Transform] = None):
    super().__init__(memory, batch_size, gamma=gamma, transform=transform)
    self.reward_scale = float(reward_scale)
    self.returns = tf.Variable(tf.zeros([memory.capacity], tf.float32),
                               trainable=False, name='return_to_go')
    self._fill(memory.transition_rows())

  def _fill(self, rows: np.ndarray) -> None:
    """Computes the returns of every live episode holding one of `rows`."""
    if not len(rows):
      return
    touched = np.zeros(self.memory.capacity, bool)
    touched[rows] = True
    for _, start, length in self.memory.episode_rows():
      if length < 2 or not touched[start:start + length].any():
        continue
      steps = self.memory.read_fields(np.arange(start, start + length - 1),
                                      ('reward', 'discount'))
      rewards = self.reward_scale * steps['reward'].numpy().astype(
          np.float64)
      discounts = steps['discount'].numpy().astype(np.float64)
      returns = np.zeros(length - 1)
      following = 0.0
      for t in range(length - 2, -1, -1):
        following = rewards[t] + self.gamma * discounts[t] * following
        returns[t] = following
      self.returns.scatter_nd_update(
          np.arange(start, start + length - 1)[:, None],
          returns.astype(np.float32))

  def __call__(self) -> tuple[Any, tf.Tensor]:
    rows = self.memory.sample_rows(self.batch_size)
    batch = self._transform(self.memory.transitions(rows))
    return batch, tf.gather(self.returns, rows)

  def on_added(self, added: memory_lib.Added) -> None:
    self._fill(added.new_rows)

  def train_step(self, agent: Any) -> Callable[[Any], tf.Tensor]:
    return lambda batch: agent.train(batch[0], mc_return=batch[1]).loss


@dataclasses.dataclass(frozen=True)
class SampleInfo:
  """Which rows a prioritized batch came from and how likely they were."""
  rows: tf.Tensor  # int32 [B]
  probability: tf.Tensor  # float [B]
  num_transitions: tf.Tensor  # int32 []


class PrioritizedFeed:
  """Proportional PER (Schaul et al. 2015) on a sum tree in TF ops.

  Leaf i of the tree holds p_i^alpha for the transition starting at row i
  (0 where none does); new transitions come in at the running maximum
  priority, evicted ones drop to 0. `raw_priorities` / `set_priorities`
  carry the p_i out to the Reverb store and back, keyed by episode.
  """

  def __init__(self, memory: memory_lib.TransitionMemory, batch_size: int,
               config: per.PerConfig, *, n_step: int = 1, gamma: float = 0.99,
               transform: Optional[Transform] = None,
               max_priority: Optional[per.MaxPriority] = None):
    _check(batch_size, n_step, gamma)
    self.memory, self.batch_size = memory, int(batch_size)
    self.n_step, self.gamma = int(n_step), float(gamma)
    self.config = config
    self._transform = transform or _identity
    self.tree = sum_tree_lib.SumTree(memory.capacity)
    self.max_priority = max_priority or per.MaxPriority()
    rows = memory.transition_rows()  # Already stored: at the maximum.
    self.on_added(memory_lib.Added(np.zeros(0, np.int64), rows, 0, len(rows),
                                   0))

  def _leaf(self, priorities: Any) -> tf.Tensor:
    return tf.pow(tf.cast(priorities, tf.float32), self.config.alpha)

  def on_added(self, added: memory_lib.Added) -> None:
    if len(added.evicted_rows):
      self.tree.set(added.evicted_rows.astype(np.int32),
                    tf.zeros(len(added.evicted_rows), tf.float32))
    if len(added.new_rows):
      self.tree.set(added.new_rows.astype(np.int32), self._leaf(tf.fill(
          [len(added.new_rows)], self.max_priority())))

  def __call__(self) -> tuple[Any, SampleInfo]:
    rows, values = self.tree.sample(self.batch_size)
    probability = values / self.tree.total()
    batch = self.memory.transitions(rows, n_step=self.n_step,
                                    gamma=self.gamma)
    return self._transform(batch), SampleInfo(
        rows, probability, self.memory.num_transitions)

  def update(self, rows: tf.Tensor, priorities: tf.Tensor) -> None:
    """New raw priorities for the `rows` just sampled (capped, > 0)."""
    priorities = tf.debugging.assert_all_finite(
        priorities, 'prioritized replay: a TD error is not finite (NaN or '
        'inf in the data or the loss)')
    self.tree.set(rows, self._leaf(priorities), validate=False)
    self.max_priority.observe(priorities)

  def train_step(self, agent: Any) -> Callable[[Any], tf.Tensor]:
    """Importance weights in, TD-error priorities into the sum tree out."""
    return per.PrioritizedTrainStep(
        agent, self.config, self.max_priority,
        lambda info, priorities: self.update(info.rows, priorities),
        lambda info: info.num_transitions)

  # ------------------------------------------- the store keeps priorities

  def raw_priorities(self) -> np.ndarray:
    """p_i per row (0 where no transition), float32 [capacity]."""
    leaves = self.tree.values().numpy().astype(np.float64)
    if self.config.alpha == 0:
      return (leaves > 0).astype(np.float32) * np.float32(
          self.max_priority())
    return np.power(leaves, 1.0 / self.config.alpha).astype(np.float32)

  def set_priorities(self, rows: np.ndarray, priorities: np.ndarray) -> None:
    rows = np.asarray(rows, np.int32)
    priorities = np.asarray(priorities, np.float32)
    if len(rows):
      self.tree.set(rows, self._leaf(priorities))
      self.max_priority.observe(tf.constant(priorities))


def _check(batch_size: int, n_step: int, gamma: float) -> None:
  for name, value in (('batch_size', batch_size), ('n_step', n_step)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
        or value < 1:
      raise ValueError(f'{name} must be a positive integer, got {value!r}.')
  if not 0 < gamma <= 1:
    raise ValueError(f'gamma must be in (0, 1], got {gamma!r}.')


# ------------------------------------------------------------------ store

PRIORITY_SUFFIX = '.priorities'


def priority_table_name(table: str) -> str:
  return table + PRIORITY_SUFFIX


def make_priority_table(table: str) -> reverb.Table:
  """The side table where a prioritized learner leaves its priorities:
  one item (the latest write-back), keyed by the episodes' Reverb keys."""
  signature = {
      'keys': tf.TensorSpec([None], tf.uint64),
      'lengths': tf.TensorSpec([None], tf.int32),
      'priorities': tf.TensorSpec([None], tf.float32)}
  return reverb.Table(
      name=priority_table_name(table), sampler=reverb.selectors.Fifo(),
      remover=reverb.selectors.Fifo(), max_size=1,
      rate_limiter=reverb.rate_limiters.MinSize(1), signature=signature)


def write_priorities(client: reverb.Client, table: str,
                     feed: PrioritizedFeed) -> int:
  """Writes each live episode's per-step priorities to the side table.

  Returns the number of episodes written.
  """
  rows = feed.memory.episode_rows()
  priorities = feed.raw_priorities()
  keys = np.asarray([k for k, _, _ in rows], np.uint64)
  lengths = np.asarray([n for _, _, n in rows], np.int32)
  values = (np.concatenate([priorities[s:s + n] for _, s, n in rows])
            if rows else np.zeros(0, np.float32))
  with client.trajectory_writer(num_keep_alive_refs=1) as writer:
    writer.append({'keys': keys, 'lengths': lengths, 'priorities': values})
    writer.create_item(priority_table_name(table), 1.0, {
        'keys': writer.history['keys'][-1],
        'lengths': writer.history['lengths'][-1],
        'priorities': writer.history['priorities'][-1]})
    writer.flush()
  return len(rows)


def restore_priorities(client: reverb.Client, table: str,
                       feed: PrioritizedFeed) -> int:
  """Sets the priorities the store kept for the episodes in memory.

  Returns the number of episodes restored; episodes the store has no
  priorities for keep theirs (the running maximum).
  """
  name = priority_table_name(table)
  info = client.server_info().get(name)
  if info is None or info.current_size == 0:
    return 0
  sample = next(client.sample(name, 1, emit_timesteps=False,
                              unpack_as_table_signature=True))
  sample = sample[0] if isinstance(sample, list) else sample
  saved_keys = np.asarray(sample.data['keys'])
  saved_lengths = np.asarray(sample.data['lengths'])
  saved = np.asarray(sample.data['priorities'])
  offsets = np.concatenate([[0], np.cumsum(saved_lengths)])
  where = {int(k): i for i, k in enumerate(saved_keys)}
  rows, values, restored = [], [], 0
  for key, start, length in feed.memory.episode_rows():
    i = where.get(key)
    if i is None or saved_lengths[i] != length:
      continue
    p = saved[offsets[i]:offsets[i + 1]][:length - 1]
    keep = p > 0
    rows.append(np.arange(start, start + length - 1)[keep])
    values.append(p[keep])
    restored += 1
  if rows:
    feed.set_priorities(np.concatenate(rows), np.concatenate(values))
  return restored
