"""`python -m pipelines.push --num_workers N`: the split pushed by N worker
processes, with global barriers held by the parent (rlds_reverb/storage/shards.py).

Subprocesses on loopback, every wait bounded, every process killed at the
end. The data: episodes of 5-8 steps whose observations name episode and
step (e * 1000 + t), so an episode read back from an episode table says
which one it is.
"""

import json
import pathlib
import re
import signal
from typing import List

import numpy as np
import pytest

from rlds_reverb.storage import push
from rlds_reverb.storage import shards
import rlds_fixtures as fx  # pylint: disable=g-bad-import-order
from test_push_faults import _Process, _push, _serve, _summary, _wait_for_points

EPISODES = 24


def _length(e: int) -> int:
  return 5 + e % 4


def _write_dataset(out: pathlib.Path, episodes: int) -> str:
  return fx.write_tfds(out, [fx.counting_steps(_length(e), e * 1000)
                             for e in range(episodes)], name='shards')


@pytest.fixture(scope='module')
def dataset(tmp_path_factory) -> str:
  return _write_dataset(tmp_path_factory.mktemp('shards') / 'data', EPISODES)


def _read_episodes(address: str) -> List[int]:
  """The episode numbers of every episode item of table 'rlds', checked
  whole (every step of it, in order)."""
  import reverb  # pylint: disable=g-import-not-at-top
  from rlds_reverb.replay import episode_table  # pylint: disable=g-import-not-at-top
  reader = episode_table.EpisodeReader(reverb.Client(address), 'rlds',
                                       timeout_s=10)
  found = []
  for episode in reader.read_all():
    observation = np.asarray(episode.data.observation)[:, 0]
    e = int(observation[0]) // 1000
    np.testing.assert_array_equal(
        observation, e * 1000 + np.arange(_length(e), dtype=np.float32))
    found.append(e)
  return sorted(found)


def test_split_ranges_cover_the_split_once():
  assert shards.split_ranges(10, 3) == [(0, 4), (4, 7), (7, 10)]
  assert shards.split_ranges(1, 2) == [(0, 1), (1, 1)]
  point = push.PushPoint(5, 9, 9, shards=[
      dict(start=0, stop=4, position=3, items=6),
      dict(start=4, stop=7, position=6, items=3)])
  assert point.held() == 'episodes 0-2, 4-5'


def test_two_workers_write_every_episode_once(dataset, tmp_path):
  processes = []
  try:
    server, address = _serve(tmp_path, 'serve', dataset, tmp_path / 'ckpt',
                             '--feed_table')
    processes.append(server)
    state = tmp_path / 'state.json'
    sharded = _push(tmp_path, '--dataset', dataset, '--feed_table',
                    '--reverb_address', address, '--num_workers', '2',
                    '--checkpoint_every', '5', '--state_file', str(state))
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    summary = _summary(sharded.stdout)
    assert _read_episodes(address) == list(range(EPISODES))
    steps = sum(_length(e) for e in range(EPISODES))
    assert (summary['episodes'], summary['steps'], summary['items'],
            summary['table_size']) == (EPISODES, steps, EPISODES, EPISODES)
    assert [(s['start'], s['stop'], s['episodes']) for s in
            summary['shards']] == [(0, 12, 12), (12, 24, 12)]
    recorded = json.loads(state.read_text())
    assert recorded['complete']
    assert recorded['points'][-1]['checkpoint']
    # Barriers every 5 episodes of each shard: 5 and 10, then the end.
    assert [p['episodes'] for p in recorded['points']] == [0, 10, 20, 24]
    # The same totals as one process pushing (embedded server).
    single = _push(tmp_path, '--dataset', dataset, '--feed_table')
    assert single.returncode == 0, single.stderr[-3000:]
    alone = _summary(single.stdout)
    for key in ('episodes', 'steps', 'items', 'truncated', 'terminated',
                'table_size'):
      assert summary[key] == alone[key], key
  finally:
    for process in processes:
      process.kill()


def test_three_workers_into_the_embedded_server(dataset, tmp_path):
  pushed = _push(tmp_path, '--dataset', dataset, '--num_workers', '3',
                 '--max_episodes', '20')
  assert pushed.returncode == 0, pushed.stderr[-3000:]
  summary = _summary(pushed.stdout)
  items = sum(_length(e) - 1 for e in range(20))
  assert (summary['episodes'], summary['items'], summary['table_size']) == (
      20, items, items)
  assert [s['stop'] - s['start'] for s in summary['shards']] == [7, 7, 6]


def test_resume_after_the_server_died_completes_exactly(dataset, tmp_path):
  data = _write_dataset(tmp_path / 'data', 60)
  state = tmp_path / 'state.json'
  processes = []
  try:
    server, address = _serve(tmp_path, 'serve1', data, tmp_path / 'ckpt',
                             '--feed_table')
    processes.append(server)
    args = ('--dataset', data, '--feed_table', '--num_workers', '2',
            '--checkpoint_every', '1', '--state_file', str(state))
    # Ctrl-C: every worker ends, what they confirmed is recorded, exit 130.
    # A server wait of 2 s can run out on a loaded 2-core CI machine (the
    # stop then goes unrecorded, and says so); the server is alive here.
    pushing = _Process(tmp_path, 'push0', 'push', *args,
                       '--server_timeout_s', '10', '--reverb_address', address)
    processes.append(pushing)
    _wait_for_points(state, 3, pushing)
    pushing.proc.send_signal(signal.SIGINT)
    assert pushing.proc.wait(timeout=90) == 130, pushing.stderr()[-3000:]
    error = pushing.stderr().rstrip().splitlines()[-1]
    assert re.match(r'^push: error: interrupted after \d+ episodes, \d+ '
                    r'items written \(--resume pushes the rest\)$', error), error
    # Nothing is recorded after the stop.
    assert json.loads(state.read_text())['points'][-1]['reason'] == 'stopped'

    # Resumed on the same server, then the server killed mid-push.
    pushing = _Process(tmp_path, 'push1', 'push', *args,
                       '--server_timeout_s', '2', '--reverb_address', address,
                       '--resume')
    processes.append(pushing)
    _wait_for_points(state, len(json.loads(state.read_text())['points']) + 3,
                     pushing)
    server.kill()
    assert pushing.proc.wait(timeout=90) == 1, pushing.stderr()[-3000:]
    error = pushing.stderr().rstrip().splitlines()[-1]
    assert error.startswith('push: error: '), error
    assert re.search(r'not durably stored: shard 0: episodes? \d+', error)
    assert re.search(r'; episodes [-\d, ]+ are in checkpoint \S+ \(\d+ '
                     r'items\)', error), error
    print(error)

    server, address = _serve(tmp_path, 'serve2', data, tmp_path / 'ckpt',
                             '--feed_table')
    processes.append(server)
    resumed = _push(tmp_path, *args, '--server_timeout_s', '10',
                    '--reverb_address', address, '--resume')
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = _summary(resumed.stdout)
    assert summary['table_size'] == 60
    assert summary['episodes'] < 60  # Only what the checkpoint lacked.
    assert _read_episodes(address) == list(range(60))
  finally:
    for process in processes:
      process.kill()
