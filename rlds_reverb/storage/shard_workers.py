"""The worker processes of a sharded push, and the parent's barriers.

`shards` holds the protocol (ranges, barrier lines, messages); this module
runs it: `run_workers` starts one process per unfinished shard (the command
line is the caller's: `pipelines.push` starts itself), relays their stderr,
reads their barrier and summary lines, and at every global barrier checks
that the table holds what the workers confirmed, checkpoints and records it
(`PushLedger.on_barrier`) before it lets them go on. On a failed shard, a
lost item or Ctrl-C it stops the workers, waits a bounded time for their
last reports and records where they stopped, so a resumed push continues
from there.
"""

import contextlib
import dataclasses
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional

from rlds_reverb.storage import push
from rlds_reverb.storage import shards as shards_lib

Command = Callable[[shards_lib.Shard], List[str]]


class Workers:
  """The worker processes of a sharded push and their stdout lines."""

  def __init__(self, shards: List[shards_lib.Shard], command: Command):
    self.events: 'queue.Queue[tuple]' = queue.Queue()
    self.procs: Dict[int, subprocess.Popen] = {}
    self.relays: List[threading.Thread] = []
    for shard in shards:
      if shard.finished:
        continue
      # A session of its own: a Ctrl-C at the terminal reaches the parent
      # only, which passes one SIGINT on (a second would drop queued items).
      proc = subprocess.Popen(
          command(shard),
          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
          stderr=subprocess.PIPE, text=True, start_new_session=True)
      self.procs[shard.index] = proc
      for target in (self._read, self._relay):
        thread = threading.Thread(target=target, args=(shard.index, proc),
                                  daemon=True)
        thread.start()
        if target == self._relay:
          self.relays.append(thread)

  def _read(self, index: int, proc: subprocess.Popen) -> None:
    for line in proc.stdout:
      self.events.put((index, line))
    self.events.put((index, None))

  @staticmethod
  def _relay(index: int, proc: subprocess.Popen) -> None:
    """Passes the worker's stderr on, a line per progress refresh (text
    mode reads tqdm's carriage returns as line ends)."""
    del index  # Its progress lines name their shard.
    for line in proc.stderr:
      if line.strip():
        with contextlib.suppress(OSError, ValueError):
          sys.stderr.write(line.rstrip('\n') + '\n')

  def go(self, shard: shards_lib.Shard) -> None:
    with contextlib.suppress(OSError):  # A dead worker reports on its own.
      self.procs[shard.index].stdin.write(f'{shards_lib.GO}\n')
      self.procs[shard.index].stdin.flush()

  def stop(self) -> None:
    for proc in self.procs.values():
      if proc.poll() is None:
        with contextlib.suppress(OSError):
          proc.send_signal(signal.SIGINT)

  def kill(self) -> None:
    for proc in self.procs.values():
      if proc.poll() is None:
        proc.kill()
        proc.wait()
    for thread in self.relays:  # Their last lines before the summary.
      thread.join(timeout=2)


def handle(event: tuple, shards: List[shards_lib.Shard],
           workers: Workers) -> None:
  """Applies a worker's line (or its end) to its shard."""
  index, line = event
  shard = shards[index]
  if line is None:
    shard.returncode = workers.procs[index].wait()
    shard.finished, shard.waiting = True, False
    if shard.returncode and not shard.error:
      shard.error = (f'exited with code {shard.returncode}'
                     if shard.returncode != 130 else 'interrupted')
    return
  data = shards_lib.parse_line(line)
  if data is None:
    return
  if shards_lib.BARRIER_KEY in data:
    shard.confirmed = data['position']
    shard.confirmed_items = data['items']
    shard.waiting = data[shards_lib.BARRIER_KEY] == 'every'
  else:
    shard.report = data
    shard.error = data.get(shards_lib.ERROR_KEY) or shard.error


def barrier(ledger: push.PushLedger, shards: List[shards_lib.Shard],
            reason: str, table: str) -> None:
  """Checks the table holds its start size plus every shard's confirmed
  items, then checkpoints and records (`PushLedger.on_barrier`).

  Raises:
    push.ItemsLostError: The size differs; names what is not durable.
    push.ServerUnavailableError: The server does not answer in time.
  """
  stats = shards_lib.combined_stats(shards)
  size = ledger.size()
  expected = ledger.expected_size(stats)
  if size != expected:
    raise push.ItemsLostError(
        f'table {table!r} at {ledger.address} holds {size} items '
        f'where the workers confirmed {expected}'
        f'{" (another writer?)" if size > expected else " (restarted?)"}; '
        'not durably stored: '
        f'{shards_lib.not_durable(shards, ledger.state.last_checkpointed)}')
  ledger.on_barrier(stats, reason, [s.record() for s in shards])


@dataclasses.dataclass
class Outcome:
  """How a sharded push ended."""
  failed: Optional[str] = None
  """What failed (a shard's error, lost items), or None."""
  interrupted: bool = False
  """Ctrl-C reached the parent."""
  unrecorded: str = ''
  """Why the stop could not be recorded, if it could not."""


def run_workers(shards: List[shards_lib.Shard], command: Command,
                ledger: push.PushLedger, table: str, *,
                lost: Callable[[Exception], str],
                failure_note: Callable[[], str],
                stop_timeout_s: float) -> Outcome:
  """Runs the unfinished shards' workers to their end, or stops them.

  Args:
    shards: All shards; finished ones (complete in the ledger) are skipped.
    command: A shard's worker command line.
    ledger: Records each barrier (and where a stop left the shards).
    table: The table's name, for messages.
    lost: The line for a barrier that failed (lost items, a dead server).
    failure_note: Appended to a shard's error (what is durable).
    stop_timeout_s: How long stopped workers get to report.
  """
  for shard in shards:
    shard.finished = shard.complete
  workers = Workers(shards, command)
  outcome = Outcome()
  try:
    while not all(s.finished for s in shards):
      try:
        event = workers.events.get(timeout=0.5)
      except queue.Empty:
        continue
      handle(event, shards, workers)
      shard = shards[event[0]]
      if shard.finished and shard.error:
        outcome.failed = f'{shard.name}: {shard.error}{failure_note()}'
        break
      if (any(s.waiting for s in shards)
          and all(s.waiting or s.finished for s in shards)):
        try:
          barrier(ledger, shards, 'every', table)
        except (push.ItemsLostError, push.ServerUnavailableError) as e:
          outcome.failed = lost(e)
          break
        for s in shards:
          if s.waiting:
            s.waiting = False
            workers.go(s)
    if outcome.failed is None:
      try:
        barrier(ledger, shards, 'end', table)
      except (push.ItemsLostError, push.ServerUnavailableError) as e:
        outcome.failed = lost(e)
  except KeyboardInterrupt:
    outcome.interrupted = True
  if outcome.interrupted or outcome.failed is not None:
    workers.stop()
    # Each worker finishes what it handed over and reports it ('stopped').
    deadline = time.monotonic() + stop_timeout_s
    try:
      while (not all(s.finished for s in shards)
             and time.monotonic() < deadline):
        with contextlib.suppress(queue.Empty):
          handle(workers.events.get(timeout=0.5), shards, workers)
    except KeyboardInterrupt:
      pass
    # Record what they confirmed, for a resume on the same server; a stop
    # that cannot be recorded is said, never passed over.
    try:
      barrier(ledger, shards, 'stopped', table)
    except Exception as e:  # pylint: disable=broad-except
      message = ' '.join(str(e).split()) or type(e).__name__
      outcome.unrecorded = f'; the stop was not recorded ({message})'
  workers.kill()
  return outcome
