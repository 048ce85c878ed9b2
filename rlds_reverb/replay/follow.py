"""A learner's memory kept in step with an episode table that actors fill.

Actors (in this process or others) write finished episodes into an episode
table, unread; `TableFollower.poll` moves what is new into the memory and
tells the feed which rows changed; `store` takes what a full read
(`EpisodeReader.read_all`) returned when a run starts or resumes, so the
memory holds what the store holds.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

import numpy as np
import reverb
import tree

from rlds_reverb.storage import tables
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import memory as memory_lib


def _as_float32(data: Any) -> Any:
  return tree.map_structure(
      lambda x: x.astype(np.float32) if x.dtype.kind == 'f' else x, data)


class TableFollower:
  """Reads an episode table into a memory; `on_added` gets every change."""

  def __init__(self, client: reverb.Client, table: str,
               memory: memory_lib.TransitionMemory, *,
               on_added: Optional[Callable[[memory_lib.Added], None]] = None,
               on_episodes: Optional[Callable[[List[Any], bool], None]] = None,
               reader: Optional[episode_table.EpisodeReader] = None,
               delete_evicted: bool = False):
    """`on_episodes(episodes, restored)` sees the numpy episodes stored
    (normaliser statistics); `restored` is True for a catch-up read. With
    `delete_evicted` (online replay), episodes the memory evicts are
    deleted from the table too, so the store holds what the memory holds
    and a resumed run reads back exactly that."""
    self._reader = reader or episode_table.EpisodeReader(client, table)
    self._client, self._table = client, table
    self._delete_evicted = delete_evicted
    self.memory = memory
    self._on_added, self._on_episodes = on_added, on_episodes
    self.episodes_read = 0

  def store(self, episodes: List[episode_table.Episode], *,
            restored: bool = False) -> int:
    """Adds episodes read from the table to the memory; returns how many."""
    if not episodes:
      return 0
    data = [_as_float32(e.data) for e in episodes]
    added = self.memory.add(data, [e.key for e in episodes])
    if self._delete_evicted and len(added.evicted_keys):
      deletes = [int(k) for k in added.evicted_keys]
      tables.call_with_deadline(
          lambda: self._client.mutate_priorities(self._table,
                                                 deletes=deletes),
          timeout_s=tables.DEFAULT_TIMEOUT_S,
          what=f'deleting {len(deletes)} evicted episodes from table '
          f'{self._table!r}', address=self._client.server_address)
    if self._on_added is not None:
      self._on_added(added)
    if self._on_episodes is not None:
      self._on_episodes(data, restored)
    self.episodes_read += len(episodes)
    return len(episodes)

  def poll(self) -> int:
    """Reads the episodes written since; returns how many."""
    return self.store(self._reader.read_new())
