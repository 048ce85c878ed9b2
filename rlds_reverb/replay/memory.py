"""Episodes held in process memory as tensors, sampled in-graph.

Each stored step keeps the converted trajectory of that step once (the
trajectory an episode item holds at that position), so a transition t is the
pair of rows (t, t + 1) and its next observation is the following step's
row, as the HER buffer of the seeds stores it. Episodes are written whole
and contiguously; when one does not fit before the end of the buffer it
starts again at row 0, and whole episodes it overlaps are evicted (the gap
left at the end holds no transition). A transition exists at row t when row
t + 1 belongs to the same episode, so the pairs are exactly the 2-step items
that `push_rlds_to_table(..., sequence_length=2)` writes: none for a
one-step or empty episode, never one across two episodes.

The rows of the live transitions are kept in an index variable, so a
uniform draw is one random integer and one gather per field, inside the
learner's `tf.function`. Book-keeping of which rows hold which episode is
numpy on the host, done when episodes are added, never per sample.

Image observations (uint8 leaves of rank 2 or 3 under `observation`) are
kept one frame per step, as the environment gave them. With `frame_stack`
k, reading a row assembles the frames of that row and the k - 1 rows
before it, oldest first, on a new leading axis ([H, W] -> [k, H, W];
[H, W, C] -> [k, H, W, C]): frame-major, so a stack is a gather of whole
stored frames and nothing moves a byte after it (a channel-last stack
would interleave the k frames byte by byte, a transpose that costs more
than the gather; the networks move the axis themselves, in float, inside
their graph). A stack never reaches into the episode before: its missing
frames repeat the episode's first frame, as gymnasium's
`FrameStackObservation` pads at a reset. Stacks are therefore never
stored, and a transition's next observation is the stack one row on.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Optional, Sequence

import numpy as np
import tensorflow as tf
import tree
from tf_agents.trajectories import time_step as ts

_LAST = int(ts.StepType.LAST)


@dataclasses.dataclass
class Added:
  """What one `add` changed, for samplers that keep per-row state."""
  evicted_rows: np.ndarray  # rows whose transitions are gone
  new_rows: np.ndarray  # rows of the new transitions
  episodes: int
  transitions: int
  skipped_episodes: int  # episodes without a transition (still counted)
  # Keys of the episodes evicted (those that came with keys).
  evicted_keys: np.ndarray = dataclasses.field(
      default_factory=lambda: np.zeros(0, np.uint64))


def is_frame(path: Sequence[Any], spec: Any) -> bool:
  """Whether a leaf of the stored step is an image frame: uint8 of rank 2
  ([H, W]) or 3 ([H, W, C]) under `observation`."""
  return (bool(path) and path[0] == 'observation'
          and tf.as_dtype(spec.dtype) == tf.uint8
          and spec.shape.rank in (2, 3))


def stacked_shape(shape: Sequence[int], frame_stack: int) -> list[int]:
  """The shape of a stack of `frame_stack` frames of `shape`, frame-major:
  [k, H, W] or [k, H, W, C]."""
  return [frame_stack] + list(shape)


def stacked_spec(data_spec: Any, frame_stack: int) -> Any:
  """`data_spec` with each image frame replaced by its stack (what a
  learner's networks take: a frame alone is a stack of one)."""
  def stack(path, spec):
    if not is_frame(path, spec):
      return spec
    return tf.TensorSpec(stacked_shape(spec.shape.as_list(), frame_stack),
                         spec.dtype, getattr(spec, 'name', None))
  return tree.map_structure_with_path(stack, data_spec)


def _check_positive_int(name: str, value: Any) -> int:
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < 1):
    raise ValueError(f'{name} must be a positive integer, got {value!r}.')
  return int(value)


class TransitionMemory(tf.Module):
  """Per-step storage of trajectories with a uniform in-graph sampler.

  Attributes:
    data_spec: per-step spec of what is stored (a `Trajectory` of specs).
    capacity: rows (steps) the memory holds.
    num_transitions: int32 variable, the live transitions.
  """

  def __init__(self, data_spec: Any, capacity: int, *,
               float_dtype: Optional[tf.DType] = tf.float32,
               with_episode_bounds: bool = False,
               frame_stack: int = 1,
               name: str = 'transition_memory'):
    """`with_episode_bounds` also keeps, per row, the first and last row of
    its episode (hindsight relabelling draws goals from them; frame stacks
    stop at the first). `frame_stack` is the frames per stack image
    observations are read as (1: each frame alone, still [1, H, W(, C)])."""
    super().__init__(name=name)
    self.capacity = _check_positive_int('capacity', capacity)
    self.frame_stack = _check_positive_int('frame_stack', frame_stack)
    if not tree.flatten(data_spec):
      raise ValueError(f'data_spec holds no spec: {data_spec!r}')
    self.data_spec = data_spec
    self._float_dtype = float_dtype
    self._paths = [p for p, _ in tree.flatten_with_path(data_spec)]

    # Rows are packed: the fields of one dtype side by side in one matrix
    # [capacity, width], so a draw touches each row's memory once per dtype
    # instead of once per field (random rows of a large memory are cache
    # misses, which cost a learner more than the ops). Frames that are
    # read as stacks have a matrix of their own: a stack gathers k rows of
    # it, and the other fields only one.
    self._layout = []  # per leaf: (group, offset, width, shape)
    widths: dict[tuple[tf.DType, bool], int] = {}
    for path, spec in tree.flatten_with_path(data_spec):
      group = (tf.as_dtype(spec.dtype), is_frame(path, spec))
      width = int(np.prod(spec.shape.as_list(), dtype=np.int64))
      self._layout.append((group, widths.get(group, 0), width,
                           spec.shape.as_list()))
      widths[group] = widths.get(group, 0) + width
    self._groups = list(widths)
    self._columns = [tf.Variable(tf.zeros([self.capacity, widths[group]],
                                          group[0]), trainable=False,
                                 name=f'{"frames" if group[1] else "rows"}_'
                                 f'{group[0].name}')
                     for group in self._groups]
    with_episode_bounds = with_episode_bounds or (
        self.frame_stack > 1 and any(stacked for _, stacked in self._groups))
    self._index = tf.Variable(tf.zeros([self.capacity], tf.int32),
                              trainable=False, name='transition_rows')
    self.num_transitions = tf.Variable(0, dtype=tf.int32, trainable=False,
                                       name='num_transitions')
    self.with_episode_bounds = with_episode_bounds
    if with_episode_bounds:
      self.episode_first = tf.Variable(tf.zeros([self.capacity], tf.int32),
                                       trainable=False, name='episode_first')
      self.episode_last = tf.Variable(tf.zeros([self.capacity], tf.int32),
                                      trainable=False, name='episode_last')
    # Host book-keeping: live episodes as [first row, length, key].
    self._starts = np.zeros(0, np.int64)
    self._lengths = np.zeros(0, np.int64)
    self._keys = np.zeros(0, np.uint64)
    self._valid = np.zeros(self.capacity, bool)
    self._head = 0
    self._evicted_keys: list[int] = []

  # ---------------------------------------------------------------- writing

  def episode_rows(self) -> list[tuple[int, int, int]]:
    """(key, first row, length) of each live episode, oldest first."""
    return [(int(k), int(s), int(n)) for k, s, n in
            zip(self._keys, self._starts, self._lengths)]

  def transition_spec(self) -> Any:
    """Spec of one step as `read` returns it (floats in the read dtype)."""
    def read_spec(spec):
      dtype = tf.as_dtype(spec.dtype)
      if self._float_dtype is not None and dtype.is_floating:
        dtype = self._float_dtype
      return tf.TensorSpec(spec.shape, dtype)
    return tf.nest.map_structure(
        read_spec, stacked_spec(self.data_spec, self.frame_stack))

  def transition_rows(self) -> np.ndarray:
    """Rows where a live transition starts, ascending."""
    return np.flatnonzero(self._valid).astype(np.int32)

  @property
  def bytes(self) -> int:
    """Bytes of the tensors held (data, index, episode bounds)."""
    variables = self._columns + [self._index]
    if self.with_episode_bounds:
      variables += [self.episode_first, self.episode_last]
    return int(sum(v.shape.num_elements() * v.dtype.size for v in variables))

  def add(self, episodes: Sequence[Any], keys: Sequence[int] | None = None
          ) -> Added:
    """Stores episodes given as nests of numpy arrays [L, ...] (converted
    trajectories, as an episode item holds them), evicting the oldest rows.

    Raises:
      ValueError: an episode longer than the memory, or with fields whose
        shapes or lengths disagree with the spec (naming the episode and
        field).
    """
    keys = list(keys) if keys is not None else [0] * len(episodes)
    if len(keys) != len(episodes):
      raise ValueError(f'{len(episodes)} episodes but {len(keys)} keys')
    rows, parts, firsts, lasts = [], [], [], []
    evicted = []
    new_starts, new_lengths, new_keys = [], [], []
    skipped = 0
    # Every episode is checked before anything changes: a bad one leaves
    # the memory as it was.
    checked = [self._check_episode(number, episode)
               for number, episode in enumerate(episodes)]
    for leaves, key in zip(checked, keys):
      length = len(leaves[0])
      if length == 0:
        skipped += 1
        continue
      if length < 2:
        skipped += 1
      if self._head + length > self.capacity:
        self._head = 0
      start = self._head
      evicted.append(self._evict(start, start + length))
      # The new rows may also overlap episodes added in this same call.
      keep = [not (s < start + length and start < s + n)
              for s, n in zip(new_starts, new_lengths)]
      for i in [i for i, k in enumerate(keep) if not k]:
        evicted.append(np.arange(new_starts[i], new_starts[i] + new_lengths[i]))
        self._evicted_keys.append(new_keys[i])
      new_starts = [s for s, k in zip(new_starts, keep) if k]
      new_lengths = [n for n, k in zip(new_lengths, keep) if k]
      new_keys = [x for x, k in zip(new_keys, keep) if k]
      new_starts.append(start)
      new_lengths.append(length)
      new_keys.append(int(key))
      rows.append(np.arange(start, start + length))
      parts.append(leaves)
      firsts.append(np.full(length, start))
      lasts.append(np.full(length, start + length - 1))
      self._head = start + length
    evicted_rows = (np.unique(np.concatenate(evicted)) if evicted
                    else np.zeros(0, np.int64))
    self._valid[evicted_rows] = False
    if rows:
      all_rows = np.concatenate(rows)
      # Later episodes of this call win where rows repeat (they overlap).
      _, last_seen = np.unique(all_rows[::-1], return_index=True)
      pick = len(all_rows) - 1 - last_seen
      target = all_rows[pick][:, None].astype(np.int64)
      fields = [np.concatenate(values)[pick] for values in zip(*parts)]
      for group, column in zip(self._groups, self._columns):
        packed = np.concatenate(
            [field.reshape(len(field), -1) for field, layout in
             zip(fields, self._layout) if layout[0] == group], axis=1)
        column.scatter_nd_update(target, tf.constant(packed, dtype=group[0]))
      if self.with_episode_bounds:
        self.episode_first.scatter_nd_update(
            target, np.concatenate(firsts)[pick].astype(np.int32))
        self.episode_last.scatter_nd_update(
            target, np.concatenate(lasts)[pick].astype(np.int32))
    new_rows = []
    for start, length in zip(new_starts, new_lengths):
      self._valid[start:start + length - 1] = True
      new_rows.append(np.arange(start, start + length - 1))
    self._starts = np.concatenate([self._starts, new_starts]).astype(np.int64)
    self._lengths = np.concatenate([self._lengths, new_lengths]).astype(
        np.int64)
    self._keys = np.concatenate([self._keys, np.asarray(new_keys, np.uint64)])
    live_rows = np.flatnonzero(self._valid).astype(np.int32)
    self._index[:len(live_rows)].assign(live_rows)
    self.num_transitions.assign(len(live_rows))
    new_rows = (np.concatenate(new_rows) if new_rows
                else np.zeros(0, np.int64))
    evicted_rows = np.setdiff1d(evicted_rows, new_rows)
    evicted_keys = np.asarray([k for k in self._evicted_keys if k],
                              np.uint64)
    self._evicted_keys = []
    return Added(evicted_rows, new_rows, len(episodes) - skipped,
                 int(len(new_rows)), skipped, evicted_keys)

  def _check_episode(self, number: int, episode: Any) -> list[np.ndarray]:
    try:
      tf.nest.assert_same_structure(self.data_spec, episode,
                                    check_types=False)
    except (TypeError, ValueError) as e:
      raise ValueError(f'episode {number} does not have the structure of the '
                       f'data spec: {e}') from None
    leaves = [np.asarray(x) for x in tree.flatten(episode)]
    length = len(leaves[0]) if leaves[0].ndim else -1
    for path, spec, leaf in zip(self._paths, tree.flatten(self.data_spec),
                                leaves):
      where = '/'.join(map(str, path))
      if leaf.ndim == 0 or len(leaf) != length:
        raise ValueError(f'episode {number} field {where} has shape '
                         f'{leaf.shape}; every field needs {length} steps')
      if tuple(leaf.shape[1:]) != tuple(spec.shape.as_list()):
        raise ValueError(f'episode {number} field {where} has steps of shape '
                         f'{list(leaf.shape[1:])}, the spec says '
                         f'{spec.shape.as_list()}')
    if length > self.capacity:
      raise ValueError(f'episode {number} has {length} steps, more than the '
                       f'memory holds ({self.capacity} rows)')
    return leaves

  def _evict(self, start: int, end: int) -> np.ndarray:
    """Drops live episodes overlapping rows [start, end); their rows."""
    overlap = (self._starts < end) & (start < self._starts + self._lengths)
    if not overlap.any():
      return np.zeros(0, np.int64)
    rows = np.concatenate([np.arange(s, s + n) for s, n in
                           zip(self._starts[overlap], self._lengths[overlap])])
    keep = ~overlap
    self._evicted_keys.extend(int(k) for k in self._keys[overlap])
    self._starts, self._lengths = self._starts[keep], self._lengths[keep]
    self._keys = self._keys[keep]
    return rows

  # --------------------------------------------------------------- reading

  def sample_rows(self, batch_size: int) -> tf.Tensor:
    """Rows of `batch_size` transitions drawn uniformly (with replacement).

    Learners draw only once the memory holds a transition (the replay's
    `ready`); eagerly an empty memory fails with a message that says so.
    """
    if tf.executing_eagerly() and int(self.num_transitions) == 0:
      raise tf.errors.InvalidArgumentError(
          None, None, 'the replay memory holds no transition yet')
    slot = tf.random.uniform([batch_size], 0, self.num_transitions, tf.int32)
    return tf.gather(self._index, slot)

  def frame_rows(self, rows: tf.Tensor) -> tf.Tensor:
    """Rows of the frames stacked at `rows`: [..., frame_stack], oldest
    first, none before the first row of the row's episode."""
    if self.frame_stack == 1:
      return rows[..., None]
    first = tf.cast(tf.gather(self.episode_first, rows), rows.dtype)
    offsets = tf.range(1 - self.frame_stack, 1, dtype=rows.dtype)
    return tf.maximum(rows[..., None] + offsets, first[..., None])

  def read(self, rows: tf.Tensor) -> Any:
    """The stored steps at `rows` (any shape), floats cast, frames stacked."""
    return tree.unflatten_as(self.data_spec, self._read_leaves(rows, None))

  def read_fields(self, rows: tf.Tensor, fields: Sequence[str]
                  ) -> dict[str, tf.Tensor]:
    """Only the top-level fields `fields` (tensors, not nests) at `rows`:
    what n-step sums need, without fetching any frame."""
    paths = [path for path in self._paths if path[0] in fields]
    leaves = self._read_leaves(rows, set(paths))
    return {path[0]: leaf for path, leaf in zip(self._paths, leaves)
            if path in paths}

  def _read_leaves(self, rows: tf.Tensor,
                   paths: Optional[set[tuple[Any, ...]]]) -> list[Any]:
    """The leaves at `rows` in spec order; None for those `paths` leaves
    out (None: every leaf)."""
    rows = tf.convert_to_tensor(rows)
    wanted = [paths is None or path in paths for path in self._paths]
    gathered = {}
    for group, column in zip(self._groups, self._columns):
      if not any(w for w, layout in zip(wanted, self._layout)
                 if layout[0] == group):
        continue
      dtype, stacked = group
      x = tf.gather(column, self.frame_rows(rows) if stacked else rows)
      if (self._float_dtype is not None and dtype.is_floating
          and dtype != self._float_dtype):
        x = tf.cast(x, self._float_dtype)
      gathered[group] = x
    outer = (rows.shape.as_list() if rows.shape.is_fully_defined()
             else tf.shape(rows))
    leaves = []
    for want, (group, offset, width, shape) in zip(wanted, self._layout):
      if not want:
        leaves.append(None)
        continue
      x = gathered[group]
      if width != x.shape[-1]:
        x = x[..., offset:offset + width]
      if group[1]:
        leaves.append(self._stack(x, outer, shape))
      elif isinstance(outer, list):
        leaves.append(tf.reshape(x, outer + shape))
      else:
        leaves.append(tf.reshape(x, tf.concat([outer, shape], 0)))
    return leaves

  def _stack(self, frames: tf.Tensor, outer: Any, shape: list[int]
             ) -> tf.Tensor:
    """[..., k, H*W*C] flat frames -> [..., k, H, W(, C)]."""
    target = stacked_shape(shape, self.frame_stack)
    if isinstance(outer, list):
      return tf.reshape(frames, outer + target)
    return tf.reshape(frames, tf.concat([outer, target], 0))

  def transitions(self, rows: tf.Tensor, *, n_step: int = 1,
                  gamma: float = 0.99) -> Any:
    """The 2-step items of the transitions starting at `rows`, [B, 2, ...].

    With `n_step` > 1 the item spans t -> t + m, m = n_step or fewer where
    the episode ends first: reward[:, 0] is the discounted sum of the m
    rewards and discount[:, 0] is gamma^(m-1) times the product of their
    discounts, so an agent's usual target r + gamma * d * V(s') is the
    n-step target. A terminal zeroes the product (no bootstrap); a
    truncated ending keeps it and bootstraps on the final observation.
    """
    if n_step == 1:
      return self.read(tf.stack([rows, rows + 1], axis=1))
    offsets = tf.range(n_step, dtype=rows.dtype)
    window = tf.minimum(rows[:, None] + offsets[None, :], self.capacity - 1)
    steps = self.read_fields(window, ('step_type', 'reward', 'discount'))
    # Transition t + k exists while none of the steps t + 1 .. t + k is an
    # episode's last step.
    is_last = tf.equal(tf.cast(steps['step_type'][:, 1:], tf.int32), _LAST)
    alive = tf.concat([tf.ones_like(rows[:, None], tf.bool),
                       tf.equal(tf.cumsum(tf.cast(is_last, tf.int32),
                                          axis=1), 0)], axis=1)
    alive_f = tf.cast(alive, tf.float32)
    discount = tf.cast(steps['discount'], tf.float32) * alive_f
    reward = tf.cast(steps['reward'], tf.float32) * alive_f
    # Discount applied before reward k: gamma^k * d_t ... d_{t+k-1}.
    before = tf.math.cumprod(gamma * discount, axis=1, exclusive=True)
    n_reward = tf.reduce_sum(before * reward, axis=1)
    m = tf.reduce_sum(tf.cast(alive, rows.dtype), axis=1)
    n_discount = tf.reduce_prod(tf.where(alive, discount, 1.0), axis=1) * (
        gamma ** tf.cast(m - 1, tf.float32))
    pair = self.read(tf.stack([rows, rows + m], axis=1))
    next_step_type = self.read_fields(rows + m - 1,
                                      ('next_step_type',))['next_step_type']

    def first_is(x, value):
      value = tf.cast(value, x.dtype)
      return tf.concat([value[:, None], x[:, 1:]], axis=1)

    return pair._replace(
        reward=first_is(pair.reward, n_reward),
        discount=first_is(pair.discount, n_discount),
        next_step_type=first_is(pair.next_step_type, next_step_type))

  def sample(self, batch_size: int, *, n_step: int = 1,
             gamma: float = 0.99) -> Any:
    return self.transitions(self.sample_rows(batch_size), n_step=n_step,
                            gamma=gamma)


def from_episodes(data_spec: Any, episodes: Sequence[Any],
                  keys: Sequence[int] | None = None, *,
                  capacity: int | None = None, **kwargs: Any
                  ) -> TransitionMemory:
  """A memory just big enough for `episodes` (offline data), filled."""
  steps = sum(len(tree.flatten(e)[0]) for e in episodes)
  memory = TransitionMemory(data_spec, capacity or max(steps, 1), **kwargs)
  memory.add(episodes, keys)
  return memory
