"""CQL-SAC through TF-Agents' Learner against the toolkit's CQL-SAC row.

Reads the evaluations run_cql_sac_learner.sh wrote (one JSON line per
evaluation and seed) and the toolkit's row of docs/results/offline.json
(cql_sac, medium, 30k gradient steps); writes cql_sac_learner.json beside
this file and prints it. The score of a run is its last evaluation's D4RL
normalised score (10 episodes), as the toolkit's row takes it.

  python docs/results/tf_agents/summarize_cql_sac_learner.py
"""

import glob
import json
import os
import re
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
BUDGET = 30_000


def _runs() -> dict[int, dict]:
  runs = {}
  for path in sorted(glob.glob(os.path.join(HERE,
                                            'cql_sac_learner_seed*.jsonl'))):
    seed = int(re.search(r'seed(\d+)', path).group(1))
    with open(path) as f:
      records = [json.loads(line) for line in f if line.startswith('{')]
    # Greedy evaluations only (the toolkit's row evaluates greedily).
    final = [r for r in records if r['train_step'] == BUDGET and
             r.get('policy') == 'greedy']
    if final:
      runs[seed] = final[-1]
  return runs


def _toolkit_row() -> dict:
  with open(os.path.join(REPOSITORY, 'docs/results/offline.json')) as f:
    rows = json.load(f)['rows']
  return next(r for r in rows if r['agent'] == 'cql_sac' and
              r['dataset'] == 'medium' and r['gradient_steps'] == BUDGET)


def main() -> None:
  runs = _runs()
  toolkit = _toolkit_row()
  seeds = sorted(runs)
  scores = [round(runs[s]['normalized_score'], 2) for s in seeds]
  result = {
      'agent': 'cql_sac', 'dataset': 'medium',
      'path': 'data/halfcheetah_v5_medium', 'gradient_steps': BUDGET,
      'trainer': 'tf_agents.train.Learner (examples/cql_sac_offline.py, '
                 'MemoryReplayBuffer.as_draws)',
      'seeds': seeds, 'scores': scores,
      'returns': [round(runs[s]['AverageReturn'], 1) for s in seeds],
      'mean': round(statistics.mean(scores), 2) if scores else None,
      'std': round(statistics.pstdev(scores), 2) if scores else None,
      'toolkit': {k: toolkit[k] for k in ('seeds', 'scores', 'mean', 'std',
                                          'date')},
      'corl': toolkit['corl'],
      'command': 'bash docs/results/tf_agents/run_cql_sac_learner.sh',
      'machine': '2 cores, x86_64, no GPU',
      'date': time.strftime('%Y-%m-%d', time.gmtime(max(
          [os.path.getmtime(p) for p in glob.glob(os.path.join(
              HERE, 'cql_sac_learner_seed*.jsonl'))] or [time.time()]))),
  }
  if scores:
    # Within noise: the difference of the means is within two standard
    # errors of it, from both sides' per-seed spreads.
    a, b = scores, toolkit['scores']
    se = (statistics.pvariance(a) / len(a) +
          statistics.pvariance(b) / len(b)) ** 0.5
    result['difference'] = round(result['mean'] - toolkit['mean'], 2)
    result['two_standard_errors'] = round(2 * se, 2)
    result['within_noise'] = abs(result['difference']) <= 2 * se
  with open(os.path.join(HERE, 'cql_sac_learner.json'), 'w') as f:
    json.dump(result, f, indent=1)
    f.write('\n')
  print(json.dumps(result))


if __name__ == '__main__':
  main()
