"""tests/preloaded_cli.py: a pipeline run in a fork of the preloaded
interpreter gives what `python -m pipelines.<name>` gives in a fresh one."""

import os
import pathlib
import subprocess
import sys

import pytest

import preloaded_cli  # pylint: disable=g-bad-import-order
from pipeline_process import error_line  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')


def _fresh(module: str, *args: str, cwd=REPO) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, '-m', f'pipelines.{module}', *args],
                        cwd=cwd, env=ENV, capture_output=True, text=True,
                        timeout=300, check=False)


def test_help_is_the_same_text():
  fresh, preloaded = (_fresh('plot', '--help'),
                      preloaded_cli.run('plot', '--help', cwd=REPO, env=ENV))
  assert fresh.returncode == preloaded.returncode == 0, fresh.stderr
  assert 'Traceback' not in preloaded.stderr
  assert preloaded.stdout == fresh.stdout
  assert '--max_x' in preloaded.stdout


def test_usage_error_same_line_same_code(tmp_path):
  # A relative path: the child resolves it against its own cwd, as a fresh
  # interpreter started there does.
  args = ('--agent', 'bc', '--dataset', 'no_such_dir')
  fresh = _fresh('train', *args, cwd=tmp_path)
  preloaded = preloaded_cli.run('train', *args, cwd=tmp_path, env=ENV)
  assert fresh.returncode == preloaded.returncode != 0
  assert error_line(preloaded, 'train') == error_line(fresh, 'train')
  assert 'no_such_dir' in error_line(preloaded, 'train')
  assert preloaded.stdout == fresh.stdout


def test_a_run_past_its_timeout_is_killed():
  with pytest.raises(subprocess.TimeoutExpired):
    preloaded_cli.run('plot', '--help', cwd=REPO, env=ENV, timeout_s=0)
  # The interpreter serves the next run.
  assert preloaded_cli.run('plot', '--help', cwd=REPO, env=ENV).returncode == 0


def test_a_start_past_its_bound_is_a_clear_error(monkeypatch):
  # No interpreter imports TensorFlow in 10 ms: the start misses its bound,
  # and its late 'ready' line must not become the first run's reply.
  monkeypatch.setattr(preloaded_cli, 'START_TIMEOUT_S', 0.01)
  with pytest.raises(RuntimeError, match='did not start within 0.01 s'):
    preloaded_cli._Preloaded(ENV)  # pylint: disable=protected-access
