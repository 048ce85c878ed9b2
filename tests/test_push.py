"""rlds_reverb.storage.push against TF-Agents' observers, on a real Reverb server.

Items are read back from queue tables (FIFO, each item once) in the order
they were inserted, and compared field by field with the items that
TF-Agents' `push_rlds_to_reverb` + `ReverbAddTrajectoryObserver` /
`ReverbAddEpisodeObserver` write for the same data.
"""

import json
import os
import re
import tempfile
import time
from typing import Any, List
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import reverb
import rlds
import tensorflow as tf
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.replay_buffers import reverb_utils
from tf_agents.replay_buffers import rlds_to_reverb as tfa
from tf_agents.specs import tensor_spec
import tree

import rlds_reverb
from rlds_reverb.storage import push
from rlds_reverb.data import validate

import rlds_fixtures as fx  # pylint: disable=g-bad-import-order

SIGNATURE_MISMATCH = (
    'Replay buffer table signature spec should match RLDS data spec.')
MID_BEFORE_FIRST = 'Mid step should not be followed by a first step.'
_LAST = 2  # ts.StepType.LAST

c = fx.complete_episode
t_ = fx.truncated_episode
single = fx.single_step_episode

# Lengths and endings of the main test data: short and long episodes (one
# longer than the writer's chunk of 10 steps), single steps, an empty one.
_LENGTHS = [3, 1, 12, 0, 2, 5, 4, 6, 1]
_TERMINAL = [True, False, False, True, True, False, True, True, True]
EPISODES = fx.episodes_with_lengths(_LENGTHS, _TERMINAL, seed=10)
DATA_SPEC = rlds_reverb.create_trajectory_data_spec(fx.make_rlds(EPISODES))
SIGNATURE = tensor_spec.add_outer_dim(DATA_SPEC)
INFO_SPEC = {'log_prob': tf.TensorSpec([], tf.float32)}

QUEUES = ('ours', 'theirs')
_MAX_SIZE = 10_000
_SMALL = 10  # max_size of table 'small'.


_TF_AGENTS_TRAJECTORIES = []


def tf_agents_trajectories() -> List[Any]:
  """TF-Agents' conversion of EPISODES, computed once per module."""
  if not _TF_AGENTS_TRAJECTORIES:
    _TF_AGENTS_TRAJECTORIES.extend(
        tfa.convert_rlds_to_trajectories(fx.make_rlds(EPISODES)))
  return _TF_AGENTS_TRAJECTORIES


def replay_tf_agents_push(dataset, observer):
  """TF-Agents' `push_rlds_to_reverb` for EPISODES, conversion cached.

  Its loop, `for entry in convert_rlds_to_trajectories(...): observer(entry)`,
  fed with the trajectories it converted once (tracing its conversion per
  test is what would be slow). The real function is used where its own
  checks matter (the drop-in, error and episode tests).
  """
  del dataset  # Always fx.make_rlds(EPISODES).
  for entry in tf_agents_trajectories():
    observer(entry)
  return len(tf_agents_trajectories())


def _tables() -> List[reverb.Table]:
  mismatch_spec = rlds_reverb.create_trajectory_data_spec(
      fx.make_rlds([c(2, obs_dim=4)]))
  return [
      *(reverb.Table.queue(name, _MAX_SIZE, signature=SIGNATURE)
        for name in QUEUES),
      reverb.Table(
          'uniform', sampler=reverb.selectors.Uniform(),
          remover=reverb.selectors.Fifo(), max_size=_MAX_SIZE,
          rate_limiter=reverb.rate_limiters.MinSize(1), signature=SIGNATURE),
      reverb.Table(
          'small', sampler=reverb.selectors.Uniform(),
          remover=reverb.selectors.Fifo(), max_size=_SMALL,
          rate_limiter=reverb.rate_limiters.MinSize(1), signature=SIGNATURE),
      reverb.Table.queue('mismatch', _MAX_SIZE, signature=tensor_spec
                         .add_outer_dim(mismatch_spec)),
      reverb.Table.queue('with_info', _MAX_SIZE, signature=tensor_spec
                         .add_outer_dim(DATA_SPEC._replace(
                             policy_info=INFO_SPEC))),
  ]


class _ServerTestCase(parameterized.TestCase):
  """One real Reverb server per class; every table emptied after each test."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.server = reverb.Server(_tables())
    cls.client = reverb.Client(f'localhost:{cls.server.port}')

  @classmethod
  def tearDownClass(cls):
    cls.server.stop()
    super().tearDownClass()

  def tearDown(self):
    for table in self.client.server_info():
      self.client.reset(table)
    super().tearDown()

  def size(self, table: str) -> int:
    return self.client.server_info()[table].current_size

  def drain(self, table: str) -> List[Any]:
    """Every item of a queue table, oldest first (removes them)."""
    size = self.size(table)
    if not size:
      return []
    samples = list(self.client.sample(table, num_samples=size,
                                      emit_timesteps=False,
                                      unpack_as_table_signature=True))
    self.assertEqual(self.size(table), 0)
    return samples

  def push_theirs(self, dataset, sequence_length=2, stride_length=1,
                  priority=1.0, table='theirs', episodes=False,
                  push_fn=tfa.push_rlds_to_reverb) -> int:
    """TF-Agents' push through TF-Agents' observer; returns its count."""
    if episodes:
      observer = reverb_utils.ReverbAddEpisodeObserver(
          self.client, table, max_sequence_length=1000, priority=priority)
    else:
      observer = reverb_utils.ReverbAddTrajectoryObserver(
          self.client, table, sequence_length=sequence_length,
          stride_length=stride_length, priority=priority)
    try:
      return push_fn(dataset, observer)
    finally:
      observer.flush()
      observer.close()

  def assert_same_items(self, ours, theirs, label=''):
    """Same number of items, and per item every field equal (dtype too)."""
    self.assertEqual(len(ours), len(theirs), f'{label}: number of items')
    for i, (a, b) in enumerate(zip(ours, theirs)):
      tree.assert_same_structure(a.data, b.data)
      for (path, x), y in zip(tree.flatten_with_path(a.data),
                              tree.flatten(b.data)):
        where = f'{label} item {i} {"/".join(map(str, path))}'
        self.assertEqual(x.dtype, y.dtype, where)
        self.assertEqual(x.shape, y.shape, where)
        np.testing.assert_array_equal(x, y, err_msg=where)
      self.assertEqual(a.info.priority, b.info.priority, f'{label} item {i}')


def _expected_window_count(lengths, sequence_length, stride_length):
  """Items of ReverbAddTrajectoryObserver when every episode ends in LAST."""
  return sum((n - sequence_length) // stride_length + 1
             for n in lengths if n >= sequence_length)


def _episode_key(sample):
  data = sample.data
  return (len(data.step_type), data.observation[0].tolist())


class WindowItemsTest(_ServerTestCase):

  @parameterized.named_parameters(
      ('pairs', 2, 1, 1.0),
      ('single_steps', 1, 1, 0.5),
      ('length_3_stride_2', 3, 2, 2.0),
      ('disjoint_length_5', 5, 5, 1.0),
      ('length_4_with_shorter_episodes', 4, 1, 0.25),
  )
  def test_same_items_as_trajectory_observer(self, sequence_length,
                                             stride_length, priority):
    dataset = fx.make_rlds(EPISODES)
    theirs_count = self.push_theirs(dataset, sequence_length, stride_length,
                                    priority, push_fn=replay_tf_agents_push)
    stats = push.PushStats()
    ours_count = rlds_reverb.push_rlds_to_table(
        dataset, self.client, 'ours', sequence_length=sequence_length,
        stride_length=stride_length, priority=priority, stats=stats)
    self.assertEqual(ours_count, theirs_count)
    self.assertEqual(ours_count, sum(_LENGTHS))
    expected_items = _expected_window_count(_LENGTHS, sequence_length,
                                            stride_length)
    self.assertEqual(self.size('theirs'), expected_items)
    self.assertEqual(self.size('ours'), expected_items)
    self.assertEqual(stats.items, expected_items)
    ours, theirs = self.drain('ours'), self.drain('theirs')
    self.assert_same_items(ours, theirs)
    for sample in ours:
      self.assertEqual(sample.info.priority, priority)
      self.assertEqual(sample.data.step_type.shape, (sequence_length,))

  @parameterized.named_parameters(('two', 2), ('three', 3))
  def test_several_workers_write_the_same_items(self, num_workers):
    # Segments may interleave across workers, so compare as multisets; each
    # item's own content (its window) must still be exactly TF-Agents'.
    dataset = fx.make_rlds(EPISODES)
    self.push_theirs(dataset, 3, 1, 1.0, push_fn=replay_tf_agents_push)
    count = rlds_reverb.push_rlds_to_table(
        dataset, self.client, 'ours', sequence_length=3,
        num_workers=num_workers)
    self.assertEqual(count, sum(_LENGTHS))
    key = lambda sample: (sample.data.observation.tobytes(),
                          sample.data.step_type.tobytes())
    ours = sorted(self.drain('ours'), key=key)
    theirs = sorted(self.drain('theirs'), key=key)
    self.assertLen(ours, _expected_window_count(_LENGTHS, 3, 1))
    self.assert_same_items(ours, theirs)

  def test_push_rlds_to_reverb_with_tf_agents_observer(self):
    # The drop-in: our push_rlds_to_reverb feeding TF-Agents' own observer.
    dataset = fx.make_rlds(EPISODES)
    theirs_count = self.push_theirs(dataset, 3, 1, 0.5)
    ours_count = self.push_theirs(dataset, 3, 1, 0.5, table='ours',
                                  push_fn=rlds_reverb.push_rlds_to_reverb)
    self.assertEqual(ours_count, theirs_count)
    self.assert_same_items(self.drain('ours'), self.drain('theirs'))

  def test_readable_by_tf_agents_replay_buffer(self):
    dataset = fx.make_rlds(EPISODES)
    rlds_reverb.push_rlds_to_table(dataset, self.client, 'uniform',
                                   sequence_length=3, stride_length=1)
    # The windows that must be in the table, from the conversion itself.
    windows = set()
    for episode in rlds_reverb.convert_rlds_to_episodes(
        dataset).as_numpy_iterator():
      n = len(episode.trajectory.step_type)
      for start in range(n - 2):
        windows.add(episode.trajectory.observation[start:start + 3].tobytes())
    self.assertEqual(self.size('uniform'), len(windows))

    replay = reverb_replay_buffer.ReverbReplayBuffer(
        DATA_SPEC, 'uniform', sequence_length=3, local_server=self.server)
    experience, info = next(iter(
        replay.as_dataset(sample_batch_size=4, num_steps=3)))
    self.assertEqual(experience.step_type.shape, (4, 3))
    self.assertEqual(experience.step_type.dtype, tf.int32)
    self.assertEqual(experience.observation.shape, (4, 3, fx.OBS_DIM))
    self.assertEqual(experience.action.shape, (4, 3, fx.ACTION_DIM))
    self.assertEqual(experience.reward.shape, (4, 3))
    self.assertEqual(experience.discount.shape, (4, 3))
    self.assertEqual(experience.policy_info, ())
    self.assertEqual(info.key.shape[0], 4)  # Sample info, per sequence.
    for row in experience.observation.numpy():
      self.assertIn(row.tobytes(), windows)

  def test_policy_info_fn(self):
    episodes = fx.episodes_with_lengths([3, 2, 1], [True, False, True],
                                        log_prob=True)
    dataset = fx.make_rlds(episodes)
    fn = lambda cur, nxt: {'log_prob': cur['log_prob']}
    rlds_reverb.push_rlds_to_table(dataset, self.client, 'with_info',
                                   sequence_length=1, policy_info_fn=fn)
    items = self.drain('with_info')
    expected = np.concatenate([e['log_prob'] for e in episodes])
    self.assertLen(items, len(expected))
    np.testing.assert_array_equal(
        [item.data.policy_info['log_prob'][0] for item in items], expected)
    # Without the policy_info_fn the data no longer fits that table.
    with self.assertRaisesRegex(ValueError, re.escape(SIGNATURE_MISMATCH)):
      rlds_reverb.push_rlds_to_table(dataset, self.client, 'with_info')

  @parameterized.named_parameters(('window', 1), ('episodes', None))
  def test_zero_terminal_discount(self, sequence_length):
    dataset = fx.make_rlds(EPISODES)
    rlds_reverb.push_rlds_to_table(dataset, self.client, 'ours',
                                   sequence_length=sequence_length,
                                   zero_terminal_discount=True)
    # Off: TF-Agents' items (our default equals them, tested above).
    self.push_theirs(dataset, sequence_length=1,
                     episodes=sequence_length is None,
                     push_fn=replay_tf_agents_push)
    on = self.drain('ours')
    off = self.drain('theirs')
    if sequence_length is None:
      on, off = sorted(on, key=_episode_key), sorted(off, key=_episode_key)
    discount_on = np.concatenate([x.data.discount for x in on])
    discount_off = np.concatenate([x.data.discount for x in off])
    # Per flat step: the step before a terminal last step gets 0, the rest
    # (truncated endings included) is unchanged.
    step_type = np.concatenate([x.data.step_type for x in off])
    next_step_type = np.concatenate([x.data.next_step_type for x in off])
    into_last = (next_step_type == _LAST) & (step_type != _LAST)
    # A terminal last step has discount 0 (the fixture's are never 0 else).
    terminal_next = np.zeros_like(into_last)
    terminal_next[:-1] = (step_type[1:] == _LAST) & (discount_off[1:] == 0)
    expected = np.where(into_last & terminal_next, 0.0, discount_off)
    np.testing.assert_array_equal(discount_on, expected)
    self.assertEqual(int((discount_on != discount_off).sum()),
                     sum(1 for n, term in zip(_LENGTHS, _TERMINAL)
                         if term and n >= 2))
    self.assert_same_items(
        [x._replace(data=x.data._replace(discount=())) for x in on],
        [x._replace(data=x.data._replace(discount=())) for x in off])


class EpisodeItemsTest(_ServerTestCase):

  @parameterized.named_parameters(
      ('mixed', EPISODES),
      # More distinct lengths than the writer keeps open (16), one long.
      ('many_lengths', fx.episodes_with_lengths(
          list(range(1, 19)) + [40, 0, 3],
          [i % 3 != 0 for i in range(21)], seed=50)),
  )
  def test_same_items_as_episode_observer(self, episodes):
    dataset = fx.make_rlds(episodes)
    theirs_count = self.push_theirs(dataset, episodes=True, priority=3.0)
    stats = push.PushStats()
    ours_count = rlds_reverb.push_rlds_to_table(
        dataset, self.client, 'ours', sequence_length=None, priority=3.0,
        stats=stats)
    self.assertEqual(ours_count, theirs_count)
    nonempty = sum(1 for e in episodes if len(e[rlds.IS_FIRST]))
    self.assertEqual(self.size('theirs'), nonempty)
    self.assertEqual(self.size('ours'), nonempty)
    self.assertEqual(stats.items, nonempty)
    # Items of different lengths come from different writers and may arrive
    # in another order: compare as multisets.
    ours = sorted(self.drain('ours'), key=_episode_key)
    theirs = sorted(self.drain('theirs'), key=_episode_key)
    self.assert_same_items(ours, theirs)
    for sample in ours:
      self.assertEqual(sample.info.priority, 3.0)
    self.assertEqual(
        sorted(len(x.data.step_type) for x in ours),
        sorted(len(e[rlds.IS_FIRST]) for e in episodes
               if len(e[rlds.IS_FIRST])))

  def test_same_timesteps_as_episode_observer(self):
    # Read back as timesteps (Client.sample's default), an episode item must
    # be the episode's T steps too, not one step holding [T, ...] arrays.
    dataset = fx.make_rlds(EPISODES)
    self.push_theirs(dataset, episodes=True, push_fn=replay_tf_agents_push)
    rlds_reverb.push_rlds_to_table(dataset, self.client, 'ours',
                                   sequence_length=None)

    def episodes_as_timesteps(table):
      out = []
      for steps in self.client.sample(table, num_samples=self.size(table)):
        out.append([tuple((x.dtype.str, x.shape, x.tobytes())
                          for x in map(np.asarray, step.data))
                    for step in steps])
      return sorted(out)

    ours = episodes_as_timesteps('ours')
    theirs = episodes_as_timesteps('theirs')
    self.assertEqual(sorted(len(x) for x in ours),
                     sorted(n for n in _LENGTHS if n))
    self.assertEqual(ours, theirs)

  def test_push_rlds_to_reverb_with_tf_agents_episode_observer(self):
    dataset = fx.make_rlds(EPISODES)
    theirs_count = self.push_theirs(dataset, episodes=True)
    ours_count = self.push_theirs(dataset, episodes=True, table='ours',
                                  push_fn=rlds_reverb.push_rlds_to_reverb)
    self.assertEqual(ours_count, theirs_count)
    # One observer, one writer: same order.
    self.assert_same_items(self.drain('ours'), self.drain('theirs'))


class ErrorsTest(_ServerTestCase):

  def test_signature_mismatch_push_rlds_to_reverb(self):
    dataset = fx.make_rlds(EPISODES)
    with self.assertRaises(ValueError) as theirs:
      self.push_theirs(dataset, table='mismatch')
    with self.assertRaises(ValueError) as ours:
      self.push_theirs(dataset, table='mismatch',
                       push_fn=rlds_reverb.push_rlds_to_reverb)
    self.assertEqual(str(theirs.exception), SIGNATURE_MISMATCH)
    self.assertEqual(str(ours.exception), str(theirs.exception))
    self.assertEqual(self.size('mismatch'), 0)

  def test_signature_mismatch_push_rlds_to_table(self):
    dataset = fx.make_rlds(EPISODES)
    with self.assertRaises(ValueError) as ours:
      rlds_reverb.push_rlds_to_table(dataset, self.client, 'mismatch')
    message = str(ours.exception)
    self.assertStartsWith(message, SIGNATURE_MISMATCH)
    self.assertIn('observation', message)  # Says what differs.
    self.assertEqual(self.size('mismatch'), 0)

  def test_missing_table(self):
    dataset = fx.make_rlds(EPISODES)
    with self.assertRaisesRegex(ValueError, 'no_such_table'):
      rlds_reverb.push_rlds_to_table(dataset, self.client, 'no_such_table')

  @parameterized.named_parameters(
      ('sequence_length_0', dict(sequence_length=0), 'sequence_length'),
      ('sequence_length_negative', dict(sequence_length=-2),
       'sequence_length'),
      ('sequence_length_float', dict(sequence_length=2.5), 'sequence_length'),
      ('stride_length_0', dict(stride_length=0), 'stride_length'),
      ('priority_negative', dict(priority=-1.0), 'priority'),
      ('priority_nan', dict(priority=float('nan')), 'priority'),
      ('num_workers_0', dict(num_workers=0), 'num_workers'),
  )
  def test_bad_arguments(self, kwargs, name):
    dataset = fx.make_rlds(EPISODES)
    with self.assertRaisesRegex(ValueError, name):
      rlds_reverb.push_rlds_to_table(dataset, self.client, 'ours', **kwargs)
    self.assertEqual(self.size('ours'), 0)

  @parameterized.named_parameters(
      ('missing_step_field',
       lambda: fx.make_rlds([fx.without_field(c(3), rlds.IS_TERMINAL)])),
      ('no_steps',
       lambda: tf.data.Dataset.from_tensors({'episode_id': tf.constant(1)})),
  )
  def test_same_value_error_for_bad_rlds(self, make_dataset):
    dataset = make_dataset()
    with self.assertRaises(ValueError) as theirs:
      self.push_theirs(dataset)
    with self.assertRaises(ValueError) as ours:
      self.push_theirs(dataset, push_fn=rlds_reverb.push_rlds_to_reverb)
    self.assertEqual(str(ours.exception), str(theirs.exception))
    with self.assertRaises(ValueError) as ours_table:
      rlds_reverb.push_rlds_to_table(dataset, self.client, 'ours')
    self.assertEqual(str(ours_table.exception), str(theirs.exception))

  @parameterized.named_parameters(('window', 2), ('episodes', None))
  def test_invalid_episode_in_the_middle(self, sequence_length):
    good = [c(4, seed=1), t_(3, seed=2)]
    bad = fx.without_last(c(5, seed=3))
    episodes = good + [bad, c(3, seed=4)]
    # What TF-Agents' observer writes for the two good episodes alone.
    self.push_theirs(fx.make_rlds(good), sequence_length=2,
                     episodes=sequence_length is None)
    theirs = self.drain('theirs')
    self.assertLen(theirs, 5 if sequence_length else 2)

    stats = push.PushStats()
    progress = []
    with self.assertRaises(tf.errors.InvalidArgumentError) as ours_error:
      rlds_reverb.push_rlds_to_table(
          fx.make_rlds(episodes), self.client, 'ours',
          sequence_length=sequence_length, stats=stats,
          progress=progress.append)
    message = ours_error.exception.message
    self.assertIn(f'{MID_BEFORE_FIRST} (episode 2, step 4)', message)
    self.assertIn(f'{len(theirs)} items were already written', message)
    self.assertIn("'ours'", message)
    # Exactly the two good episodes are in the table, nothing of episode 2.
    ours = self.drain('ours')
    if sequence_length is None:
      ours, theirs = (sorted(ours, key=_episode_key),
                      sorted(theirs, key=_episode_key))
    self.assert_same_items(ours, theirs)
    self.assertEqual((stats.episodes, stats.steps, stats.items),
                     (2, 7, len(theirs)))
    self.assertEqual(progress, [4, 3])

  def test_invalid_episode_push_rlds_to_reverb(self):
    episodes = [c(4, seed=1), t_(3, seed=2), fx.without_last(c(5, seed=3)),
                c(3, seed=4)]
    with self.assertRaises(tf.errors.InvalidArgumentError) as theirs:
      self.push_theirs(fx.make_rlds(episodes))
    with self.assertRaises(tf.errors.InvalidArgumentError) as ours:
      self.push_theirs(fx.make_rlds(episodes), table='ours',
                       push_fn=rlds_reverb.push_rlds_to_reverb)
    self.assertIn(MID_BEFORE_FIRST, theirs.exception.message)
    self.assertIn(f'{MID_BEFORE_FIRST} (episode 2, step 4)',
                  ours.exception.message)
    # Ours validates an episode before feeding any of it to the observer:
    # only episodes 0-1's 3 + 2 pairs. TF-Agents also fed episode 2's first
    # four steps (3 more pairs) before it failed.
    self.assertEqual(self.size('ours'), 5)
    self.assertEqual(self.size('theirs'), 8)


class StatsTest(_ServerTestCase):

  def test_counts_and_progress(self):
    episodes = [c(4, seed=1), fx.empty_episode(), t_(3, seed=2),
                single(True, seed=3), single(False, seed=4), c(2, seed=5)]
    stats = push.PushStats()
    progress = []
    count = rlds_reverb.push_rlds_to_table(
        fx.make_rlds(episodes), self.client, 'ours', sequence_length=2,
        stats=stats, progress=progress.append)
    self.assertEqual(count, 11)
    self.assertEqual(stats.episodes, 5)  # The empty episode holds no step.
    self.assertEqual(stats.empty_episodes, 1)  # ... but is counted.
    self.assertEqual(stats.steps, 11)
    self.assertEqual(stats.items, 3 + 2 + 1)
    self.assertEqual(stats.items, self.size('ours'))
    self.assertEqual(stats.terminated, 3)
    self.assertEqual(stats.truncated, 2)
    self.assertGreater(stats.seconds, 0)
    self.assertGreater(stats.steps_per_second, 0)
    self.assertEqual(progress, [4, 3, 1, 1, 2])
    self.assertEqual(sum(progress), count)

  def test_leading_and_trailing_empty_episodes_are_counted(self):
    episodes = [fx.empty_episode(), fx.empty_episode(), c(3, seed=1),
                fx.empty_episode(), t_(2, seed=2), fx.empty_episode()]
    stats = push.PushStats()
    rlds_reverb.push_rlds_to_table(
        fx.make_rlds(episodes), self.client, 'ours', stats=stats)
    self.assertEqual((stats.episodes, stats.empty_episodes), (2, 4))

  def test_empty_dataset(self):
    stats = push.PushStats()
    count = rlds_reverb.push_rlds_to_table(
        fx.empty_rlds(c(2)), self.client, 'ours', stats=stats)
    self.assertEqual(count, 0)
    self.assertEqual((stats.episodes, stats.steps, stats.items), (0, 0, 0))
    self.assertEqual(self.size('ours'), 0)


def _bad_episodes(field, step, value):
  """Three episodes of 3, 4, 3 steps; episode 1 has `value` at `step`."""
  episodes = [c(3, seed=1), c(4, seed=2), c(3, seed=3)]
  episodes[1][field] = episodes[1][field].copy()
  episodes[1][field][step] = value
  return episodes


class ValidationTest(_ServerTestCase):

  @parameterized.named_parameters(
      ('nan_observation', rlds.OBSERVATION, 2, np.nan,
       'episode 1, step 2: observation[0] is nan'),
      ('inf_action', rlds.ACTION, 1, np.inf,
       'episode 1, step 1: action[0] is inf'),
      ('inf_reward', rlds.REWARD, 0, -np.inf,
       'episode 1, step 0: reward is -inf'),
      ('discount_7', rlds.DISCOUNT, 1, 7.0,
       'episode 1, step 1: discount is 7.0, not in [0, 1]'),
  )
  def test_bad_values_are_refused_before_the_episode(self, field, step,
                                                     value, message):
    stats = push.PushStats()
    with self.assertRaises(validate.InvalidDataError) as error:
      rlds_reverb.push_rlds_to_table(
          fx.make_rlds(_bad_episodes(field, step, value)), self.client,
          'ours', stats=stats, num_workers=2)
    self.assertEqual(str(error.exception), f"{message}; 2 items were already "
                     "written to table 'ours', none from this episode")
    self.assertIsInstance(error.exception, ValueError)
    # Episode 0's 2 pairs, nothing of episode 1.
    self.assertEqual(self.size('ours'), 2)
    self.assertEqual((stats.episodes, stats.items), (1, 2))

  def test_opt_out_writes_everything(self):
    count = rlds_reverb.push_rlds_to_table(
        fx.make_rlds(_bad_episodes(rlds.REWARD, 1, np.nan)), self.client,
        'ours', validate=False)
    self.assertEqual((count, self.size('ours')), (10, 7))

  def test_resumed_push_names_the_episode_in_the_whole_dataset(self):
    with self.assertRaisesRegex(validate.InvalidDataError,
                                '^episode 11, step 2: observation'):
      rlds_reverb.push_rlds_to_table(
          fx.make_rlds(_bad_episodes(rlds.OBSERVATION, 2, np.nan)),
          self.client, 'ours', first_episode=10)
    bad = fx.make_rlds([c(3, seed=1), fx.without_last(c(5, seed=3)),
                        c(3, seed=4)])
    with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                r'\(episode 11, step 4\)'):
      rlds_reverb.push_rlds_to_table(bad, self.client, 'ours',
                                     first_episode=10)


class EvictionTest(_ServerTestCase):

  def test_refused_up_front_when_episodes_outnumber_the_room(self):
    episodes = fx.episodes_with_lengths([3] * (_SMALL + 1), [True] * 11)
    with self.assertRaises(push.TableFullError) as error:
      rlds_reverb.push_rlds_to_table(fx.make_rlds(episodes), self.client,
                                     'small', allow_eviction=False)
    self.assertRegex(str(error.exception),
                     r"^table 'small' at localhost:\d+ holds at most 10 "
                     r'items and has 0; this push would evict: its 11 '
                     r'episodes make one item or more each, and 10 fit$')
    self.assertEqual(self.size('small'), 0)

  @parameterized.named_parameters(('one_worker', 1), ('two_workers', 2))
  def test_refused_at_the_first_episode_that_does_not_fit(self, workers):
    # 4 pairs per episode: episodes 0-1 fit (8 items), episode 2 does not.
    episodes = fx.episodes_with_lengths([5, 5, 5], [True] * 3)
    stats = push.PushStats()
    with self.assertRaises(push.TableFullError) as error:
      rlds_reverb.push_rlds_to_table(
          fx.make_rlds(episodes), self.client, 'small', stats=stats,
          allow_eviction=False, num_workers=workers)
    self.assertRegex(str(error.exception),
                     r"^table 'small' at localhost:\d+ holds at most 10 more "
                     r'items; this push would evict: 8 items written so far '
                     r'\(episodes 0-1\), episode 2 makes 4 more$')
    self.assertEqual((self.size('small'), stats.items), (8, 8))
    # Allowed (the default), the oldest items make room.
    self.client.reset('small')
    rlds_reverb.push_rlds_to_table(fx.make_rlds(episodes), self.client,
                                   'small')
    self.assertEqual(self.size('small'), _SMALL)

  def test_whole_episodes_count_one_item_each(self):
    episodes = fx.episodes_with_lengths([2] * 12, [True] * 12)
    rlds_reverb.push_rlds_to_table(
        fx.make_rlds(episodes[:9]), self.client, 'small',
        sequence_length=None, allow_eviction=False)
    with self.assertRaisesRegex(push.TableFullError, 'holds at most 10 items '
                                'and has 9;.* its 2 episodes make one item '
                                'each, and 1 fit'):
      rlds_reverb.push_rlds_to_table(
          fx.make_rlds(episodes[:2]), self.client, 'small',
          sequence_length=None, allow_eviction=False)


def _fingerprint(**changes):
  return {'dataset': 'test', 'table': 'ours', 'sequence_length': 2,
          **changes}


class DurabilityTest(_ServerTestCase):
  """Barriers, the ledger's size checks and state file, resume, deadlines."""

  def setUp(self):
    super().setUp()
    self.state_path = os.path.join(tempfile.mkdtemp(), 'state.json')
    self.episodes = fx.episodes_with_lengths([4] * 10, [True] * 10, seed=7)

  def ledger(self, table='ours', **kwargs):
    kwargs.setdefault('fingerprint', _fingerprint())
    return push.PushLedger(self.client, table, state_path=self.state_path,
                           checkpoints=False, timeout_s=5, **kwargs)

  def test_barriers_record_points_and_resume_skips_what_the_table_holds(
      self):
    ledger = self.ledger()
    calls = []

    def stop_after_two_barriers(stats, reason):
      ledger.on_barrier(stats, reason)
      calls.append(reason)
      if calls == ['every', 'every']:
        raise KeyboardInterrupt

    with self.assertRaises(KeyboardInterrupt):
      rlds_reverb.push_rlds_to_table(
          fx.make_rlds(self.episodes), self.client, 'ours',
          checkpoint_every=3, on_barrier=stop_after_two_barriers,
          num_workers=2)
    self.assertEqual(calls, ['every', 'every', 'stopped'])
    with open(self.state_path) as f:
      state = json.load(f)
    self.assertFalse(state['complete'])
    self.assertEqual([(p['episodes'], p['items'], p['table_size'],
                       p['reason']) for p in state['points']],
                     [(0, 0, 0, 'start'), (3, 9, 9, 'every'),
                      (6, 18, 18, 'every'), (6, 18, 18, 'stopped')])
    # A fresh push would duplicate: refused.
    with self.assertRaisesRegex(push.ResumeError, 'unfinished push'):
      self.ledger()
    with self.assertRaisesRegex(push.ResumeError,
                                'records another push: sequence_length: '
                                'recorded 2, now 3'):
      self.ledger(resume=True, fingerprint=_fingerprint(sequence_length=3))
    resumed = self.ledger(resume=True)
    self.assertEqual(resumed.first_episode, 6)
    rlds_reverb.push_rlds_to_table(
        fx.make_rlds(self.episodes).skip(6), self.client, 'ours',
        on_barrier=resumed.on_barrier, first_episode=6)
    self.assertEqual(self.size('ours'), 30)  # Every pair once.
    self.assertTrue(resumed.complete)
    keys = sorted(s.data.observation.tobytes() for s in self.drain('ours'))
    self.assertLen(set(keys), 30)

  def test_a_stop_between_writing_and_counting_keeps_every_item_once(self):
    # Ctrl-C can land after an episode was handed to the writers and before
    # the push counted it: its items reach the table, so the stop must
    # record it too, or a resume writes it a second time.
    ledger = self.ledger()
    count = push._count_episode
    interrupted = []

    def interrupt_before_counting_episode_4(stats, episode):
      if int(episode.episode_index) == 4 and not interrupted:
        interrupted.append(True)
        raise KeyboardInterrupt
      count(stats, episode)

    stats = push.PushStats()
    with mock.patch.object(push, '_count_episode',
                           interrupt_before_counting_episode_4):
      with self.assertRaises(KeyboardInterrupt):
        rlds_reverb.push_rlds_to_table(
            fx.make_rlds(self.episodes), self.client, 'ours', stats=stats,
            checkpoint_every=2, on_barrier=ledger.on_barrier, num_workers=2)
    self.assertEqual((stats.episodes, stats.confirmed_position,
                      stats.confirmed_items), (5, 5, 15))
    with open(self.state_path) as f:
      last = json.load(f)['points'][-1]
    self.assertEqual((last['episodes'], last['items'], last['table_size'],
                      last['reason']), (5, 15, 15, 'stopped'))
    resumed = self.ledger(resume=True)
    self.assertEqual(resumed.first_episode, 5)
    rlds_reverb.push_rlds_to_table(
        fx.make_rlds(self.episodes).skip(5), self.client, 'ours',
        on_barrier=resumed.on_barrier, first_episode=5)
    keys = [s.data.observation.tobytes() for s in self.drain('ours')]
    self.assertEqual((len(keys), len(set(keys))), (30, 30))

  def test_a_stop_that_cannot_be_recorded_is_said(self):
    ledger = self.ledger('uniform')  # A queue's size is not checked.
    calls = []
    stats = push.PushStats()

    def lose_items_at_the_stop(stats, reason):
      calls.append(reason)
      if reason == 'stopped':  # As a server restarted with no checkpoint.
        self.client.reset('uniform')
      ledger.on_barrier(stats, reason)
      if calls == ['every', 'every']:
        raise KeyboardInterrupt

    with self.assertRaises(KeyboardInterrupt):  # The push's own error wins.
      rlds_reverb.push_rlds_to_table(
          fx.make_rlds(self.episodes), self.client, 'uniform',
          checkpoint_every=3, on_barrier=lose_items_at_the_stop, stats=stats)
    self.assertEqual(calls, ['every', 'every', 'stopped'])
    self.assertRegex(stats.stop_unrecorded,
                     r"^table 'uniform' at localhost:\d+ holds 0 items where "
                     r'this push confirmed 18: the server lost 18 items')
    with open(self.state_path) as f:
      reasons = [p['reason'] for p in json.load(f)['points']]
    self.assertEqual(reasons, ['start', 'every', 'every'])

  def test_a_table_that_matches_no_point_is_refused(self):
    ledger = self.ledger()
    rlds_reverb.push_rlds_to_table(
        fx.make_rlds(self.episodes[:4]), self.client, 'ours',
        checkpoint_every=2, on_barrier=ledger.on_barrier)
    with open(self.state_path) as f:
      state = json.load(f)
    state['complete'] = False
    state['points'] = state['points'][:2]  # Sizes 0 and 6; the table has 12.
    with open(self.state_path, 'w') as f:
      json.dump(state, f)
    with self.assertRaisesRegex(
        push.ResumeError, r"table 'ours' at localhost:\d+ holds 12 items, "
        r'which matches no point that .*state.json recorded \(0 items '
        r'\(no episode, not checkpointed\); 6 items \(episodes 0-1, not '
        r'checkpointed\)\): restore the server from its latest checkpoint'):
      self.ledger(resume=True)

  def test_lost_items_are_detected_at_the_next_barrier(self):
    # Sampling removes nothing from 'uniform' (a queue is not checked).
    ledger = self.ledger('uniform')

    def lose_items(stats, reason):
      ledger.on_barrier(stats, reason)
      if stats.confirmed_position == 4:  # As a restart with no checkpoint.
        self.client.reset('uniform')

    with self.assertRaises(push.ItemsLostError) as error:
      rlds_reverb.push_rlds_to_table(
          fx.make_rlds(self.episodes), self.client, 'uniform',
          checkpoint_every=2, on_barrier=lose_items)
    self.assertRegex(str(error.exception),
                     r"^table 'uniform' at localhost:\d+ holds 6 items where "
                     r'this push confirmed 18: the server lost 12 items '
                     r'\(restarted\?\), so episodes 0-5 are not all in '
                     r'it; no episode of this push is in a server checkpoint '
                     r'yet \(the table held 0 items before it\)$')

  def test_a_dead_server_ends_the_push_within_the_deadline(self):
    server = reverb.Server([reverb.Table.queue('q', 1000,
                                               signature=SIGNATURE)])
    client = reverb.Client(f'localhost:{server.port}')

    def stop_server(stats, reason):
      del reason
      if stats.confirmed_position == 2:
        server.stop()

    start = time.monotonic()
    stats = push.PushStats()
    with self.assertRaises(push.ServerUnavailableError) as error:
      rlds_reverb.push_rlds_to_table(
          fx.make_rlds(self.episodes), client, 'q', timeout_s=1,
          checkpoint_every=1, on_barrier=stop_server, num_workers=2,
          stats=stats)
    self.assertLess(time.monotonic() - start, 20)
    self.assertRegex(
        str(error.exception),
        rf'^Reverb server at localhost:{server.port} did not confirm items '
        r'within 1s \(server down\?\): 6 items of episodes 0-1 confirmed, '
        r'\d+ items of episodes? 2(-\d+)? in flight$')
    self.assertEqual((stats.confirmed_position, stats.confirmed_items), (2, 6))


if __name__ == '__main__':
  absltest.main()
