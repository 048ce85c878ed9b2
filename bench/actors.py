"""Actor scaling: env steps/s of 1, 2, ... `pipelines.act` processes.

One `pipelines.serve --env` process holds the episode and weights tables; this
script publishes the weights of a freshly made agent's actor (what a learner
publishes at its start), then runs K actor processes side by side, each for
`--steps_per_actor` env steps with those weights (no random warm-up), with
no learner reading: `--max_unread_episodes` is set high enough that the
balance never holds an actor back, so the figure is collection alone.
Each count runs once per `--policy_refresh_steps` value (how often each
actor fetches the newest weights from the weights table), so the cost of
fresher weights is measured beside the old default. Reference in the same
run: the first count at the first refresh interval. Prints one JSON line
(and appends it to `--out`): per (K, refresh interval) the total env steps/s
(all actors' steps over the acting time of the slowest) and the speed-up
over the reference.

  python bench/actors.py [--env HalfCheetah-v5] [--agent sac] [--actors 1,2,4]
                         [--steps_per_actor 20000]
                         [--policy_refresh_steps 1000,10]

On a machine with C cores, expect the speed-up to stop near C (each actor
process steps its envs and its numpy policy on one core).
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import signal
import socket
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 180


def free_port() -> int:
  with socket.socket() as probe:
    probe.bind(('localhost', 0))
    return probe.getsockname()[1]


def start_server(env: str, port: int, log: pathlib.Path) -> subprocess.Popen:
  server = subprocess.Popen(
      [sys.executable, '-m', 'pipelines.serve', '--env', env, '--port',
       str(port)], cwd=REPO, stdout=subprocess.PIPE,
      stderr=open(log, 'w'), text=True)
  deadline = time.monotonic() + START_TIMEOUT_S
  for line in server.stdout:
    if re.match(r'^serving table ', line):
      return server
    if time.monotonic() > deadline:
      break
  server.kill()
  raise RuntimeError(f'serve did not start; see {log}')


def publish_initial_weights(env: str, agent: str, address: str) -> None:
  """What a learner publishes at its start: its actor's initial weights."""
  # Imported here: the parent needs TensorFlow only for this.
  from rlds_reverb.storage import tables  # pylint: disable=g-import-not-at-top
  from rlds_reverb.acting import envs  # pylint: disable=g-import-not-at-top
  from rlds_reverb.agents import factory  # pylint: disable=g-import-not-at-top
  from rlds_reverb.agents import registry  # pylint: disable=g-import-not-at-top
  from rlds_reverb.experiments import run  # pylint: disable=g-import-not-at-top
  from rlds_reverb.replay import variables  # pylint: disable=g-import-not-at-top
  specs = envs.env_specs(env)
  made = registry.make_agent(agent, specs.time_step_spec, specs.action_spec,
                           factory.AgentConfig())
  policy = run.export_policy(made, agent, specs)
  variables.publish(tables.connect(address), policy, 0)


def run_actors(count: int, refresh: int, args: argparse.Namespace,
               address: str, work_dir: pathlib.Path) -> dict:
  procs = []
  start = time.monotonic()
  for i in range(count):
    procs.append(subprocess.Popen(
        [sys.executable, '-m', 'pipelines.act', '--reverb_address', address,
         '--env', args.env, '--agent', args.agent, '--run_dir',
         str(work_dir / f'k{count}_r{refresh}'), '--seed',
         str(100 * count + i), '--initial_random_steps', '0',
         '--max_env_steps', str(args.steps_per_actor),
         '--max_unread_episodes', '1000000', '--policy_refresh_steps',
         str(refresh), '--noprogress'], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, text=True))
  summaries = []
  try:
    for proc in procs:
      out, _ = proc.communicate(timeout=args.timeout_s)
      if proc.returncode != 0:
        raise RuntimeError(f'an actor exited {proc.returncode}')
      summaries.append(json.loads(out.strip().splitlines()[-1]))
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  wall = time.monotonic() - start
  steps = sum(s['env_steps'] for s in summaries)
  # Each actor's own acting time leaves out its TensorFlow import.
  acting_s = max(s['seconds'] for s in summaries)
  return {'actors': count, 'policy_refresh_steps': refresh,
          'env_steps': steps,
          'episodes_written': sum(s['episodes_written'] for s in summaries),
          'acting_seconds': round(acting_s, 2),
          'wall_seconds_with_startup': round(wall, 2),
          'env_steps_per_s': round(steps / acting_s, 1),
          'per_actor_env_steps_per_s': [s['env_steps_per_s']
                                        for s in summaries]}


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n')[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--env', default='HalfCheetah-v5',
                      help='gymnasium env the actors step')
  parser.add_argument('--agent', default='sac',
                      help="agent whose actor's weights the actors act with")
  parser.add_argument('--actors', default='1,2,4',
                      help='comma-separated actor counts; the first is the '
                      'reference')
  parser.add_argument('--steps_per_actor', type=int, default=20_000,
                      help='env steps each actor takes')
  parser.add_argument('--policy_refresh_steps', default='1000,10',
                      help='comma-separated refresh intervals (env steps '
                      'between weight fetches); the first is the reference')
  parser.add_argument('--timeout_s', type=float, default=600,
                      help='give up on an actor after this many seconds')
  parser.add_argument('--out', default=str(
      REPO / 'docs/results/distributed/bench_actors.jsonl'),
                      help='JSON lines file the result is appended to')
  args = parser.parse_args()
  counts = [int(c) for c in args.actors.split(',')]
  load_at_start = os.getloadavg()
  work_dir = pathlib.Path(os.environ.get('TMPDIR', '/tmp')) / (
      f'bench_actors_{os.getpid()}')
  work_dir.mkdir(parents=True, exist_ok=True)
  port = free_port()
  address = f'localhost:{port}'
  server = start_server(args.env, port, work_dir / 'serve.log')
  try:
    publish_initial_weights(args.env, args.agent, address)
    refreshes = [int(r) for r in args.policy_refresh_steps.split(',')]
    rows = [run_actors(count, refresh, args, address, work_dir)
            for refresh in refreshes for count in counts]
  finally:
    server.send_signal(signal.SIGTERM)
    try:
      server.wait(timeout=30)
    except subprocess.TimeoutExpired:
      server.kill()
  reference = rows[0]['env_steps_per_s']
  for row in rows:
    row['speedup_vs_first'] = round(row['env_steps_per_s'] / reference, 2)
  result = {
      'bench': 'actors', 'command': ' '.join(['bench/actors.py',
                                              *sys.argv[1:]]),
      'date': datetime.datetime.now(datetime.timezone.utc).isoformat(
          timespec='seconds'),
      'machine': {'cpu_count': os.cpu_count(), 'python':
                  platform.python_version(),
                  'loadavg_at_start': load_at_start},
      'env': args.env, 'agent': args.agent,
      'steps_per_actor': args.steps_per_actor, 'rows': rows}
  line = json.dumps(result)
  print(line, flush=True)
  pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  with open(args.out, 'a') as f:
    f.write(line + '\n')


if __name__ == '__main__':
  main()
