r"""Draws groups of eval logs on one PNG: each run thin, each group's mean
thick, so that two agents' seeds can be compared on one figure.

  python -m tools.curves_png \
      --group 'A2C=docs/results/onpolicy/a2c_cartpole_seed*_eval.jsonl' \
      --group 'ACKTR=docs/results/onpolicy/acktr_cartpole_seed*_eval.jsonl' \
      --max_x 200000 --target 475 --title 'ACKTR vs A2C on CartPole-v1' \
      --out docs/results/onpolicy/acktr_vs_a2c_cartpole_v1.png
"""

import glob
import json

from absl import app
from absl import flags

from rlds_reverb.experiments import curves

_GROUP = flags.DEFINE_multi_string(
    'group', [], 'NAME=GLOB: the eval.jsonl files of one group of runs '
    '(one seed each); repeat for each group.')
_X = flags.DEFINE_string('x', 'env_steps', 'Eval-record key of the x axis.')
_Y = flags.DEFINE_string('y', 'average_return', 'Eval-record key of the y '
                         'axis.')
_MAX_X = flags.DEFINE_float('max_x', None, 'Records beyond this x are left '
                            'out (runs of different lengths, one budget).')
_TARGET = flags.DEFINE_float('target', None, 'A dashed reference line.')
_TITLE = flags.DEFINE_string('title', '', 'Figure title.')
_OUT = flags.DEFINE_string('out', None, 'The PNG to write.', required=True)

_COLORS = ('tab:blue', 'tab:red', 'tab:green', 'tab:orange', 'tab:purple')


def _records(path: str) -> list[dict]:
  with open(path) as f:
    records = [json.loads(line) for line in f if line.strip()]
  return [r for r in records
          if _MAX_X.value is None or r[_X.value] <= _MAX_X.value]


def main(argv):
  del argv
  if not _GROUP.value:
    raise app.UsageError('give at least one --group NAME=GLOB')
  runs, styles = {}, {}
  for index, group in enumerate(_GROUP.value):
    name, _, pattern = group.partition('=')
    paths = sorted(glob.glob(pattern))
    if not name or not paths:
      raise app.UsageError(f'--group {group!r}: want NAME=GLOB matching '
                           'eval logs')
    color = _COLORS[index % len(_COLORS)]
    group_runs = []
    for path in paths:
      group_runs.append(_records(path))
      runs[f'{name} {path}'] = group_runs[-1]
      styles[f'{name} {path}'] = {'color': color, 'alpha': 0.3,
                                  'linewidth': 1, 'markersize': 0,
                                  'label': None}
    mean_name = f'{name}, mean of {len(paths)} runs'
    runs[mean_name] = curves.mean_curve(group_runs, x=_X.value)
    styles[mean_name] = {'color': color, 'linewidth': 2.2}
  hlines = ({} if _TARGET.value is None
            else {f'target {_TARGET.value:g}': _TARGET.value})
  curves.plot_curves(runs, _OUT.value, x=_X.value, y=_Y.value,
                     title=_TITLE.value, x_label=_X.value.replace('_', ' '),
                     y_label=_Y.value.replace('_', ' '), hlines=hlines,
                     styles=styles)
  print(_OUT.value)


if __name__ == '__main__':
  app.run(main)
