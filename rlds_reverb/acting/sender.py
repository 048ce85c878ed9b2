"""An actor's episodes to a remote episode table, without outrunning the learner.

Finished episodes wait in a list; one write at a time runs on a thread of
its own (a write costs about as much CPU as stepping a 1000-step HalfCheetah
episode, mostly the conversion's tf.data graph) and takes every waiting
episode the table has room for, so the actor steps on meanwhile.

Room is the balance with the learner (docs/distributed.md): the table may
hold at most `max_unread_episodes` episodes that no learner has taken yet,
counted on Reverb's own counters (`unread_episodes`). An actor whose
finished episodes wait on a full table stops stepping until the table takes
them (`pace`), so it is at most `max_unread_episodes` finished episodes,
plus those that end during one write, ahead of the learner.

Every server call has a deadline. A write still running after `timeout_s`
is not an error by itself (a table with a rate limiter of its own holds
inserts back); the server is asked whether it is alive, and only a server
that does not answer is one.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

import reverb

from rlds_reverb.storage import tables
from rlds_reverb.acting import collect
from rlds_reverb.replay import episode_table

# How often waits look at the stop request and at a full table.
SLICE_S = 0.2
# on_wait(kind, value): 'unread' (unread episodes in a full table), 'write'
# (seconds a write has waited on a server that answers), 'weights' (seconds
# an actor has waited for a first publish).
OnWait = Callable[[str, float], None]


def unread_episodes(client: reverb.Client, table: str, *,
                    timeout_s: float = tables.DEFAULT_TIMEOUT_S) -> int:
  """Episodes of an episode table that no learner has taken yet.

  Inserts completed minus items sampled at least once: Reverb keeps both
  counts (and restores them from a checkpoint), and a learner's second read
  of an item (the full pass at a resume) changes neither. An item evicted
  unread would stay counted; the table's size caps the count.

  Raises:
    TableNotFoundError: no such table.
    ServerUnavailableError: no answer within `timeout_s`.
  """
  info = tables.get_table_info(client, table, timeout_s=timeout_s)
  inserted = info.rate_limiter_info.insert_stats.completed
  return int(min(max(inserted - info.num_unique_samples, 0),
                 info.current_size))


def write_episodes(client: reverb.Client, table: str,
                   episodes: list[dict[str, Any]]) -> int:
  """Writes RLDS episodes as the online learner's collector does (one item
  per episode, unread, terminal discounts fixed); returns items written."""
  return collect.write_episodes(client, table, episodes, sequence_length=None,
                                priority=episode_table.UNREAD)


class _Write:
  """One write in flight on a thread of its own."""

  def __init__(self, client: reverb.Client, table: str,
               episodes: list[dict[str, Any]]):
    self.count = len(episodes)
    self.started = time.monotonic()
    self.done = threading.Event()
    self.error: Optional[BaseException] = None
    threading.Thread(target=self._run, args=(client, table, episodes),
                     daemon=True, name='episode write').start()

  def _run(self, client, table, episodes):
    try:
      write_episodes(client, table, episodes)
    except BaseException as e:  # pylint: disable=broad-except
      self.error = e
    finally:
      self.done.set()


def sleep(seconds: float, should_stop: Callable[[], bool]) -> bool:
  """Sleeps in slices; False as soon as a stop is requested."""
  end = time.monotonic() + seconds
  while time.monotonic() < end:
    if should_stop():
      return False
    time.sleep(min(SLICE_S, max(end - time.monotonic(), 0)))
  return not should_stop()


class EpisodeSender:
  """Sends finished episodes to an episode table, one write at a time."""

  def __init__(self, client: reverb.Client, table: str, *,
               max_unread_episodes: int, timeout_s: float):
    self._client, self._table = client, table
    self._address = client.server_address
    self._max_unread, self._timeout_s = max_unread_episodes, timeout_s
    self._pending: list[dict[str, Any]] = []
    self._write: Optional[_Write] = None
    self._checked = 0.0  # When the write in flight was last looked at.
    self._full_at, self._unread = -1.0, 0  # The last look at a full table.
    self.written = 0
    """Episodes the server confirmed."""
    self.waiting_s = 0.0
    """Seconds `pace` and `flush` waited."""

  def add(self, episodes: list[dict[str, Any]]) -> None:
    """Finished episodes (RLDS steps) to send."""
    self._pending.extend(episodes)

  @property
  def unsent(self) -> int:
    """Episodes not confirmed yet: waiting, or in the write in flight."""
    return len(self._pending) + (self._write.count if self._write else 0)

  def _poll(self) -> None:
    """Collects a finished write; pings a server that takes `timeout_s`."""
    write = self._write
    if write is None:
      return
    if write.done.is_set():
      self._write = None
      if write.error is not None:
        # push raises a ConnectionError of its own for a lost server.
        if (isinstance(write.error, ConnectionError) or
            tables.is_unavailable(write.error)):
          raise tables.ServerUnavailableError(
              f'Reverb server at {self._address} is unavailable while '
              f'writing {write.count} episode(s) to table {self._table!r}: '
              f'{" ".join(str(write.error).split())[:200]}') from write.error
        raise write.error
      self.written += write.count
      return
    now = time.monotonic()
    if now - self._checked >= self._timeout_s:
      tables.call_with_deadline(
          self._client.server_info, timeout_s=self._timeout_s,
          what=f'writing {write.count} episode(s) to table {self._table!r}',
          address=self._address)
      self._checked = now

  def _hand_over(self) -> Optional[int]:
    """Starts a write of the waiting episodes the table has room for;
    returns the unread episodes seen (None: not looked)."""
    self._poll()
    if self._write is not None or not self._pending:
      return None
    if time.monotonic() - self._full_at < SLICE_S:
      return self._unread  # The table was full a moment ago.
    unread = unread_episodes(self._client, self._table,
                             timeout_s=self._timeout_s)
    self._unread = unread
    room = self._max_unread - unread
    if room <= 0:
      self._full_at = time.monotonic()
    else:
      episodes, self._pending = self._pending[:room], self._pending[room:]
      self._write = _Write(self._client, self._table, episodes)
      self._checked = time.monotonic()
    return unread

  def send_waiting(self) -> None:
    """Starts a write of the waiting episodes the table has room for, if
    none is in flight; does not wait (for an actor that holds still for
    another reason).

    Raises:
      ServerUnavailableError: the server stopped answering.
    """
    self._hand_over()

  def _ahead(self) -> bool:
    """Whether the actor should hold still: episodes wait on a full table
    (nothing in flight), or as many wait as the table may hold unread."""
    return bool(self._pending) and (self._write is None or
                                    len(self._pending) >= self._max_unread)

  def pace(self, should_stop: Callable[[], bool],
           on_wait: Optional[OnWait] = None) -> bool:
    """Sends what it can; returns once the actor may step on (False if
    stopped first): nothing waits, or a write is in flight and fewer than
    `max_unread_episodes` wait for it.

    Raises:
      ServerUnavailableError: the server stopped answering.
    """
    return self._wait(self._ahead, should_stop, on_wait)

  def flush(self, should_stop: Callable[[], bool],
            on_wait: Optional[OnWait] = None) -> bool:
    """Waits until every episode is confirmed (False if stopped first)."""
    return self._wait(lambda: bool(self.unsent), should_stop, on_wait)

  def _wait(self, busy: Callable[[], bool], should_stop: Callable[[], bool],
            on_wait: Optional[OnWait]) -> bool:
    start = time.monotonic()
    try:
      while True:
        unread = self._hand_over()
        if not busy():
          return True
        if on_wait is not None:
          if unread is not None and unread >= self._max_unread:
            on_wait('unread', unread)
          elif self._write is not None and (
              time.monotonic() - self._write.started > self._timeout_s):
            on_wait('write', time.monotonic() - self._write.started)
        if not sleep(SLICE_S, should_stop):
          return False
    finally:
      self.waiting_s += time.monotonic() - start

  def _wait_write(self, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while self._write is not None and time.monotonic() < deadline:
      self._write.done.wait(min(SLICE_S, max(deadline - time.monotonic(), 0)))
      self._poll()

  def finish(self) -> int:
    """At the end: the write in flight gets `timeout_s`, then the waiting
    episodes the table has room for now get `timeout_s` (a full table is
    not waited for); returns the episodes left unconfirmed.

    Raises:
      ServerUnavailableError: the server stopped answering.
    """
    self._wait_write(self._timeout_s)
    if self._write is None and self._pending:
      self._full_at = -1.0  # Look at the table once more.
      self._hand_over()
      self._wait_write(self._timeout_s)
    return self.unsent
