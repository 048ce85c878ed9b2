"""tools/offline_table.py: rows of added seeds join the earlier ones; runs
under way add rows of their last evaluation."""

import json
import os

import pytest

from conftest import tools_module  # pylint: disable=g-bad-import-order


def _line(seeds, scores, *, steps=30000, date='2026-11-24', kind='medium'):
  return json.dumps({
      'agent': 'cql_sac', 'dataset': 'data/m', 'dataset_kind': kind,
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
  summary = tools_module('offline_table').summarize(
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
  rows = tools_module('offline_table').summarize([str(path)])['rows']
  assert [(r['scores'], r.get('critic_dtype')) for r in rows] == [
      ([45.0], None), ([44.0], 'bfloat16')]


def test_a_row_names_the_gin_files_its_last_line_ran_with(tmp_path):
  path = tmp_path / 'a.jsonl'
  tuned = json.loads(_line([1], [60.0]))
  tuned['gin_files'] = ['configs/cql_sac_corl_locomotion.gin']
  path.write_text(_line([0], [45.0], kind='hopper-medium') + '\n'
                  + json.dumps(tuned) + '\n')
  rows = tools_module('offline_table').summarize([str(path)])['rows']
  assert [(r['dataset'], r.get('gin_files')) for r in rows] == [
      ('hopper-medium', None),
      ('medium', ['configs/cql_sac_corl_locomotion.gin'])]


def test_a_line_that_bootstraps_through_terminations_is_no_row(tmp_path):
  """--bootstrap_through_terminals measures what a loader bug costs; its
  line sits beside the contract's in one file and joins no row."""
  path = tmp_path / 'a.jsonl'
  buggy = json.loads(_line([0], [20.0]))
  buggy['bootstrap_through_terminals'] = True
  path.write_text(_line([0], [45.0]) + '\n' + json.dumps(buggy) + '\n')
  rows = tools_module('offline_table').summarize([str(path)])['rows']
  assert [r['scores'] for r in rows] == [[45.0]]


def _run_dir(tmp_path, steps, scores, *, train_steps=1_000_000,
             dataset='data/m'):
  run_dir = tmp_path / 'cql_sac_seed0'
  run_dir.mkdir()
  (run_dir / 'config.json').write_text(json.dumps({
      'agent': 'cql_sac', 'dataset': dataset, 'seed': 0,
      'train_steps': train_steps,
      'agent_config': {'critic_dtype': 'bfloat16'},
      'resumed_with_changes': [{'from_step': 20, 'changes': {
          'agent_config.critic_dtype': ['float32', 'bfloat16']}}]}))
  (run_dir / 'eval.jsonl').write_text(''.join(
      json.dumps({'train_step': step, 'normalized_score': score,
                  'time': 1795830788.8, 'phase': 'offline'}) + '\n'
      for step, score in zip(steps, scores)))
  return str(run_dir)


def test_a_run_under_way_is_a_row_of_its_last_evaluation(tmp_path):
  path = tmp_path / 'a.jsonl'
  path.write_text(_line([0], [45.0]) + '\n')
  run_dir = _run_dir(tmp_path, range(10, 130, 10), [float(i) for i in
                                                      range(12)])
  summary = tools_module('offline_table')
  rows = summary.summarize([str(path)])['rows']
  (row,) = summary.runs_under_way([run_dir], rows)
  assert row['dataset'] == 'medium' and row['corl'] == 47.04
  assert row['gradient_steps'] == 120 and row['scores'] == [11.0]
  assert row['complete'] is False and row['target_steps'] == 1_000_000
  assert row['best'] == 11.0
  assert row['mean_last_10_evaluations'] == pytest.approx(6.5)  # 2..11
  assert row['critic_dtype'] == 'bfloat16'
  assert row['resumed_with_changes'][0]['from_step'] == 20
  assert row['date'] == '2026-11-28'


def test_a_finished_run_is_left_to_its_bench_line(tmp_path):
  path = tmp_path / 'a.jsonl'
  path.write_text(_line([0], [45.0]) + '\n'
                  + _line([0], [2.0], steps=1_000_000) + '\n')
  run_dir = _run_dir(tmp_path, [990_000, 1_000_000], [1.0, 2.0])
  summary = tools_module('offline_table')
  rows = summary.summarize([str(path)])['rows']
  assert summary.runs_under_way([run_dir], rows) == []
  summary.add_finished_runs([run_dir], rows)
  short, finished = rows
  assert 'best' not in short
  # Its score stays the bench line's (the last evaluation); the run adds
  # what one evaluation leaves out, the resume's dtype change included.
  assert finished['scores'] == [2.0] and 'complete' not in finished
  assert finished['best'] == 2.0
  assert finished['mean_last_10_evaluations'] == pytest.approx(1.5)
  assert finished['resumed_with_changes'][0]['changes'] == {
      'agent_config.critic_dtype': ['float32', 'bfloat16']}
  table_row = summary.markdown_table(rows).splitlines()[2]
  assert table_row.endswith('| 2.0 at 1M (best 2.0, last 10 evaluations '
                            '1.5) | 47.0 | -45.0 |')


def test_a_finished_run_without_its_bench_line_is_an_error(tmp_path):
  path = tmp_path / 'a.jsonl'
  path.write_text(_line([0], [45.0]) + '\n')
  run_dir = _run_dir(tmp_path, [10, 20], [1.0, 2.0], train_steps=20)
  summary = tools_module('offline_table')
  rows = summary.summarize([str(path)])['rows']
  with pytest.raises(ValueError, match='finished \\(20 steps\\), but no bench '
                     'line holds its cql_sac seed 0 run'):
    summary.add_finished_runs([run_dir], rows)


def test_a_run_on_a_dataset_no_line_names_is_an_error(tmp_path):
  run_dir = _run_dir(tmp_path, [10], [1.0], dataset='data/other')
  with pytest.raises(ValueError, match="no bench line trains on dataset "
                     "'other'"):
    tools_module('offline_table').runs_under_way([run_dir], [])


def test_the_markdown_table_sets_short_rows_beside_the_longest_run(tmp_path):
  path = tmp_path / 'a.jsonl'
  path.write_text(_line([0, 1, 2], [45.0, 47.0, 46.0]) + '\n'
                  + _line([0], [44.0], steps=1_000_000) + '\n')
  summary = tools_module('offline_table')
  rows = summary.summarize([str(path)])['rows']
  table = summary.markdown_table(rows).splitlines()
  assert len(table) == 3  # Header, rule, the one agent and dataset.
  assert table[2] == ('| CQL-SAC | halfcheetah-medium | 46.0 +- 0.8 (3) '
                      '| 44.0 at 1M | 47.0 | -3.0 (within 5) |')
  # A run under way is judged by its last 10 evaluations, not its last one.
  run_dir = _run_dir(tmp_path, range(40_000, 160_000, 10_000),
                     [float(i) for i in range(30, 42)])
  under_way = summary.runs_under_way([run_dir], rows[:1])
  row = summary.markdown_table(rows[:1] + under_way).splitlines()[2]
  assert row.endswith('| 41.0 at 150k (under way to 1M; best 41.0, last 10 '
                      'evaluations 36.5) | 47.0 | -10.5 |')
  # Seeds run later to the long budget join it: the cell and the gap are
  # over them.
  path.write_text(path.read_text() + _line([1, 2], [48.0, 49.0],
                                           steps=1_000_000) + '\n')
  rows = summary.summarize([str(path)])['rows']
  assert summary.markdown_table(rows).splitlines()[2] == (
      '| CQL-SAC | halfcheetah-medium | 46.0 +- 0.8 (3) | 47.0 +- 2.2 (3) '
      'at 1M | 47.0 | -0.0 (within 5) |')


def test_rows_of_other_environments_follow_halfcheetahs_named_in_full(
    tmp_path):
  path = tmp_path / 'a.jsonl'
  path.write_text(_line([0], [60.0], kind='walker2d-medium') + '\n'
                  + _line([0], [50.0], kind='hopper-medium') + '\n'
                  + _line([0], [45.0]) + '\n')
  summary = tools_module('offline_table')
  result = summary.summarize([str(path)])
  table = summary.markdown_table(result['rows']).splitlines()[2:]
  assert [line.split(' | ')[1] for line in table] == [
      'halfcheetah-medium', 'hopper-medium', 'walker2d-medium']
  assert result['behaviour_returns']['hopper-medium']['d4rl_return'] == (
      1422.0)


def test_the_published_json_and_table_are_what_the_committed_inputs_make():
  """docs/results/offline.json and the table docs/results/offline.md opens
  with are made from the committed bench lines and run directories: a line
  added or a run moved on without making them again fails here."""
  summary = tools_module('offline_table')
  docs = os.path.join(summary.REPOSITORY, 'docs', 'results')
  with open(os.path.join(docs, 'offline.json')) as f:
    assert json.loads(summary.published_summary()) == json.loads(f.read())
  with open(os.path.join(docs, 'offline.md')) as f:
    text = f.read()
  start = text.index('<!-- offline-table -->\n') + len(
      '<!-- offline-table -->\n')
  table = text[start:text.index('<!-- /offline-table -->')].strip('\n')
  assert table == summary.published_summary(markdown=True)


def test_published_refuses_paths_of_its_own(capsys):
  with pytest.raises(SystemExit):
    tools_module('offline_table').main(['--published', 'a.jsonl'])
  assert '--published reads its own inputs' in capsys.readouterr().err
