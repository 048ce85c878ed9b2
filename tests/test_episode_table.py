"""rlds_reverb.replay.episode_table: reading whole-episode tables once per
pass, on a real Reverb server."""

from absl.testing import absltest

import rlds_reverb
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


if __name__ == '__main__':
  absltest.main()


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
