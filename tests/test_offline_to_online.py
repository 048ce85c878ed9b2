"""tools/offline_to_online.py: the dip is measured from the last offline score."""

import json

import pytest

from rlds_reverb.experiments import loop

from conftest import tools_module  # pylint: disable=g-bad-import-order


def _run(tmp_path, records):
  run_dir = tmp_path / 'cal_ql_seed0'
  run_dir.mkdir()
  (run_dir / loop.EVAL_LOG).write_text(
      ''.join(json.dumps(r) + '\n' for r in records))
  return str(run_dir)


def _record(phase, train_step, env_steps, score):
  return {'phase': phase, 'train_step': train_step, 'env_steps': env_steps,
          'normalized_score': score, 'average_return': 100.0 * score}


def test_dip_is_the_lowest_early_online_score_below_the_last_offline_one(
    tmp_path):
  run_dir = _run(tmp_path, [
      _record('offline', 10, 0, 30.0), _record('offline', 20, 0, 44.0),
      _record('online', 21, 1000, 41.5), _record('online', 22, 2000, 45.0),
      # Outside the 5,000-step window: not part of the dip.
      _record('online', 30, 10000, 20.0), _record('online', 40, 20000, 50.0)])
  summary = tools_module('offline_to_online').summarize(
      run_dir, dip_window=5000)
  assert summary['before'] == 44.0
  assert summary['after'] == 50.0
  assert summary['dip'] == pytest.approx(-2.5)
  assert summary['online_scores'] == [41.5, 45.0, 20.0, 50.0]


def test_curve_starts_at_the_offline_score_on_env_step_zero(tmp_path):
  run_dir = _run(tmp_path, [
      _record('offline', 10, 0, 30.0), _record('offline', 20, 0, 44.0),
      _record('online', 21, 1000, 41.5)])
  curve = tools_module('offline_to_online').switch_curve(run_dir)
  assert [(r['env_steps'], r['normalized_score']) for r in curve] == [
      (0, 44.0), (1000, 41.5)]


def test_a_run_without_an_online_phase_is_an_error_naming_it(tmp_path):
  run_dir = _run(tmp_path, [_record('offline', 20, 0, 44.0)])
  with pytest.raises(ValueError, match='cal_ql_seed0'):
    tools_module('offline_to_online').summarize(
      run_dir, dip_window=5000)
