"""Item writers: what TF-Agents' Reverb observers write, at Reverb's speed.

Each writer takes whole episodes of converted trajectories as numpy columns
(the flattened `Trajectory`, time first) and writes the items the matching
observer would, through Reverb's C++ trajectory writer directly (its Python
wrapper's bookkeeping costs more than the write). `ParallelWriter` runs
several writers on threads: the C++ writer releases the GIL, so they overlap.
"""

from __future__ import annotations

import collections
import queue
import threading
from typing import Any, Callable, List, Sequence

import numpy as np
import reverb
from reverb import pybind
from tf_agents.trajectories import time_step as ts

_LAST = int(ts.StepType.LAST)
# Steps per chunk of the window writer: larger chunks cost fewer messages and
# compressions, too large ones delay items until the chunk closes.
_CHUNK_LENGTH = 10
# Items a writer may leave unconfirmed before it waits for the server; Reverb
# logs warnings once 50 are pending, a flush every 24 items keeps it under 48.
_MAX_PENDING_ITEMS = 24
# Episode writers (one per episode length) kept open at once.
_MAX_OPEN_EPISODE_WRITERS = 16


class WindowWriter:
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


class EpisodeWriter:
  """Writes the items of `ReverbAddEpisodeObserver`: one per segment.

  A segment (trajectories up to and including a LAST one) is appended as a
  single Reverb step holding the whole [T, ...] arrays and referenced
  squeezed, so the item reads back as exactly the [T, ...] tensors that the
  observer's T single-step appends give, at the cost of one append. Reverb
  fixes a column's shape at its first append, so there is one C++ writer per
  segment length (the few most recent are kept open).
  """

  def __init__(self, client: reverb.Client, table_name: str, priority: float,
               priority_fn: Callable[[int], float] | None = None):
    """`priority_fn(steps)`, if given, sets each item's priority from its
    length instead (HER: transitions per episode, for uniform transitions)."""
    self._client = client
    self._table = table_name
    self._priority = float(priority)
    self._priority_fn = priority_fn
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
      priority = (self._priority if self._priority_fn is None else
                  float(self._priority_fn(len(segment[0]))))
      writer.CreateItem(self._table, priority, [[r] for r in refs],
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


class ParallelWriter:
  """Writes on worker threads; with several, episodes are spread over them.

  Items of one segment (up to a LAST trajectory) come from one writer, in
  order, exactly as with a single writer; only the order *between* segments
  in the table changes. An episode that does not end its segment goes to the
  same writer as the episode that continues it.
  """

  def __init__(self, make_writer: Callable[[], Any], num_workers: int):
    self._writers = [make_writer() for _ in range(num_workers)]
    # Two episodes in flight per worker keep them busy while bounding memory.
    self._queues = [queue.Queue(maxsize=2) for _ in range(num_workers)]
    self._errors: List[BaseException] = []
    self._threads = [
        threading.Thread(target=self._run, args=(w, q), daemon=True)
        for w, q in zip(self._writers, self._queues)]
    for thread in self._threads:
      thread.start()
    self._next = 0
    self._continues_segment = False

  def _run(self, writer: Any, episodes: queue.Queue) -> None:
    while True:
      work = episodes.get()
      if work is None:
        return
      if self._errors:
        continue  # Drain without writing once a sibling failed.
      try:
        writer.write(*work)
      except BaseException as e:  # pylint: disable=broad-except
        self._errors.append(e)

  @property
  def items(self) -> int:
    return sum(writer.items for writer in self._writers)

  def write(self, columns: Sequence[np.ndarray], step_type: np.ndarray) -> None:
    if self._errors:
      raise self._errors[0]
    self._queues[self._next].put((columns, step_type))
    self._continues_segment = step_type[-1] != _LAST
    if not self._continues_segment:
      self._next = (self._next + 1) % len(self._queues)

  def close(self) -> None:
    if self._threads:
      for episodes in self._queues:
        episodes.put(None)
      for thread in self._threads:
        thread.join()
      self._threads = []
      for writer in self._writers:
        writer.close()
    if self._errors:
      raise self._errors[0]
