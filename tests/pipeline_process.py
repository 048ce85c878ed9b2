"""A `python -m pipelines.<name>` left running, as the CLI tests drive it.

The tests of push, serve and the server faults start a pipeline, wait for
the lines it prints, then stop or kill it; they share this class,
`unused_port` and `reserved_port` (for a server restarted on its port). `error_line`, the check of a failed run's stderr, serves
every CLI test (act and train too). Import with `from pipeline_process
import ...`; conftest puts tests/ on sys.path.
"""

import os
import pathlib
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import List, Mapping, Optional, Union

import pytest

# A loaded 2-core machine imports TensorFlow slowly.
START_TIMEOUT_S = 120


def unused_port() -> int:
  """A loopback port nothing listens on now."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


# Ports a test restarts a server on come from here: below the kernel's
# ephemeral range (where `bind(0)` and portpicker hand out the ports of every
# other server of the suite) and above portpicker's fallback 15000-25000.
# gRPC binds with SO_REUSEPORT, so had another xdist worker been handed the
# port between a kill and the restart, both would listen on it and share
# its connections (one such CI run timed out a fixture's first call).
_RESERVED_PORTS = range(26000, 32000)


def reserved_port() -> int:
  """A loopback port nothing listens on now, from a range that no other
  server of the suite is handed: for a server killed and restarted on the
  same port."""
  low = int(open('/proc/sys/net/ipv4/ip_local_port_range').read().split()[0])
  ports = [p for p in _RESERVED_PORTS if p < low]
  rng = random.Random()
  for _ in range(100):
    port = rng.choice(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
      try:
        s.bind(('localhost', port))
      except OSError:
        continue
      return port
  raise RuntimeError(f'no free port in {ports[0]}-{ports[-1]}')


def error_line(run: Union[subprocess.CompletedProcess, str], prog: str) -> str:
  """The one `<prog>: error: ` line of a failed run (a finished process or
  its stderr), checked as the CLI rule asks: no traceback, and the error
  line comes last, so a user sees it at the bottom of the terminal."""
  if isinstance(run, subprocess.CompletedProcess):
    assert run.returncode != 0, run.stdout + run.stderr
    run = run.stderr
  tail = run[-3000:]
  assert 'Traceback' not in run, tail
  errors = [line for line in run.splitlines()
            if line.startswith(f'{prog}: error: ')]
  assert len(errors) == 1, tail
  assert run.rstrip('\n').splitlines()[-1] == errors[0], tail
  return errors[0]


class PipelineProcess:
  """A pipeline in the background; stdout lines arrive as printed.

  stderr goes to a file, not a pipe: a pipe nobody reads could fill up and
  block the pipeline mid-run.
  """

  def __init__(self, module: str, *args: str, stderr_path: pathlib.Path,
               cwd: os.PathLike, env: Mapping[str, str]):
    self._stderr_path = stderr_path
    with open(stderr_path, 'w') as stderr:
      self.proc = subprocess.Popen(
          [sys.executable, '-m', f'pipelines.{module}', *args], cwd=cwd,
          env=dict(env), stdout=subprocess.PIPE, stderr=stderr, text=True)
    self._name = module
    self.lines: List[str] = []
    self._queue: 'queue.Queue[Optional[str]]' = queue.Queue()
    threading.Thread(target=self._read, daemon=True).start()

  def _read(self) -> None:
    for line in self.proc.stdout:
      self._queue.put(line.rstrip('\n'))
    self._queue.put(None)

  def wait_for(self, pattern: str, timeout_s: float = START_TIMEOUT_S
               ) -> re.Match:
    """The match of the next stdout line that matches `pattern`; fails the
    test (and kills the pipeline) if none comes within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
      try:
        line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
      except queue.Empty:
        self.kill()
        pytest.fail(f'{self._name}: no line matching {pattern!r} within '
                    f'{timeout_s}s; stdout so far: {self.lines}; stderr: '
                    f'{self.stderr()}')
      if line is None:
        pytest.fail(f'{self._name} exited {self.proc.wait()} before printing '
                    f'{pattern!r}; stdout: {self.lines}; stderr: '
                    f'{self.stderr()}')
      self.lines.append(line)
      found = re.search(pattern, line)
      if found:
        return found

  def stop(self, sig: int = signal.SIGINT, timeout_s: float = 180) -> int:
    """Sends `sig` (Ctrl-C by default); the exit code once all of stdout is
    read. Generous by default: on a loaded 2-core machine a checkpoint and
    exit can be slow."""
    if self.proc.poll() is None:
      self.proc.send_signal(sig)
    code = self.proc.wait(timeout=timeout_s)
    while (line := self._queue.get(timeout=10)) is not None:
      self.lines.append(line)
    return code

  def kill(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait(timeout=30)

  def stderr(self) -> str:
    return self._stderr_path.read_text()
