"""rlds_reverb.replay.rollout_queue on a real Reverb server."""

import time

import numpy as np
import pytest
import reverb

from rlds_reverb.storage import tables
from rlds_reverb.replay import rollout_queue

FIELDS = ('observation', 'reward', 'rollout')


def a_rollout(number: int) -> dict:
  return {'observation': np.full((4, 2, 3), number, np.float32),
          'reward': np.arange(8, dtype=np.float32).reshape(4, 2) + number,
          'rollout': np.int64(number)}


@pytest.fixture
def queue():
  server = tables.start_server([rollout_queue.make_table('rollouts',
                                                         max_rollouts=5)])
  yield server, server.localhost_client()
  server.stop()


def test_each_rollout_is_read_once_in_the_order_written(queue):
  _, client = queue
  rollout_queue.check_queue(client, 'rollouts')
  for number in range(5):
    rollout_queue.write(client, 'rollouts', a_rollout(number))
  read = [rollout_queue.read(client, 'rollouts', FIELDS) for _ in range(5)]
  assert [int(r['rollout']) for r in read] == [0, 1, 2, 3, 4]
  for number, rollout in enumerate(read):
    for key, value in a_rollout(number).items():
      np.testing.assert_array_equal(rollout[key], value)
      assert rollout[key].dtype == np.asarray(value).dtype
  assert client.server_info()['rollouts'].current_size == 0


def test_an_empty_queue_is_an_error_within_the_deadline(queue):
  _, client = queue
  start = time.monotonic()
  with pytest.raises(tables.ServerUnavailableError, match='reading a rollout'):
    rollout_queue.read(client, 'rollouts', FIELDS, timeout_s=0.5)
  assert time.monotonic() - start < 5.0


def test_a_full_queue_holds_the_writer_back(queue):
  _, client = queue
  for number in range(5):
    rollout_queue.write(client, 'rollouts', a_rollout(number))
  with pytest.raises(tables.ServerUnavailableError, match='writing a rollout'):
    rollout_queue.write(client, 'rollouts', a_rollout(5), timeout_s=0.5)


def test_a_table_that_is_not_a_queue_is_refused():
  server = tables.start_server([reverb.Table(
      'uniform', sampler=reverb.selectors.Uniform(),
      remover=reverb.selectors.Fifo(), max_size=10,
      rate_limiter=reverb.rate_limiters.MinSize(1))])
  try:
    client = server.localhost_client()
    with pytest.raises(ValueError, match='not a queue'):
      rollout_queue.check_queue(client, 'uniform')
    with pytest.raises(ValueError, match="no table 'rollouts'"):
      rollout_queue.check_queue(client, 'rollouts')
  finally:
    server.stop()


def test_bad_arguments():
  with pytest.raises(ValueError, match='max_rollouts'):
    rollout_queue.make_table('q', max_rollouts=0)
  with pytest.raises(ValueError, match='name'):
    rollout_queue.make_table('', max_rollouts=1)
  with pytest.raises(ValueError, match='non-empty dict'):
    rollout_queue.write(None, 'q', {})
