"""Prioritized replay speed: sample-and-update loops against uniform sampling.

Data: `--transitions` halfcheetah-shaped RLDS steps (observation (17,),
action (6,) float32), pushed with `push_rlds_to_table(sequence_length=2)`
into two tables of one in-process Reverb server: 'prioritized'
(`per.make_table`, alpha 0.6) and 'uniform' (the same items).

Figures are transitions/s (one transition = one 2-step item) of batches of
`--batch_size`, each loop running `--batches_per_call` batches per
`tf.function` call, as the learner does:
  uniform                  sampling.transition_dataset on 'uniform'
  prioritized              per.dataset on 'prioritized' (with SampleInfo)
  prioritized_updates      the same, plus one update_priorities call per
                           batch with new priorities (|reward| + eps) and the
                           importance weights computed: PER's whole overhead
  prioritized_updates_N_readers   the same with num_parallel_readers=N
Each figure is the median of --rounds timed runs of --seconds; the loops
take turns within a round, so other load on the machine falls on all alike.

Reference, same run: cpprb's in-process PrioritizedReplayBuffer (sum tree
in C++, numpy in and out) doing the same sample(256) + update_priorities
loop, when --cpprb_python names an interpreter that has cpprb installed (it
is not a dependency of this project). Target: prioritized_updates >= 100k
transitions/s.

  python bench/per.py [--transitions 100000] [--batch_size 256]
                      [--cpprb_python /tmp/cpprb_venv/bin/python]
"""

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import reverb  # pylint: disable=g-import-not-at-top
import tensorflow as tf

import rlds_reverb
from rlds_reverb.replay import per
from rlds_reverb.replay import sampling
from rlds_reverb.storage import tables

from halfcheetah_data import make_rlds  # pylint: disable=g-bad-import-order

TARGET = 100_000

# Runs in the cpprb interpreter: same shapes, same batch, same loop.
_CPPRB_SCRIPT = r'''
import json, sys, time
import numpy as np
from cpprb import PrioritizedReplayBuffer
size, batch, seconds, rounds = (int(sys.argv[1]), int(sys.argv[2]),
                                float(sys.argv[3]), int(sys.argv[4]))
rng = np.random.default_rng(0)
rb = PrioritizedReplayBuffer(size, {"obs": {"shape": 17}, "act": {"shape": 6},
                                    "rew": {}, "next_obs": {"shape": 17},
                                    "done": {}}, alpha=0.6)
rb.add(obs=rng.standard_normal((size, 17)), act=rng.uniform(-1, 1, (size, 6)),
       rew=rng.standard_normal(size), next_obs=rng.standard_normal((size, 17)),
       done=np.zeros(size))
rates = []
for _ in range(rounds):
  n, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    sample = rb.sample(batch, beta=0.4)
    rb.update_priorities(sample["indexes"], np.abs(sample["rew"][:, 0]) + 1e-6)
    n += 1
  rates.append(n * batch / (time.perf_counter() - start))
print(json.dumps(sorted(rates)[len(rates) // 2]))
'''


def _loop(dataset: tf.data.Dataset, batches_per_call: int, updater=None,
          with_info: bool = False):
  """A tf.function taking `batches_per_call` batches (and updating them)."""
  iterator = iter(dataset)

  @tf.function
  def run():
    total = tf.constant(0.0)
    for _ in tf.range(batches_per_call):
      element = next(iterator)
      if updater is None:
        experience = element[0] if with_info else element
        total += tf.reduce_sum(experience.reward[:, 0])
      else:
        experience, info = element
        weights = per.importance_weights(info.probability, info.table_size,
                                         0.4)
        priorities = per.priorities_from_td_errors(
            experience.reward[:, 0], per.DEFAULT_EPS, per.DEFAULT_PRIORITY_CAP)
        updater.update(info.key, priorities)
        total += tf.reduce_sum(weights)
    return total

  return run


def _cpprb(python: str, size: int, batch: int, seconds: float,
           rounds: int) -> float | None:
  if not python:
    return None
  proc = subprocess.run([python, '-c', _CPPRB_SCRIPT, str(size), str(batch),
                         str(seconds), str(rounds)], capture_output=True,
                        text=True, check=False, timeout=600)
  if proc.returncode:
    raise SystemExit(f'cpprb reference failed: {proc.stderr[-2000:]}')
  return float(proc.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--transitions', type=int, default=100_000,
                      help='RLDS steps pushed (rounded up to whole episodes).')
  parser.add_argument('--steps', type=int, default=1000,
                      help='RLDS steps per episode.')
  parser.add_argument('--batch_size', type=int, default=256,
                      help='Transitions per sampled batch (also for cpprb).')
  parser.add_argument('--readers', type=int, default=2,
                      help='num_parallel_readers of the _N_readers figure.')
  parser.add_argument('--batches_per_call', type=int, default=20,
                      help='Batches per tf.function call, as the learner.')
  parser.add_argument('--rounds', type=int, default=5,
                      help='Timed runs of each loop; the median is kept.')
  parser.add_argument('--seconds', type=float, default=2.0,
                      help='Length of one timed run.')
  parser.add_argument('--cpprb_python', default='',
                      help='Interpreter with cpprb installed, for the '
                           'reference figure (skipped when empty).')
  args = parser.parse_args()
  for flag in ('transitions', 'steps', 'batch_size', 'readers', 'rounds',
               'batches_per_call'):
    if getattr(args, flag) < 1:
      parser.error(f'--{flag} must be >= 1, got {getattr(args, flag)}')
  if args.steps < 2 or not args.seconds > 0:
    parser.error('--steps must be >= 2 and --seconds > 0')
  batch = args.batch_size

  episodes = math.ceil(args.transitions / args.steps)
  data = make_rlds(episodes, args.steps)
  spec = rlds_reverb.create_trajectory_data_spec(data)
  size = episodes * args.steps
  server = tables.start_server([
      per.make_table('prioritized', spec, max_size=size),
      tables.make_table('uniform', spec, max_size=size)])
  address = f'localhost:{server.port}'
  client = reverb.Client(address)
  for table in ('prioritized', 'uniform'):
    rlds_reverb.push_rlds_to_table(data, client, table, sequence_length=2,
                                   num_workers=2)
  table_size = client.server_info()['prioritized'].current_size
  updater = per.PriorityUpdater(address, 'prioritized')

  def make(name):
    if name == 'uniform':
      return _loop(sampling.transition_dataset(address, 'uniform', spec,
                                               batch), args.batches_per_call)
    readers = args.readers if name.endswith('readers') else 1
    dataset = per.dataset(address, 'prioritized', spec, batch,
                          num_parallel_readers=readers)
    return _loop(dataset, args.batches_per_call,
                 updater if 'updates' in name else None, with_info=True)

  names = ['uniform', 'prioritized', 'prioritized_updates',
           f'prioritized_updates_{args.readers}_readers']
  rates = {name: [] for name in names}
  for _ in range(args.rounds):
    for name in names:
      run = make(name)
      run()  # Traces, starts the samplers, fills the buffers.
      calls, start = 0, time.perf_counter()
      while time.perf_counter() - start < args.seconds:
        run()
        calls += 1
      wall = time.perf_counter() - start
      rates[name].append(calls * args.batches_per_call * batch / wall)
      del run
  load = os.getloadavg()
  # Priorities really changed: the prioritized table no longer samples 1.0.
  updated = {float(s.info.priority) for s in client.sample(
      'prioritized', num_samples=20, emit_timesteps=False)} != {1.0}
  server.stop()
  cpprb = _cpprb(args.cpprb_python, size, batch, args.seconds, args.rounds)

  median = {name: statistics.median(r) for name, r in rates.items()}
  with_updates = median['prioritized_updates']
  result = {
      'bench': 'per',
      'table_items': table_size,
      'batch_size': batch,
      'batches_per_call': args.batches_per_call,
      'rounds': args.rounds,
      'seconds_per_round': args.seconds,
      'transitions_per_s': {k: round(v) for k, v in median.items()},
      'transitions_per_s_rounds': {k: [round(x) for x in v]
                                   for k, v in rates.items()},
      'per_cost_vs_uniform': round(median['uniform'] / with_updates, 2),
      'priorities_updated': updated,
      'target_per_s': TARGET,
      'target_met': with_updates >= TARGET,
      'best_with_updates': round(max(
          with_updates, median[f'prioritized_updates_{args.readers}_readers'])),
      'cpprb_transitions_per_s': round(cpprb) if cpprb else None,
      'cpprb_over_ours': round(cpprb / with_updates, 1) if cpprb else None,
      'load_average_1m': round(load[0], 2),
      'machine': f'{platform.machine()} {os.cpu_count()} cores',
  }
  print(json.dumps(result))


if __name__ == '__main__':
  main()
