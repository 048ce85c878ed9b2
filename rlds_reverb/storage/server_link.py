"""A reader's link to a remote Reverb table: deadlines, and waiting on a loss.

A learner that reads a table on another server (a `pipelines.serve`, a push
job's) must not hang when that server dies, nor carry on silently when it
comes back. A `ServerLink` runs each client call within a deadline
(`tables.call_with_deadline`). When the server does not answer:

  * with `reconnect_s == 0` the call fails at once with
    `tables.ServerUnavailableError`, one line naming the address and what
    was in flight;
  * with `reconnect_s > 0` it says so on stderr, waits up to that long for
    the server to answer again, reports what it found (the table's size now
    against before the loss: fewer items means the server came back from an
    older checkpoint), and retries the call. A server that does not come back
    in time, or comes back with the table empty, raises `ServerLostError`.

      lost Reverb server at localhost:8000 while sampling table 'rlds';
          waiting up to 300s for it to come back
      Reverb server at localhost:8000 is back after 14s: table 'rlds' holds
          180 items, 200 before the loss (it came back from an older
          checkpoint: what was written since is gone)

Readers deep in the library (`replay.episode_table.EpisodeReader`) find the
link of their client with `of(client)`; whoever makes the client attaches
it (`attach`).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Optional, TypeVar

import reverb

from rlds_reverb.storage import tables

_T = TypeVar('_T')
# Seconds between probes of a lost server.
POLL_S = 1.0
# A call that fails again right after the server came back is retried this
# often, quietly: gRPC's first call on a channel to a restarted server fails.
_RETRIES_AFTER_RETURN = 3


class ServerLostError(tables.ServerUnavailableError):
  """The server did not come back in time, or came back without the data."""


def _print_line(line: str) -> None:
  print(line, file=sys.stderr, flush=True)


class ServerLink:
  """Calls on one remote table with deadlines; waits for a lost server.

  Attributes:
    address, table: the server and the table read.
    reconnect_s: how long to wait for a lost server (0: fail at once).
    timeout_s: deadline of each call.
    reconnects: how many times the server came back.
    last_size: the table's size when last seen (`note_size`, probes).
  """

  def __init__(self, address: str, table: str, *, reconnect_s: float = 0.0,
               timeout_s: float = tables.DEFAULT_TIMEOUT_S,
               report: Callable[[str], None] = _print_line):
    if not reconnect_s >= 0:
      raise ValueError(f'reconnect_s must be >= 0, got {reconnect_s!r}.')
    if not timeout_s > 0:
      raise ValueError(f'timeout_s must be > 0, got {timeout_s!r}.')
    self.address, self.table = address, table
    self.reconnect_s, self.timeout_s = float(reconnect_s), float(timeout_s)
    self._report = report
    self.reconnects = 0
    self.last_size: Optional[int] = None

  def note_size(self, size: int) -> None:
    """The table's size as a reader saw it (compared after a loss)."""
    self.last_size = int(size)

  def call(self, fn: Callable[[], _T], what: str, *,
           timeout_s: Optional[float] = None, own_deadline: bool = False
           ) -> _T:
    """`fn()` within the deadline; on a lost server, waits and retries.

    `own_deadline`: `fn` is a `tables` function with a deadline of its own
    (raising `tables.ServerUnavailableError`), called as it is.

    Raises:
      tables.ServerUnavailableError: the server does not answer (no
        reconnect), or `ServerLostError` (it did not come back in time).
    """
    timeout_s = timeout_s or self.timeout_s
    retries = 0
    while True:
      try:
        if own_deadline:
          return fn()
        return tables.call_with_deadline(fn, timeout_s=timeout_s, what=what,
                                         address=self.address)
      except tables.ServerUnavailableError as e:
        if not self.reconnect_s:
          raise
        if 0 < retries < _RETRIES_AFTER_RETURN:
          retries += 1
          time.sleep(POLL_S)
          continue
        self.wait(what, e)
        retries = 1

  def table_size(self, client: reverb.Client) -> int:
    """The table's size now (one server call, with the deadline)."""
    size = tables.get_table_info(client, self.table,
                                 timeout_s=self.timeout_s).current_size
    self.note_size(size)
    return size

  def wait(self, what: str, error: BaseException) -> None:
    """After `error` while `what`: waits for the server to answer again and
    reports what it found; re-raises `error` when not reconnecting.

    Raises:
      The error itself (reconnect_s == 0); ServerLostError when the server
      is not back within reconnect_s or its table is empty.
    """
    if not self.reconnect_s:
      raise error
    before = self.last_size
    self._report(f'lost Reverb server at {self.address} while {what}; '
                 f'waiting up to {self.reconnect_s:g}s for it to come back')
    start = time.monotonic()
    deadline = start + self.reconnect_s
    size = None
    while True:
      try:
        client = tables.connect(self.address, timeout_s=min(
            self.timeout_s, max(deadline - time.monotonic(), 1.0)))
        size = tables.get_table_info(client, self.table,
                                     timeout_s=self.timeout_s).current_size
        break
      except tables.TableNotFoundError as e:
        raise ServerLostError(
            f'Reverb server at {self.address} came back without table '
            f'{self.table!r} ({e})') from error
      except ConnectionError:
        pass
      if time.monotonic() + POLL_S > deadline:
        raise ServerLostError(
            f'Reverb server at {self.address} did not come back within '
            f'{self.reconnect_s:g}s (lost while {what})') from error
      time.sleep(POLL_S)
    self.reconnects += 1
    self.note_size(size)
    waited = time.monotonic() - start
    found = f'table {self.table!r} holds {size} items'
    if before is None:
      found += ' (its size before the loss is not known)'
    elif size == before:
      found += ', as before the loss'
    elif size < before:
      found += (f', {before} before the loss (it came back from an older '
                'checkpoint: what was written since is gone)')
    else:
      found += f', {before} before the loss (more were written meanwhile)'
    if size == 0:
      raise ServerLostError(
          f'Reverb server at {self.address} came back after {waited:.0f}s '
          f'with table {self.table!r} empty ({before} items before the '
          'loss): nothing to read (restart it from its checkpoint)'
      ) from error
    self._report(f'Reverb server at {self.address} is back after '
                 f'{waited:.0f}s: {found}')


def attach(client: reverb.Client, link: ServerLink) -> reverb.Client:
  """Gives `client` a link, which readers of it find with `of`."""
  client.server_link = link
  return client


def of(client: Any) -> Optional[ServerLink]:
  """The link attached to `client`, if any."""
  return getattr(client, 'server_link', None)
