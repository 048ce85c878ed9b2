r"""Summarises on-policy runs from their eval logs: one JSON line.

  python -m tools.onpolicy_table --runs runs/onpolicy/ppo_halfcheetah_seed{0,1,2} \
      --env HalfCheetah-v5 --env_steps 1000000 \
      [--compare runs/onpolicy/ppo_halfcheetah_noproper_seed0 --compare_key noproper_time_limits_return] \
      [--target 475] [--out docs/results/ppo_halfcheetah_v5.json] \
      [--rows_file docs/results/atari.json --agent ppo]

Per run: its seed (from config.json), the mean return of its last
evaluation at or before --env_steps (`final_returns`), and with --target
the first env step whose evaluation reached it (`steps_to_target`, None if
never). --rows_file keeps a table of such rows, {"rows": [{agent, env,
env_steps, seeds, final_returns, mean, ...}]} (issue 46's
docs/results/atari.json): the row of --agent and --env is added, or
replaces the one already there.
"""

import argparse
import json
import os
import statistics
import sys
from typing import Optional, Sequence


def read_run(run_dir: str) -> tuple[dict, list[dict]]:
  with open(os.path.join(run_dir, 'config.json')) as f:
    config = json.load(f)
  with open(os.path.join(run_dir, 'eval.jsonl')) as f:
    records = [json.loads(line) for line in f if line.strip()]
  if not records:
    raise ValueError(f'{run_dir} has no evaluation records')
  return config, records


def summarize(run_dirs: Sequence[str], env: str, env_steps: int,
              target: Optional[float] = None) -> dict:
  """The line of `run_dirs`: seeds, final returns, their mean and std."""
  seeds, finals, reached = [], [], []
  for run_dir in run_dirs:
    config, records = read_run(run_dir)
    records = [r for r in records if r['env_steps'] <= env_steps]
    if not records:
      raise ValueError(f'{run_dir} has no evaluation at or before '
                       f'{env_steps} env steps')
    seeds.append(config['seed'])
    finals.append(round(records[-1]['average_return'], 1))
    if target is not None:
      hits = [r['env_steps'] for r in records
              if r['average_return'] >= target]
      reached.append(hits[0] if hits else None)
  line = {'env': env, 'env_steps': env_steps, 'seeds': seeds,
          'final_returns': finals,
          'mean_return': round(statistics.mean(finals), 1),
          'std_return': round(statistics.pstdev(finals), 1)}
  if target is not None:
    line['target'] = target
    line['steps_to_target'] = reached
  return line


def upsert_row(rows_file: str, agent: str, line: dict) -> dict:
  """Adds `line` as the row of (agent, env) of `rows_file`, replacing
  the row already there; returns the table written."""
  table = {'rows': []}
  if os.path.exists(rows_file):
    with open(rows_file) as f:
      table = json.load(f)
  row = {'agent': agent, 'env': line['env'], 'env_steps': line['env_steps'],
         'seeds': line['seeds'], 'final_returns': line['final_returns'],
         'mean': line['mean_return'],
         **{key: line[key] for key in ('target', 'steps_to_target')
            if key in line}}
  table['rows'] = [r for r in table['rows']
                   if (r['agent'], r['env']) != (agent, line['env'])]
  table['rows'].append(row)
  os.makedirs(os.path.dirname(os.path.abspath(rows_file)), exist_ok=True)
  with open(rows_file, 'w') as f:
    json.dump(table, f, indent=1)
    f.write('\n')
  return table


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--runs', nargs='+', required=True,
                      help='run directories, each with config.json and '
                           'eval.jsonl, one per seed')
  parser.add_argument('--env', required=True,
                      help='the environment name written in the line')
  parser.add_argument('--env_steps', type=int, required=True,
                      help='env steps: each run\'s final return is that of '
                           'its last evaluation at or before this step')
  parser.add_argument('--target', type=float, default=None,
                      help='a return to reach: per run, the first env step '
                           'whose evaluation reached it (steps_to_target); '
                           'unset: not reported')
  parser.add_argument('--compare', default=None,
                      help='one more run whose final return is reported')
  parser.add_argument('--compare_key', default='compare_return',
                      help='the key of the --compare run\'s return in the '
                           'line')
  parser.add_argument('--out', default=None,
                      help='a file the JSON line is also written to')
  parser.add_argument('--rows_file', default=None,
                      help='a {"rows": [...]} table the line joins as the '
                           'row of --agent and --env')
  parser.add_argument('--agent', default=None,
                      help='the agent of the --rows_file row')
  args = parser.parse_args()
  if args.rows_file and not args.agent:
    parser.error('--rows_file needs --agent')
  line = summarize(args.runs, args.env, args.env_steps, args.target)
  if args.compare:
    _, records = read_run(args.compare)
    line[args.compare_key] = round(records[-1]['average_return'], 1)
  text = json.dumps(line)
  print(text)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'w') as f:
      f.write(text + '\n')
  if args.rows_file:
    upsert_row(args.rows_file, args.agent, line)


if __name__ == '__main__':
  sys.exit(main())
