"""EDAC's slow start beside its critics' agreement, read from finished runs.

EDAC's diversity term (`sac_n.diversity_loss`) is eta / (N - 1) times the
batch mean of sum_{i != j} <u_i, u_j>, the cosines between the N critics'
action gradients at the data action. Divided by eta * N it is the mean
pairwise cosine: near 0 when the critics disagree about which way Q rises
away from the data (the pessimism EDAC relies on), 1 when they all agree
(then their minimum is no more cautious than one critic). This reads what
`pipelines.train` already wrote (TensorBoard summaries and eval.jsonl) and
sets each evaluation's score beside the mean cosine, temperature and
Q(s, pi(s)) logged over the gradient steps since the one before, so a
start that tracks the critics' agreement shows without training again.

Prints ONE JSON line: per run, per evaluation, those figures, and the rank
correlation of score against cosine; no reference library logs this, so
the reference is the runs themselves. `--out` also draws the two curves.

  python bench/edac_diversity.py \
      --run_dirs runs/offline_rl/medium_1m_edac_bf16/edac_seed0 \
      --out images/results/offline_rl/edac_diversity.png
"""

import argparse
import glob
import json
import os
import platform
import time

import numpy as np
import tensorflow as tf

from rlds_reverb.learners import loop
from rlds_reverb.learners import sac_n

_SUMMARIES = {'diversity': 'while/diversity_loss', 'alpha': 'while/alpha',
              'actor_loss': 'while/actor_loss'}


def read_scalars(run_dir: str) -> dict[str, dict[int, float]]:
  """Every scalar of the run's TensorBoard files: tag -> {step: value}; a
  step logged twice (a resumed run) keeps its last value."""
  scalars: dict[str, dict[int, float]] = {}
  for path in sorted(glob.glob(os.path.join(run_dir, loop.TENSORBOARD_DIR, '*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        number = (float(tf.make_ndarray(value.tensor))
                  if value.HasField('tensor') else float(value.simple_value))
        scalars.setdefault(value.tag, {})[event.step] = number
  return scalars


def rank_correlation(a: list[float], b: list[float]) -> float:
  """Spearman's rho (no ties expected in these real-valued series)."""
  ranks = [np.argsort(np.argsort(x)).astype(float) for x in (a, b)]
  return float(np.corrcoef(*ranks)[0, 1])


def probe(run_dir: str) -> dict:
  """The run's evaluations with the summaries averaged since the last one.

  Raises:
    ValueError: the run is not EDAC, or has no evaluations or summaries.
  """
  with open(os.path.join(run_dir, 'config.json')) as f:
    config = json.load(f)
  if config.get('agent') != 'edac':
    raise ValueError(f'{run_dir}: not an EDAC run (agent '
                     f'{config.get("agent")!r})')
  settings = config.get('method_settings') or {}
  # Unset, they are what make_edac resolves them to.
  eta = settings.get('eta') or sac_n.EDAC_ETA
  num_critics = settings.get('num_critics') or sac_n.SacNConfig.num_critics
  evaluations = loop.Learner.read_eval_log(run_dir)
  scalars = read_scalars(run_dir)
  missing = [t for t in _SUMMARIES.values() if t not in scalars]
  if not evaluations or missing:
    raise ValueError(f'{run_dir}: {len(evaluations)} evaluations, '
                     f'summaries missing: {missing}')
  rows, previous = [], 0
  for record in evaluations:
    step = record['train_step']
    window = {name: [v for s, v in scalars[tag].items() if previous < s <= step]
              for name, tag in _SUMMARIES.items()}
    previous = step
    if not window['diversity']:
      continue
    mean = {name: float(np.mean(v)) for name, v in window.items()}
    rows.append({
        'train_step': step,
        'normalized_score': round(record['normalized_score'], 2),
        'mean_gradient_cosine': round(
            mean['diversity'] / (eta * num_critics), 3),
        'alpha': round(mean['alpha'], 3),
        # -actor loss = min_i Q_i(s, a) - alpha log pi(a|s), a ~ pi(s).
        'policy_value': round(-mean['actor_loss'], 1),
        'summaries': len(window['diversity'])})
  return {'run_dir': run_dir, 'eta': eta, 'num_critics': num_critics,
          'critic_dtype': config.get('agent_config', {}).get('critic_dtype'),
          'evaluations': rows,
          'score_vs_cosine_rank_correlation': round(rank_correlation(
              [r['normalized_score'] for r in rows],
              [r['mean_gradient_cosine'] for r in rows]), 3)}


def draw(runs: list[dict], labels: list[str], path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use('Agg')
  from matplotlib import pyplot  # pylint: disable=g-import-not-at-top
  figure, (top, bottom) = pyplot.subplots(2, 1, sharex=True, figsize=(8, 6))
  for label, result in zip(labels, runs):
    steps = [r['train_step'] for r in result['evaluations']]
    top.plot(steps, [r['normalized_score'] for r in result['evaluations']],
             marker='.', label=label)
    bottom.plot(steps, [r['mean_gradient_cosine']
                        for r in result['evaluations']], marker='.',
                label=label)
  top.set_ylabel('normalised score (greedy)')
  bottom.set_ylabel("mean cosine of the critics'\naction gradients")
  bottom.set_xlabel('gradient steps')
  top.legend()
  for axes in (top, bottom):
    axes.grid(alpha=0.3)
  figure.tight_layout()
  figure.savefig(path, dpi=100)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--run_dirs', required=True,
                      help='Comma-separated EDAC run directories of '
                      'pipelines.train or bench/offline.py.')
  parser.add_argument('--labels', default=None,
                      help='Comma-separated legend names (default: dirs).')
  parser.add_argument('--out', default=None, help='PNG of both curves.')
  args = parser.parse_args()
  run_dirs = args.run_dirs.split(',')
  labels = args.labels.split(',') if args.labels else run_dirs
  if len(labels) != len(run_dirs):
    parser.error(f'--labels has {len(labels)} names for {len(run_dirs)} '
                 'run dirs')
  try:
    runs = [probe(d) for d in run_dirs]
  except (OSError, ValueError) as error:
    parser.error(str(error))
  if args.out:
    draw(runs, labels, args.out)
  print(json.dumps({
      'probe': 'edac_diversity', 'runs': runs,
      'reference': 'the runs themselves (no library logs this)',
      'machine': f'{os.cpu_count()} cores, {platform.machine()}, no GPU',
      'date': time.strftime('%Y-%m-%d')}), flush=True)


if __name__ == '__main__':
  main()
