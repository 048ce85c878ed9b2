"""The in-memory replay (rlds_reverb.replay.memory): transitions equal to
the pushed 2-step items, n-step returns, uniform draws, eviction. Reading the
episode tables it is filled from: test_episode_table.py."""

from typing import Any

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import tensorflow as tf
import tree

import rlds_reverb
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import memory as memory_lib
import rlds_fixtures as fx  # pylint: disable=g-bad-import-order
from conftest import _Server  # pylint: disable=g-bad-import-order
from conftest import chi_square  # pylint: disable=g-bad-import-order
from conftest import chi_square_bound  # pylint: disable=g-bad-import-order
from conftest import converted_episodes  # pylint: disable=g-bad-import-order

EDGE_LENGTHS = [5, 1, 2, 0, 7, 1, 3]
EDGE_TERMINAL = [True, True, False, True, False, False, True]


def _items_of(flat_item: Any) -> bytes:
  return b''.join(np.ascontiguousarray(x).tobytes()
                  for x in tree.flatten(flat_item))


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
    if kwargs.get('dict_observation'):
      # Image frames are read as stacks, here of one frame: [2, 1, H, W, C].
      for item in ours:
        pixels = item.observation['pixels']
        self.assertEqual(pixels.shape[1], 1)
        item.observation['pixels'] = pixels[:, 0]
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


def _memory_with(lengths, terminal=None, capacity=None, **kwargs):
  spec, converted = converted_episodes(
      fx.make_rlds(fx.episodes_with_lengths(lengths, terminal)))
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
    # The steps once and a 4-byte index: at most 1.2x the raw steps.
    self.assertLess(memory.bytes, 1.2 * raw)

  def test_read_fields_gives_those_fields_as_read_does(self):
    memory, converted = _memory_with([5, 7])
    memory.add(converted)
    rows = tf.constant([[0, 1, 2], [6, 7, 8]])
    whole = memory.read(rows)
    part = memory.read_fields(rows, ('reward', 'discount'))
    self.assertEqual(sorted(part), ['discount', 'reward'])
    np.testing.assert_array_equal(part['reward'], whole.reward)
    np.testing.assert_array_equal(part['discount'], whole.discount)


if __name__ == '__main__':
  absltest.main()
