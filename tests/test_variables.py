"""Tests of rlds_reverb/replay/variables.py: weights in a Reverb table."""

import time

import numpy as np
import pytest
import reverb

from rlds_reverb.storage import tables
from rlds_reverb.acting import numpy_policy
from rlds_reverb.replay import variables


def _policy(bias: float = 0.5) -> numpy_policy.NumpyPolicy:
  rng = np.random.default_rng(0)
  return numpy_policy.NumpyPolicy(
      head='tanh_normal',
      kernels=[rng.normal(size=(3, 8)).astype(np.float32),
               rng.normal(size=(8, 4)).astype(np.float32)],
      biases=[np.zeros(8, np.float32), np.full(4, bias, np.float32)],
      action_low=-np.ones(2, np.float32), action_high=np.ones(2, np.float32),
      obs_mean=np.arange(3, dtype=np.float32),
      obs_std=np.full(3, 2.0, np.float32), obs_clip=5.0,
      metadata={'agent': 'sac', 'env': 'X'})


@pytest.fixture
def server():
  server = reverb.Server([variables.make_table(),
                          variables.make_table('empty'),
                          reverb.Table.queue('queue', 5)])
  yield server
  server.stop()


@pytest.fixture
def client(server):
  return server.localhost_client()


def test_round_trip_gives_the_policy_back(client):
  policy = _policy()
  variables.publish(client, policy, 12, info={'env_steps': 3000})
  published = variables.fetch(client)
  assert published.version == 12
  assert published.info == {'env_steps': 3000}
  back = numpy_policy.NumpyPolicy(**published.weights)
  assert back.head == 'tanh_normal' and back.obs_clip == 5.0
  assert back.metadata == policy.metadata
  for got, want in zip(back.kernels + back.biases,
                       policy.kernels + policy.biases):
    np.testing.assert_array_equal(got, want)
  np.testing.assert_array_equal(back.obs_mean, policy.obs_mean)
  obs = np.random.default_rng(1).normal(size=(5, 3))
  np.testing.assert_allclose(back.greedy(obs), policy.greedy(obs))


def test_q_policy_keeps_integer_bounds(client):
  policy = numpy_policy.NumpyPolicy(
      head='q_argmax', kernels=[np.ones((4, 2), np.float32)],
      biases=[np.array([0.0, 1.0], np.float32)],
      action_low=np.asarray(0, np.int64), action_high=np.asarray(1, np.int64))
  variables.publish(client, policy, 0)
  back = numpy_policy.NumpyPolicy(**variables.fetch(client).weights)
  assert back.action_low.dtype == np.int64 and back.action_low.shape == ()
  np.testing.assert_array_equal(back.greedy(np.zeros((3, 4))), [1, 1, 1])


def test_newest_publish_replaces_the_last(client):
  for version in (1, 2, 3):
    variables.publish(client, _policy(bias=version), version)
  assert client.server_info()[variables.TABLE].current_size == 1
  published = variables.fetch(client)
  assert published.version == 3
  np.testing.assert_array_equal(published.weights['biases'][1], 3.0)


def test_nothing_published_is_none(client):
  assert variables.fetch(client, table='empty') is None


def test_check_table(client):
  variables.check_table(client)
  with pytest.raises(tables.TableNotFoundError, match="'nope'.*'queue'"):
    variables.check_table(client, 'nope')
  with pytest.raises(ValueError, match="'queue' keeps 5 items"):
    variables.check_table(client, 'queue')


def test_bad_arguments_are_refused(client):
  with pytest.raises(ValueError, match='version must be'):
    variables.publish(client, _policy(), -1)
  with pytest.raises(ValueError, match='JSON'):
    variables.publish(client, {'w': object()}, 1)
  with pytest.raises(ValueError, match="table 'nope' since the table could not be found"):
    variables.publish(client, _policy(), 1, table='nope')
  with pytest.raises(ValueError, match='name must be'):
    variables.make_table('')


def test_a_foreign_item_is_refused(client):
  client.insert([np.zeros(3, np.float32)], {variables.TABLE: 1.0})
  with pytest.raises(ValueError, match='not an item of'):
    variables.fetch(client)


def test_a_stopped_server_is_an_error_within_the_deadline():
  server = reverb.Server([variables.make_table()])
  client = reverb.Client(f'localhost:{server.port}')
  variables.publish(client, _policy(), 1)
  server.stop()
  start = time.monotonic()
  with pytest.raises(tables.ServerUnavailableError,
                     match=f'localhost:{server.port}'):
    variables.fetch(client, timeout_s=1.0)
  with pytest.raises(tables.ServerUnavailableError):
    variables.publish(client, _policy(), 2, timeout_s=1.0)
  assert time.monotonic() - start < 10
