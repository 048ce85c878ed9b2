"""tools/rlds_npz.py and bench/d3rlpy_offline.py's reading of its rows: the
episodes a peer library trains on are the ones our learners train on."""


import numpy as np
import pytest

from rlds_reverb.data import tfds_writer

from conftest import bench_module, tools_module  # pylint: disable=g-bad-import-order


def _episode(length, terminal, offset):
  """`length` steps plus the final observation's step; values tell rows apart."""
  rows = length + 1
  flags = np.zeros(rows, bool)
  last = flags.copy()
  last[-1] = True
  return {'steps': {
      'observation': (offset + np.arange(rows, dtype=np.float32))[:, None]
                     * np.ones((1, 3), np.float32),
      'action': np.full((rows, 2), offset, np.float32),
      'reward': offset + np.arange(rows, dtype=np.float32),
      'discount': np.ones(rows, np.float32),
      'is_first': np.arange(rows) == 0,
      'is_last': last,
      'is_terminal': last & terminal,
      'infos': {'action_log_probs': np.zeros(rows)},
  }}


def test_export_keeps_every_step_in_order_with_its_flags(tmp_path):
  episodes = [_episode(4, False, 0), _episode(2, True, 100),
              _episode(3, False, 200)]
  dataset_dir = tfds_writer.write_episodes(
      enumerate(episodes), str(tmp_path / 'tfds'), name='tiny',
      spec=tfds_writer.StepSpec(observation_shape=(3,), action_shape=(2,)))
  out = str(tmp_path / 'steps.npz')
  counts = tools_module('rlds_npz').export(dataset_dir, out)
  assert counts == {'episodes': 3, 'steps': 5 + 3 + 4}
  with np.load(out) as f:
    rows = {name: f[name] for name in f.files}
  # Episodes come back in their keys' order, final steps included.
  np.testing.assert_array_equal(
      rows['observation'][:, 0],
      [0, 1, 2, 3, 4, 100, 101, 102, 200, 201, 202, 203])
  np.testing.assert_array_equal(np.flatnonzero(rows['is_first']), [0, 5, 8])
  np.testing.assert_array_equal(np.flatnonzero(rows['is_last']), [4, 7, 11])
  np.testing.assert_array_equal(np.flatnonzero(rows['is_terminal']), [7])
  assert rows['action'].shape == (12, 2)


def test_d3rlpy_rows_keep_cut_final_observations_and_drop_terminal_ones():
  flags = bench_module('d3rlpy_offline').episode_flags
  # Episode 0 cut by its time limit (rows 0-3), episode 1 terminal (4-6).
  is_last = np.array([0, 0, 0, 1, 0, 0, 1], bool)
  is_terminal = np.array([0, 0, 0, 0, 0, 0, 1], bool)
  keep, terminals, timeouts = flags(is_last, is_terminal)
  np.testing.assert_array_equal(keep, [1, 1, 1, 1, 1, 1, 0])
  # The terminal moves to the last real transition; the cut stays a timeout
  # on the final observation's row (d3rlpy makes no transition from it).
  np.testing.assert_array_equal(terminals, [0, 0, 0, 0, 0, 1])
  np.testing.assert_array_equal(timeouts, [0, 0, 0, 1, 0, 0])


@pytest.mark.parametrize('is_last, is_terminal, message', [
    ([0, 1, 0], [0, 0, 0], 'last row must end an episode'),
    ([0, 0, 1], [0, 1, 1], 'row 1 is terminal but not last'),
    ([0, 1, 1], [0, 0, 1], 'needs a step before its final one'),
])
def test_d3rlpy_rows_refuse_broken_episode_flags(is_last, is_terminal,
                                                 message):
  flags = bench_module('d3rlpy_offline').episode_flags
  with pytest.raises(ValueError, match=message):
    flags(np.array(is_last, bool), np.array(is_terminal, bool), 'x.npz')
