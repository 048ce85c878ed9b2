"""Every D4RL encoding gives the same transitions where the information
exists (DESIGN.md, Terminations and D4RL encodings), on hopper-shaped
episodes that terminate, time out, and do both at once."""

import os

import numpy as np
import pytest
import rlds
import tensorflow as tf
import tensorflow_datasets as tfds
from tf_agents.trajectories import time_step as ts

import rlds_reverb
from rlds_reverb.data import d4rl_format
from rlds_reverb.data import datasets
from rlds_reverb.data import recording
from rlds_reverb.replay import memory

OBS, ACT = 11, 3  # Hopper's observation and action sizes.


def _recording(length: int, terminated: bool, seed: int) -> dict:
  """The toolkit's encoding: `length` transitions, T + 1 steps."""
  rng = np.random.default_rng(seed)
  n = length + 1
  return {
      rlds.OBSERVATION: rng.standard_normal((n, OBS)).astype(np.float32),
      rlds.ACTION: np.concatenate([
          rng.uniform(-1, 1, (length, ACT)).astype(np.float32),
          np.zeros((1, ACT), np.float32)]),
      rlds.REWARD: np.append(rng.uniform(0, 3, length).astype(np.float32),
                             np.float32(0)),
      rlds.DISCOUNT: np.ones(n, np.float32),
      rlds.IS_FIRST: np.arange(n) == 0,
      rlds.IS_LAST: np.arange(n) == n - 1,
      rlds.IS_TERMINAL: (np.arange(n) == n - 1) & terminated,
  }


# Terminates after 3 steps; times out at the limit of 4; terminates at the
# limit of 4 (D4RL sets both flags on its last row).
EPISODES = [_recording(3, True, 0), _recording(4, False, 1),
            _recording(4, True, 2)]


def _expected(episodes, *, next_observations: bool = True) -> list[tuple]:
  """(o, a, r, o', discount) by hand: a terminal transition has discount
  0; without next observations a timeout's last transition is gone and a
  terminal one's next observation is zeros."""
  out = []
  for steps in episodes:
    n = len(steps[rlds.REWARD]) - 1
    terminal = bool(steps[rlds.IS_TERMINAL][-1])
    for t in range(n):
      last = t == n - 1
      if last and not terminal and not next_observations:
        continue
      following = steps[rlds.OBSERVATION][t + 1]
      if last and terminal and not next_observations:
        following = np.zeros(OBS, np.float32)
      out.append((steps[rlds.OBSERVATION][t], steps[rlds.ACTION][t],
                  steps[rlds.REWARD][t], following,
                  0.0 if last and terminal else 1.0))
  return out


def _as_rlds(episodes) -> tf.data.Dataset:
  return tf.data.Dataset.from_generator(
      lambda: iter(episodes), output_signature=tf.nest.map_structure(
          lambda v: tf.TensorSpec((None,) + v.shape[1:],
                                  tf.as_dtype(v.dtype)), episodes[0])
  ).map(lambda s: {rlds.STEPS: tf.data.Dataset.from_tensor_slices(s)})


def _transitions(rlds_data: tf.data.Dataset) -> list[tuple]:
  """The contract's transitions (terminal discounts fixed), boundaries
  (a LAST step paired with the next episode) left out."""
  out = []
  for episode in rlds_reverb.convert_rlds_to_episodes(
      rlds_data, zero_terminal_discount=True):
    traj = tf.nest.map_structure(lambda x: x.numpy(), episode.trajectory)
    for t in range(len(traj.step_type)):
      if traj.step_type[t] == ts.StepType.LAST:
        continue
      out.append((traj.observation[t], traj.action[t], traj.reward[t],
                  traj.observation[t + 1], float(traj.discount[t])))
  return out


def _numpy_steps(episode) -> dict:
  return tf.nest.map_structure(
      lambda x: x.numpy(),
      episode[rlds.STEPS].batch(10**6).get_single_element())


def _assert_same(got: list[tuple], expected: list[tuple]) -> None:
  assert len(got) == len(expected)
  for g, e in zip(got, expected):
    for a, b in zip(g, e):
      np.testing.assert_array_equal(a, b)


def _hand_arrays(next_observations: bool) -> dict:
  arrays = d4rl_format.to_arrays(EPISODES,
                                 next_observations=next_observations)
  arrays['timeouts'][-1] = True  # The third episode: both flags.
  return arrays


def test_toolkit_encoding_gives_the_hand_built_transitions():
  _assert_same(_transitions(_as_rlds(EPISODES)), _expected(EPISODES))


def test_tfds_encoding_gives_the_same_transitions():
  encoded = [d4rl_format.tfds_encoding(e) for e in EPISODES]
  # TFDS's discounts: 0 on the last real step of a terminated episode and
  # on every extra step.
  np.testing.assert_array_equal(encoded[0][rlds.DISCOUNT], [1, 1, 0, 0])
  np.testing.assert_array_equal(encoded[1][rlds.DISCOUNT], [1, 1, 1, 1, 0])
  _assert_same(_transitions(_as_rlds(encoded)), _expected(EPISODES))


def test_flat_arrays_with_next_observations_give_the_same_transitions():
  episodes, summary = d4rl_format.episodes_from_arrays(_hand_arrays(True))
  assert (summary.episodes, summary.terminated, summary.timed_out,
          summary.lost_transitions) == (3, 2, 1, 0)
  assert summary.loss_message('x') is None
  # TFDS's encoding, step for step.
  for got, recorded in zip(episodes, EPISODES):
    for key, value in d4rl_format.tfds_encoding(recorded).items():
      np.testing.assert_array_equal(got[key], value, err_msg=key)
  _assert_same(_transitions(_as_rlds(episodes)), _expected(EPISODES))


def test_flat_arrays_without_next_observations_say_what_is_lost():
  episodes, summary = d4rl_format.episodes_from_arrays(_hand_arrays(False))
  assert (summary.episodes, summary.terminated, summary.lost_transitions
          ) == (3, 2, 1)
  assert '1 of 3 episodes' in summary.loss_message('hopper.hdf5')
  # The timed-out episode ends on its last row, which RLDS reads as a
  # final observation: 4 steps, 3 transitions.
  assert len(episodes[1][rlds.REWARD]) == 4
  assert episodes[1][rlds.IS_LAST][-1] and not episodes[1][
      rlds.IS_TERMINAL][-1]
  _assert_same(_transitions(_as_rlds(episodes)),
               _expected(EPISODES, next_observations=False))


def test_extra_step_never_becomes_a_transition_that_bootstraps():
  """The memory feed's transitions: only real ones, terminal ones at 0."""
  encoded = [d4rl_format.tfds_encoding(e) for e in EPISODES]
  spec = rlds_reverb.create_trajectory_data_spec(_as_rlds(encoded))
  trajectories = [
      tf.nest.map_structure(lambda x: x.numpy(), e.trajectory)
      for e in rlds_reverb.convert_rlds_to_episodes(
          _as_rlds(encoded), zero_terminal_discount=True)]
  feed = memory.from_episodes(spec, trajectories)
  rows = feed.transition_rows()
  assert len(rows) == 3 + 4 + 4  # Every real transition, no extra step.
  batch = tf.nest.map_structure(
      lambda x: x.numpy(), feed.transitions(tf.constant(rows, tf.int32)))
  got = [(batch.observation[i, 0], batch.action[i, 0], batch.reward[i, 0],
          batch.observation[i, 1], float(batch.discount[i, 0]))
         for i in range(len(rows))]
  _assert_same(got, _expected(EPISODES))


def test_arrays_validation_names_the_field():
  arrays = _hand_arrays(True)
  del arrays['timeouts']
  with pytest.raises(ValueError, match='lack timeouts'):
    d4rl_format.episodes_from_arrays(arrays)
  arrays = _hand_arrays(True)
  arrays['rewards'] = arrays['rewards'][:-1]
  with pytest.raises(ValueError, match='rewards has 10 rows, observations 11'):
    d4rl_format.episodes_from_arrays(arrays)


def test_arrays_shapes_flags_infos_and_unfinished_rows():
  """Rewards (N, 1), float flags, infos zeroed on the extra step as TFDS
  does, and rows after the last done flag as one unfinished episode."""
  arrays = _hand_arrays(True)
  rows = len(arrays['rewards'])
  arrays['rewards'] = arrays['rewards'][:, None]
  arrays['terminals'] = arrays['terminals'].astype(np.float32)
  arrays['infos/qpos'] = np.arange(rows, dtype=np.float64)[:, None] + 1
  arrays['timeouts'][-1] = False
  arrays['terminals'][-1] = 0.0  # The third episode now has no done flag.
  episodes, summary = d4rl_format.episodes_from_arrays(arrays)
  assert (summary.episodes, summary.terminated, summary.timed_out,
          summary.unfinished, summary.lost_transitions) == (3, 1, 1, 1, 0)
  first = episodes[0]
  np.testing.assert_array_equal(first['infos']['qpos'][:, 0], [1, 2, 3, 0])
  np.testing.assert_array_equal(first[rlds.REWARD][:-1],
                                EPISODES[0][rlds.REWARD][:-1])
  # Unfinished, with next observations: an extra step, not terminal.
  assert episodes[2][rlds.IS_LAST][-1] and not episodes[2][
      rlds.IS_TERMINAL][-1]
  assert len(episodes[2][rlds.REWARD]) == 5


def _fixed(episodes) -> list[dict]:
  data = d4rl_format.drop_unknown_final_observations(_as_rlds(episodes))
  return [_numpy_steps(e) for e in data]


def test_drop_unknown_final_observations_keeps_every_real_step():
  with_next, _ = d4rl_format.episodes_from_arrays(_hand_arrays(True))
  without_next, _ = d4rl_format.episodes_from_arrays(_hand_arrays(False))
  one_row = {k: v[:1] for k, v in _hand_arrays(True).items()}
  one_row['timeouts'][0] = True
  one_step, _ = d4rl_format.episodes_from_arrays(one_row)
  fixed = _fixed(with_next)
  # Terminated: untouched. Timed out with TFDS's extra step: it goes.
  for key in (rlds.OBSERVATION, rlds.DISCOUNT, rlds.IS_LAST):
    np.testing.assert_array_equal(fixed[0][key], with_next[0][key])
  assert len(fixed[1][rlds.REWARD]) == len(with_next[1][rlds.REWARD]) - 1
  np.testing.assert_array_equal(fixed[1][rlds.OBSERVATION],
                                with_next[1][rlds.OBSERVATION][:-1])
  assert fixed[1][rlds.IS_LAST][-1] and fixed[1][rlds.IS_LAST].sum() == 1
  # No extra step (v0 files): the last real row has discount 1 and stays.
  for got, kept in zip(_fixed(without_next), without_next):
    for key in (rlds.OBSERVATION, rlds.DISCOUNT, rlds.IS_LAST):
      np.testing.assert_array_equal(got[key], kept[key])
  # One row and its extra step: the row stays, as the episode's only step.
  assert len(one_step[0][rlds.REWARD]) == 2
  (single,) = _fixed(one_step)
  assert len(single[rlds.REWARD]) == 1 and single[rlds.IS_LAST][0]


def test_load_refuses_other_splits_of_a_file_and_generate_other_encodings(
    tmp_path):
  path = str(tmp_path / 'hopper.npz')
  np.savez(path, **_hand_arrays(True))
  with pytest.raises(ValueError, match="one split, 'train'"):
    datasets.load(path, split='train[:1]')
  with pytest.raises(ValueError, match="unknown encoding 'd4rl'"):
    recording.generate_dataset('Hopper-v5', 'random', 1,
                               str(tmp_path / 'out'), encoding='d4rl')


def test_hdf5_round_trip_with_infos_and_metadata(tmp_path, capsys):
  arrays = _hand_arrays(True)
  arrays['infos/qvel'] = np.ones((len(arrays['rewards']), 6))
  path = str(tmp_path / 'hopper.hdf5')
  d4rl_format.write_hdf5(path, arrays)
  import h5py  # pylint: disable=g-import-not-at-top
  with h5py.File(path, 'a') as f:
    f.create_dataset('metadata/algorithm', data='SAC')  # A scalar.
  read = d4rl_format.read_arrays(path)
  assert sorted(read) == sorted(arrays)
  for key, value in arrays.items():
    np.testing.assert_array_equal(read[key], value, err_msg=key)
  episode = [_numpy_steps(e) for e in datasets.load(path)][0]
  np.testing.assert_array_equal(episode['infos']['qvel'][:-1], 1)
  assert capsys.readouterr().err == ''  # Scalars are not rows: no note.


@pytest.mark.parametrize('suffix', ['.hdf5', '.npz'])
def test_load_reads_a_d4rl_file(tmp_path, suffix, capsys):
  path = str(tmp_path / f'hopper{suffix}')
  arrays = _hand_arrays(False)
  if suffix == '.npz':
    np.savez(path, **arrays)
  else:
    d4rl_format.write_hdf5(path, arrays)
  _assert_same(_transitions(datasets.load(path)),
               _expected(EPISODES, next_observations=False))
  assert 'last transitions (1 of 11 rows) are lost' in capsys.readouterr().err


def _by_first_observation(episodes) -> list:
  """TFDS shuffles episodes by key: compare them in one order."""
  return sorted(episodes,
                key=lambda e: e[rlds.OBSERVATION][0].tobytes())


@pytest.fixture(scope='module')
def hopper_recording(tmp_path_factory):
  """Random Hopper-v5 with a time limit of 12: both endings occur."""
  out = str(tmp_path_factory.mktemp('hopper') / 'tfds_d4rl')
  recording.generate_dataset('Hopper-v5', 'random', 12, out, seed=3,
                             num_envs=2, max_episode_steps=12,
                             show_progress=False, encoding='tfds_d4rl')
  episodes = [_numpy_steps(e) for e in datasets.load(out)]
  return out, episodes


def test_generated_hopper_has_both_endings_and_tfds_discounts(
    hopper_recording):
  _, episodes = hopper_recording
  terminal = [bool(e[rlds.IS_TERMINAL][-1]) for e in episodes]
  assert any(terminal) and not all(terminal)
  for steps, ended in zip(episodes, terminal):
    assert steps[rlds.DISCOUNT][-1] == 0
    assert steps[rlds.DISCOUNT][-2] == (0 if ended else 1)
    assert (steps[rlds.DISCOUNT][:-2] == 1).all()


def test_tfds_d4rl_builder_on_our_rows(hopper_recording, tmp_path,
                                       monkeypatch, capsys):
  """TFDS's own d4rl_mujoco_hopper builder, run offline on the generated
  rows written as D4RL's hdf5, makes the steps `tfds_encoding` made but
  one: every extra step holds the file's last next observation. Loading
  it drops what that leaves unknown, and says so."""
  _, episodes = hopper_recording
  arrays = d4rl_format.to_arrays(episodes)
  path = str(tmp_path / 'hopper_medium_expert-v2.hdf5')
  d4rl_format.write_hdf5(path, arrays)
  monkeypatch.setattr(
      tfds.download.DownloadManager, 'download_and_extract',
      lambda self, urls: {'file_path': path})
  builder = tfds.builder('d4rl_mujoco_hopper/v2-medium-expert',
                         data_dir=str(tmp_path / 'tfds'))
  with datasets.gcs_disabled():
    builder.download_and_prepare()
  raw = _by_first_observation([_numpy_steps(e)
                               for e in builder.as_dataset(split='train')])
  ours = _by_first_observation(episodes)
  assert len(raw) == len(ours)
  for got, mine in zip(raw, ours):
    for key in (rlds.ACTION, rlds.REWARD, rlds.DISCOUNT, rlds.IS_FIRST,
                rlds.IS_LAST, rlds.IS_TERMINAL):
      np.testing.assert_array_equal(got[key], mine[key], err_msg=key)
    np.testing.assert_array_equal(got[rlds.OBSERVATION][:-1],
                                  mine[rlds.OBSERVATION][:-1])
    # TFDS's bug: the file's last next observation, in every episode.
    np.testing.assert_array_equal(got[rlds.OBSERVATION][-1],
                                  arrays['next_observations'][-1])
  # What datasets.load gives: each timed-out episode without its last
  # transition (its final observation is unknown), the rest as recorded.
  loaded = datasets.load(builder.data_dir)
  assert 'loses its last transition' in capsys.readouterr().err
  expected = _expected(ours, next_observations=False)
  got = sorted(_transitions(loaded), key=lambda t: t[0].tobytes())
  expected = sorted(expected, key=lambda t: t[0].tobytes())
  assert len(got) == len(expected) == sum(
      len(e[rlds.REWARD]) - 1 - (not e[rlds.IS_TERMINAL][-1]) for e in ours)
  for g, e in zip(got, expected):
    for a, b in zip(g[:3] + g[4:], e[:3] + e[4:]):  # Not o' of terminals.
      np.testing.assert_array_equal(a, b)
    if g[4] == 1.0:
      np.testing.assert_array_equal(g[3], e[3])


def test_bootstrap_through_terminals_is_the_loader_bug_it_measures():
  """The control arm of the termination measurement: the same
  transitions, every one bootstrapping, terminal ones included."""
  from rlds_reverb.experiments import offline_data  # pylint: disable=g-import-not-at-top
  encoded = [d4rl_format.tfds_encoding(e) for e in EPISODES]
  got = _transitions(offline_data.without_terminations(_as_rlds(encoded)))
  expected = [e[:4] + (1.0,) for e in _expected(EPISODES)]
  _assert_same(got, expected)
