"""rlds_reverb.replay.sampling on a real in-process Reverb server.

Observations encode where a step comes from (episode, step, then a random
value), so every sampled transition can be looked up in the data that was
pushed: both of its steps, every field, must be the stored ones, and its
second step must be the first step's successor in the same episode.
"""

from typing import Any, Dict, List, Tuple

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import rlds
import tensorflow as tf
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.trajectories import time_step as ts

import rlds_reverb
from rlds_reverb.replay import sampling
from rlds_reverb.storage import tables

import rlds_fixtures as fx  # pylint: disable=g-bad-import-order

_LENGTHS = [7, 12, 3, 9, 2, 11, 6, 10]
_TERMINAL = [True, False, True, False, True, True, False, True]
_FLOAT_FIELDS = (rlds.OBSERVATION, rlds.ACTION, rlds.REWARD, rlds.DISCOUNT)


def _encoded_episodes(first_id: int = 0, reward: Any = None,
                      float_dtype=np.float32) -> List[fx.Episode]:
  """Episodes whose observation is (episode id, step, random value)."""
  episodes = fx.episodes_with_lengths(_LENGTHS, _TERMINAL, seed=first_id)
  out = []
  for i, steps in enumerate(episodes):
    n = len(steps[rlds.IS_FIRST])
    observation = steps[rlds.OBSERVATION].copy()  # [n, fx.OBS_DIM]
    observation[:, 0] = first_id + i
    observation[:, 1] = np.arange(n)
    changes = {rlds.OBSERVATION: observation}
    if reward is not None:
      changes[rlds.REWARD] = np.full(n, reward, np.float32)
    steps = fx.with_fields(steps, **changes)
    # The data spec keeps TF-Agents' float32 discount whatever the data's
    # dtype, so only these three follow `float_dtype`.
    for field in (rlds.OBSERVATION, rlds.ACTION, rlds.REWARD):
      steps[field] = steps[field].astype(float_dtype)
    out.append(steps)
  return out


def _items(episodes: List[fx.Episode]) -> int:
  """Window items of 2 that the push writes (episodes end in LAST)."""
  return sum(len(e[rlds.IS_FIRST]) - 1 for e in episodes)


EPISODES = _encoded_episodes()
EPISODES_64 = _encoded_episodes(float_dtype=np.float64)
OFFLINE = _encoded_episodes(first_id=0, reward=0.0)
ONLINE = _encoded_episodes(first_id=100, reward=1.0)
SPEC = rlds_reverb.create_trajectory_data_spec(fx.make_rlds(EPISODES))
SPEC_64 = rlds_reverb.create_trajectory_data_spec(fx.make_rlds(EPISODES_64))


def _stored_steps(episodes: List[fx.Episode]
                  ) -> Dict[Tuple[int, int], Dict[str, np.ndarray]]:
  """(episode id, step) -> the trajectory fields that step becomes."""
  stored = {}
  for steps in episodes:
    n = len(steps[rlds.IS_FIRST])
    for t in range(n):
      key = (int(steps[rlds.OBSERVATION][t, 0]), t)
      step_type = (ts.StepType.FIRST if t == 0 else
                   ts.StepType.LAST if t == n - 1 else ts.StepType.MID)
      stored[key] = dict({f: steps[f][t] for f in _FLOAT_FIELDS},
                         step_type=int(step_type))
      if steps[rlds.IS_TERMINAL][t]:  # A terminal last step: discount 0.
        stored[key][rlds.DISCOUNT] = np.zeros_like(steps[rlds.DISCOUNT][t])
  return stored


class SamplingTest(parameterized.TestCase):
  """One server for the whole class; the tables are only read."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.server = tables.start_server([
        tables.make_table('pairs', SPEC, max_size=1000),
        tables.make_table('pairs64', SPEC_64, max_size=1000),
        tables.make_table('offline', SPEC, max_size=1000),
        tables.make_table('online', SPEC, max_size=1000),
        tables.make_table('empty', SPEC, max_size=1000),
    ])
    cls.address = f'localhost:{cls.server.port}'
    client = tables.connect(cls.address)
    for table, episodes in (('pairs', EPISODES), ('pairs64', EPISODES_64),
                            ('offline', OFFLINE), ('online', ONLINE)):
      rlds_reverb.push_rlds_to_table(fx.make_rlds(episodes), client, table,
                                     sequence_length=2)

  @classmethod
  def tearDownClass(cls):
    cls.server.stop()
    super().tearDownClass()

  def batches(self, dataset: tf.data.Dataset, n: int) -> List[Any]:
    return list(dataset.take(n).as_numpy_iterator())

  def assert_real_transitions(self, batch: Any, stored) -> List[Tuple]:
    """Every item is two consecutive stored steps; returns the items' keys."""
    keys = []
    observation = batch.observation
    for i in range(observation.shape[0]):
      episode, step = int(observation[i, 0, 0]), int(observation[i, 0, 1])
      self.assertEqual((int(observation[i, 1, 0]), int(observation[i, 1, 1])),
                       (episode, step + 1), f'item {i}: not a successor')
      for t in (0, 1):
        expected = stored[(episode, step + t)]
        where = f'item {i} (episode {episode}, step {step}) time {t}'
        for field in _FLOAT_FIELDS:
          np.testing.assert_array_equal(
              getattr(batch, field)[i, t],
              expected[field].astype(getattr(batch, field).dtype),
              err_msg=f'{where} {field}')
        self.assertEqual(batch.step_type[i, t], expected['step_type'], where)
      self.assertEqual(batch.next_step_type[i, 0], batch.step_type[i, 1])
      keys.append((episode, step))
    return keys

  def test_same_elements_as_reverb_replay_buffer(self):
    batch_size = 16
    buffer = reverb_replay_buffer.ReverbReplayBuffer(
        SPEC, 'pairs', sequence_length=2, local_server=self.server)
    theirs = buffer.as_dataset(sample_batch_size=batch_size, num_steps=2)
    ours = sampling.transition_dataset(self.address, 'pairs', SPEC,
                                       batch_size)
    self.assertEqual(ours.element_spec, theirs.element_spec[0])
    (our_batch,) = self.batches(ours, 1)
    (their_batch, _) = self.batches(theirs, 1)[0]
    tf.nest.assert_same_structure(our_batch, their_batch)
    self.assertIsInstance(our_batch, type(their_batch))
    for a, b in zip(tf.nest.flatten(our_batch), tf.nest.flatten(their_batch)):
      self.assertEqual((a.dtype, a.shape), (b.dtype, b.shape))
    self.assertEqual(our_batch.observation.shape,
                     (batch_size, 2, fx.OBS_DIM))

  @parameterized.named_parameters(('one_reader', 1), ('two_readers', 2),
                                  ('three_readers', 3))
  def test_samples_are_stored_transitions(self, readers):
    dataset = sampling.transition_dataset(
        self.address, 'pairs', SPEC, 32, num_parallel_readers=readers)
    stored = _stored_steps(EPISODES)
    seen = set()
    for batch in self.batches(dataset, 8):
      seen.update(self.assert_real_transitions(batch, stored))
    # 256 uniform draws from 63 items leave about one unseen; a sampler stuck
    # on a few items (or one reader's buffer replayed) would show here.
    self.assertGreater(len(seen), 0.8 * _items(EPISODES))

  def test_float64_fields_arrive_as_float32(self):
    self.assertEqual(SPEC_64.observation.dtype, tf.float64)
    self.assertEqual(SPEC_64.reward.dtype, tf.float64)
    dataset = sampling.transition_dataset(self.address, 'pairs64', SPEC_64, 8)
    spec = dataset.element_spec
    for field in _FLOAT_FIELDS:
      self.assertEqual(getattr(spec, field).dtype, tf.float32, field)
    self.assertEqual(spec.step_type.dtype, tf.int32)
    self.assertEqual(spec.next_step_type.dtype, tf.int32)
    (batch,) = self.batches(dataset, 1)
    self.assertEqual(batch.observation.dtype, np.float32)
    self.assert_real_transitions(batch, _stored_steps(EPISODES_64))

  def test_float64_kept_without_cast(self):
    dataset = sampling.transition_dataset(self.address, 'pairs64', SPEC_64, 8,
                                          dtypes_to=None)
    (batch,) = self.batches(dataset, 1)
    for field in (rlds.OBSERVATION, rlds.ACTION, rlds.REWARD):
      self.assertEqual(getattr(batch, field).dtype, np.float64, field)
    self.assertEqual(batch.discount.dtype, np.float32)
    self.assert_real_transitions(batch, _stored_steps(EPISODES_64))

  def test_mixed_dataset_takes_exact_counts(self):
    offline = sampling.transition_dataset(self.address, 'offline', SPEC, 3)
    online = sampling.transition_dataset(self.address, 'online', SPEC, 5)
    mixed = sampling.mixed_dataset([offline, online], [3, 5])
    self.assertEqual(mixed.element_spec.observation.shape,
                     (8, 2, fx.OBS_DIM))
    stored = _stored_steps(OFFLINE + ONLINE)
    for batch in self.batches(mixed, 6):
      self.assertEqual(batch.reward.shape, (8, 2))
      np.testing.assert_array_equal(batch.reward[:3], 0.0)
      np.testing.assert_array_equal(batch.reward[3:], 1.0)
      self.assertTrue(np.all(batch.observation[:3, :, 0] < 100))
      self.assertTrue(np.all(batch.observation[3:, :, 0] >= 100))
      self.assert_real_transitions(batch, stored)

  def test_rate_limiter_timeout_ends_an_empty_table(self):
    dataset = sampling.transition_dataset(
        self.address, 'empty', SPEC, 4, rate_limiter_timeout_ms=50)
    self.assertEqual(self.batches(dataset, 1), [])

  def test_missing_table(self):
    with self.assertRaisesRegex(ValueError, 'no_such_table'):
      sampling.transition_dataset(self.address, 'no_such_table', SPEC, 8)

  def test_signature_mismatch(self):
    other = rlds_reverb.create_trajectory_data_spec(
        fx.make_rlds([fx.complete_episode(3, obs_dim=5)]))
    with self.assertRaisesRegex(ValueError, 'observation'):
      sampling.transition_dataset(self.address, 'pairs', other, 8)

  @parameterized.named_parameters(
      ('batch_size_0', dict(batch_size=0), 'batch_size'),
      ('batch_size_negative', dict(batch_size=-4), 'batch_size'),
      ('batch_size_float', dict(batch_size=2.5), 'batch_size'),
      ('batch_size_bool', dict(batch_size=True), 'batch_size'),
      ('sequence_length_0', dict(sequence_length=0), 'sequence_length'),
      ('readers_0', dict(num_parallel_readers=0), 'num_parallel_readers'),
      ('max_in_flight_0', dict(max_in_flight=0), 'max_in_flight'),
      ('dtypes_to_int', dict(dtypes_to=tf.int32), 'dtypes_to'),
      ('dtypes_to_junk', dict(dtypes_to='junk'), 'dtypes_to'),
      ('timeout', dict(rate_limiter_timeout_ms=-2), 'rate_limiter_timeout_ms'),
      ('address', dict(server_address=''), 'server_address'),
      ('table', dict(table=''), 'table'),
      ('data_spec_empty', dict(data_spec=()), 'data_spec'),
      ('data_spec_junk', dict(data_spec={'a': 3}), 'data_spec'),
  )
  def test_bad_arguments(self, changes, name):
    kwargs = dict(server_address=self.address, table='pairs', data_spec=SPEC,
                  batch_size=8)
    kwargs.update(changes)
    with self.assertRaisesRegex(ValueError, name):
      sampling.transition_dataset(**kwargs)


def _batches(batch_size: int, value: float = 0.0, **fields) -> tf.data.Dataset:
  """Endless batches of {'x': [batch_size, 2] float32} for mixed_dataset."""
  element = {'x': tf.fill([2], value), **fields}
  return tf.data.Dataset.from_tensors(element).repeat().batch(
      batch_size, drop_remainder=True)


class MixedDatasetArgumentsTest(parameterized.TestCase):

  def test_concatenates_in_order(self):
    mixed = sampling.mixed_dataset(
        [_batches(2, 0.0), _batches(1, 1.0), _batches(3, 2.0)], [2, 1, 3])
    batch = next(mixed.as_numpy_iterator())
    np.testing.assert_array_equal(batch['x'][:, 0], [0, 0, 1, 2, 2, 2])
    self.assertEqual(mixed.element_spec['x'].shape, (6, 2))

  @parameterized.named_parameters(
      ('no_datasets', [], [], 'at least one'),
      ('lengths', [_batches(2)], [2, 2], 'same length'),
      ('zero_size', [_batches(2), _batches(2)], [2, 0], r'batch_sizes\[1\]'),
      ('negative_size', [_batches(2)], [-2], r'batch_sizes\[0\]'),
      ('float_size', [_batches(2)], [2.0], r'batch_sizes\[0\]'),
      ('not_a_dataset', [_batches(2), [1, 2]], [2, 2], r'datasets\[1\]'),
      ('structure', [_batches(2), _batches(2, y=tf.constant(1))], [2, 2],
       r'datasets\[1\].*structure'),
      ('dtype', [_batches(2), tf.data.Dataset.from_tensors(
          {'x': tf.zeros([2, 2], tf.float64)})], [2, 2], 'float64'),
      ('item_shape', [_batches(2), tf.data.Dataset.from_tensors(
          {'x': tf.zeros([2, 3])})], [2, 2], 'shape'),
      ('batch_size', [_batches(2), _batches(3)], [2, 2],
       r'batches of 3.*batch_sizes\[1\] is 2'),
  )
  def test_bad_arguments(self, datasets, batch_sizes, message):
    with self.assertRaisesRegex(ValueError, message):
      sampling.mixed_dataset(datasets, batch_sizes)

  def test_unknown_batch_size_checked_when_run(self):
    # 5 items in batches of 2: the last batch has 1, which must not pass.
    short = tf.data.Dataset.from_tensor_slices({'x': tf.zeros([5, 2])}
                                               ).batch(2)
    self.assertIsNone(short.element_spec['x'].shape[0])
    mixed = sampling.mixed_dataset([_batches(2), short], [2, 2])
    iterator = iter(mixed)
    next(iterator)
    next(iterator)
    with self.assertRaises(tf.errors.InvalidArgumentError):
      next(iterator)


if __name__ == '__main__':
  absltest.main()
