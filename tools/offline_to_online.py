"""Offline-to-online: the score before and after fine-tuning, and the dip.

Reads the eval logs of finished `pipelines.train --online_finetune_steps`
runs (Cal-QL and its reference, TD3+BC, from the same dataset and budget)
and prints one JSON line per run: the last offline score (`before`), the
last online one (`after`), and the dip, the lowest online score within
`--dip_window` env steps of the switch minus `before` (Cal-QL's claim is
that it does not dip; negative is a dip). Draws each run's curve against
env steps into --curve, starting from its last offline score at 0.

  python -m tools.offline_to_online --runs runs/offline_rl/o2o/cal_ql_seed0,\
runs/offline_rl/o2o/td3_bc_seed0 --curve docs/results/offline_rl/o2o.png
"""

import argparse
import json
import os

from rlds_reverb.experiments import curves
from rlds_reverb.experiments import loop


def summarize(run_dir: str, dip_window: int) -> dict:
  """before / after / dip of one run (normalised scores)."""
  records = loop.Learner.read_eval_log(run_dir)
  offline = [r for r in records if r.get('phase') == 'offline']
  online = [r for r in records if r.get('phase') == 'online']
  if not offline or not online:
    raise ValueError(f'{run_dir} has no offline and online evaluations')
  before = offline[-1]['normalized_score']
  # Fine-tuning counts env steps from 0 at the switch.
  early = [r['normalized_score'] for r in online
           if r['env_steps'] <= dip_window]
  return {'run': run_dir, 'offline_steps': offline[-1]['train_step'],
          'online_env_steps': online[-1]['env_steps'],
          'before': round(before, 2),
          'after': round(online[-1]['normalized_score'], 2),
          'dip': round(min(early) - before, 2),
          'online_scores': [round(r['normalized_score'], 1) for r in online]}


def switch_curve(run_dir: str) -> list[dict]:
  """The online evaluations, led by the last offline one at env step 0.

  The score fine-tuning starts from belongs on the curve: without it a dip
  at the first online evaluation has nothing to dip from.
  """
  records = loop.Learner.read_eval_log(run_dir)
  offline = [r for r in records if r.get('phase') == 'offline']
  online = [r for r in records if r.get('phase') == 'online']
  return [{**offline[-1], 'env_steps': 0}] * bool(offline) + online


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--runs', required=True,
                      help='Comma-separated run directories.')
  parser.add_argument('--dip_window', type=int, default=5000,
                      help='Env steps after the switch the dip looks at.')
  parser.add_argument('--curve', default='',
                      help='PNG to draw the runs\' curves into (none if '
                           'empty).')
  args = parser.parse_args()
  runs = args.runs.split(',')
  for run_dir in runs:
    print(json.dumps(summarize(run_dir, args.dip_window)))
  if args.curve:
    curves.plot_curves(
        {os.path.basename(r.rstrip('/')): switch_curve(r) for r in runs},
        args.curve, x='env_steps', title='offline-to-online from medium',
        x_label='env steps (fine-tuning)', y_label='average return')


if __name__ == '__main__':
  main()
