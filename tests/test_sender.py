"""Tests of rlds_reverb/acting/sender.py: episodes to a remote table, paced."""

import time

import numpy as np
import pytest
import reverb
from tf_agents.specs import tensor_spec

from rlds_reverb.storage import tables
from rlds_reverb.acting import envs
from rlds_reverb.acting import sender
from rlds_reverb.experiments import run
from rlds_reverb.replay import episode_table

ENV = 'InvertedPendulum-v5'


@pytest.fixture(scope='module')
def spec():
  return run.trajectory_spec(envs.env_specs(ENV))


def _episode(steps: int, seed: int = 0) -> dict:
  """RLDS steps of a pendulum episode of `steps` env steps, terminal."""
  rng = np.random.default_rng(seed)
  n = steps + 1
  return {'observation': rng.normal(size=(n, 4)).astype(np.float32),
          'action': rng.uniform(-3, 3, (n, 1)).astype(np.float32),
          'reward': np.ones(n, np.float32), 'discount': np.ones(n, np.float32),
          'is_first': np.arange(n) == 0, 'is_last': np.arange(n) == n - 1,
          'is_terminal': np.arange(n) == n - 1}


@pytest.fixture
def server(spec):
  # 'limited' holds a third unread insert back until a sample: a table with
  # a rate limiter of its own.
  limited = reverb.Table(
      'limited', sampler=reverb.selectors.MinHeap(),
      remover=reverb.selectors.Fifo(), max_size=100,
      rate_limiter=reverb.rate_limiters.SampleToInsertRatio(
          1.0, 1, error_buffer=(-100.0, 2.0)),
      signature=tensor_spec.add_outer_dim(tensor_spec.from_spec(spec)))
  server = reverb.Server([episode_table.make_table('online', spec,
                                                   max_episodes=100),
                          limited])
  yield server
  server.stop()


def test_unread_is_inserts_minus_first_reads(server):
  client = server.localhost_client()
  assert sender.write_episodes(client, 'online',
                               [_episode(3, i) for i in range(4)]) == 4
  assert sender.unread_episodes(client, 'online') == 4
  reader = episode_table.EpisodeReader(client, 'online')
  assert len(reader.read_new(1)) == 1
  assert sender.unread_episodes(client, 'online') == 3
  assert len(reader.read_all()) == 4  # A full pass: read ones again.
  assert sender.unread_episodes(client, 'online') == 0


def test_keeps_at_most_max_unread_in_the_table(server):
  client = server.localhost_client()
  episodes = sender.EpisodeSender(client, 'online', max_unread_episodes=3,
                                  timeout_s=2.0)
  episodes.add([_episode(2, i) for i in range(5)])
  assert episodes.pace(lambda: False)  # 3 in a write, 2 wait for it.
  # The first write traces the conversion's graph: seconds on a loaded
  # machine. Stop once it is confirmed (or at a generous bound); the two
  # left must still wait on the full table.
  deadline = time.monotonic() + 60.0
  assert not episodes.flush(
      lambda: episodes.written >= 3 or time.monotonic() > deadline)  # Full.
  assert episodes.written == 3 and episodes.unsent == 2
  assert not episodes.pace(lambda: True)  # The actor must hold still.
  start = time.monotonic()
  assert episodes.finish() == 2  # A full table is not waited for.
  assert time.monotonic() - start < 1.5
  episode_table.EpisodeReader(client, 'online').read_new(2)
  assert episodes.flush(lambda: False)
  assert episodes.written == 5 and episodes.unsent == 0
  assert episodes.finish() == 0


def test_waits_on_a_live_server_that_holds_inserts_back(server):
  client = server.localhost_client()
  reader = episode_table.EpisodeReader(client, 'limited')
  waits = []

  def on_wait(kind, value):
    waits.append((kind, value))
    reader.read_new(1)  # A sample lets the held insert in.

  # timeout_s is also the deadline of the sender's ping of the server: a
  # live server on a loaded 2-core CI machine once took over 0.5 s to
  # answer it. Only the third write is held, so one wait of 3 s.
  episodes = sender.EpisodeSender(client, 'limited', max_unread_episodes=100,
                                  timeout_s=3.0)
  for i in range(3):
    episodes.add([_episode(2, i)])
    assert episodes.flush(lambda: False, on_wait)
  assert episodes.written == 3
  assert waits and waits[0][0] == 'write' and waits[0][1] > 3.0


def test_a_dead_server_is_an_error(server):
  client = reverb.Client(f'localhost:{server.port}')
  episodes = sender.EpisodeSender(client, 'online', max_unread_episodes=100,
                                  timeout_s=1.0)
  server.stop()
  episodes.add([_episode(2)])
  start = time.monotonic()
  with pytest.raises(tables.ServerUnavailableError,
                     match=f'localhost:{server.port}'):
    episodes.flush(lambda: False)
  assert time.monotonic() - start < 8
