r"""PPO env steps/s: one process against a learner fed by actor processes.

Both arms train the same PPO run (default HalfCheetah-v5, the agent's
defaults: one env copy, rollouts of 2048 steps, 10 epochs x 32 minibatches)
for --rollouts rollouts, in this process, through `onpolicy.train_onpolicy`:

  single    num_actors 1: the learner collects each rollout itself, then
            updates (collection and learning take turns);
  actors_K  num_actors 0: a `pipelines.serve --env ENV --rollouts` process
            and K `pipelines.act --agent ppo` processes collect while the
            learner updates (collection overlaps learning).

Each figure is env steps/s from the end of the first update (graphs traced,
actors up) to the end of the last, read from the learner's own update
callback, so start-up and the final evaluation are left out. The reference
is `single`, in the same run. Prints one JSON line (and appends it to
--out).

  python bench/onpolicy_actors.py [--env HalfCheetah-v5] [--actors 2] \
      [--rollouts 12]

On 2 cores the server, the learner and two actors share the machine; the
most overlap can give is (collect + update) / max(collect, update) per
rollout.
"""

import argparse
import dataclasses
import datetime
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / 'bench'))

import actors as actor_bench  # pylint: disable=g-import-not-at-top,wrong-import-position


def start_rollout_server(env: str, port: int,
                         log: pathlib.Path) -> subprocess.Popen:
  server = subprocess.Popen(
      [sys.executable, '-m', 'pipelines.serve', '--env', env, '--rollouts',
       '--port', str(port)], cwd=REPO, stdout=subprocess.PIPE,
      stderr=open(log, 'w'), text=True)
  for line in server.stdout:
    if line.startswith('serving table '):
      return server
  server.kill()
  raise RuntimeError(f'serve did not start; see {log}')


def timed_run(config, onpolicy) -> dict:
  """Trains `config`; env steps/s between the first and the last update."""
  updates = []
  onpolicy.train_onpolicy(config, show_progress=False,
                          on_update=lambda record: updates.append(
                              (time.monotonic(), record['env_steps'])))
  (t0, steps0), (t1, steps1) = updates[0], updates[-1]
  return {'updates': len(updates), 'timed_env_steps': steps1 - steps0,
          'timed_seconds': round(t1 - t0, 2),
          'env_steps_per_s': round((steps1 - steps0) / (t1 - t0), 1)}


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--env', default='HalfCheetah-v5',
                      help='environment both arms train on')
  parser.add_argument('--agent', default='ppo', choices=('ppo', 'a2c'),
                      help='on-policy agent both arms train, with its '
                      'defaults')
  parser.add_argument('--actors', default='2',
                      help='comma-separated actor-process counts')
  parser.add_argument('--rollouts', type=int, default=12,
                      help='rollouts (updates) per arm')
  parser.add_argument('--seed', type=int, default=0,
                      help='seed of the learner runs (actor i of K gets '
                      '100 * K + i)')
  parser.add_argument('--out', default=str(
      REPO / 'docs/results/distributed/bench_onpolicy_actors.jsonl'),
                      help='JSON lines file the result is appended to')
  args = parser.parse_args()
  # Imported here: --help needs no TensorFlow.
  from rlds_reverb.experiments import configs  # pylint: disable=g-import-not-at-top
  from rlds_reverb.experiments import onpolicy  # pylint: disable=g-import-not-at-top

  load_at_start = os.getloadavg()
  work = pathlib.Path(tempfile.mkdtemp(prefix='bench_onpolicy_actors_'))
  base = configs.make(configs.OnPolicyConfig, args.agent,
                      {'env': args.env, 'seed': args.seed, 'root_dir': ''})
  steps = base.ppo_config.rollout_size * args.rollouts
  base = configs.make(configs.OnPolicyConfig, args.agent, {
      'env': args.env, 'seed': args.seed, 'env_steps': steps,
      'eval_interval': 10 * steps, 'checkpoint_interval': 10 * steps,
      'eval_episodes': 1, 'root_dir': ''})
  rows = {'single': timed_run(dataclasses.replace(
      base, root_dir=str(work / 'single')), onpolicy)}
  for count in [int(c) for c in args.actors.split(',')]:
    port = actor_bench.free_port()
    server = start_rollout_server(args.env, port, work / f'serve_{count}.log')
    procs = [subprocess.Popen(
        [sys.executable, '-m', 'pipelines.act', '--agent', args.agent,
         '--reverb_address', f'localhost:{port}', '--env', args.env,
         '--run_dir', str(work / f'actors_{count}'), '--seed',
         str(100 * count + i), '--noprogress'], cwd=REPO,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for i in range(count)]
    try:
      rows[f'actors_{count}'] = timed_run(dataclasses.replace(
          base, root_dir=str(work / f'learner_{count}'), num_actors=0,
          reverb_address=f'localhost:{port}'), onpolicy)
    finally:
      for proc in [*procs, server]:
        proc.send_signal(signal.SIGTERM)
      for proc in [*procs, server]:
        try:
          proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
          proc.kill()
  reference = rows['single']['env_steps_per_s']
  result = {
      'bench': 'onpolicy_actors',
      'command': ' '.join(['bench/onpolicy_actors.py', *sys.argv[1:]]),
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      'machine': {'cpu_count': os.cpu_count(),
                  'python': platform.python_version(),
                  'loadavg_at_start': load_at_start},
      'env': args.env, 'agent': args.agent, 'seed': args.seed,
      'rollout_size': base.ppo_config.rollout_size,
      'rows': rows,
      'speedup_vs_single': {name: round(row['env_steps_per_s'] / reference, 2)
                            for name, row in rows.items()}}
  line = json.dumps(result)
  print(line, flush=True)
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  with open(args.out, 'a') as f:
    f.write(line + '\n')


if __name__ == '__main__':
  main()
