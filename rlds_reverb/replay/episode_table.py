"""Whole-episode Reverb tables that a learner reads in bulk, each item once.

Reverb has no call that lists a table's items, and its samplers draw with
replacement, so "read everything once" needs a table whose sampler can be
steered. An episode table samples with a min-heap on the item priority, and
the priority records when the item was last read by a learner:

  * writers insert at priority 0 (`UNREAD`), the lowest there is;
  * a reader that takes an item sets its priority to the read time, so the
    heap always hands out the least recently read item first;
  * a full read (`read_all`) samples until it meets an item it already took
    in this pass: every item read before this pass has an older time, so by
    then every item has been read exactly once;
  * an incremental read (`read_new`) takes items while the heap's top is
    still unread, which is how a learner picks up what actors wrote since.

A reader's calls on the server have deadlines, and a client with a
`server_link.ServerLink` attached waits for a lost server to come back.

The same table is the store of record (checkpoints, remote writers) and the
learner's queue, and the episode keys stay the table's own, so per-step
state such as PER priorities can be written back against them. One learner
reads a table at a time: two would take turns with the same clock.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Iterator, List, Optional

import numpy as np
import reverb
import tree
from tf_agents.specs import tensor_spec

from rlds_reverb.storage import server_link
from rlds_reverb.storage import tables

UNREAD = 0.0


@dataclasses.dataclass
class Episode:
  """One episode item: its Reverb key and its per-step columns [L, ...]."""
  key: int
  data: Any  # nest of numpy arrays shaped like the table's per-step spec


def make_table(name: str, data_spec: Any, *, max_episodes: int) -> reverb.Table:
  """A table of whole episodes for in-memory learners, oldest evicted first.

  Write into it with `push_rlds_to_table(..., sequence_length=None,
  priority=UNREAD)` (or an actor that does the same); read it with
  `EpisodeReader`.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f'name must be a non-empty string, got {name!r}.')
  if (isinstance(max_episodes, bool) or not isinstance(max_episodes, int)
      or max_episodes < 1):
    raise ValueError(f'max_episodes must be a positive integer, got '
                     f'{max_episodes!r}.')
  signature = tensor_spec.add_outer_dim(tensor_spec.from_spec(data_spec))
  return reverb.Table(
      name=name, sampler=reverb.selectors.MinHeap(),
      remover=reverb.selectors.Fifo(), max_size=max_episodes,
      rate_limiter=reverb.rate_limiters.MinSize(1), signature=signature)


def is_episode_table(client: reverb.Client, table: str) -> bool:
  """Whether `table` samples with a min-heap (made by `make_table`)."""
  options = tables.get_table_info(client, table).sampler_options
  return (options.WhichOneof('distribution') == 'heap' and
          bool(options.heap.min_heap))


def check_episode_table(client: reverb.Client, table: str) -> None:
  """Raises ValueError unless the learner can read `table` in bulk."""
  if not is_episode_table(client, table):
    kind = tables.get_table_info(client, table).sampler_options.WhichOneof(
        'distribution')
    raise ValueError(
        f'table {table!r} samples {kind}; the in-memory feed reads whole '
        'episodes from a table made by replay.episode_table.make_table '
        '(min-heap sampler, written with sequence_length=None; '
        'pipelines.push --feed_table / pipelines.serve --feed_table). Read '
        'this table with the streaming feed instead (--feed stream).')


def check_table_kind(client: reverb.Client, table: str, *,
                     episodes: bool) -> None:
  """Checks, before a write, that `table` is an episode table iff `episodes`.

  Whole episodes written unread belong in an episode table; items of a
  fixed length in any other (a min-heap would hand the learner the same
  item over and over).

  Raises:
    ValueError: `episodes` and `table` is not an episode table, or the
      other way round.
  """
  if is_episode_table(client, table) == episodes:
    return
  if episodes:
    kind = tables.get_table_info(client, table).sampler_options.WhichOneof(
        'distribution')
    raise ValueError(
        f'table {table!r} samples {kind}: it is not an episode table, which '
        'takes whole episodes for the in-memory feed (make one with '
        'pipelines.serve --feed_table or replay.episode_table.make_table)')
  raise ValueError(
      f'table {table!r} is an episode table (min-heap sampler, whole '
      'episodes for the in-memory feed): write whole episodes into it, '
      'unread (pipelines.push --feed_table)')


class EpisodeReader:
  """Takes episodes out of an episode table without removing them.

  Every server call has a deadline: a server that does not answer raises
  `tables.ServerUnavailableError` (naming the address and the call) within
  `timeout_s`, unless the client carries a `server_link.ServerLink` that
  waits for the server to come back (then the read goes on, and a full read
  that met a server restored from an older checkpoint still takes each
  episode once).
  """

  def __init__(self, client: reverb.Client, table: str, *,
               clock: Callable[[], float] = time.time,
               timeout_s: float = tables.DEFAULT_TIMEOUT_S):
    self._client, self._table = client, table
    self._link = server_link.of(client) or server_link.ServerLink(
        client.server_address, table, timeout_s=timeout_s)
    self._call(lambda: check_episode_table(client, table),
               f'checking table {table!r}', own_deadline=True)
    self._clock, self._last = clock, 0.0
    self._signature = self._call(
        lambda: tables.get_table_signature(client, table),
        f'reading the signature of table {table!r}', own_deadline=True)
    self.items_read = 0

  def _call(self, fn: Callable[[], Any], what: str, **kwargs: Any) -> Any:
    return self._link.call(fn, what, **kwargs)

  def _now(self) -> float:
    """Strictly increasing read times, above every earlier reader's."""
    self._last = max(self._clock(), self._last + 1e-6)
    return self._last

  def _size(self) -> int:
    return self._call(lambda: self._link.table_size(self._client),
                      f'reading the size of table {self._table!r}',
                      own_deadline=True)

  def _take(self) -> Optional[tuple[reverb.SampleInfo, List[np.ndarray]]]:
    """The heap's top item (the least recently read), or None if empty."""
    if self._size() == 0:  # Sampling an empty table would block.
      return None
    # A new sampler per call: one that met a lost server is done for.
    sample = self._call(
        lambda: next(self._client.sample(self._table, 1,
                                         emit_timesteps=False)),
        f'sampling table {self._table!r}')
    sample = sample[0] if isinstance(sample, list) else sample
    return sample.info, sample.data

  def _mark_read(self, key: int) -> None:
    self._call(lambda: self._client.mutate_priorities(
        self._table, updates={key: self._now()}),
               f'marking an episode of table {self._table!r} read')

  def _episode(self, info: Any, columns: List[np.ndarray]) -> Episode:
    data = tree.unflatten_as(self._signature,
                             [np.asarray(c) for c in columns])
    self._mark_read(int(info.key))
    self.items_read += 1
    return Episode(int(info.key), data)

  def iter_all(self) -> Iterator[Episode]:
    """Every episode in the table once, least recently read first."""
    seen = set()
    reconnects = self._link.reconnects
    started = self._now()
    while True:
      taken = self._take()
      if taken is None:
        return
      info, columns = taken
      key = int(np.asarray(info.key).reshape(()))
      if key in seen:
        # A server restored from a checkpoint of before this pass began
        # forgot that we read `key`: mark it again and go on.
        priority = float(np.asarray(info.priority).reshape(()))
        if self._link.reconnects != reconnects and priority < started:
          self._mark_read(key)
          continue
        return
      seen.add(key)
      yield self._episode(info, columns)

  def read_all(self) -> List[Episode]:
    return list(self.iter_all())

  def read_new(self, max_episodes: Optional[int] = None) -> List[Episode]:
    """Episodes no learner has read yet (written at priority `UNREAD`)."""
    episodes = []
    while max_episodes is None or len(episodes) < max_episodes:
      taken = self._take()
      if taken is None:
        break
      info, columns = taken
      if float(np.asarray(info.priority).reshape(())) != UNREAD:
        break
      episodes.append(self._episode(info, columns))
    return episodes
