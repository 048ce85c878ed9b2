"""tools/curves_png.py: groups of eval logs on one figure."""

import json
import os
import subprocess
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _log(path, returns):
  with open(path, 'w') as f:
    for step, value in enumerate(returns, 1):
      f.write(json.dumps({'env_steps': step * 100,
                          'average_return': value}) + '\n')


def _draw(*args):
  return subprocess.run([sys.executable, '-m', 'tools.curves_png', *args],
                        capture_output=True, text=True, cwd=_REPO,
                        timeout=120, check=False)


def test_two_groups_draw_one_png_and_a_bad_group_is_refused(tmp_path):
  for seed in range(2):
    _log(tmp_path / f'a_seed{seed}.jsonl', [10, 20, 30])
    _log(tmp_path / f'b_seed{seed}.jsonl', [5, 50, 500])
  out = tmp_path / 'curves.png'
  done = _draw('--group', f'A={tmp_path}/a_seed*.jsonl',
               '--group', f'B={tmp_path}/b_seed*.jsonl', '--max_x', '200',
               '--target', '40', '--out', str(out))
  assert done.returncode == 0, done.stderr[-2000:]
  with open(out, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  refused = _draw('--group', f'C={tmp_path}/none*.jsonl', '--out',
                  str(tmp_path / 'x.png'))
  assert refused.returncode != 0
  assert 'want NAME=GLOB matching eval logs' in refused.stderr
  assert not os.path.exists(tmp_path / 'x.png')
