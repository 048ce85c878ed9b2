"""Collects bench/offline.py's JSON lines into docs/results/offline.json.

One JSON line out: {"rows": [{agent, dataset, gradient_steps, seeds,
scores, mean, std, corl}, ...], "behaviour_returns": {dataset kind:
{"return", "normalized_score", "d4rl_return"}}}. Lines of the same
(agent, dataset kind, gradient steps) are one row: seeds run later (a
`--seeds 1,2` run beside an earlier seed 0) join it, and a later score of
the same seed replaces the earlier one; mean and std (population, as
bench/offline.py) are over the row's seeds. Runs with bfloat16 critics (`critic_dtype`) are rows of
their own, marked with that field.

  python bench/offline_summary.py images/results/offline_rl/*.jsonl \
      > docs/results/offline.json
"""

import json
import sys

import numpy as np

# D4RL's halfcheetah-medium-v2 behaviour return (the level the medium
# policy was chosen for); the other files' figures were not at hand offline
# and are left out rather than guessed.
D4RL_BEHAVIOUR = {'medium': 4770.0}


def summarize(paths: list[str]) -> dict:
  rows, scores, behaviour = {}, {}, {}
  for path in paths:
    with open(path) as f:
      for line in f:
        if not line.startswith('{'):
          continue
        record = json.loads(line)
        if 'normalized_scores' not in record:
          continue
        kind = record.get('dataset_kind', 'medium')
        dtype = record.get('critic_dtype', 'float32')
        key = (record['agent'], kind, record['steps'], dtype)
        rows[key] = {
            'agent': record['agent'], 'dataset': kind, 'critic_dtype': dtype,
            'path': record['dataset'], 'gradient_steps': record['steps'],
            'corl': record.get('corl'), 'date': record['date']}
        scores.setdefault(key, {}).update(
            zip(record['seeds'], record['normalized_scores']))
        behaviour[kind] = {
            'return': record['behaviour_return'],
            'normalized_score': record['behaviour_normalized_score'],
            'd4rl_return': D4RL_BEHAVIOUR.get(kind)}
  merged = []
  for key, row in rows.items():
    by_seed = dict(sorted(scores[key].items()))
    values = list(by_seed.values())
    merged.append({
        **{k: row[k] for k in ('agent', 'dataset', 'path', 'gradient_steps')},
        'seeds': list(by_seed), 'scores': values,
        'mean': round(float(np.mean(values)), 2),
        'std': round(float(np.std(values)), 2),
        'corl': row['corl'], 'date': row['date'],
        **({} if row['critic_dtype'] == 'float32'
           else {'critic_dtype': row['critic_dtype']})})
  return {'rows': merged, 'behaviour_returns': behaviour}


def main(paths: list[str]) -> None:
  print(json.dumps(summarize(paths)))


if __name__ == '__main__':
  main(sys.argv[1:])
