"""The in-memory replay: episode tables read once, transitions equal to the
pushed 2-step items, n-step returns, uniform draws, eviction."""

from typing import Any, List

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.specs import tensor_spec
import tree

import rlds_reverb
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import memory as memory_lib
try:
  from tests import rlds_fixtures as fx  # pylint: disable=g-import-not-at-top
except ImportError:
  import rlds_fixtures as fx  # pylint: disable=g-import-not-at-top

def chi_square(observed, expected) -> float:
  observed, expected = np.asarray(observed, float), np.asarray(expected, float)
  return float(np.sum((observed - expected) ** 2 / expected))


def chi_square_bound(dof: int) -> float:
  """dof + 6 sd of the chi-square: a correct sampler exceeds it with
  probability below 1e-6 for the dofs used here."""
  return dof + 6.0 * np.sqrt(2.0 * dof)


EDGE_LENGTHS = [5, 1, 2, 0, 7, 1, 3]
EDGE_TERMINAL = [True, True, False, True, False, False, True]


def _items_of(flat_item: Any) -> bytes:
  return b''.join(np.ascontiguousarray(x).tobytes()
                  for x in tree.flatten(flat_item))


class _Server:
  """A real Reverb server with a queue of 2-step items and an episode table."""

  def __init__(self, spec: Any):
    self.server = reverb.Server([
        reverb.Table.queue('pairs', 10_000,
                           signature=tensor_spec.add_outer_dim(spec)),
        episode_table.make_table('episodes', spec, max_episodes=10_000)])
    self.client = reverb.Client(f'localhost:{self.server.port}')

  def pairs(self) -> List[Any]:
    size = self.client.server_info()['pairs'].current_size
    if not size:
      return []
    return [s.data for s in self.client.sample(
        'pairs', num_samples=size, emit_timesteps=False,
        unpack_as_table_signature=True)]

  def stop(self):
    self.server.stop()


def _push_both(server: _Server, rlds_data, zero_terminal_discount=True):
  rlds_reverb.push_rlds_to_table(
      rlds_data, server.client, 'pairs', sequence_length=2,
      zero_terminal_discount=zero_terminal_discount)
  rlds_reverb.push_rlds_to_table(
      rlds_data, server.client, 'episodes', sequence_length=None,
      priority=episode_table.UNREAD,
      zero_terminal_discount=zero_terminal_discount)


def _all_transitions(memory: memory_lib.TransitionMemory, **kwargs):
  rows = memory._index[:int(memory.num_transitions)]  # pylint: disable=protected-access
  batch = memory.transitions(rows, **kwargs)
  return [tree.map_structure(lambda x, i=i: x[i].numpy(), batch)
          for i in range(int(memory.num_transitions))]


class FeedEqualsPushedItemsTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ('flat', {}, True), ('dict_observation', {'dict_observation': True}, True),
      ('discrete', {'discrete': True}, False),
      ('no_terminal_fix', {}, False))
  def test_every_transition_equals_a_pushed_item(self, kwargs, zero_fix):
    episodes = fx.episodes_with_lengths(EDGE_LENGTHS, EDGE_TERMINAL, **kwargs)
    rlds_data = fx.make_rlds(episodes)
    spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
    server = _Server(spec)
    try:
      _push_both(server, rlds_data, zero_fix)
      pairs = server.pairs()
      read = episode_table.EpisodeReader(server.client, 'episodes').read_all()
      memory = memory_lib.from_episodes(spec, [e.data for e in read],
                                        [e.key for e in read],
                                        float_dtype=None)
    finally:
      server.stop()
    ours = _all_transitions(memory)
    # Transitions: L - 1 per episode, none for 0- or 1-step episodes.
    self.assertLen(pairs, sum(max(n - 1, 0) for n in EDGE_LENGTHS))
    self.assertLen(ours, len(pairs))
    for item in ours:
      tf.nest.assert_same_structure(item, pairs[0], check_types=False)
      for x, y in zip(tree.flatten(item), tree.flatten(pairs[0])):
        self.assertEqual(x.dtype, y.dtype)
        self.assertEqual(x.shape, y.shape)
    self.assertEqual(sorted(map(_items_of, ours)),
                     sorted(map(_items_of, pairs)))


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


def _memory_with(lengths, terminal=None, capacity=None, **kwargs):
  episodes = fx.episodes_with_lengths(lengths, terminal)
  rlds_data = fx.make_rlds(episodes)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  converted = [tree.map_structure(np.asarray, e.trajectory) for e in
               rlds_reverb.convert_rlds_to_episodes(
                   rlds_data, zero_terminal_discount=True
               ).as_numpy_iterator()]
  memory = memory_lib.TransitionMemory(
      spec, capacity or sum(lengths), float_dtype=None, **kwargs)
  return memory, converted


class NStepTest(parameterized.TestCase):

  def _expected(self, episode, t, n, gamma):
    """n-step target pieces computed by hand in numpy."""
    length = len(episode.step_type)
    reward, scale, m = 0.0, 1.0, 0
    for k in range(n):
      if t + k + 1 >= length:  # no transition t + k
        break
      reward += scale * episode.reward[t + k]
      scale *= gamma * episode.discount[t + k]
      m = k + 1
    discount = scale / gamma
    return reward, discount, m

  @parameterized.parameters(1, 2, 3, 5)
  def test_n_step_stops_at_terminals_and_bootstraps_at_truncations(self, n):
    lengths, terminal = [6, 4, 2, 5], [True, False, True, False]
    memory, converted = _memory_with(lengths, terminal)
    memory.add(converted)
    gamma = 0.9
    start = 0
    for episode in converted:
      for t in range(len(episode.step_type) - 1):
        item = memory.transitions(tf.constant([start + t]), n_step=n,
                                  gamma=gamma)
        reward, discount, m = self._expected(episode, t, n, gamma)
        where = f'episode at row {start}, t={t}, n={n}'
        np.testing.assert_allclose(item.reward[0, 0], reward, rtol=1e-5,
                                   err_msg=where)
        np.testing.assert_allclose(item.discount[0, 0], discount, rtol=1e-5,
                                   atol=1e-7, err_msg=where)
        np.testing.assert_array_equal(item.observation[0, 1],
                                      episode.observation[t + m],
                                      err_msg=where)
        np.testing.assert_array_equal(item.observation[0, 0],
                                      episode.observation[t], err_msg=where)
      start += len(episode.step_type)

  def test_terminal_zeroes_the_bootstrap_truncation_keeps_it(self):
    memory, converted = _memory_with([3, 3], [True, False])
    memory.add(converted)
    # The last transition of each episode: row 1 (terminal), row 4 (cut).
    item = memory.transitions(tf.constant([1, 4]), n_step=3, gamma=0.9)
    self.assertEqual(float(item.discount[0, 0]), 0.0)
    self.assertGreater(float(item.discount[1, 0]), 0.0)


class UniformAndEvictionTest(absltest.TestCase):

  def test_uniform_frequencies_over_all_transitions(self):
    lengths = [2, 9, 1, 30, 5]
    memory, converted = _memory_with(lengths)
    memory.add(converted)
    n = int(memory.num_transitions)
    self.assertEqual(n, sum(x - 1 for x in lengths))
    draws = tf.function(lambda: memory.sample_rows(200_000))().numpy()
    counts = np.bincount(draws, minlength=memory.capacity)
    valid = np.zeros(memory.capacity, bool)
    start = 0
    for length in lengths:
      valid[start:start + length - 1] = True
      start += length
    # No draw outside the transitions; chi-square uniform over them.
    self.assertEqual(counts[~valid].sum(), 0)
    expected = np.full(n, 200_000 / n)
    self.assertLess(chi_square(counts[valid], expected),
                    chi_square_bound(n - 1))

  def test_wrap_evicts_whole_overlapped_episodes(self):
    memory, converted = _memory_with([4, 4, 4], capacity=10)
    added = memory.add(converted[:2])
    self.assertEqual(int(memory.num_transitions), 6)
    added = memory.add(converted[2:])  # Does not fit at row 8: row 0.
    self.assertEqual(added.new_rows.tolist(), [0, 1, 2])
    self.assertEqual(added.evicted_rows.tolist(), [3])
    self.assertEqual(int(memory.num_transitions), 6)
    rows = set(memory._index[:6].numpy().tolist())  # pylint: disable=protected-access
    self.assertEqual(rows, {0, 1, 2, 4, 5, 6})
    # Row 0..3 hold the third episode now.
    np.testing.assert_array_equal(
        memory.read(tf.range(4)).observation.numpy(),
        converted[2].observation)
    self.assertEqual([r[1:] for r in memory.episode_rows()],
                     [(4, 4), (0, 4)])

  def test_episode_too_long_is_refused_naming_it(self):
    memory, converted = _memory_with([3, 12], capacity=10)
    with self.assertRaisesRegex(ValueError, 'episode 1 has 12 steps'):
      memory.add(converted)

  def test_wrong_shape_is_refused_naming_episode_and_field(self):
    memory, converted = _memory_with([3, 3])
    bad = converted[1]._replace(observation=converted[1].observation[:, :2])
    with self.assertRaisesRegex(ValueError, 'episode 1 field observation'):
      memory.add([converted[0], bad])

  def test_empty_memory_sample_fails_clearly(self):
    memory, _ = _memory_with([3])
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                'holds no transition'):
      memory.sample_rows(4)

  def test_bytes_per_transition_near_the_raw_steps(self):
    memory, converted = _memory_with([100] * 5)
    memory.add(converted)
    raw = sum(x.nbytes for e in converted for x in tree.flatten(e))
    # Step types as bytes and a 4-byte index: at most 1.2x the raw steps.
    self.assertLess(memory.bytes, 1.2 * raw)


if __name__ == '__main__':
  absltest.main()
