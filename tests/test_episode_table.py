"""rlds_reverb.replay.episode_table: reading whole-episode tables once per
pass, on a real Reverb server."""

import shutil
import tempfile
import threading
import time

from absl.testing import absltest
import reverb

import rlds_reverb
from rlds_reverb.storage import server_link
from rlds_reverb.storage import tables
from rlds_reverb.replay import episode_table
import rlds_fixtures as fx  # pylint: disable=g-bad-import-order
from conftest import _Server  # pylint: disable=g-bad-import-order


class EpisodeReaderTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.episodes = fx.episodes_with_lengths([4, 3, 6, 1, 2])
    self.rlds = fx.make_rlds(self.episodes)
    self.spec = rlds_reverb.create_trajectory_data_spec(self.rlds)
    self.server = _Server(self.spec)
    self.addCleanup(self.server.stop)

  def _push(self, rlds_data):
    rlds_reverb.push_rlds_to_table(rlds_data, self.server.client, 'episodes',
                                   sequence_length=None,
                                   priority=episode_table.UNREAD)

  def test_read_all_takes_each_episode_once_every_pass(self):
    self._push(self.rlds)
    reader = episode_table.EpisodeReader(self.server.client, 'episodes')
    for _ in range(3):
      read = reader.read_all()
      self.assertLen(read, 5)
      self.assertLen({e.key for e in read}, 5)
      self.assertEqual(sorted(len(e.data.step_type) for e in read),
                       [1, 2, 3, 4, 6])
    # The table still holds everything: reading removes nothing.
    self.assertEqual(
        self.server.client.server_info()['episodes'].current_size, 5)

  def test_a_new_reader_reads_everything_again(self):
    self._push(self.rlds)
    episode_table.EpisodeReader(self.server.client, 'episodes').read_all()
    again = episode_table.EpisodeReader(self.server.client,
                                        'episodes').read_all()
    self.assertLen({e.key for e in again}, 5)

  def test_read_new_takes_only_unread_episodes(self):
    self._push(self.rlds)
    reader = episode_table.EpisodeReader(self.server.client, 'episodes')
    self.assertLen(reader.read_new(), 5)
    self.assertEqual(reader.read_new(), [])
    self._push(fx.make_rlds(fx.episodes_with_lengths([2, 9], seed=50)))
    new = reader.read_new()
    self.assertEqual(sorted(len(e.data.step_type) for e in new), [2, 9])
    self.assertEqual(reader.read_new(), [])

  def test_empty_table_reads_nothing_without_blocking(self):
    reader = episode_table.EpisodeReader(self.server.client, 'episodes')
    self.assertEqual(reader.read_all(), [])
    self.assertEqual(reader.read_new(), [])

  def test_refuses_a_table_it_cannot_read_once(self):
    with self.assertRaisesRegex(ValueError, 'min-heap.*--feed stream'):
      episode_table.EpisodeReader(self.server.client, 'pairs')


def test_online_memory_deletes_what_it_evicts_from_the_table():
  """The store holds what the memory holds: evicted episodes leave both."""
  from rlds_reverb.replay import follow  # pylint: disable=g-import-not-at-top
  from rlds_reverb.replay import memory as memory_lib  # pylint: disable=g-import-not-at-top
  episodes = fx.episodes_with_lengths([4, 4, 4, 4])
  rlds_data = fx.make_rlds(episodes)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  server = _Server(spec)
  try:
    rlds_reverb.push_rlds_to_table(
        fx.make_rlds(episodes[:2]), server.client, 'episodes',
        sequence_length=None, priority=episode_table.UNREAD)
    memory = memory_lib.TransitionMemory(spec, 10, float_dtype=None)
    follower = follow.TableFollower(server.client, 'episodes', memory,
                                    delete_evicted=True)
    assert follower.poll() == 2
    rlds_reverb.push_rlds_to_table(
        fx.make_rlds(episodes[2:]), server.client, 'episodes',
        sequence_length=None, priority=episode_table.UNREAD)
    assert follower.poll() == 2  # 16 steps in 10 rows: two evicted.
    kept = {key for key, _, _ in memory.episode_rows()}
    assert len(kept) == 2
    left = episode_table.EpisodeReader(server.client, 'episodes').read_all()
    assert {e.key for e in left} == kept
  finally:
    server.stop()


class ReaderOnALostServerTest(absltest.TestCase):
  """A reader's calls have deadlines; with a link it waits for the server."""

  def setUp(self):
    super().setUp()
    self.rlds = fx.make_rlds(fx.episodes_with_lengths([4, 3, 6, 1, 2]))
    self.spec = rlds_reverb.create_trajectory_data_spec(self.rlds)
    self.checkpoints = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.checkpoints, ignore_errors=True)
    self.server = self._serve(None)
    self.port = self.server.port
    self.address = f'localhost:{self.port}'
    self.client = reverb.Client(self.address)
    rlds_reverb.push_rlds_to_table(self.rlds, self.client, 'episodes',
                                   sequence_length=None,
                                   priority=episode_table.UNREAD)
    self.client.checkpoint()  # Before any read: every episode unread.

  def _serve(self, port):
    server = reverb.Server(
        [episode_table.make_table('episodes', self.spec, max_episodes=100)],
        port=port, checkpointer=reverb.checkpointers.DefaultCheckpointer(
            self.checkpoints))
    self.addCleanup(server.stop)
    return server

  def test_lost_server_fails_within_the_deadline(self):
    reader = episode_table.EpisodeReader(self.client, 'episodes',
                                         timeout_s=2)
    self.server.stop()
    start = time.monotonic()
    with self.assertRaises(tables.ServerUnavailableError) as raised:
      reader.read_all()
    self.assertLess(time.monotonic() - start, 15)
    message = str(raised.exception)
    self.assertIn(self.address, message)
    self.assertIn("table 'episodes'", message)
    self.assertNotIn('\n', message)

  def test_reconnect_goes_on_and_reads_each_episode_once(self):
    lines = []
    link = server_link.ServerLink(self.address, 'episodes', reconnect_s=60,
                                  timeout_s=2, report=lines.append)
    server_link.attach(self.client, link)
    reader = episode_table.EpisodeReader(self.client, 'episodes')
    episodes = reader.iter_all()
    first = [next(episodes), next(episodes)]
    self.server.stop()
    # Back from the checkpoint of before the read: the two episodes read
    # are unread there again.
    threading.Timer(3, lambda: self._serve(self.port)).start()
    rest = list(episodes)
    keys = [e.key for e in first + rest]
    self.assertLen(keys, 5)
    self.assertLen(set(keys), 5)
    self.assertLen(lines, 2, lines)
    self.assertStartsWith(lines[0], f'lost Reverb server at {self.address} '
                          'while')
    self.assertIn('waiting up to 60s', lines[0])
    self.assertIn("is back after", lines[1])
    self.assertIn("table 'episodes' holds 5 items, as before the loss",
                  lines[1])
    self.assertEqual(link.reconnects, 1)


if __name__ == '__main__':
  absltest.main()
