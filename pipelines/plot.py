r"""Draws the learning curves of several runs on one PNG.

Each run directory of `pipelines.train` holds an eval.jsonl; this puts them
side by side, e.g. prioritized against uniform replay:

  python -m pipelines.plot --out per_vs_uniform.png \
      --run_dirs runs/dqn_per_cartpole_v1_seed0,runs/dqn_cartpole_v1_seed0 \
      --labels prioritized,uniform --hline 475

An entry of --run_dirs may also be an eval log kept on its own (a *.jsonl
file, as docs/ keep those of finished runs), and --max_x cuts every run at
one budget, so a run still under way is compared with finished ones at the
same step. With --mean, runs that share a label are the seeds of one
setting: each is drawn thin and their mean thick, one colour a label:

  python -m pipelines.plot --mean --max_x 200000 --hline 475 --out cmp.png \
      --run_dirs a2c_seed0_eval.jsonl,a2c_seed1_eval.jsonl,acktr_seed0_eval.jsonl,... \
      --labels A2C,A2C,ACKTR,...

Bad input ends with one line on stderr (`plot: error: ...`), exit code 1 (2
for bad flags).
"""

import os

# TensorFlow's C++ start-up chatter would bury the errors.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from pipelines import cli
from rlds_reverb.experiments import curves
from rlds_reverb.experiments import loop

_PROG = 'plot'

_RUN_DIRS = flags.DEFINE_list(
    'run_dirs', None, 'Comma-separated run directories of pipelines.train '
    '(each with an eval.jsonl), or eval logs themselves (files ending in '
    '.jsonl). Required.')
_LABELS = flags.DEFINE_list(
    'labels', None, 'Legend names, one per run dir (default: the dir names).')
_OUT = flags.DEFINE_string('out', None, 'PNG file to write. Required.')
_X = flags.DEFINE_enum(
    'x', 'env_steps', ['env_steps', 'train_step'], 'Horizontal axis: env '
    'steps (online runs) or gradient steps (offline runs).')
_Y = flags.DEFINE_string(
    'y', 'average_return', 'Eval record field on the vertical axis '
    '(average_return, normalized_score...).')
_TITLE = flags.DEFINE_string('title', '', 'Figure title.')
_HLINE = flags.DEFINE_float(
    'hline', None, 'Draw a dashed reference line at this y (e.g. a target).')
_MAX_X = flags.DEFINE_integer(
    'max_x', None, 'Draw only the evaluations at or before this --x value '
    '(compares runs at one budget); default: all.')
_MEAN = flags.DEFINE_bool(
    'mean', False, 'Runs that share a --labels name are one group (seeds of '
    'one setting): each drawn thin, the group\'s mean thick.')

_COLORS = ('tab:blue', 'tab:red', 'tab:green', 'tab:orange', 'tab:purple',
           'tab:brown')


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(_PROG, ValueError(f'unexpected arguments: {" ".join(argv[1:])}'),
             code=2)
  if not _RUN_DIRS.value or not _OUT.value:
    cli.fail(_PROG, ValueError('--run_dirs and --out are required'), code=2)
  labels = _LABELS.value or [
      os.path.basename(d.rstrip('/')).removesuffix('.jsonl')
      for d in _RUN_DIRS.value]
  if len(labels) != len(_RUN_DIRS.value):
    cli.fail(_PROG, ValueError(
        f'--labels has {len(labels)} names for {len(_RUN_DIRS.value)} '
        '--run_dirs'), code=2)
  if not _MEAN.value and len(set(labels)) != len(labels):
    cli.fail(_PROG, ValueError('--labels names a run twice: give --mean to '
                               'draw runs of one name as a group'), code=2)
  runs, cuts = {}, []
  for label, run_dir in zip(labels, _RUN_DIRS.value):
    if run_dir.endswith('.jsonl'):
      records = loop.read_eval_file(run_dir)
      if not records:
        cli.fail(_PROG, ValueError(f'{run_dir}: no eval records (missing or '
                                   'empty)'))
    else:
      records = loop.Learner.read_eval_log(run_dir)
      if not records:
        cli.fail(_PROG, ValueError(f'{run_dir} has no {loop.EVAL_LOG} (not a '
                                   'pipelines.train run dir, or no eval yet)'))
    if not any(r.get(_Y.value) is not None for r in records):
      cli.fail(_PROG, ValueError(f'{run_dir}: no eval record has a '
                                 f'{_Y.value!r} value'))
    if _MAX_X.value is not None:
      kept = [r for r in records if r.get(_X.value, 0) <= _MAX_X.value]
      cuts.append(f'{label} {len(kept)} of {len(records)}')
      if not kept:
        cli.fail(_PROG, ValueError(f'{run_dir}: no evaluation at or before '
                                   f'{_X.value} {_MAX_X.value}'))
      records = kept
    runs[f'{label} {run_dir}' if _MEAN.value else label] = records
  styles = None
  if _MEAN.value:
    runs, styles = _groups(runs, labels, _RUN_DIRS.value)
  hlines = {f'{_HLINE.value:g}': _HLINE.value} if _HLINE.value is not None \
      else None
  path = curves.plot_curves(runs, _OUT.value, x=_X.value, y=_Y.value,
                            title=_TITLE.value,
                            x_label=_X.value.replace('_', ' '),
                            y_label=_Y.value.replace('_', ' '), hlines=hlines,
                            styles=styles)
  print(f'{_PROG}: wrote {path} ({len(_RUN_DIRS.value)} runs)', flush=True)
  if cuts:
    print(f'{_PROG}: evaluations up to {_X.value} {_MAX_X.value}: '
          f'{", ".join(cuts)}', flush=True)


def _groups(runs: dict, labels: list[str], run_dirs: list[str]
            ) -> tuple[dict, dict]:
  """Each label's runs, thin in its colour, and their mean, thick."""
  grouped, styles = {}, {}
  for index, label in enumerate(dict.fromkeys(labels)):
    color = _COLORS[index % len(_COLORS)]
    members = [runs[f'{label} {d}'] for l, d in zip(labels, run_dirs)
               if l == label]
    for number, records in enumerate(members):
      name = f'{label} run {number}'
      grouped[name] = records
      styles[name] = {'color': color, 'alpha': 0.3, 'linewidth': 1,
                      'markersize': 0, 'label': None}
    mean = f'{label}, mean of {len(members)}'
    grouped[mean] = curves.mean_curve(members, x=_X.value)
    styles[mean] = {'color': color, 'linewidth': 2.2}
  return grouped, styles


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser(_PROG))
