"""Runs of `python -m pipelines.plot`, as a user runs it.

A plot is a second's work after the imports: the runs are forks of a
preloaded interpreter (tests/preloaded_cli.py), as the refused runs of the
other CLI tests are.
"""

import json
import os
import pathlib
import subprocess

import preloaded_cli  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
TIMEOUT_S = 600


def _plot(*args: str) -> subprocess.CompletedProcess:
  return preloaded_cli.run('plot', *args, cwd=REPO, env=ENV,
                           timeout_s=TIMEOUT_S)


def test_plot_draws_several_runs_on_one_png(tmp_path):
  runs = []
  for name, returns in (('per', [10, 200, 500]), ('uniform', [10, 100, 300])):
    run = tmp_path / name
    run.mkdir()
    (run / 'eval.jsonl').write_text(''.join(
        json.dumps({'env_steps': 1000 * (i + 1), 'average_return': r}) + '\n'
        for i, r in enumerate(returns)))
    runs.append(str(run))
  out = tmp_path / 'both.png'
  proc = _plot('--run_dirs', ','.join(runs), '--labels',
               'prioritized,uniform', '--hline', '475', '--out', str(out))
  assert proc.returncode == 0, proc.stderr
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert f'plot: wrote {out} (2 runs)' in proc.stdout
  missing = _plot('--run_dirs', str(tmp_path / 'nope'), '--out', str(out))
  assert missing.returncode == 1
  assert f'plot: error: {tmp_path / "nope"} has no eval.jsonl' in (
      missing.stderr)


def test_plot_takes_eval_logs_and_cuts_at_max_x(tmp_path):
  """A run dir beside an eval log kept on its own, both cut at one budget."""
  run = tmp_path / 'run'
  run.mkdir()
  log = tmp_path / 'td3_bc_seed0_eval.jsonl'
  for path, steps in ((run / 'eval.jsonl', (1000, 2000)),
                      (log, (1000, 2000, 3000, 4000))):
    path.write_text(''.join(
        json.dumps({'train_step': s, 'normalized_score': s / 100}) + '\n'
        for s in steps))
  out = tmp_path / 'cut.png'
  proc = _plot('--run_dirs', f'{run},{log}', '--x', 'train_step', '--y',
               'normalized_score', '--max_x', '2500', '--out', str(out))
  assert proc.returncode == 0, proc.stderr
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  # The log's default label drops .jsonl; its evaluations past 2500 go.
  assert proc.stdout.splitlines()[-1] == (
      'plot: evaluations up to train_step 2500: run 2 of 2, '
      'td3_bc_seed0_eval 2 of 4')
  empty = _plot('--run_dirs', str(log), '--x', 'train_step', '--y',
                'normalized_score', '--max_x', '500', '--out', str(out))
  assert empty.returncode == 1
  assert empty.stderr.strip().splitlines()[-1] == (
      f'plot: error: {log}: no evaluation at or before train_step 500')


def test_plot_draws_the_mean_of_runs_that_share_a_label(tmp_path):
  """--mean: two settings of two seeds each, as eval logs."""
  logs = []
  for name, returns in (('a_seed0', [10, 20, 30]), ('a_seed1', [30, 40, 50]),
                        ('b_seed0', [5, 50, 500]), ('b_seed1', [5, 60, 400])):
    log = tmp_path / f'{name}_eval.jsonl'
    log.write_text(''.join(
        json.dumps({'env_steps': 100 * (i + 1), 'average_return': r}) + '\n'
        for i, r in enumerate(returns)))
    logs.append(str(log))
  out = tmp_path / 'groups.png'
  proc = _plot('--run_dirs', ','.join(logs), '--labels', 'A,A,B,B',
               '--mean', '--max_x', '200', '--hline', '40', '--out', str(out))
  assert proc.returncode == 0, proc.stderr
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert f'plot: wrote {out} (4 runs)' in proc.stdout
  twice = _plot('--run_dirs', ','.join(logs[:2]), '--labels', 'A,A',
                '--out', str(tmp_path / 'x.png'))
  assert twice.returncode == 2
  assert 'give --mean to draw runs of one name as a group' in twice.stderr
  assert not (tmp_path / 'x.png').exists()
