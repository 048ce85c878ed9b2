"""tools/onpolicy_table.py: final returns at the step budget, steps to a
target, and the rows table of docs/results/atari.json."""

import json

from conftest import tools_module  # pylint: disable=g-bad-import-order


def _run(tmp_path, name, seed, returns, every=100):
  run_dir = tmp_path / name
  run_dir.mkdir()
  (run_dir / 'config.json').write_text(json.dumps({'seed': seed}))
  (run_dir / 'eval.jsonl').write_text(''.join(
      json.dumps({'env_steps': every * (i + 1), 'average_return': r}) + '\n'
      for i, r in enumerate(returns)))
  return str(run_dir)


def test_rows_hold_the_last_evaluation_within_the_budget(tmp_path):
  table = tools_module('onpolicy_table')
  runs = [_run(tmp_path, 'a', 0, [-21, -5, 19, 21]),
          _run(tmp_path, 'b', 1, [-21, -20, 10])]
  line = table.summarize(runs, 'ALE/Pong-v5', 300, target=18)
  # Run a's evaluation at 400 lies past the budget.
  assert line['final_returns'] == [19.0, 10.0] and line['mean_return'] == 14.5
  assert line['steps_to_target'] == [300, None]
  rows_file = str(tmp_path / 'atari.json')
  table.upsert_row(rows_file, 'ppo', line)
  table.upsert_row(rows_file, 'a2c', table.summarize(runs[1:], 'ALE/Pong-v5',
                                                     300))
  # The same agent and env again: its row is replaced, not repeated.
  table.upsert_row(rows_file, 'ppo', table.summarize(runs[:1],
                                                     'ALE/Pong-v5', 300))
  with open(rows_file) as f:
    rows = json.load(f)['rows']
  assert [(r['agent'], r['seeds'], r['mean']) for r in rows] == [
      ('a2c', [1], 10.0), ('ppo', [0], 19.0)]
  assert set(rows[0]) == {'agent', 'env', 'env_steps', 'seeds',
                          'final_returns', 'mean'}
