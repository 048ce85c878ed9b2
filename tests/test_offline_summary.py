"""bench/offline_summary.py: rows of added seeds join the earlier ones."""

import json

import pytest

from conftest import bench_module  # pylint: disable=g-bad-import-order


def _line(seeds, scores, *, steps=30000, date='2026-11-24'):
  return json.dumps({
      'agent': 'cql_sac', 'dataset': 'data/m', 'dataset_kind': 'medium',
      'steps': steps, 'seeds': seeds, 'normalized_scores': scores,
      'normalized_score_mean': sum(scores) / len(scores),
      'normalized_score_std': 0.0, 'corl': 47.04, 'date': date,
      'behaviour_return': 4575.5, 'behaviour_normalized_score': 39.11})


def test_later_seeds_join_the_row_and_a_repeated_seed_is_replaced(tmp_path):
  first = tmp_path / 'a.jsonl'
  first.write_text(_line([0], [45.0]) + '\n' + _line([0], [10.0], steps=5)
                   + '\n')
  later = tmp_path / 'b.jsonl'
  later.write_text('not json\n' + _line([1, 2], [47.0, 46.0],
                                        date='2026-11-25') + '\n'
                   + _line([2], [49.0], date='2026-11-25') + '\n')
  summary = bench_module('offline_summary').summarize(
      [str(first), str(later)])
  rows = {row['gradient_steps']: row for row in summary['rows']}
  assert rows[30000]['seeds'] == [0, 1, 2]
  assert rows[30000]['scores'] == [45.0, 47.0, 49.0]
  assert rows[30000]['mean'] == pytest.approx(47.0)
  assert rows[30000]['std'] == pytest.approx(1.63, abs=0.01)
  assert rows[30000]['date'] == '2026-11-25'
  assert rows[5]['seeds'] == [0] and rows[5]['std'] == 0.0
  assert summary['behaviour_returns']['medium']['d4rl_return'] == 4770.0


def test_bfloat16_runs_are_rows_of_their_own(tmp_path):
  path = tmp_path / 'a.jsonl'
  half = json.loads(_line([0], [44.0]))
  half['critic_dtype'] = 'bfloat16'
  path.write_text(_line([0], [45.0]) + '\n' + json.dumps(half) + '\n')
  rows = bench_module('offline_summary').summarize([str(path)])['rows']
  assert [(r['scores'], r.get('critic_dtype')) for r in rows] == [
      ([45.0], None), ([44.0], 'bfloat16')]
