"""Trajectories -> Reverb tables: TF-Agents' observer path and a fast path.

`push_rlds_to_reverb` keeps TF-Agents' signature and feeds any observer.
`push_rlds_to_table` writes the very items that TF-Agents'
`ReverbAddTrajectoryObserver` (fixed-length windows) or
`ReverbAddEpisodeObserver` (whole episodes) would write, without a Python
call per trajectory field: episodes arrive converted as whole numpy arrays,
steps go to Reverb's C++ trajectory writer directly, and an episode item is
one append of the whole episode.
"""

import collections
import dataclasses
import re
import time
from typing import Any, Callable, List, Optional, Sequence

from absl import logging
import numpy as np
import reverb
from reverb import pybind
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from rlds_reverb import convert
from rlds_reverb import tables

_LAST = int(ts.StepType.LAST)
# Steps per chunk of the window writer: larger chunks cost fewer messages and
# compressions, too large ones delay items until the chunk closes.
_CHUNK_LENGTH = 10
# Items a writer may leave unconfirmed before it waits for the server; Reverb
# logs warnings once 50 are pending, a flush every 24 items keeps it under 48.
_MAX_PENDING_ITEMS = 24
# Episode writers (one per episode length) kept open at once.
_MAX_OPEN_EPISODE_WRITERS = 16


@dataclasses.dataclass
class PushStats:
  """Running totals of a push; valid even when the push stops on an error."""
  episodes: int = 0
  steps: int = 0
  items: int = 0
  terminated: int = 0
  truncated: int = 0
  empty_episodes: int = 0  # Episodes without steps: nothing to write.
  seconds: float = 0.0

  @property
  def steps_per_second(self) -> float:
    return self.steps / self.seconds if self.seconds > 0 else 0.0


def push_rlds_to_reverb(
    rlds_data: tf.data.Dataset,
    reverb_observer: Any,
    policy_info_fn: convert.PolicyInfoFn = None,
) -> int:
  """Pushes RLDS data through a TF-Agents Reverb observer.

  Drop-in for `tf_agents.replay_buffers.rlds_to_reverb.push_rlds_to_reverb`.
  The observer is still called once per trajectory (it owns the item
  logic), but the conversion feeding it is done per episode.

  Args:
    rlds_data: An RLDS dataset of episodes.
    reverb_observer: A `ReverbAddTrajectoryObserver` or
      `ReverbAddEpisodeObserver` (anything with `get_table_signature()` that is
      called with single trajectories).
    policy_info_fn: Optional per-step `(cur_step, next_step) -> policy_info`.

  Returns:
    The number of trajectories pushed.

  Raises:
    ValueError: If no RLDS steps exist in rlds_data.
    ValueError: If step spec for rlds_data is not valid.
    ValueError: If the observer's table signature does not match the data
      spec of `rlds_data`.
    InvalidArgumentError: For invalid episodes (see
      `convert_rlds_to_trajectories`); nothing of that episode is pushed.
  """
  table_signature_spec = reverb_observer.get_table_signature()
  if table_signature_spec != tensor_spec.add_outer_dim(
      convert.create_trajectory_data_spec(rlds_data)):
    raise ValueError(tables.SIGNATURE_MISMATCH)

  steps = 0
  for episode in convert.convert_rlds_to_episodes(
      rlds_data, policy_info_fn).as_numpy_iterator():
    traj = episode.trajectory
    for t in range(len(traj.step_type)):
      reverb_observer(tf.nest.map_structure(lambda x, t=t: x[t], traj))
    steps += len(traj.step_type)
  logging.info('Successfully wrote %d steps to Reverb.', steps)
  return steps


def _validate_arguments(sequence_length: Optional[int], stride_length: int,
                        priority: float) -> None:
  if sequence_length is not None and (
      not isinstance(sequence_length, (int, np.integer))
      or sequence_length < 1):
    raise ValueError(
        f'sequence_length must be a positive integer or None (whole '
        f'episodes), got {sequence_length!r}.')
  if not isinstance(stride_length, (int, np.integer)) or stride_length < 1:
    raise ValueError(
        f'stride_length must be a positive integer, got {stride_length!r}.')
  if not np.isfinite(priority) or priority < 0:
    raise ValueError(
        f'priority must be a finite number >= 0, got {priority!r}.')


class _WindowWriter:
  """Writes the items of `ReverbAddTrajectoryObserver`, item logic included.

  Windows of `sequence_length` trajectories, a new one every `stride_length`
  steps, counted from the start of each segment; a segment ends after a
  trajectory whose step_type is LAST, exactly where the observer resets.
  """

  def __init__(self, client: reverb.Client, table_name: str,
               sequence_length: int, stride_length: int, priority: float):
    self._table = table_name
    self._length = sequence_length
    self._stride = stride_length
    self._priority = float(priority)
    chunk = max(_CHUNK_LENGTH, sequence_length)
    # The C++ writer behind `reverb.Client.trajectory_writer`, used without
    # its Python wrapper, whose bookkeeping costs more than the write.
    self._writer = client._client.NewTrajectoryWriter(  # pylint: disable=protected-access
        pybind.ConstantChunkerOptions(chunk, chunk + sequence_length), False)
    self._window = collections.deque(maxlen=sequence_length)
    self._cached = 0
    self.items = 0

  def _steps_cached(self, step_type: np.ndarray) -> np.ndarray:
    """Steps in the observer's cache after each append (its item clock)."""
    index = np.arange(len(step_type))
    segment_start = np.full(len(step_type), -self._cached)
    restarts = np.flatnonzero(step_type[:-1] == _LAST) + 1
    segment_start[restarts] = restarts
    return index - np.maximum.accumulate(segment_start) + 1

  def write(self, columns: Sequence[np.ndarray], step_type: np.ndarray) -> None:
    cached = self._steps_cached(step_type)
    makes_item = ((cached >= self._length)
                  & ((cached - self._length) % self._stride == 0))
    ends_segment = step_type == _LAST
    append, create_item = self._writer.Append, self._writer.CreateItem
    table, priority, window = self._table, self._priority, self._window
    squeeze = [False] * len(columns)
    for row, make_item, end in zip(zip(*columns), makes_item.tolist(),
                                   ends_segment.tolist()):
      window.append(append(row))
      if make_item:
        create_item(table, priority, list(zip(*window)), squeeze)
        self.items += 1
        if self.items % _MAX_PENDING_ITEMS == 0:
          self._writer.Flush(_MAX_PENDING_ITEMS, -1)
      if end:
        self._writer.EndEpisode(True, None)
        window.clear()
    self._cached = 0 if ends_segment[-1] else int(cached[-1])

  def close(self) -> None:
    if self._writer is not None:
      self._writer.Flush(0, -1)
      self._writer.Close()
      self._writer = None


class _EpisodeWriter:
  """Writes the items of `ReverbAddEpisodeObserver`: one per segment.

  A segment (trajectories up to and including a LAST one) is appended as a
  single Reverb step holding the whole [T, ...] arrays and referenced
  squeezed, so the item reads back as exactly the [T, ...] tensors that the
  observer's T single-step appends give, at the cost of one append. Reverb
  fixes a column's shape at its first append, so there is one C++ writer per
  segment length (the few most recent are kept open).
  """

  def __init__(self, client: reverb.Client, table_name: str, priority: float):
    self._client = client
    self._table = table_name
    self._priority = float(priority)
    self._writers: collections.OrderedDict = collections.OrderedDict()
    self._pending: List[List[np.ndarray]] = []  # Segment cut by an episode.
    self.items = 0

  def _writer_for(self, length: int) -> Any:
    writer = self._writers.pop(length, None)
    if writer is None:
      if len(self._writers) >= _MAX_OPEN_EPISODE_WRITERS:
        _, oldest = self._writers.popitem(last=False)
        oldest.Flush(0, -1)
        oldest.Close()
      writer = self._client._client.NewTrajectoryWriter(  # pylint: disable=protected-access
          pybind.ConstantChunkerOptions(1, 1), False)
    self._writers[length] = writer  # Most recently used last.
    return writer

  def write(self, columns: Sequence[np.ndarray], step_type: np.ndarray) -> None:
    ends = np.flatnonzero(step_type == _LAST) + 1
    start = 0
    for end in ends:
      parts = self._pending + [[c[start:end] for c in columns]]
      self._pending = []
      segment = (parts[0] if len(parts) == 1 else
                 [np.concatenate(cols) for cols in zip(*parts)])
      writer = self._writer_for(len(segment[0]))
      refs = writer.Append(segment)
      writer.CreateItem(self._table, self._priority, [[r] for r in refs],
                        [True] * len(refs))
      self.items += 1
      if self.items % _MAX_PENDING_ITEMS == 0:
        writer.Flush(_MAX_PENDING_ITEMS, -1)
      start = end
    if start < len(step_type):
      self._pending.append([c[start:] for c in columns])

  def close(self) -> None:
    for writer in self._writers.values():
      writer.Flush(0, -1)
      writer.Close()
    self._writers.clear()


def _invalid_episode_error(error: tf.errors.InvalidArgumentError,
                           items: int, table_name: str) -> Exception:
  """The conversion's error, cleaned to one line, plus what was written."""
  found = re.search(r'assertion failed: \[(.*?)\]', error.message)
  reason = found.group(1) if found else error.message.splitlines()[0]
  return tf.errors.InvalidArgumentError(
      error.node_def, error.op,
      f'{reason}; {items} items were already written to table '
      f'{table_name!r}, none from this episode.')


def _count_episode(stats: PushStats, episode: convert.EpisodeTrajectories
                   ) -> None:
  step_type = episode.trajectory.step_type
  if stats.episodes == 0:
    stats.empty_episodes += int(episode.episode_index)
  stats.empty_episodes += int(
      episode.next_episode_index - episode.episode_index - 1)
  stats.episodes += 1
  stats.steps += len(step_type)
  if step_type[-1] == _LAST:
    if episode.is_terminal[-1]:
      stats.terminated += 1
    else:
      stats.truncated += 1


def push_rlds_to_table(
    rlds_data: tf.data.Dataset,
    client: reverb.Client,
    table_name: str,
    *,
    sequence_length: Optional[int] = 2,
    stride_length: int = 1,
    priority: float = 1.0,
    policy_info_fn: convert.PolicyInfoFn = None,
    zero_terminal_discount: bool = False,
    stats: Optional[PushStats] = None,
    progress: Optional[Callable[[int], None]] = None,
) -> int:
  """Pushes RLDS data into a Reverb table, fast.

  Writes the same items as `ReverbAddTrajectoryObserver(client, table_name,
  sequence_length, stride_length, priority)` fed by `push_rlds_to_reverb`
  (or, with `sequence_length=None`, as `ReverbAddEpisodeObserver`: one item
  per episode), readable by TF-Agents' `ReverbReplayBuffer`.

  Args:
    rlds_data: An RLDS dataset of episodes.
    client: Client of the Reverb server that holds `table_name`.
    table_name: Table to write to; its signature must be the trajectory spec
      of the data with an outer time dimension.
    sequence_length: Trajectories per item, or None for whole episodes.
    stride_length: Steps between the starts of consecutive items.
    priority: Priority of every item.
    policy_info_fn: Optional per-step `(cur_step, next_step) -> policy_info`.
    zero_terminal_discount: Zero the discount of the step whose next step is
      last and terminal (see `convert_rlds_to_episodes`).
    stats: Optional `PushStats` updated in place as episodes are written.
    progress: Optional callback, called with the step count of each episode
      once it is written (for a progress bar).

  Returns:
    The number of trajectories (RLDS steps) pushed, as `push_rlds_to_reverb`.

  Raises:
    ValueError: If an argument is out of range, the table does not exist, or
      its signature does not match the data (TF-Agents' message, then the
      differences).
    ValueError: If no RLDS steps exist in rlds_data or the step spec is not
      valid.
    InvalidArgumentError: At the first invalid episode, before any of it is
      written; the message names episode and step and how many items were
      already written.
  """
  _validate_arguments(sequence_length, stride_length, priority)
  stats = stats if stats is not None else PushStats()
  episodes = convert.convert_rlds_to_episodes(
      rlds_data, policy_info_fn, zero_terminal_discount=zero_terminal_discount)
  trajectory_spec = episodes.element_spec.trajectory
  per_step_spec = tf.nest.map_structure(
      lambda s: tf.TensorSpec(s.shape[1:], s.dtype), trajectory_spec)
  tables.check_signature(client, table_name, per_step_spec)

  if sequence_length is None:
    writer = _EpisodeWriter(client, table_name, priority)
  else:
    writer = _WindowWriter(client, table_name, sequence_length, stride_length,
                           priority)
  start = time.perf_counter()
  iterator = episodes.as_numpy_iterator()
  try:
    while True:
      try:
        episode = next(iterator)
      except StopIteration:
        break
      except tf.errors.InvalidArgumentError as e:
        writer.close()
        raise _invalid_episode_error(e, writer.items, table_name) from None
      writer.write(tf.nest.flatten(episode.trajectory),
                   episode.trajectory.step_type)
      _count_episode(stats, episode)
      stats.items = writer.items
      stats.seconds = time.perf_counter() - start
      if progress is not None:
        progress(len(episode.trajectory.step_type))
  finally:
    # Whatever stopped the push, what was written reaches the server and
    # `stats` counts it.
    writer.close()
    stats.items = writer.items
    stats.seconds = time.perf_counter() - start
  logging.info('Wrote %d steps as %d items to Reverb table %r.', stats.steps,
               writer.items, table_name)
  return stats.steps
