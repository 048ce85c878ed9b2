"""Sampling speed: rlds_reverb.replay.sampling against TF-Agents, same table, same run.

Data: `--transitions` RLDS steps of halfcheetah-shaped data (observation
(17,), action (6,) float32) in random episodes of `--steps` steps, pushed with
`push_rlds_to_table(sequence_length=2)` into one uniform table of an
in-process Reverb server (99,900 window items for the default 100k steps).

Prints one JSON line. Figures are transitions/s (one transition = one
2-step item) of batches of `--batch_size`, read from the same table:
  tfa_replay_buffer   TF-Agents ReverbReplayBuffer.as_dataset(
                      sample_batch_size=B, num_steps=2)
  reverb_raw          reverb.TrajectoryDataset.from_table_signature + batch(B)
                      (samples still carry Reverb's SampleInfo)
  ours                sampling.transition_dataset(..., B), defaults (one
                      reader)
  ours_N_readers      the same with num_parallel_readers=--readers
Each figure is the median of --rounds timed runs of --seconds each; the
methods take turns within a round, so noise from the rest of the machine
(other jobs on its cores) falls on all of them alike. Each run gets a fresh
iterator, warmed up with --warmup_batches untimed batches, and only that one
is alive: an idle pipeline refilling its buffers would take CPU from the
timed one. `cpu_us_per_transition` is the process CPU time per
transition (all threads), which other jobs on the machine disturb less than
the rates do; `cpu_saving_ours_vs_tfa` is TF-Agents' figure over ours.
Target: ours >= 3x tfa_replay_buffer in transitions/s (aim: 100k/s).

  python bench/sample.py [--transitions 100000] [--batch_size 256]
                         [--readers 2] [--rounds 5] [--seconds 1.5]
                         [--chunk_length N]
"""

import argparse
import json
import math
import os
import platform
import statistics
import time
from typing import Dict, List

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import reverb  # pylint: disable=g-import-not-at-top
import tensorflow as tf
from tf_agents.replay_buffers import reverb_replay_buffer

import rlds_reverb
from rlds_reverb.replay import sampling
from rlds_reverb.storage import tables
from rlds_reverb.storage import writers

from halfcheetah_data import make_rlds  # pylint: disable=g-bad-import-order
from halfcheetah_data import OBS_DIM  # pylint: disable=g-bad-import-order
TABLE = 'transitions'


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--transitions', type=int, default=100_000,
                      help='RLDS steps pushed (rounded up to whole episodes).')
  parser.add_argument('--steps', type=int, default=1000,
                      help='RLDS steps per episode.')
  parser.add_argument('--batch_size', type=int, default=256,
                      help='Transitions per sampled batch, for every method.')
  parser.add_argument('--readers', type=int, default=2,
                      help='num_parallel_readers of the ours_N_readers '
                           'figure.')
  parser.add_argument('--rounds', type=int, default=5,
                      help='Timed runs of each method; the median is kept.')
  parser.add_argument('--seconds', type=float, default=1.5,
                      help='Length of one timed run.')
  parser.add_argument('--warmup_batches', type=int, default=10,
                      help='Batches taken untimed from each fresh iterator '
                           '(starting its samplers, filling its buffers).')
  # The window writer's chunk length is a module constant; the flag swaps it
  # for this run only, to see what the per-sample decompression costs.
  default_chunk = writers._CHUNK_LENGTH  # pylint: disable=protected-access
  parser.add_argument('--chunk_length', type=int, default=default_chunk,
                      help='Steps per chunk of the window writer; each '
                           'sample decompresses the chunks it spans.')
  args = parser.parse_args()
  for flag in ('transitions', 'steps', 'batch_size', 'readers', 'rounds',
               'warmup_batches', 'chunk_length'):
    if getattr(args, flag) < 1:
      parser.error(f'--{flag} must be >= 1, got {getattr(args, flag)}')
  if args.steps < 2:
    parser.error(f'--steps must be >= 2 (a window needs two), got {args.steps}')
  if not args.seconds > 0:
    parser.error(f'--seconds must be > 0, got {args.seconds}')
  writers._CHUNK_LENGTH = args.chunk_length  # pylint: disable=protected-access
  batch = args.batch_size

  episodes = math.ceil(args.transitions / args.steps)
  data = make_rlds(episodes, args.steps)
  spec = rlds_reverb.create_trajectory_data_spec(data)
  server = tables.start_server([tables.make_table(
      TABLE, spec, max_size=episodes * args.steps)])
  address = f'localhost:{server.port}'
  client = reverb.Client(address)
  start = time.perf_counter()
  rlds_reverb.push_rlds_to_table(data, client, TABLE, sequence_length=2,
                                 num_workers=2)
  push_seconds = time.perf_counter() - start
  table_size = client.server_info()[TABLE].current_size

  replay_buffer = reverb_replay_buffer.ReverbReplayBuffer(
      spec, TABLE, sequence_length=2, local_server=server)
  datasets: Dict[str, tf.data.Dataset] = {
      'tfa_replay_buffer': replay_buffer.as_dataset(
          sample_batch_size=batch, num_steps=2),
      'reverb_raw': reverb.TrajectoryDataset.from_table_signature(
          address, TABLE, max_in_flight_samples_per_worker=2 * batch
      ).batch(batch),
      'ours': sampling.transition_dataset(address, TABLE, spec, batch),
      f'ours_{args.readers}_readers': sampling.transition_dataset(
          address, TABLE, spec, batch, num_parallel_readers=args.readers),
  }

  def observation(element) -> tf.Tensor:
    if isinstance(element, reverb.ReplaySample):
      element = element.data
    elif not hasattr(element, 'observation'):  # (Trajectory, SampleInfo)
      element = element[0]
    return element.observation

  rates: Dict[str, List[float]] = {name: [] for name in datasets}
  cpu_us: Dict[str, List[float]] = {name: [] for name in datasets}
  shapes_ok = True
  for _ in range(args.rounds):
    for name, dataset in datasets.items():
      # A fresh iterator per run, and only one alive at a time: an idle
      # pipeline refilling its buffers would take CPU from the one timed.
      iterator = iter(dataset)
      for _ in range(args.warmup_batches):
        element = next(iterator)
      shapes_ok &= observation(element).shape.as_list() == [batch, 2, OBS_DIM]
      batches = 0
      wall, cpu = time.perf_counter(), time.process_time()
      while time.perf_counter() - wall < args.seconds:
        next(iterator)
        batches += 1
      wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
      del iterator, element
      rates[name].append(batches * batch / wall)
      cpu_us[name].append(cpu / (batches * batch) * 1e6)
  load = os.getloadavg()
  server.stop()

  median = {name: statistics.median(r) for name, r in rates.items()}
  cpu = {name: statistics.median(c) for name, c in cpu_us.items()}
  speedup = median['ours'] / median['tfa_replay_buffer']
  result = {
      'bench': 'sample',
      'table_items': table_size,
      'push_seconds': round(push_seconds, 1),
      'batch_size': batch,
      'n_readers': args.readers,
      'chunk_length': args.chunk_length,
      'rounds': args.rounds,
      'seconds_per_round': args.seconds,
      'transitions_per_s': {k: round(v) for k, v in median.items()},
      'transitions_per_s_rounds': {
          k: [round(x) for x in v] for k, v in rates.items()},
      'cpu_us_per_transition': {k: round(v, 1) for k, v in cpu.items()},
      'speedup_ours_vs_tfa': round(speedup, 2),
      'cpu_saving_ours_vs_tfa': round(
          cpu['tfa_replay_buffer'] / cpu['ours'], 2),
      'speedup_reverb_raw_vs_tfa': round(
          median['reverb_raw'] / median['tfa_replay_buffer'], 2),
      'target_3x': speedup >= 3,
      'aim_100k_per_s': median['ours'] >= 100_000,
      'shapes_ok': bool(shapes_ok),
      'load_average_1m': round(load[0], 2),
      'machine': f'{platform.machine()} {os.cpu_count()} cores',
  }
  print(json.dumps(result))


if __name__ == '__main__':
  main()
