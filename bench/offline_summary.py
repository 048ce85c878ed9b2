"""Collects bench/offline.py's JSON lines into docs/results/offline.json.

One JSON line out: {"rows": [{agent, dataset, gradient_steps, seeds,
scores, mean, std, corl}, ...], "behaviour_returns": {dataset kind:
{"return", "normalized_score", "d4rl_return"}}}. A later line for the same
(agent, dataset kind, gradient steps) replaces an earlier one.

  python bench/offline_summary.py images/results/offline_rl/*.jsonl \
      > docs/results/offline.json
"""

import json
import sys

# D4RL's halfcheetah-medium-v2 behaviour return (the level the medium
# policy was chosen for); the other files' figures were not at hand offline
# and are left out rather than guessed.
D4RL_BEHAVIOUR = {'medium': 4770.0}


def main(paths: list[str]) -> None:
  rows, behaviour = {}, {}
  for path in paths:
    with open(path) as f:
      for line in f:
        if not line.startswith('{'):
          continue
        record = json.loads(line)
        if 'normalized_scores' not in record:
          continue
        kind = record.get('dataset_kind', 'medium')
        key = (record['agent'], kind, record['steps'])
        rows[key] = {
            'agent': record['agent'], 'dataset': kind,
            'path': record['dataset'], 'gradient_steps': record['steps'],
            'seeds': record['seeds'], 'scores': record['normalized_scores'],
            'mean': record['normalized_score_mean'],
            'std': record['normalized_score_std'], 'corl': record.get('corl'),
            'date': record['date']}
        behaviour[kind] = {
            'return': record['behaviour_return'],
            'normalized_score': record['behaviour_normalized_score'],
            'd4rl_return': D4RL_BEHAVIOUR.get(kind)}
  print(json.dumps({'rows': list(rows.values()),
                    'behaviour_returns': behaviour}))


if __name__ == '__main__':
  main(sys.argv[1:])
