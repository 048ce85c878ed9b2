"""Push speed: rlds_reverb's fast push against TF-Agents' observers, same run.

Data: `--episodes` x `--steps` of halfcheetah-shaped RLDS steps (observation
(17,), action (6,) float32), held in memory, so the read side is as fast as
tf.data gets and the figures measure conversion + writing.

Prints one JSON line. Figures are steps/s (one item per step for
sequence_length=2, one item per episode for whole episodes):
  raw_read            batched read of the same episodes, no conversion (ceiling)
  reverb_writer_python  Reverb's per-step TrajectoryWriter fed from ready
                      numpy arrays, one item per step, no conversion (the
                      per-item ceiling of one Python process)
  tfa_trajectory      TF-Agents push_rlds_to_reverb + ReverbAddTrajectoryObserver
  tfa_episode         TF-Agents push_rlds_to_reverb + ReverbAddEpisodeObserver
  ours_sequence       push_rlds_to_table(sequence_length=2), one writer
                      thread: items in exactly TF-Agents' order
  ours_sequence_Nw    the same with --workers writer threads
  ours_episode        push_rlds_to_table(sequence_length=None)
Targets: ours_sequence(_Nw) >= 10x tfa_trajectory, ours_episode >= 100x
tfa_episode.

  python bench/push.py [--episodes 100] [--steps 1000] [--tfa_episodes 100]
                       [--workers 2] [--repeats 3]

TF-Agents' pushes take minutes and run once; each fast figure (raw_read,
ours_*) is the best of --repeats runs of about a second.
"""

import argparse
import json
import os
import platform
import time
from typing import Callable, Dict

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import reverb  # pylint: disable=g-import-not-at-top
import rlds
import tensorflow as tf
from tf_agents.replay_buffers import reverb_utils
from tf_agents.replay_buffers import rlds_to_reverb
from tf_agents.specs import tensor_spec

import rlds_reverb

from halfcheetah_data import make_rlds  # pylint: disable=g-bad-import-order


def timed(fn: Callable[[], int]) -> float:
  """Steps per second of `fn`, which returns the steps it handled."""
  start = time.perf_counter()
  steps = fn()
  return steps / (time.perf_counter() - start)


def raw_read(data: tf.data.Dataset) -> int:
  steps = 0
  for episode in data.map(
      lambda e: e[rlds.STEPS].batch(1 << 30).get_single_element()):
    steps += int(episode[rlds.IS_FIRST].shape[0])
  return steps


def reverb_writer_python(client: reverb.Client, table: str,
                         columns) -> int:
  """reverb.TrajectoryWriter (public API), one window-2 item per step."""
  with client.trajectory_writer(num_keep_alive_refs=3) as writer:
    for episode in columns:
      for row in zip(*episode):
        writer.append(list(row))
        if writer.episode_steps >= 2:
          writer.create_item(table, 1.0, [c[-2:] for c in writer.history])
      writer.end_episode()
  return sum(len(e[0]) for e in columns)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--episodes', type=int, default=100,
                      help='HalfCheetah-shaped episodes held in memory and '
                           'pushed by each fast push.')
  parser.add_argument('--steps', type=int, default=1000,
                      help='RLDS steps per episode.')
  parser.add_argument('--tfa_episodes', type=int, default=100,
                      help='Episodes pushed through the (slow) TF-Agents '
                           'reference; fewer gives the same rate sooner.')
  parser.add_argument('--repeats', type=int, default=3,
                      help='Runs of each fast (rlds_reverb) push, each into '
                           'a fresh server; the best is reported, as timeit '
                           'does (one run takes about a second, so noise '
                           'from the rest of the machine matters).')
  parser.add_argument('--workers', type=int, default=2,
                      help='Writer threads of the ours_sequence_Nw figure.')
  args = parser.parse_args()

  data = make_rlds(args.episodes, args.steps)
  tfa_data = data.take(args.tfa_episodes)
  spec = rlds_reverb.create_trajectory_data_spec(data)
  signature = tensor_spec.add_outer_dim(spec)
  workers_name = f'ours_sequence_{args.workers}w'
  sizes: Dict[str, int] = {}

  def measure(name: str, push: Callable[[reverb.Client], int],
              repeats: int = 1) -> float:
    """Best steps/s of `push`, each run into a fresh server of its own."""
    rates = []
    for _ in range(repeats):
      server = reverb.Server([reverb.Table(
          name, reverb.selectors.Uniform(), reverb.selectors.Fifo(),
          max_size=10 ** 7, rate_limiter=reverb.rate_limiters.MinSize(1),
          signature=signature)])
      client = reverb.Client(f'localhost:{server.port}')
      rates.append(timed(lambda: push(client)))
      sizes[name] = client.server_info()[name].current_size
      server.stop()
    return max(rates)

  figures: Dict[str, float] = {}
  raw_read(data.take(2))  # Warm up tf.data tracing.
  figures['raw_read'] = max(timed(lambda: raw_read(data))
                            for _ in range(args.repeats))

  columns = [tf.nest.flatten(e.trajectory) for e in
             rlds_reverb.convert_rlds_to_episodes(data).as_numpy_iterator()]
  figures['reverb_writer_python'] = measure(
      'reverb_python',
      lambda client: reverb_writer_python(client, 'reverb_python', columns))

  def tfa(observer) -> int:
    steps = rlds_to_reverb.push_rlds_to_reverb(tfa_data, observer)
    observer.close()
    return steps

  figures['tfa_trajectory'] = measure('tfa_trajectory', lambda client: tfa(
      reverb_utils.ReverbAddTrajectoryObserver(
          client, 'tfa_trajectory', sequence_length=2, stride_length=1)))
  figures['tfa_episode'] = measure('tfa_episode', lambda client: tfa(
      reverb_utils.ReverbAddEpisodeObserver(
          client, 'tfa_episode', max_sequence_length=args.steps + 1)))
  figures['ours_sequence'] = measure(
      'ours_sequence', lambda client: rlds_reverb.push_rlds_to_table(
          data, client, 'ours_sequence', sequence_length=2), args.repeats)
  figures[workers_name] = measure(
      workers_name, lambda client: rlds_reverb.push_rlds_to_table(
          data, client, workers_name, sequence_length=2,
          num_workers=args.workers), args.repeats)
  figures['ours_episode'] = measure(
      'ours_episode', lambda client: rlds_reverb.push_rlds_to_table(
          data, client, 'ours_episode', sequence_length=None), args.repeats)

  expected_items = {
      'tfa_trajectory': args.tfa_episodes * (args.steps - 1),
      'tfa_episode': args.tfa_episodes,
      'ours_sequence': args.episodes * (args.steps - 1),
      workers_name: args.episodes * (args.steps - 1),
      'ours_episode': args.episodes,
  }
  speedup_sequence = figures['ours_sequence'] / figures['tfa_trajectory']
  speedup_workers = figures[workers_name] / figures['tfa_trajectory']
  speedup_episode = figures['ours_episode'] / figures['tfa_episode']
  result = {
      'bench': 'push',
      'episodes': args.episodes,
      'steps_per_episode': args.steps,
      'tfa_episodes': args.tfa_episodes,
      'repeats_of_fast_runs': args.repeats,
      'steps_per_s': {k: round(v) for k, v in figures.items()},
      'speedup_sequence_vs_tfa': round(speedup_sequence, 1),
      f'speedup_sequence_{args.workers}w_vs_tfa': round(speedup_workers, 1),
      'speedup_episode_vs_tfa': round(speedup_episode, 1),
      'target_sequence_10x': max(speedup_sequence, speedup_workers) >= 10,
      'target_episode_100x': speedup_episode >= 100,
      'items_ok': all(sizes[k] == v for k, v in expected_items.items()),
      'table_sizes': sizes,
      'machine': f'{platform.machine()} {os.cpu_count()} cores',
  }
  print(json.dumps(result))


if __name__ == '__main__':
  main()
