"""rlds_reverb.data.convert against TF-Agents' `rlds_to_reverb`, element by element.

TF-Agents 0.19's `tf_agents.replay_buffers.rlds_to_reverb` is the reference:
same trajectories (every field, dtype, shape and value), same specs, same
error messages. Where the two are known to differ on purpose (nested dict
step fields, how far iteration gets before an invalid episode raises), the
test says so and checks our behaviour against a plain-numpy reference.
"""

import re
from typing import Any, Callable, List, NamedTuple, Optional, Sequence, Tuple

from absl.testing import absltest
from absl.testing import parameterized
from hypothesis import given
from hypothesis import HealthCheck
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
import numpy as np
import rlds
import tensorflow as tf
from tf_agents.replay_buffers import rlds_to_reverb as tfa
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory
import tree

import rlds_reverb
from rlds_reverb.data import convert

import rlds_fixtures as fx  # pylint: disable=g-bad-import-order

FIRST, MID, LAST = (int(ts.StepType.FIRST), int(ts.StepType.MID),
                    int(ts.StepType.LAST))

# TF-Agents' `_validate_step` messages, typed out here (not imported from
# convert.py) so that a change on either side shows.
TERMINAL_NOT_LAST = 'Terminal step must be the last step of an episode.'
MID_BEFORE_FIRST = 'Mid step should not be followed by a first step.'
LAST_NOT_BEFORE_FIRST = (
    'Last step of an episode must be followed by a first step.')


# ---------------------------------------------------------------- helpers


def _as_list(dataset: tf.data.Dataset) -> List[Any]:
  """All elements as nested numpy arrays (scalars as 0-d arrays)."""
  return [tf.nest.map_structure(np.asarray, x)
          for x in dataset.as_numpy_iterator()]


def _collect_until_error(
    dataset: tf.data.Dataset
) -> Tuple[List[Any], Optional[tf.errors.InvalidArgumentError]]:
  """Elements read before iteration raised, and the error (None if none)."""
  items = []
  iterator = dataset.as_numpy_iterator()
  while True:
    try:
      items.append(tf.nest.map_structure(np.asarray, next(iterator)))
    except StopIteration:
      return items, None
    except tf.errors.InvalidArgumentError as e:
      return items, e


def _assertion_text(error: tf.errors.InvalidArgumentError) -> str:
  """The text inside `assertion failed: [...]` of a tf.Assert error."""
  found = re.search(r'assertion failed: \[(.*?)\]', error.message)
  assert found, f'not a tf.Assert failure: {error.message!r}'
  return found.group(1)


def assert_same_elements(test: absltest.TestCase, ours: Sequence[Any],
                         theirs: Sequence[Any], label: str = '') -> None:
  """Same count; per element same structure, and per leaf dtype/shape/value."""
  test.assertEqual(len(ours), len(theirs), f'{label}: number of elements')
  for i, (a, b) in enumerate(zip(ours, theirs)):
    tree.assert_same_structure(a, b)
    for (path, x), y in zip(tree.flatten_with_path(a), tree.flatten(b)):
      where = f'{label} element {i} field {"/".join(map(str, path))}'
      test.assertEqual(x.dtype, y.dtype, f'{where}: dtype')
      test.assertEqual(x.shape, y.shape, f'{where}: shape')
      np.testing.assert_array_equal(x, y, err_msg=where)


def assert_matches_spec(test: absltest.TestCase, elements: Sequence[Any],
                        spec: Any) -> None:
  for i, element in enumerate(elements):
    tree.assert_same_structure(element, spec)
    for (path, x), s in zip(tree.flatten_with_path(element),
                            tree.flatten(spec)):
      where = f'element {i} field {"/".join(map(str, path))}'
      test.assertEqual(x.dtype, s.dtype.as_numpy_dtype, where)
      test.assertEqual(x.shape, tuple(s.shape.as_list()), where)


def _step_type(is_first: bool, is_last: bool) -> int:
  return FIRST if is_first else LAST if is_last else MID


def reference_trajectories(
    episodes: Sequence[fx.Episode],
    policy_info_fn: Optional[Callable[[Any, Any], Any]] = None,
    zero_terminal_discount: bool = False,
) -> List[trajectory.Trajectory]:
  """The DESIGN.md contract in plain numpy, one step at a time.

  Nested step fields are split per step like flat ones (what TF-Agents means
  to do, and what rlds_reverb does). Valid episodes only.
  """
  steps = []
  for steps_of_episode in episodes:
    n = len(steps_of_episode[rlds.IS_FIRST])
    steps.extend(tree.map_structure(lambda x, t=t: np.asarray(x[t]),
                                    steps_of_episode) for t in range(n))
  if not steps:
    return []
  padding = tree.map_structure(np.zeros_like, steps[0])
  padding[rlds.IS_FIRST] = np.asarray(True)
  steps.append(padding)
  out = []
  for cur, nxt in zip(steps[:-1], steps[1:]):
    step_type = _step_type(cur[rlds.IS_FIRST], cur[rlds.IS_LAST])
    next_step_type = _step_type(nxt[rlds.IS_FIRST], nxt[rlds.IS_LAST])
    if step_type == FIRST and next_step_type == FIRST:
      step_type = next_step_type = LAST
    discount = cur[rlds.DISCOUNT]
    if cur[rlds.IS_LAST] and cur[rlds.IS_TERMINAL]:
      discount = np.zeros_like(discount)
    if (zero_terminal_discount and not cur[rlds.IS_LAST]
        and nxt[rlds.IS_LAST] and nxt[rlds.IS_TERMINAL]):
      discount = np.zeros_like(discount)
    out.append(trajectory.Trajectory(
        step_type=np.asarray(step_type, np.int32),
        observation=cur[rlds.OBSERVATION],
        action=cur[rlds.ACTION],
        policy_info=(policy_info_fn(cur, nxt) if policy_info_fn else ()),
        next_step_type=np.asarray(next_step_type, np.int32),
        reward=cur[rlds.REWARD],
        discount=discount,
    ))
  return out


class _Pipelines(NamedTuple):
  source: fx.SwappableRLDS
  ours: tf.data.Dataset
  theirs: tf.data.Dataset
  ours_episodes: tf.data.Dataset
  ours_zero: tf.data.Dataset  # zero_terminal_discount=True


_PIPELINES = {}


def pipelines_for(episodes: Sequence[fx.Episode],
                  like: Optional[fx.Episode] = None) -> _Pipelines:
  """Conversion pipelines (ours, TF-Agents') fed with `episodes`.

  Building a pipeline traces its functions, which costs far more than
  iterating it, so one set is built per step structure (field names, dtypes,
  per-step shapes) and reused with the episodes swapped in.
  """
  like = episodes[0] if like is None else like
  key = tuple((path, np.asarray(x).dtype.str, np.asarray(x).shape[1:])
              for path, x in tree.flatten_with_path(like))
  if key not in _PIPELINES:
    source = fx.SwappableRLDS(like)
    _PIPELINES[key] = _Pipelines(
        source,
        rlds_reverb.convert_rlds_to_trajectories(source.dataset),
        tfa.convert_rlds_to_trajectories(source.dataset),
        rlds_reverb.convert_rlds_to_episodes(source.dataset),
        rlds_reverb.convert_rlds_to_trajectories(
            source.dataset, zero_terminal_discount=True))
  pipelines = _PIPELINES[key]
  pipelines.source.episodes = list(episodes)
  return pipelines


def _convert_both(dataset, policy_info_fn=None):
  ours = _as_list(rlds_reverb.convert_rlds_to_trajectories(
      dataset, policy_info_fn))
  theirs = _as_list(tfa.convert_rlds_to_trajectories(dataset, policy_info_fn))
  return ours, theirs


# ------------------------------------------------------------ case tables

c = fx.complete_episode
t_ = fx.truncated_episode
single = fx.single_step_episode

# Valid datasets on which rlds_reverb must equal TF-Agents exactly.
MATCHING_CASES = (
    dict(testcase_name='complete_episode', episodes=[c(5)]),
    dict(testcase_name='truncated_episode', episodes=[t_(5)]),
    dict(testcase_name='single_step_terminal', episodes=[single(True)]),
    dict(testcase_name='single_step_truncated', episodes=[single(False)]),
    dict(testcase_name='single_steps_in_a_row',
         episodes=[single(True, seed=1), single(False, seed=2),
                   single(True, seed=3)]),
    dict(testcase_name='two_step_episodes',
         episodes=[c(2, seed=1), t_(2, seed=2)]),
    dict(testcase_name='several_lengths',
         episodes=[c(3, seed=1), t_(6, seed=2), single(seed=3), c(2, seed=4),
                   t_(1, seed=5), c(4, seed=6)]),
    dict(testcase_name='empty_episode_in_the_middle',
         episodes=[c(3, seed=1), fx.empty_episode(), t_(4, seed=2)]),
    dict(testcase_name='empty_episode_at_the_end',
         episodes=[c(3, seed=1), t_(2, seed=2), fx.empty_episode()]),
    dict(testcase_name='empty_episode_first_and_twice_in_a_row',
         episodes=[fx.empty_episode(), c(3, seed=1), fx.empty_episode(),
                   fx.empty_episode(), single(seed=2)]),
    dict(testcase_name='only_empty_episodes',
         episodes=[fx.empty_episode(), fx.empty_episode()]),
    dict(testcase_name='extra_step_fields_are_ignored',
         episodes=fx.episodes_with_lengths([3, 1, 4], [True, False, False],
                                           infos=True, extra_field=True)),
    dict(testcase_name='discrete_action',
         episodes=fx.episodes_with_lengths([3, 2], discrete=True)),
    # TF-Agents never checks the very first step of the dataset, so a first
    # episode without `is_first` starts with MID there; it must here too.
    dict(testcase_name='first_episode_without_is_first',
         episodes=[fx.without_first(c(3, seed=1)), t_(2, seed=2)]),
)


# ------------------------------------------------------------------ tests


class StepFeaturesAndSpecTest(parameterized.TestCase):

  def test_rlds_step_features_equal_tf_agents(self):
    self.assertEqual(rlds_reverb.get_rlds_step_features(),
                     tfa.get_rlds_step_features())
    self.assertEqual(convert.get_rlds_step_features(),
                     ['observation', 'action', 'reward', 'discount',
                      'is_first', 'is_last', 'is_terminal'])

  @parameterized.named_parameters(
      dict(testcase_name='flat', episode=c(2)),
      dict(testcase_name='dict_observation',
           episode=c(2, dict_observation=True)),
      dict(testcase_name='discrete_action', episode=c(2, discrete=True)),
      dict(testcase_name='extra_fields',
           episode=c(2, infos=True, extra_field=True, log_prob=True)),
  )
  def test_trajectory_data_spec_equals_tf_agents(self, episode):
    dataset = fx.make_rlds([episode])
    ours = rlds_reverb.create_trajectory_data_spec(dataset)
    theirs = tfa.create_trajectory_data_spec(dataset)
    self.assertEqual(ours, theirs)
    # And field by field, names and bounds included (== on a Trajectory of
    # specs compares them too, this says which one differs).
    for (path, a), b in zip(tree.flatten_with_path(ours), tree.flatten(theirs)):
      self.assertEqual(type(a), type(b), path)
      self.assertEqual(a, b, path)

  def test_spec_of_empty_dataset_equals_tf_agents(self):
    dataset = fx.empty_rlds(c(2))
    self.assertEqual(rlds_reverb.create_trajectory_data_spec(dataset),
                     tfa.create_trajectory_data_spec(dataset))


class ConvertMatchesTfAgentsTest(parameterized.TestCase):

  @parameterized.named_parameters(*MATCHING_CASES)
  def test_same_trajectories_as_tf_agents(self, episodes):
    pipelines = pipelines_for(episodes)
    ours, theirs = _as_list(pipelines.ours), _as_list(pipelines.theirs)
    assert_same_elements(self, ours, theirs, 'ours vs TF-Agents')
    # Independent of TF-Agents: one trajectory per step, right values.
    assert_same_elements(self, ours, reference_trajectories(episodes),
                         'ours vs reference')
    self.assertLen(ours, sum(len(e[rlds.IS_FIRST]) for e in episodes))
    spec = rlds_reverb.create_trajectory_data_spec(pipelines.source.dataset)
    assert_matches_spec(self, ours, spec)
    # The datasets' element specs agree too (dtype and shape per field).
    ours_spec = pipelines.ours.element_spec
    theirs_spec = pipelines.theirs.element_spec
    tree.assert_same_structure(ours_spec, theirs_spec)
    for (path, a), b in zip(tree.flatten_with_path(ours_spec),
                            tree.flatten(theirs_spec)):
      self.assertEqual(a.dtype, b.dtype, path)
      self.assertEqual(a.shape, b.shape, path)

  def test_static_tfds_like_dataset_with_episode_metadata(self):
    # The other cases feed a generator-backed dataset; this one is built like
    # a TFDS dataset (a fixed dataset of episodes), with an episode-level
    # field next to `steps`, which the conversion ignores.
    episodes = [c(3, seed=1), fx.empty_episode(), t_(4, seed=2),
                single(seed=3), t_(2, seed=4)]
    dataset = fx.make_rlds(
        episodes, [{'episode_id': np.int64(i)} for i in range(5)])
    ours, theirs = _convert_both(dataset)
    assert_same_elements(self, ours, theirs)
    assert_same_elements(self, ours, reference_trajectories(episodes))

  def test_step_types_of_a_mixed_dataset(self):
    # Spelled out, so that a bug shared with TF-Agents would still show.
    ours = _as_list(pipelines_for(
        [c(3, seed=1), single(seed=2), t_(2, seed=3), fx.empty_episode(),
         single(False, seed=4)]).ours)
    self.assertEqual([int(x.step_type) for x in ours],
                     [FIRST, MID, LAST, LAST, FIRST, LAST, LAST])
    self.assertEqual([int(x.next_step_type) for x in ours],
                     [MID, LAST, FIRST, LAST, LAST, FIRST, LAST])
    # Terminal last steps (episode 0's and the single terminal step) get 0.
    discounts = [float(x.discount) for x in ours]
    self.assertEqual(discounts[2], 0.0)
    self.assertEqual(discounts[3], 0.0)
    self.assertNotEqual(discounts[5], 0.0)  # Truncated: kept.
    self.assertNotEqual(discounts[6], 0.0)  # Truncated single step: kept.

  def test_empty_dataset_gives_no_trajectories(self):
    static = fx.empty_rlds(c(3))  # A fixed dataset of zero episodes.
    ours, theirs = _convert_both(static)
    self.assertEqual(ours, [])
    self.assertEqual(theirs, [])
    pipelines = pipelines_for([], like=c(3))  # A generator giving none.
    self.assertEqual(_as_list(pipelines.ours), [])
    self.assertEqual(_as_list(pipelines.theirs), [])
    self.assertEqual(_as_list(pipelines.ours_episodes), [])
    self.assertEqual(_as_list(pipelines.ours_zero), [])

  def test_dataset_can_be_iterated_twice(self):
    episodes = [c(3, seed=1), t_(2, seed=2)]
    pipelines = pipelines_for(episodes)
    assert_same_elements(self, _as_list(pipelines.ours),
                         _as_list(pipelines.ours))


def _policy_info_fn(cur, nxt):
  """Uses the current and the next step, constants and Python control flow.

  TF-Agents runs policy_info_fn under autograph, one pair at a time: a Python
  `if` on a step tensor works there and must keep working here.
  """
  if cur[rlds.IS_LAST]:
    branch = tf.constant(-1.0)
  else:
    branch = cur[rlds.REWARD] * 2.0 + nxt[rlds.REWARD]
  return {
      'log_prob': cur['log_prob'],
      'next_reward': nxt[rlds.REWARD],
      'next_observation': nxt[rlds.OBSERVATION],
      'mixed': (cur[rlds.REWARD] + 2.0 * nxt[rlds.DISCOUNT],
                tf.cast(nxt[rlds.IS_FIRST], tf.int32)),
      'constant': tf.constant(3, tf.int64),
      'branch': branch,
  }


def _eagerly(fn):
  """`fn` run eagerly on numpy steps, for the numpy reference."""
  def run(cur, nxt):
    out = fn(tree.map_structure(tf.constant, cur),
             tree.map_structure(tf.constant, nxt))
    return tree.map_structure(np.asarray, out)
  return run


class PolicyInfoTest(parameterized.TestCase):

  @parameterized.named_parameters(
      dict(testcase_name='steps_constants_and_control_flow',
           fn=_policy_info_fn),
      dict(testcase_name='empty_tuple', fn=lambda cur, nxt: ()),
  )
  def test_policy_info_fn_equals_tf_agents(self, fn):
    episodes = fx.episodes_with_lengths([3, 1, 4, 2], [True, True, False, True],
                                        log_prob=True)
    episodes.insert(2, fx.empty_episode(episodes[0]))
    ours, theirs = _convert_both(fx.make_rlds(episodes), fn)
    assert_same_elements(self, ours, theirs)
    assert_same_elements(self, ours,
                         reference_trajectories(episodes, _eagerly(fn)))

  def test_policy_info_fn_on_nested_infos_field(self):
    # TF-Agents passes nested dict step fields through its pairing unsplit, so
    # its `cur['infos']['log_prob']` is the pair [cur, nxt] (shape [2]).
    # rlds_reverb splits them: cur['infos'] is the current step's. Ours must
    # equal the reference and TF-Agents' first row.
    def fn(cur, nxt):
      return {'log_prob': cur['infos']['log_prob'],
              'next_counter': nxt['infos']['counter']}

    episodes = fx.episodes_with_lengths([3, 2, 1], [True, False, True],
                                        infos=True, extra_field=True)
    ours, theirs = _convert_both(fx.make_rlds(episodes), fn)
    reference = reference_trajectories(episodes, fn)
    assert_same_elements(self, ours, reference)
    self.assertLen(theirs, len(ours))
    for a, b in zip(ours, theirs):
      self.assertEqual(b.policy_info['log_prob'].shape, (2,))  # TF-Agents bug.
      self.assertEqual(a.policy_info['log_prob'].shape, ())
      self.assertEqual(a.policy_info['log_prob'], b.policy_info['log_prob'][0])
      # Everything outside policy_info still equals TF-Agents.
      assert_same_elements(self, [a._replace(policy_info=())],
                           [b._replace(policy_info=())])


class DictObservationTest(absltest.TestCase):

  def test_observation_is_the_current_steps(self):
    # KNOWN TF-AGENTS BUG: `_pair_to_tuple` leaves nested dict fields unsplit,
    # so TF-Agents' observation is both steps of the pair stacked ([2, ...]),
    # which its own `create_trajectory_data_spec` does not describe.
    # rlds_reverb gives the current step's observation, as the spec says.
    episodes = [c(3, seed=1, dict_observation=True),
                fx.empty_episode(c(1, dict_observation=True)),
                t_(2, seed=2, dict_observation=True),
                single(seed=3, dict_observation=True)]
    dataset = fx.make_rlds(episodes)
    spec = rlds_reverb.create_trajectory_data_spec(dataset)
    self.assertEqual(spec, tfa.create_trajectory_data_spec(dataset))
    ours, theirs = _convert_both(dataset)
    assert_same_elements(self, ours, reference_trajectories(episodes))
    assert_matches_spec(self, ours, spec)
    self.assertLen(theirs, len(ours))
    for a, b in zip(ours, theirs):
      # The documented difference: TF-Agents' leaves have a leading 2 and
      # their row 0 is our value.
      for x, y in zip(tree.flatten(a.observation), tree.flatten(b.observation)):
        self.assertEqual(y.shape, (2,) + x.shape)
        np.testing.assert_array_equal(x, y[0])
      assert_same_elements(self, [a._replace(observation=())],
                           [b._replace(observation=())])


class InvalidInputTest(parameterized.TestCase):

  def _assert_same_value_error(self, fn_name, dataset):
    with self.assertRaises(ValueError) as theirs:
      getattr(tfa, fn_name)(dataset)
    with self.assertRaises(ValueError) as ours:
      getattr(rlds_reverb, fn_name)(dataset)
    self.assertEqual(str(ours.exception), str(theirs.exception))
    return str(ours.exception)

  @parameterized.parameters('create_trajectory_data_spec',
                            'convert_rlds_to_trajectories')
  def test_dataset_without_steps(self, fn_name):
    dataset = tf.data.Dataset.from_tensors(
        {'episode_id': tf.constant(1), 'trajectory': tf.zeros([3])})
    message = self._assert_same_value_error(fn_name, dataset)
    self.assertEqual(message,
                     'No dataset representing RLDS steps exist in the data.')

  @parameterized.product(
      fn_name=['create_trajectory_data_spec', 'convert_rlds_to_trajectories'],
      missing=['observation', 'action', 'reward', 'discount', 'is_first',
               'is_last', 'is_terminal'])
  def test_steps_missing_a_field(self, fn_name, missing):
    dataset = fx.make_rlds([fx.without_field(c(3, extra_field=True), missing)])
    message = self._assert_same_value_error(fn_name, dataset)
    self.assertStartsWith(message, 'Invalid RLDS step spec. Features expected')
    self.assertIn('but found [', message)
    self.assertNotIn(f"'{missing}'", message.split('but found')[1])

  def test_value_errors_are_raised_by_the_call_not_by_iteration(self):
    # The steps dataset raises if read: the ValueError must come first.
    def boom(x):
      tf.debugging.Assert(False, ['steps were read'])
      return x
    steps = tf.data.Dataset.from_tensor_slices(
        fx.without_field(c(2), 'discount')).map(boom)
    dataset = tf.data.Dataset.from_tensors({'steps': steps})
    for fn in (rlds_reverb.create_trajectory_data_spec,
               rlds_reverb.convert_rlds_to_trajectories,
               rlds_reverb.convert_rlds_to_episodes):
      with self.assertRaisesRegex(ValueError, 'Invalid RLDS step spec'):
        fn(dataset)


# (testcase_name, episodes, message, episode index, step index). Indices are
# 0-based and count empty episodes. The step is where TF-Agents' check fires:
# the current step of the first failing pair.
_INVALID_CASES = (
    ('terminal_step_not_last',
     [c(3, seed=1), fx.terminal_at(c(4, seed=2), 1), c(2, seed=3)],
     TERMINAL_NOT_LAST, 1, 1),
    ('terminal_first_step_not_last',
     [fx.terminal_at(c(3, seed=1), 0)], TERMINAL_NOT_LAST, 0, 0),
    ('mid_step_followed_by_next_episode',
     [c(3, seed=1), fx.without_last(c(4, seed=2)), c(2, seed=3)],
     MID_BEFORE_FIRST, 1, 3),
    ('mid_step_followed_by_padding_step',
     [c(3, seed=1), t_(2, seed=2), fx.without_last(c(4, seed=3))],
     MID_BEFORE_FIRST, 2, 3),
    ('mid_step_followed_by_episode_after_empty_ones',
     [fx.without_last(c(3, seed=1)), fx.empty_episode(), fx.empty_episode(),
      c(2, seed=2)],
     MID_BEFORE_FIRST, 0, 2),
    ('last_step_followed_by_step_without_is_first',
     [c(3, seed=1), t_(2, seed=2), fx.without_first(c(3, seed=3))],
     LAST_NOT_BEFORE_FIRST, 1, 1),
    ('last_step_in_the_middle_of_an_episode',
     [c(2, seed=1),
      fx.with_fields(t_(4, seed=2), is_last=np.array([0, 1, 0, 1], bool))],
     LAST_NOT_BEFORE_FIRST, 1, 1),
    ('empty_episode_before_counts',
     [c(3, seed=1), fx.empty_episode(), fx.without_last(c(4, seed=2)),
      c(2, seed=3)],
     MID_BEFORE_FIRST, 2, 3),
    ('empty_episode_between_last_step_and_missing_first',
     [c(3, seed=1), fx.empty_episode(), fx.without_first(c(2, seed=2))],
     LAST_NOT_BEFORE_FIRST, 0, 2),
    # A step failing two checks reports the first one TF-Agents runs.
    ('terminal_and_mid_before_first_on_one_step',
     [c(2, seed=1), fx.terminal_at(fx.without_last(c(3, seed=2)), 2),
      c(2, seed=3)],
     TERMINAL_NOT_LAST, 1, 2),
    ('first_of_two_bad_episodes_wins',
     [c(2, seed=1), fx.without_last(c(3, seed=2)),
      fx.terminal_at(c(3, seed=3), 0)],
     MID_BEFORE_FIRST, 1, 2),
    ('first_bad_step_of_an_episode_wins',
     [fx.terminal_at(fx.terminal_at(c(5, seed=1), 3), 1)],
     TERMINAL_NOT_LAST, 0, 1),
)


class ValidationTest(parameterized.TestCase):

  @parameterized.named_parameters(*_INVALID_CASES)
  def test_error_names_episode_and_step(self, episodes, message, episode,
                                        step):
    pipelines = pipelines_for(episodes)
    theirs_items, theirs_error = _collect_until_error(pipelines.theirs)
    ours_items, ours_error = _collect_until_error(pipelines.ours)
    self.assertIsInstance(theirs_error, tf.errors.InvalidArgumentError)
    self.assertIsInstance(ours_error, tf.errors.InvalidArgumentError)
    # TF-Agents' text word for word, then where.
    self.assertEqual(_assertion_text(theirs_error), message)
    self.assertEqual(_assertion_text(ours_error),
                     f'{message} (episode {episode}, step {step})')
    # We stop at the start of the bad episode (it is validated as a whole);
    # TF-Agents gets to the bad step. What we did return equals TF-Agents'.
    steps_before = sum(len(e[rlds.IS_FIRST]) for e in episodes[:episode])
    self.assertLen(ours_items, steps_before)
    self.assertEqual(len(theirs_items),
                     steps_before + step)
    assert_same_elements(self, ours_items, theirs_items[:steps_before])

  @parameterized.named_parameters(*_INVALID_CASES)
  def test_episodes_view_raises_at_the_bad_episode(self, episodes, message,
                                                   episode, step):
    items, error = _collect_until_error(
        pipelines_for(episodes).ours_episodes)
    self.assertIsInstance(error, tf.errors.InvalidArgumentError)
    self.assertEqual(_assertion_text(error),
                     f'{message} (episode {episode}, step {step})')
    nonempty_before = [i for i, e in enumerate(episodes[:episode])
                       if len(e[rlds.IS_FIRST])]
    self.assertEqual([int(x.episode_index) for x in items], nonempty_before)


class EpisodesViewTest(absltest.TestCase):

  def test_episodes_group_the_trajectories(self):
    episodes = [c(3, seed=1), fx.empty_episode(), t_(2, seed=2),
                single(seed=3), fx.empty_episode()]
    grouped = _as_list(pipelines_for(episodes).ours_episodes)
    self.assertEqual([int(e.episode_index) for e in grouped], [0, 2, 3])
    self.assertEqual([e.is_terminal.tolist() for e in grouped],
                     [[False, False, True], [False, False], [True]])
    flat = []
    for e in grouped:
      n = len(e.trajectory.step_type)
      flat.extend(tree.map_structure(lambda x, t=t: x[t], e.trajectory)
                  for t in range(n))
    assert_same_elements(self, flat, reference_trajectories(episodes))


# (testcase_name, episodes). zero_terminal_discount=True must zero exactly the
# discount of the step before a terminal last step; the rest stays TF-Agents'.
_ZERO_DISCOUNT_CASES = (
    ('complete', [c(4)]),
    ('truncated_keeps_all', [t_(4)]),
    ('two_step_complete', [c(2)]),
    ('single_step_terminal', [single(True)]),
    ('single_step_truncated', [single(False)]),
    ('mixed', [c(3, seed=1), t_(3, seed=2), fx.empty_episode(), single(seed=3),
               c(2, seed=4), t_(1, seed=5), c(5, seed=6)]),
)


class ZeroTerminalDiscountTest(parameterized.TestCase):

  @parameterized.named_parameters(*_ZERO_DISCOUNT_CASES)
  def test_zero_terminal_discount(self, episodes):
    ours = _as_list(pipelines_for(episodes).ours_zero)
    # Expected: the contract's trajectories (equal to TF-Agents', see
    # ConvertMatchesTfAgentsTest) with the discount of each step whose next
    # step is last-and-terminal in the same episode set to 0.
    plain = reference_trajectories(episodes)
    expected = list(plain)
    offset = 0
    zeroed = []
    for e in episodes:
      n = len(e[rlds.IS_FIRST])
      if n >= 2 and e[rlds.IS_TERMINAL][-1]:
        i = offset + n - 2
        expected[i] = expected[i]._replace(
            discount=np.zeros_like(expected[i].discount))
        zeroed.append(i)
      offset += n
    assert_same_elements(self, ours, expected)
    assert_same_elements(
        self, ours, reference_trajectories(episodes,
                                           zero_terminal_discount=True))
    for i in zeroed:  # The fixture's discounts are never 0 to begin with.
      self.assertNotEqual(float(plain[i].discount), 0.0)
    if not any(e[rlds.IS_TERMINAL][-1:].any() and len(e[rlds.IS_FIRST]) >= 2
               for e in episodes):
      self.assertEqual(zeroed, [])

  def test_against_tf_agents_and_default(self):
    episodes = dict(_ZERO_DISCOUNT_CASES)['mixed']
    pipelines = pipelines_for(episodes)
    theirs = _as_list(pipelines.theirs)
    default = _as_list(pipelines.ours)
    explicit_off = _as_list(rlds_reverb.convert_rlds_to_trajectories(
        pipelines.source.dataset, zero_terminal_discount=False))
    on = _as_list(pipelines.ours_zero)
    assert_same_elements(self, default, theirs)
    assert_same_elements(self, explicit_off, theirs)
    # Episodes c(3), t(3), empty, single, c(2), t(1), c(5): steps 0-2, 3-5,
    # 6, 7-8, 9, 10-14. The steps before a terminal last step of an episode
    # longer than one are 1, 7 and 13; nothing else moves.
    changed = [i for i, (a, b) in enumerate(zip(on, theirs))
               if float(a.discount) != float(b.discount)]
    self.assertEqual(changed, [1, 7, 13])
    for i in changed:
      self.assertEqual(float(on[i].discount), 0.0)
    assert_same_elements(self, [x._replace(discount=()) for x in on],
                         [x._replace(discount=()) for x in theirs])

  def test_is_keyword_only(self):
    dataset = fx.make_rlds([c(2)])
    with self.assertRaises(TypeError):
      rlds_reverb.convert_rlds_to_trajectories(  # pylint: disable=too-many-function-args
          dataset, None, True)


# ------------------------------------------------------- property test


@st.composite
def _valid_datasets(draw):
  """Lists of 1-5 valid episodes (lengths 0..8, terminal or truncated)."""
  num = draw(st.integers(1, 5))
  lengths = draw(st.lists(st.integers(0, 8), min_size=num, max_size=num))
  terminal = draw(st.lists(st.booleans(), min_size=num, max_size=num))
  seed = draw(st.integers(0, 2**16))
  episodes = fx.episodes_with_lengths(lengths, terminal, seed=seed)
  finite = dict(allow_nan=False, allow_infinity=False, width=32)
  for e, n in zip(episodes, lengths):
    e[rlds.REWARD] = draw(hnp.arrays(
        np.float32, n, elements=st.floats(-1e6, 1e6, **finite)))
    e[rlds.DISCOUNT] = draw(hnp.arrays(
        np.float32, n, elements=st.floats(0.0, 1.0, **finite)))
  return episodes


class PropertyTest(absltest.TestCase):
  """Random valid datasets: ours equals TF-Agents' element by element."""

  @settings(max_examples=25, deadline=None,
            suppress_health_check=[HealthCheck.too_slow])
  @given(episodes=_valid_datasets())
  def test_equals_tf_agents_on_random_valid_data(self, episodes):
    pipelines = pipelines_for(episodes)
    ours, theirs = _as_list(pipelines.ours), _as_list(pipelines.theirs)
    assert_same_elements(self, ours, theirs)
    self.assertLen(ours, sum(len(e[rlds.IS_FIRST]) for e in episodes))
    assert_same_elements(self, ours, reference_trajectories(episodes))
    assert_same_elements(
        self, _as_list(pipelines.ours_zero),
        reference_trajectories(episodes, zero_terminal_discount=True))


if __name__ == '__main__':
  absltest.main()
