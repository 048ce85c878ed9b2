"""Runs of `python -m pipelines.plot`, as a user runs it."""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
TIMEOUT_S = 600


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
  proc = subprocess.run(
      [sys.executable, '-m', 'pipelines.plot', '--run_dirs', ','.join(runs),
       '--labels', 'prioritized,uniform', '--hline', '475', '--out',
       str(out)], cwd=REPO, env=ENV, capture_output=True, text=True,
      timeout=TIMEOUT_S, check=False)
  assert proc.returncode == 0, proc.stderr
  assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
  assert f'plot: wrote {out} (2 runs)' in proc.stdout
  missing = subprocess.run(
      [sys.executable, '-m', 'pipelines.plot', '--run_dirs',
       str(tmp_path / 'nope'), '--out', str(out)], cwd=REPO, env=ENV,
      capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
  assert missing.returncode == 1
  assert f'plot: error: {tmp_path / "nope"} has no eval.jsonl' in (
      missing.stderr)
