"""Tests of tools/advantage_probe.py: the flat transitions it trains on and
the kinds it measures the weights on, from a Hopper dataset recorded in
TFDS's d4rl_mujoco encoding (random actions: falls within tens of steps,
a 30-step limit cuts the rest)."""

import numpy as np
import pytest

from rlds_reverb.data import recording
from conftest import tools_module  # pylint: disable=g-bad-import-order


@pytest.fixture(scope='module')
def hopper(tmp_path_factory):
  out = str(tmp_path_factory.mktemp('hopper'))
  recording.generate_dataset('Hopper-v5', 'random', 12, out, seed=5,
                             num_envs=2, max_episode_steps=30,
                             show_progress=False, encoding='tfds_d4rl')
  return tools_module('advantage_probe').flat_transitions(out)


def test_flat_transitions_follow_the_episodes(hopper):
  data = hopper
  episode, t, to_end = data['episode'], data['t'], data['steps_to_end']
  assert len(np.unique(episode)) == 12
  # Rows of one episode are consecutive: t counts up, steps_to_end down.
  same = episode[1:] == episode[:-1]
  assert np.all(t[1:][same] == t[:-1][same] + 1)
  assert np.all(to_end[:-1][same] == to_end[1:][same] + 1)
  assert np.all(to_end[:-1][~same] == 0) and np.all(t[1:][~same] == 0)
  np.testing.assert_array_equal(data['next_observation'][:-1][same],
                                data['observation'][1:][same])
  # Discount 0 exactly on the falls' last transition; both kinds present.
  fall = data['terminated'] & (to_end == 0)
  np.testing.assert_array_equal(data['discount'] == 0.0, fall)
  lengths = np.bincount(episode)
  ended = np.zeros(12, bool)
  ended[episode] = data['terminated']
  assert ended.any() and not ended.all()
  # The toolkit's recordings keep the final observation of an episode cut
  # by the time limit: all 30 transitions; the falls end before it.
  assert set(lengths[~ended]) == {30} and np.all(lengths[ended] < 30)


def test_transition_kinds_pick_what_they_name(hopper):
  data = hopper
  kinds = tools_module('advantage_probe').transition_kinds(
      data, 1000, np.random.default_rng(0))
  lengths = np.bincount(data['episode'])[data['episode']]
  fall = kinds['fall']
  assert len(fall) == int((data['terminated'] &
                           (data['steps_to_end'] == 0)).sum())
  assert np.all(data['steps_to_end'][fall] == 0)
  assert np.all(data['discount'][fall] == 0.0)
  before = kinds['before_fall']
  assert np.all((data['steps_to_end'][before] >= 1) &
                (data['steps_to_end'][before] <= 10))
  assert np.all(data['terminated'][before])
  full = kinds['full_start']
  assert np.all(lengths[full] == 30) and np.all(data['t'][full] < 20)
  assert len(full) == 20 * int(np.sum(np.bincount(data['episode']) == 30))
  middle = kinds['full_middle']
  assert np.all(lengths[middle] == 30) and np.all(data['t'][middle] >= 20)
  # A kind with no transition is left out (no random hopper lasts 31 steps
  # before a fall).
  assert 'short_middle' not in kinds
  short = kinds['short_start']
  assert np.all(data['terminated'][short]) and np.all(lengths[short] < 200)


def test_probe_reports_weights_by_kind(tmp_path):
  """A few steps of IQL, end to end: one JSON line per report."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  data = str(tmp_path / 'data')
  recording.generate_dataset('Hopper-v5', 'random', 6, data, seed=6,
                             num_envs=2, max_episode_steps=30,
                             show_progress=False, encoding='tfds_d4rl')
  out = tmp_path / 'probe.jsonl'
  repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  subprocess.run(
      [sys.executable, '-m', 'tools.advantage_probe', '--dataset', data,
       '--steps', '6', '--every', '3', '--eval_episodes', '1',
       '--samples', '50', '--out', str(out), '--actor', 'gaussian'],
      cwd=repository, check=True, timeout=300, capture_output=True)
  reports = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r['train_step'] for r in reports] == [3, 6]
  kinds = reports[-1]['kinds']
  assert {'fall', 'full_start'} <= set(kinds)
  for figures in kinds.values():
    assert figures['weight_mean'] > 0 and 0 <= figures['weight_at_cap'] <= 1
  ((ret, length),) = reports[-1]['eval']
  assert 1 <= length <= 1000 and np.isfinite(ret)
