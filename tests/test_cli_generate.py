"""Runs of `python -m pipelines.generate`, as a user runs it."""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np

from conftest import _episodes
from conftest import CHEETAH_LIMIT as LIMIT
from conftest import CHEETAH_SEED as SEED
import preloaded_cli  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]


def _cli(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-m', 'pipelines.generate', *args], cwd=REPO,
      capture_output=True, text=True, timeout=300, check=False)


def test_cli_writes_the_same_data_as_the_library(tmp_path, cheetah):
  out = tmp_path / 'cli'
  result = _cli('--env', 'HalfCheetah-v5', '--policy', 'random',
                '--episodes', '3', '--num_envs', '2', '--seed', str(SEED),
                '--max_episode_steps', str(LIMIT), '--out', str(out))
  assert result.returncode == 0, result.stderr
  summary = result.stdout.strip().splitlines()[-1]
  assert re.fullmatch(
      rf'generate: 3 episodes, {3 * LIMIT} steps, mean return -?\d+\.\d{{3}}, '
      rf'\d+ steps/s, wrote {re.escape(str(out))}', summary), summary
  assert f'{cheetah[0].mean_return:.3f}' in summary
  assert (out / '.complete').is_file()
  episodes = _episodes(str(out))
  assert len(episodes) == 3
  for ours, lib in zip(episodes, cheetah[1]):
    for key in lib:
      np.testing.assert_array_equal(ours[key], lib[key], err_msg=key)


_CLI_ERRORS = {
    'unknown_env': (['--env', 'NoSuchEnv-v0'], "unknown env id 'NoSuchEnv-v0'"),
    'unknown_policy': (['--policy', 'greedy'], "unknown policy 'greedy'"),
    'zero_episodes': (['--episodes', '0'], 'num_episodes must be > 0, got 0'),
    'out_not_empty': (['--out', None], 'is not empty'),
}


def test_cli_errors_are_one_line(tmp_path):
  """Each bad invocation exits non-zero with one `generate: error:` line.

  The runs are forks of a preloaded interpreter (tests/preloaded_cli.py):
  each is mostly import time in a fresh one.
  """
  runs = {}
  for name, ((flag, value), _) in _CLI_ERRORS.items():
    out = tmp_path / name
    flags = {'--env': 'HalfCheetah-v5', '--policy': 'random',
             '--episodes': '1', '--max_episode_steps': '2', '--out': str(out)}
    if value is None:  # An existing, non-empty out dir.
      out.mkdir()
      (out / 'x').write_text('x')
    else:
      flags[flag] = value
    runs[name] = preloaded_cli.run(
        'generate', *[part for item in flags.items() for part in item],
        cwd=REPO, env=os.environ, timeout_s=300)
  for name, proc in runs.items():
    stderr = proc.stderr
    assert proc.returncode != 0, name
    assert 'Traceback' not in stderr, (name, stderr)
    errors = [l for l in stderr.splitlines() if 'error' in l.lower()]
    assert errors == [stderr.strip().splitlines()[-1]], (name, stderr)
    assert errors[0].startswith('generate: error: '), (name, errors)
    assert _CLI_ERRORS[name][1] in errors[0], (name, errors)
    assert not (tmp_path / name / '.complete').exists(), name
  assert (tmp_path / 'out_not_empty' / 'x').read_text() == 'x'


def test_cli_writes_the_tfds_d4rl_encoding(tmp_path):
  out = tmp_path / 'hopper'
  proc = preloaded_cli.run(
      'generate', '--env', 'Hopper-v5', '--episodes', '12', '--num_envs', '2',
      '--max_episode_steps', '12', '--seed', '3', '--encoding', 'tfds_d4rl',
      '--out', str(out), cwd=REPO, env=os.environ, timeout_s=300)
  assert proc.returncode == 0, proc.stderr
  episodes = _episodes(str(out))
  ended = [bool(steps['is_terminal'][-1]) for steps in episodes]
  assert any(ended) and not all(ended)  # Random hoppers fall, or time out.
  for steps, terminated in zip(episodes, ended):
    assert steps['discount'][-1] == 0
    assert steps['discount'][-2] == (0 if terminated else 1)
