"""Runs of `python -m pipelines.serve` as an operator runs it.

A tiny RLDS dataset (observations (3,), actions (2,)) gives the table its
signature; items are written straight from the test with TF-Agents' own
observer. Each run checks what serve prints, what it keeps across a kill -9
(periodic checkpoints) and a clean stop (restart on the same port at once,
with a client still connected), and that its stderr holds no Reverb C++ log
lines. `start_serve` and `tiny_dataset` are used by test_server_faults.py too.
"""

import os
import pathlib
import re
import signal

import numpy as np
import pytest
from tf_agents.replay_buffers import reverb_utils
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from rlds_reverb.storage import tables
import rlds_fixtures as fx  # pylint: disable=g-bad-import-order
from pipeline_process import PipelineProcess  # pylint: disable=g-bad-import-order
from pipeline_process import START_TIMEOUT_S  # pylint: disable=g-bad-import-order
from pipeline_process import reserved_port  # pylint: disable=g-bad-import-order
import preloaded_cli  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]
# The caller's environment, minus what would defeat the quiet default.
ENV = {k: v for k, v in os.environ.items()
       if k not in ('TF_CPP_MIN_LOG_LEVEL', 'GRPC_VERBOSITY')}
SERVING = r'^serving table rlds on (localhost:(\d+))$'


def start_serve(*args: str, stderr_path: pathlib.Path) -> PipelineProcess:
  """`pipelines.serve` with `args`, left running."""
  return PipelineProcess('serve', *args, stderr_path=stderr_path, cwd=REPO,
                         env=ENV)


@pytest.fixture(scope='module')
def tiny_dataset(tmp_path_factory) -> str:
  """Two episodes (4 and 3 steps) in TFDS format: only the spec matters."""
  return fx.write_tfds(tmp_path_factory.mktemp('tiny'),
                       [fx.counting_steps(n) for n in (4, 3)])


def write_episode(client, num_steps: int, table: str = 'rlds') -> int:
  """Writes one episode of 2-step items (flushed); returns the item count."""
  observer = reverb_utils.ReverbAddTrajectoryObserver(
      client, table, sequence_length=2, stride_length=1)
  for t in range(num_steps):
    first, last = t == 0, t == num_steps - 1
    observer(trajectory.Trajectory(
        step_type=np.int32(ts.StepType.FIRST if first else
                           ts.StepType.LAST if last else ts.StepType.MID),
        observation=np.full([3], t, np.float32),
        action=np.zeros([2], np.float32), policy_info=(),
        next_step_type=np.int32(ts.StepType.FIRST if last else
                                ts.StepType.LAST if t == num_steps - 2 else
                                ts.StepType.MID),
        reward=np.float32(1.0), discount=np.float32(1.0)))
  observer.flush()
  observer.close()
  return num_steps - 1


def assert_quiet(stderr: str) -> None:
  """No C++ log lines of Reverb or TensorFlow, no traceback."""
  assert '[reverb/cc/' not in stderr, stderr
  assert not re.search(r'^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWE] ',
                       stderr, re.M), stderr
  assert 'Traceback' not in stderr, stderr


def test_periodic_checkpoints_survive_kill_and_restart_on_same_port(
    tiny_dataset, tmp_path):
  checkpoint_dir = tmp_path / 'ckpt'
  port = reserved_port()
  serve = start_serve('--dataset', tiny_dataset, '--port', str(port),
                '--checkpoint_dir', str(checkpoint_dir),
                '--checkpoint_interval', '1', '--max_size', '1000',
                stderr_path=tmp_path / 'first.err')
  try:
    address = serve.wait_for(SERVING)[1]
    assert serve.lines[0] == "serve: table 'rlds' holds 0 items"
    client = tables.connect(address)
    items = write_episode(client, 6) + write_episode(client, 4)
    assert items == 8
    # A periodic checkpoint that holds everything: then kill -9.
    serve.wait_for(rf'^serve: wrote checkpoint {checkpoint_dir}/\S+ '
                   rf'\({items} items\)$', timeout_s=60)
  finally:
    serve.kill()
  assert serve.proc.returncode == -signal.SIGKILL
  stderr = serve.stderr()
  assert_quiet(stderr)
  # The one warning: the real listening address, on stderr.
  warning, = [l for l in stderr.splitlines() if 'warning' in l]
  assert warning.startswith(
      f'serve: warning: the Reverb server listens on all interfaces '
      f'([::]:{port}), not only on localhost: '), stderr
  assert 'no authentication' in warning and 'docs/security.md' in warning

  # At once, on the same port (its connections are in TIME_WAIT) and with
  # other settings, which the restored table does not take.
  serve = start_serve('--dataset', tiny_dataset, '--port', str(port),
                '--checkpoint_dir', str(checkpoint_dir), '--max_size', '50',
                '--sampler', 'fifo', stderr_path=tmp_path / 'second.err')
  try:
    assert serve.wait_for(SERVING)[1] == address
    assert serve.lines[0] == (
        f"serve: table 'rlds' holds {items} items (restored from "
        f'{checkpoint_dir})')
    assert re.fullmatch(
        rf'serve: restored checkpoint {checkpoint_dir}/\S+ \(written '
        r'\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, \d+ s ago\)', serve.lines[1])
    assert serve.lines[2] == (
        "serve: the restored table 'rlds' keeps its checkpointed settings, "
        'which differ from the flags: max_size 1000 (asked 50); sampler '
        'uniform (asked fifo)')
    # A generous deadline for a live server: under the suite's load the
    # first call after a restart on a port in TIME_WAIT can take seconds.
    client = tables.connect(address, timeout_s=30)
    assert tables.get_table_info(client, 'rlds',
                                 timeout_s=30).current_size == items
    # A clean stop with this client still connected...
    assert serve.stop() == 0, serve.stderr()
  finally:
    serve.kill()
  assert re.fullmatch(
      rf"serve: stopped after \d+ s: table 'rlds' holds {items} items "
      rf'\({items} at start\); 0 periodic checkpoints', serve.lines[-2]), (
          serve.lines)
  assert re.fullmatch(
      rf'serve: wrote checkpoint {checkpoint_dir}/\S+ \({items} items\)',
      serve.lines[-1]), serve.lines
  assert_quiet(serve.stderr())

  # ... and a restart on the same port at once; --verbosity brings the logs
  # back.
  serve = start_serve('--dataset', tiny_dataset, '--port', str(port),
                '--verbosity', '0', stderr_path=tmp_path / 'third.err')
  try:
    assert serve.wait_for(SERVING)[1] == address
    assert serve.stop() == 0, serve.stderr()
  finally:
    serve.kill()
  assert serve.lines[-1] == "serve: 0 items dropped (no --checkpoint_dir)"
  assert '[reverb/cc/platform/default/server.cc' in serve.stderr()
  assert 'InsecureServerWarning' in serve.stderr()
  del client


def test_checkpoint_interval_needs_checkpoint_dir(tiny_dataset):
  proc = preloaded_cli.run('serve', '--dataset', tiny_dataset,
                           '--checkpoint_interval', '5', cwd=REPO, env=ENV,
                           timeout_s=START_TIMEOUT_S)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.strip() == (
      'serve: error: --checkpoint_interval needs --checkpoint_dir (where the '
      'checkpoints go)')


def test_env_serves_the_tables_of_a_distributed_run(tmp_path):
  """--env: the actors' episode table for the env's steps and the learner's
  weights table, restored from the checkpoint dir like any table."""
  from pipelines import serve  # pylint: disable=g-import-not-at-top
  from rlds_reverb.replay import episode_table  # pylint: disable=g-import-not-at-top
  from rlds_reverb.replay import variables  # pylint: disable=g-import-not-at-top
  served = serve.start_for_env('CartPole-v1',
                               checkpoint_dir=str(tmp_path / 'ckpt'))
  try:
    client = served.server.localhost_client()
    assert served.size == 0 and served.restored_from is None
    assert episode_table.is_episode_table(client, 'online')
    variables.check_table(client)  # Raises unless a one-item weights table.
    observation = tables.get_table_signature(client, 'online').observation
    assert observation.shape.as_list() == [None, 4]
  finally:
    served.server.stop()


def test_env_and_dataset_are_exclusive(tmp_path):
  result = preloaded_cli.run('serve', '--env', 'CartPole-v1', '--dataset',
                             str(tmp_path), cwd=REPO, env=ENV,
                             timeout_s=START_TIMEOUT_S)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1] == (
      'serve: error: pass --dataset (a table for its data) or --env (the '
      'tables of a distributed online run), one of them')
