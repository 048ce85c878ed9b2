"""Item writers: what TF-Agents' Reverb observers write, at Reverb's speed.

Each writer takes whole episodes of converted trajectories as numpy columns
(the flattened `Trajectory`, time first) and writes the items the matching
observer would, through Reverb's C++ trajectory writer directly (its Python
wrapper's bookkeeping costs more than the write). `ParallelWriter` runs
several writers on threads: the C++ writer releases the GIL, so they overlap.

Every wait for the server (a flush, the end of an episode) has a deadline
when `timeout_s` is given: a server that dies mid-push makes the writer raise
`ServerTimeoutError` within it instead of waiting forever.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from typing import Any, Callable, List, NamedTuple, Optional, Sequence

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
# How often a waiting main thread looks for a failed writer thread.
_POLL_S = 0.2


class ServerTimeoutError(TimeoutError):
  """The server did not confirm the written items within the deadline."""


def _wait(call: Callable[..., None], *args: Any, timeout_s: Optional[float],
          forever: Optional[int] = -1) -> None:
  """Runs a blocking C++ writer call (Flush, EndEpisode) with its deadline.

  The deadline is in milliseconds; no deadline is -1 for Flush but None for
  EndEpisode (which takes -1 as "do not wait" and fails at once).
  """
  timeout_ms = forever if timeout_s is None else max(1, int(timeout_s * 1e3))
  try:
    call(*args, timeout_ms)
  except RuntimeError as e:
    if 'Timeout exceeded' not in str(e):
      raise
    raise ServerTimeoutError(
        f'the server did not confirm items within {timeout_s:g}s '
        f'({e})') from None


class WindowWriter:
  """Writes the items of `ReverbAddTrajectoryObserver`, item logic included.

  Windows of `sequence_length` trajectories, a new one every `stride_length`
  steps, counted from the start of each segment; a segment ends after a
  trajectory whose step_type is LAST, exactly where the observer resets.
  """

  def __init__(self, client: reverb.Client, table_name: str,
               sequence_length: int, stride_length: int, priority: float,
               timeout_s: Optional[float] = None):
    self._timeout_s = timeout_s
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

  def plan(self, step_type: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which steps of the next episode end an item, and which a segment.

    Advances the item clock: episodes must then be written in the order they
    were planned (`ParallelWriter` plans on its caller's thread, in order).
    """
    cached = self._steps_cached(step_type)
    makes_item = ((cached >= self._length)
                  & ((cached - self._length) % self._stride == 0))
    ends_segment = step_type == _LAST
    self._cached = 0 if ends_segment[-1] else int(cached[-1])
    return makes_item, ends_segment

  @staticmethod
  def items_of(plan: tuple[np.ndarray, np.ndarray]) -> int:
    return int(np.count_nonzero(plan[0]))

  def write(self, columns: Sequence[np.ndarray], step_type: np.ndarray) -> None:
    self.write_planned(columns, self.plan(step_type))

  def write_planned(self, columns: Sequence[np.ndarray],
                    plan: tuple[np.ndarray, np.ndarray]) -> None:
    makes_item, ends_segment = plan
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
          _wait(self._writer.Flush, _MAX_PENDING_ITEMS,
                timeout_s=self._timeout_s)
      if end:
        # Ends Reverb's episode and waits until its items are confirmed.
        _wait(self._writer.EndEpisode, True, timeout_s=self._timeout_s,
              forever=None)
        window.clear()

  def flush(self) -> None:
    """Waits until the server confirmed every item written so far."""
    if self._writer is not None:
      _wait(self._writer.Flush, 0, timeout_s=self._timeout_s)

  def close(self, abort: bool = False) -> None:
    """Flushes (unless `abort`: what is unconfirmed may be lost) and closes."""
    if self._writer is not None:
      try:
        if not abort:
          self.flush()
      finally:
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
               priority_fn: Callable[[int], float] | None = None,
               timeout_s: Optional[float] = None):
    """`priority_fn(steps)`, if given, sets each item's priority from its
    length instead (HER: transitions per episode, for uniform transitions)."""
    self._timeout_s = timeout_s
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
        try:
          _wait(oldest.Flush, 0, timeout_s=self._timeout_s)
        finally:
          oldest.Close()
      writer = self._client._client.NewTrajectoryWriter(  # pylint: disable=protected-access
          pybind.ConstantChunkerOptions(1, 1), False)
    self._writers[length] = writer  # Most recently used last.
    return writer

  @staticmethod
  def plan(step_type: np.ndarray) -> np.ndarray:
    """The next episode's step types (one item per segment: no state)."""
    return step_type

  @staticmethod
  def items_of(plan: np.ndarray) -> int:
    return int(np.count_nonzero(plan == _LAST))

  def write_planned(self, columns: Sequence[np.ndarray],
                    plan: np.ndarray) -> None:
    self.write(columns, plan)

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
        _wait(writer.Flush, _MAX_PENDING_ITEMS, timeout_s=self._timeout_s)
      start = end
    if start < len(step_type):
      self._pending.append([c[start:] for c in columns])

  def flush(self) -> None:
    """Waits until the server confirmed every item written so far."""
    for writer in self._writers.values():
      _wait(writer.Flush, 0, timeout_s=self._timeout_s)

  def close(self, abort: bool = False) -> None:
    """Flushes (unless `abort`: what is unconfirmed may be lost) and closes."""
    try:
      if not abort:
        self.flush()
    finally:
      for writer in self._writers.values():
        writer.Close()
      self._writers.clear()


class Planned(NamedTuple):
  """An episode assigned to a writer, and the items it will create there."""
  writer: int
  plan: Any
  items: int


class ParallelWriter:
  """Writes on worker threads; with several, episodes are spread over them.

  Items of one segment (up to a LAST trajectory) come from one writer, in
  order, exactly as with a single writer; only the order *between* segments
  in the table changes. An episode that does not end its segment goes to the
  same writer as the episode that continues it.

  The caller's thread never waits on the server without a bound: it waits
  for room in a worker's queue or for a `flush`, and gives up with the
  workers' error once one failed (each server wait of a worker has the
  writers' deadline). `close(abort=True)` returns within about
  `join_timeout_s` whatever the workers are doing.
  """

  def __init__(self, make_writer: Callable[[], Any], num_workers: int,
               join_timeout_s: Optional[float] = None):
    self._writers = [make_writer() for _ in range(num_workers)]
    # Two episodes in flight per worker keep them busy while bounding memory.
    self._queues = [queue.Queue(maxsize=2) for _ in range(num_workers)]
    self._errors: List[BaseException] = []
    self._abort = threading.Event()
    self._join_timeout_s = join_timeout_s
    self._threads = [
        threading.Thread(target=self._run, args=(i, w, q), daemon=True)
        for i, (w, q) in enumerate(zip(self._writers, self._queues))]
    # Per worker, the dataset position after the last episode it wrote: set
    # on the worker's thread right after its items, so the two agree however
    # the caller's thread is interrupted (Ctrl-C lands there only).
    self._positions: List[Optional[int]] = [None] * num_workers
    for thread in self._threads:
      thread.start()
    self._next = 0

  def _run(self, index: int, writer: Any, work_queue: queue.Queue) -> None:
    while True:
      work = work_queue.get()
      if work is None:
        return
      if isinstance(work, threading.Event):  # A flush: confirm, then signal.
        try:
          if not (self._errors or self._abort.is_set()):
            writer.flush()
        except BaseException as e:  # pylint: disable=broad-except
          self._errors.append(e)
        finally:
          work.set()
        continue
      if self._errors or self._abort.is_set():
        continue  # Drain without writing once a sibling failed.
      columns, plan, position = work
      try:
        writer.write_planned(columns, plan)
      except BaseException as e:  # pylint: disable=broad-except
        self._errors.append(e)
      else:
        if position is not None:
          self._positions[index] = position

  @property
  def items(self) -> int:
    """Items created so far (handed to Reverb; not all confirmed yet)."""
    return sum(writer.items for writer in self._writers)

  @property
  def position(self) -> Optional[int]:
    """The `position` given with the latest episode written (None before
    any): once `flush` or `close` returned, `items` holds the items of every
    episode handed over up to it, and of none after."""
    written = [p for p in self._positions if p is not None]
    return max(written) if written else None

  def _raise_if_failed(self) -> None:
    if self._errors:
      raise self._errors[0]

  def _put(self, work_queue: queue.Queue, work: Any) -> None:
    while True:
      self._raise_if_failed()
      try:
        work_queue.put(work, timeout=_POLL_S)
        return
      except queue.Full:
        continue

  def plan(self, step_type: np.ndarray) -> Planned:
    """Assigns the next episode to a writer and counts its items there.

    Episodes must be planned and then written in the same order.
    """
    writer = self._writers[self._next]
    plan = writer.plan(step_type)
    planned = Planned(self._next, plan, writer.items_of(plan))
    if step_type[-1] == _LAST:  # Else the next episode continues this one.
      self._next = (self._next + 1) % len(self._writers)
    return planned

  def write(self, columns: Sequence[np.ndarray], step_type: np.ndarray,
            planned: Optional[Planned] = None,
            position: Optional[int] = None) -> None:
    """Queues an episode (planned with `plan`, or planned here); `position`
    (increasing) is where it ends in the dataset, see `position`."""
    if planned is None:
      planned = self.plan(step_type)
    self._put(self._queues[planned.writer], (columns, planned.plan, position))

  def flush(self) -> None:
    """Waits until every item written so far is confirmed by the server.

    Raises:
      The first error of a worker (e.g. `ServerTimeoutError`).
    """
    events = [threading.Event() for _ in self._queues]
    for work_queue, event in zip(self._queues, events):
      self._put(work_queue, event)
    for event in events:
      while not event.wait(_POLL_S):
        self._raise_if_failed()
    self._raise_if_failed()

  def close(self, abort: bool = False) -> None:
    """Writes what is queued, flushes and closes; re-raises a worker's error.

    With `abort`, queued episodes are dropped, nothing is flushed (what was
    not confirmed may be lost) and no error is raised. Waits at most `join_timeout_s` per worker
    then (a worker stuck in a server call past it is left behind, with its
    writer).
    """
    if self._threads:
      if abort:
        self._abort.set()
        for work_queue in self._queues:
          _drain(work_queue)
      for work_queue in self._queues:
        # A failed worker drains its queue, an aborted one was drained: the
        # stop always finds room, at worst after a worker's server wait.
        while True:
          if abort:
            _drain(work_queue)
          try:
            work_queue.put(None, timeout=_POLL_S)
            break
          except queue.Full:
            continue
      deadline = (None if not abort or self._join_timeout_s is None else
                  time.monotonic() + self._join_timeout_s)
      for thread in self._threads:
        while thread.is_alive():
          thread.join(_POLL_S)
          if deadline is not None and time.monotonic() > deadline:
            break
      stopped = [not thread.is_alive() for thread in self._threads]
      self._threads = []
      for writer, done in zip(self._writers, stopped):
        if done:  # Never close a writer that a live thread is using.
          try:
            writer.close(abort=abort or bool(self._errors))
          except BaseException as e:  # pylint: disable=broad-except
            self._errors.append(e)
    if not abort:  # An abort has its reason already; it raises no other.
      self._raise_if_failed()


def _drain(work_queue: queue.Queue) -> None:
  while True:
    try:
      work = work_queue.get_nowait()
    except queue.Empty:
      return
    if isinstance(work, threading.Event):
      work.set()
