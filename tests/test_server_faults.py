"""A Reverb server killed under its clients: errors come fast and say where.

One `python -m pipelines.serve` on loopback is killed with SIGKILL while a
client holds a connection and a writer; every call after that must fail
within a bound (no hang) with one `tables.ServerUnavailableError` line that
names the address and what was in flight, and Ctrl-C must end a wait at
once. Every wait here is bounded.
"""

import os
import re
import signal
import threading
import time

import numpy as np
import pytest
from tf_agents.trajectories import trajectory
import tree

from rlds_reverb.storage import tables
from test_cli_serve import SERVING
from test_cli_serve import start_serve
from test_cli_serve import tiny_dataset  # pylint: disable=unused-import
from test_cli_serve import write_episode

# What "fails fast" means here: the 10 s default deadline plus slack for a
# loaded machine, far from "forever".
BOUND_S = 15.0


@pytest.fixture(scope='module')
def killed(tiny_dataset, tmp_path_factory):  # pylint: disable=redefined-outer-name
  """(address, client, writer) of a served table, once its server is dead."""
  serve = start_serve('--dataset', tiny_dataset,
                stderr_path=tmp_path_factory.mktemp('serve') / 'stderr')
  try:
    address = serve.wait_for(SERVING)[1]
    client = tables.connect(address)
    assert write_episode(client, 5) == 4
    assert tables.get_table_info(client, 'rlds').current_size == 4
    writer = client.trajectory_writer(num_keep_alive_refs=1)
  finally:
    serve.kill()
  assert serve.proc.returncode == -signal.SIGKILL
  return address, client, writer


def _step() -> trajectory.Trajectory:
  """One step of the table's signature (policy_info is empty)."""
  return trajectory.Trajectory(
      step_type=np.int32(1), observation=np.zeros(3, np.float32),
      action=np.zeros(2, np.float32), policy_info=(),
      next_step_type=np.int32(1), reward=np.float32(0),
      discount=np.float32(1))


def _timed(fn):
  start = time.monotonic()
  with pytest.raises(tables.ServerUnavailableError) as raised:
    fn()
  return raised.value, time.monotonic() - start


def test_table_info_fails_within_the_default_deadline(killed):
  address, client, _ = killed
  # The dropped connection, then a reconnect that finds nobody.
  error, seconds = _timed(lambda: tables.get_table_info(client, 'rlds'))
  assert seconds < BOUND_S
  assert isinstance(error, ConnectionError)
  assert re.fullmatch(
      rf'Reverb server at {address} (did not answer within 10s|is '
      r"unavailable) while reading the info of table 'rlds'(: .+)? "
      r'\(server down\?\)', str(error)), str(error)


def test_checkpoint_fails_fast(killed):
  address, client, _ = killed
  error, seconds = _timed(lambda: tables.checkpoint(client, timeout_s=3))
  assert seconds < BOUND_S
  assert str(error).startswith(f'Reverb server at {address} ')
  assert 'while starting a checkpoint' in str(error)


def test_a_hung_write_gets_the_deadline(killed):
  address, client, writer = killed
  # gRPC waits for the server to come back: without a deadline, forever.
  error, seconds = _timed(lambda: tables.call_with_deadline(
      lambda: client.insert(tree.flatten(_step()), {'rlds': 1.0}),
      timeout_s=2, what="inserting into table 'rlds'", address=address))
  assert 1.9 < seconds < BOUND_S
  assert str(error) == (
      f'Reverb server at {address} did not answer within 2s while inserting '
      "into table 'rlds' (server down?)")

  def flush():
    writer.append(_step())
    last = tree.map_structure(lambda column: column[-1:], writer.history)
    writer.create_item('rlds', 1.0, last)
    writer.flush()

  error, seconds = _timed(lambda: tables.call_with_deadline(
      flush, timeout_s=2, what='flushing a writer', address=address))
  assert seconds < BOUND_S
  assert str(error).startswith(f'Reverb server at {address} ')
  assert 'while flushing a writer' in str(error)


def test_ctrl_c_ends_the_wait_at_once(killed):
  address, client, _ = killed
  # Python's own Ctrl-C handler, whatever an earlier test in this worker
  # process left installed (a CI run waited out the 60 s here).
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  print('SIGINT handler before this test:', previous)  # Shown on failure.
  timer = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT))
  start = time.monotonic()
  timer.start()
  try:
    with pytest.raises(KeyboardInterrupt):
      tables.call_with_deadline(
          lambda: client.insert(tree.flatten(_step()), {'rlds': 1.0}),
          timeout_s=60, what='inserting', address=address)
  finally:
    timer.cancel()
    signal.signal(signal.SIGINT, previous)
  assert time.monotonic() - start < 5


def test_connect_to_the_dead_address_is_refused_at_once(killed):
  address, _, _ = killed
  error, seconds = _timed(lambda: tables.connect(address, timeout_s=5))
  assert seconds < 3
  assert str(error) == (f'cannot reach Reverb server at {address}: connection '
                        'refused (is a server running there?)')
