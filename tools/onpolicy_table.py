r"""Summarises on-policy runs from their eval logs: one JSON line.

  python -m tools.onpolicy_table --runs runs/onpolicy/ppo_halfcheetah_seed{0,1,2} \
      --env HalfCheetah-v5 --env_steps 1000000 \
      [--compare runs/onpolicy/ppo_halfcheetah_noproper_seed0 --compare_key noproper_time_limits_return] \
      [--target 475] [--out docs/results/ppo_halfcheetah_v5.json]

Per run: its seed (from config.json), the final evaluation's mean return
(`final_returns`), and with --target the first env step whose evaluation
reached it (`steps_to_target`, None if never).
"""

import argparse
import json
import os
import statistics
import sys


def read_run(run_dir: str) -> tuple[dict, list[dict]]:
  with open(os.path.join(run_dir, 'config.json')) as f:
    config = json.load(f)
  with open(os.path.join(run_dir, 'eval.jsonl')) as f:
    records = [json.loads(line) for line in f if line.strip()]
  if not records:
    raise ValueError(f'{run_dir} has no evaluation records')
  return config, records


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--runs', nargs='+', required=True)
  parser.add_argument('--env', required=True)
  parser.add_argument('--env_steps', type=int, required=True)
  parser.add_argument('--target', type=float, default=None)
  parser.add_argument('--compare', default=None,
                      help='one more run whose final return is reported')
  parser.add_argument('--compare_key', default='compare_return')
  parser.add_argument('--out', default=None)
  args = parser.parse_args()
  seeds, finals, reached = [], [], []
  for run_dir in args.runs:
    config, records = read_run(run_dir)
    seeds.append(config['seed'])
    finals.append(round(records[-1]['average_return'], 1))
    if args.target is not None:
      hits = [r['env_steps'] for r in records
              if r['average_return'] >= args.target]
      reached.append(hits[0] if hits else None)
  line = {'env': args.env, 'env_steps': args.env_steps, 'seeds': seeds,
          'final_returns': finals,
          'mean_return': round(statistics.mean(finals), 1),
          'std_return': round(statistics.pstdev(finals), 1)}
  if args.target is not None:
    line['target'] = args.target
    line['steps_to_target'] = reached
  if args.compare:
    _, records = read_run(args.compare)
    line[args.compare_key] = round(records[-1]['average_return'], 1)
  text = json.dumps(line)
  print(text)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
      f.write(text + '\n')


if __name__ == '__main__':
  sys.exit(main())
