"""`python -m pipelines.push` under faults: Ctrl-C, a server killed mid-push,
resume, eviction and bad values, each as a user meets it (subprocesses on
loopback, every wait bounded, every process killed at the end).

The data: 200 truncated episodes of 20 steps (19 two-step items each, 3,800
in all), written as a TFDS directory in-process. A push with
--checkpoint_every 1 checkpoints the server after every episode, which makes
it slow enough (tens of ms per episode) to interrupt in the middle.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time
from typing import List, Optional

import numpy as np
import pytest

import rlds_fixtures as fx  # pylint: disable=g-bad-import-order
from pipeline_process import error_line  # pylint: disable=g-bad-import-order
from pipeline_process import unused_port  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
           PYTHONPATH=os.pathsep.join(
               [str(REPO), *filter(None, [os.environ.get('PYTHONPATH')])]))
TIMEOUT_S = 180
EPISODES, STEPS = 200, 20
ITEMS = EPISODES * (STEPS - 1)


def _write_dataset(out: pathlib.Path, episodes: int = EPISODES,
                   bad: Optional[tuple] = None) -> str:
  """A TFDS directory of `episodes` truncated episodes; `bad` = (episode,
  step, field, value) plants one value."""
  data = [fx.counting_steps(STEPS, e * 1000) for e in range(episodes)]
  if bad is not None:
    e, t, field, value = bad
    data[e][t][field] = (np.full_like(data[e][t][field], value)
                         if field == 'observation' else np.float32(value))
  return fx.write_tfds(out, data, name='faults')


@pytest.fixture(scope='module')
def dataset(tmp_path_factory) -> str:
  return _write_dataset(tmp_path_factory.mktemp('faults') / 'data')


class _Process:
  """A pipeline in the background, its output in files (no pipe to fill)."""

  def __init__(self, tmp: pathlib.Path, name: str, module: str, *args: str):
    self.out, self.err = tmp / f'{name}.out', tmp / f'{name}.err'
    with open(self.out, 'w') as out, open(self.err, 'w') as err:
      self.proc = subprocess.Popen(
          [sys.executable, '-m', f'pipelines.{module}', *args], cwd=tmp,
          env=ENV, stdout=out, stderr=err, text=True)

  def stdout(self) -> str:
    return self.out.read_text()

  def stderr(self) -> str:
    return self.err.read_text()

  def wait_for(self, pattern: str, timeout_s: float = 120) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      found = re.search(pattern, self.stdout(), re.MULTILINE)
      if found:
        return found
      if self.proc.poll() is not None:
        break
      time.sleep(0.1)
    pytest.fail(f'no {pattern!r}: stdout {self.stdout()!r} stderr '
                f'{self.stderr()[-2000:]!r}')

  def kill(self) -> None:
    if self.proc.poll() is None:
      self.proc.kill()
    self.proc.wait(timeout=30)


def _serve(tmp, name, dataset, checkpoint_dir, *args) -> tuple:
  port = unused_port()
  server = _Process(tmp, name, 'serve', '--dataset', dataset, '--port',
                    str(port), '--checkpoint_dir', str(checkpoint_dir), *args)
  server.wait_for(r'^serving table rlds on localhost:\d+$')
  return server, f'localhost:{port}'


def _points(state_file: pathlib.Path) -> int:
  try:
    return len(json.loads(state_file.read_text())['points'])
  except (OSError, ValueError, KeyError):
    return 0


def _wait_for_points(state_file, count, process, timeout_s=120) -> None:
  """Until the push recorded `count` barriers (it is mid-push then)."""
  deadline = time.monotonic() + timeout_s
  while _points(state_file) < count:
    assert process.proc.poll() is None, process.stderr()[-2000:]
    assert time.monotonic() < deadline, 'push made no progress'
    time.sleep(0.05)


def _summary(stdout: str) -> dict:
  lines = [line for line in stdout.splitlines() if line.startswith('{')]
  assert len(lines) == 1, stdout
  return json.loads(lines[0])


def test_interrupt_kill_and_resume_leave_every_item_once(dataset, tmp_path):
  state = tmp_path / 'state.json'
  processes: List[_Process] = []
  try:
    server, address = _serve(tmp_path, 'serve1', dataset, tmp_path / 'ckpt')
    processes.append(server)
    push_args = ('--dataset', dataset, '--state_file', str(state),
                 '--checkpoint_every', '1', '--server_timeout_s', '3')

    # Ctrl-C mid-push: the summary and exit 130, promptly.
    pushing = _Process(tmp_path, 'push1', 'push', *push_args,
                       '--reverb_address', address)
    processes.append(pushing)
    _wait_for_points(state, 4, pushing)
    pushing.proc.send_signal(signal.SIGINT)
    assert pushing.proc.wait(timeout=90) == 130, pushing.stderr()[-2000:]
    interrupted = _summary(pushing.stdout())
    assert interrupted['confirmed_episodes'] >= 3
    assert re.match(r'^push: error: interrupted after \d+ episodes, \d+ items '
                    r'written \(episodes 0-\d+ confirmed: --resume pushes the '
                    r'rest\)$', error_line(pushing.stderr(), 'push'))

    # A push that does not resume would duplicate: refused.
    pushing = _Process(tmp_path, 'push2', 'push', *push_args,
                       '--reverb_address', address)
    processes.append(pushing)
    assert pushing.proc.wait(timeout=TIMEOUT_S) == 1
    assert 'records an unfinished push' in error_line(pushing.stderr(), 'push')

    # Resume, then kill -9 the server mid-push: one line within seconds.
    pushing = _Process(tmp_path, 'push3', 'push', *push_args,
                       '--reverb_address', address, '--resume')
    processes.append(pushing)
    _wait_for_points(state, _points(state) + 4, pushing)
    server.kill()
    killed = time.monotonic()
    assert pushing.proc.wait(timeout=60) == 1, pushing.stderr()[-2000:]
    assert time.monotonic() - killed < 30
    error = error_line(pushing.stderr(), 'push')
    assert re.match(
        rf'^push: error: .*Reverb server at {address}.*: \d+ items of '
        r'episodes \d+-\d+ confirmed, (\d+ items of .* in flight|nothing in '
        r'flight); episodes 0-\d+ are in checkpoint \S+ \(\d+ items\): '
        r'restart the server from its checkpoint and rerun with --resume$',
        error), error
    lost = _summary(pushing.stdout())
    assert lost['first_episode'] == interrupted['confirmed_episodes']
    assert lost['error'] == error[len('push: error: '):]

    # The server back from its checkpoint (another port: the old one may
    # linger); the resumed push completes the table exactly.
    server, address = _serve(tmp_path, 'serve2', dataset, tmp_path / 'ckpt')
    processes.append(server)
    pushing = _Process(tmp_path, 'push4', 'push', *push_args,
                       '--reverb_address', address, '--resume',
                       '--checkpoint_every', '100')
    processes.append(pushing)
    assert pushing.proc.wait(timeout=TIMEOUT_S) == 0, pushing.stderr()[-2000:]
    done = _summary(pushing.stdout())
    assert done['table_size'] == ITEMS
    assert done['first_episode'] > lost['first_episode']
    assert done['confirmed_episodes'] == EPISODES
    assert json.loads(state.read_text())['complete']
  finally:
    for process in processes:
      process.kill()


def _push(tmp_path, *args) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-m', 'pipelines.push', *args], cwd=tmp_path, env=ENV,
      capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def test_eviction_is_refused_unless_allowed(dataset, tmp_path):
  args = ('--dataset', dataset, '--max_episodes', '10', '--max_size', '100')
  refused = _push(tmp_path, *args)
  assert refused.returncode == 1
  assert re.match(
      r"^push: error: table 'rlds' at localhost:\d+ holds at most 100 more "
      r'items; this push would evict: 95 items written so far \(episodes '
      r'0-4\), episode 5 makes 19 more; pass --allow_eviction or a bigger '
      r'--max_size$', error_line(refused.stderr, 'push'))
  assert _summary(refused.stdout)['table_size'] == 95
  allowed = _push(tmp_path, *args, '--allow_eviction')
  assert allowed.returncode == 0, allowed.stderr[-2000:]
  summary = _summary(allowed.stdout)
  assert (summary['items'], summary['table_size'], summary['evicted']) == (
      190, 100, 90)
  assert '90 items evicted (--allow_eviction)' in allowed.stdout


def test_bad_values_are_refused_unless_allowed(tmp_path):
  data = _write_dataset(tmp_path / 'bad', episodes=4,
                        bad=(2, 3, 'discount', 7.0))
  refused = _push(tmp_path, '--dataset', data)
  assert error_line(refused.stderr, 'push') == (
      'push: error: episode 2, step 3: discount is 7.0, not in [0, 1]; 38 '
      "items were already written to table 'rlds', none from this episode")
  assert refused.returncode == 1
  assert _summary(refused.stdout)['table_size'] == 38
  allowed = _push(tmp_path, '--dataset', data, '--allow_nonfinite')
  assert allowed.returncode == 0, allowed.stderr[-2000:]
  assert _summary(allowed.stdout)['table_size'] == 4 * (STEPS - 1)
