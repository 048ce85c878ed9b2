r"""Load on one Reverb server: W writer and S sampler processes, bounded time.

One server process with one table, reached on loopback (`localhost:PORT`);
W writer processes write through the toolkit's writers (`writers.WindowWriter`:
2-step windows, stride 1, one item per step, as `pipelines.push` writes;
`writers.EpisodeWriter`: one item per episode, as `--sequence_length none`
and actors write), S sampler processes read with Reverb's own readers
(`reverb.TrajectoryDataset` batched, the streaming feed's path, or
`client.sample`). Every process has its own `reverb.Client`; processes are
spawned, and every child is killed on the way out.

Figures, per run (one fresh server each):
  items_per_s         items confirmed by the writers' flushes / seconds
                      writing (writers stop early at --max_items)
  samples_per_s       items the samplers received / seconds
  insert_latency_ms   p50/p99 of one write batch (--write_batch steps, or one
                      episode) until the server confirmed it (writer flush)
  sample_latency_ms   p50/p99 of one batch of --sample_batch items (the
                      first batch, which waits for the table's first item
                      and traces tf.data, is left out)
  server_bytes_per_item / _per_step
                      growth of the server's VmRSS (/proc/PID/status) from
                      just before the writers start to after they stop,
                      divided by the items (steps) the table holds; against
                      raw_item_bytes / raw_step_bytes, the numpy bytes
  counts              items confirmed by writers == inserts the server
                      counted (rate limiter insert_stats) == table size, and
                      nothing evicted (max_size above --max_items):
                      nothing_lost
The reference, in the same invocation, is W=1, S=0; the other runs are the
main --writers/--samplers pair and the --scaling_* series, each reported
against it. All processes share this machine's cores: on a small machine
the figures show per-process overhead and contention, not what several
machines would give.

  python bench/load.py [--seconds 20] [--writers 2] [--samplers 1]
      [--item_kind window|episode] [--obs_dim 17] [--episode_length 1000]

Prints one JSON line and appends it to --out.
"""

import argparse
import datetime
import importlib.metadata
import inspect
import json
import multiprocessing as mp
import os
import platform
import queue
import signal
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_OUT = os.path.join(ROOT, 'images', 'results', 'load',
                           'bench_load.jsonl')
TABLE = 'load'
ACTION_DIM = 6
# Children start by importing TensorFlow; on two busy cores that takes a while.
_READY_TIMEOUT_S = 300.0
_FLUSH_TIMEOUT_MS = 60_000
_RESULT_GRACE_S = 120.0
# Server memory the default --max_items aims at, and Reverb's own cost per
# item on top of the data (about 2.2 KB per window item in a check run).
_DEFAULT_SERVER_BYTES = 2 * 2**30
_ITEM_OVERHEAD_BYTES = 2_500


# ---------------------------------------------------------------- data


def _data_spec(args) -> trajectory.Trajectory:
  """Halfcheetah-shaped trajectory spec; with --image_size an image too."""
  observation = tf.TensorSpec([args.obs_dim], tf.float32)
  if args.image_size:
    observation = {'state': observation,
                   'image': tf.TensorSpec([args.image_size] * 2 + [3],
                                          tf.uint8)}
  return trajectory.Trajectory(
      step_type=tf.TensorSpec([], tf.int32), observation=observation,
      action=tf.TensorSpec([ACTION_DIM], tf.float32), policy_info=(),
      next_step_type=tf.TensorSpec([], tf.int32),
      reward=tf.TensorSpec([], tf.float32),
      discount=tf.TensorSpec([], tf.float32))


def _raw_step_bytes(args) -> int:
  return sum(s.dtype.size * int(np.prod(s.shape))
             for s in tf.nest.flatten(_data_spec(args)))


def _episode(args, seed: int) -> Tuple[List[np.ndarray], np.ndarray]:
  """One converted episode as the writers take it: flat columns, step types."""
  rng = np.random.default_rng(seed)
  length = args.episode_length
  step_type = np.full(length, int(ts.StepType.MID), np.int32)
  step_type[0], step_type[-1] = int(ts.StepType.FIRST), int(ts.StepType.LAST)
  next_step_type = np.concatenate(
      [step_type[1:], [int(ts.StepType.FIRST)]]).astype(np.int32)
  columns = []
  for spec in tf.nest.flatten(_data_spec(args)):
    shape = (length, *spec.shape.as_list())
    if spec.dtype == tf.uint8:
      columns.append(rng.integers(0, 256, shape, np.uint8))
    elif spec.dtype == tf.int32:
      columns.append(np.zeros(shape, np.int32))
    else:
      columns.append(rng.standard_normal(shape, np.float32))
  flat = tf.nest.flatten(_data_spec(args))
  # The int32 leaves are step_type and next_step_type, in that order.
  int_leaves = [i for i, s in enumerate(flat) if s.dtype == tf.int32]
  columns[int_leaves[0]] = step_type
  columns[int_leaves[1]] = next_step_type
  return columns, step_type


# ---------------------------------------------------------------- children


def _serve(args, max_size: int, conn) -> None:
  """Server process: one table, then waits until the parent says stop."""
  from rlds_reverb.storage import tables  # pylint: disable=g-import-not-at-top
  table = tables.make_table(
      TABLE, _data_spec(args), max_size=max_size,
      sequence_length=2 if args.item_kind == 'window' else None,
      sampler=args.sampler)
  server = tables.start_server([table])
  conn.send((server.port, os.getpid()))
  try:
    conn.recv()
  except EOFError:  # The parent is gone.
    pass
  server.stop()


def _flush(writer, timeout_ms: int) -> None:
  """Blocks until every item `writer` created is confirmed by the server.

  The toolkit's writers wait only every 24 items, at episode ends and when
  closed; the bench confirms each write batch so that its latency and the
  count of confirmed items are exact. Writers without a public `flush` get
  their C++ writers flushed directly.
  """
  if hasattr(writer, 'flush'):
    writer.flush()
    return
  # pylint: disable=protected-access
  inner = ([writer._writer] if hasattr(writer, '_writer') else
           list(writer._writers.values()))
  for w in inner:
    w.Flush(0, timeout_ms)


def _deadline_kwargs(writer_class) -> Dict[str, Any]:
  """The writer's deadline for server waits, where it takes one."""
  if 'timeout_s' in inspect.signature(writer_class).parameters:
    return {'timeout_s': _FLUSH_TIMEOUT_MS / 1000}
  return {}


def _write(index: int, address: str, args, cap: int, ready, go,
           results) -> None:
  """Writer process: writes batches until --seconds or `cap` items."""
  try:
    from rlds_reverb.storage import tables  # pylint: disable=g-import-not-at-top
    from rlds_reverb.storage import writers
    client = tables.connect(address, timeout_s=30)
    columns, step_type = _episode(args, seed=index)
    if args.item_kind == 'window':
      writer = writers.WindowWriter(
          client, TABLE, 2, 1, 1.0,
          **_deadline_kwargs(writers.WindowWriter))
      batch = args.write_batch
    else:
      writer = writers.EpisodeWriter(
          client, TABLE, 1.0, **_deadline_kwargs(writers.EpisodeWriter))
      batch = args.episode_length  # One item per write.
    ready.put(index)
    if not go.wait(_READY_TIMEOUT_S):
      return
    latencies, position, stopped_by = [], 0, 'time'
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
      if writer.items >= cap:
        stopped_by = 'max_items'
        break
      end = min(position + batch, args.episode_length)
      t0 = time.perf_counter()
      writer.write([c[position:end] for c in columns], step_type[position:end])
      _flush(writer, _FLUSH_TIMEOUT_MS)
      latencies.append(time.perf_counter() - t0)
      position = 0 if end == args.episode_length else end
    seconds = time.perf_counter() - start
    writer.close()
    results.put({'role': 'writer', 'index': index, 'items': writer.items,
                 'seconds': seconds, 'latencies': latencies,
                 'stopped_by': stopped_by})
  except BaseException:  # pylint: disable=broad-except
    results.put({'role': 'writer', 'index': index,
                 'error': traceback.format_exc()[-3000:]})


def _sample(index: int, address: str, args, ready, go, results) -> None:
  """Sampler process: draws batches of --sample_batch until --seconds."""
  try:
    import reverb  # pylint: disable=g-import-not-at-top
    from rlds_reverb.storage import tables
    client = tables.connect(address, timeout_s=30)
    batch = args.sample_batch
    timeout_ms = int((args.seconds + 60) * 1000)
    if args.sample_api == 'dataset':
      dataset = reverb.TrajectoryDataset.from_table_signature(
          address, TABLE, max_in_flight_samples_per_worker=2 * batch,
          rate_limiter_timeout_ms=timeout_ms).batch(batch)
      iterator = iter(dataset)
      draw = lambda: next(iterator)
    else:
      draw = lambda: list(client.sample(TABLE, num_samples=batch,
                                        emit_timesteps=False))
    ready.put(index)
    if not go.wait(_READY_TIMEOUT_S):
      return
    latencies, samples = [], 0
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
      t0 = time.perf_counter()
      draw()
      latencies.append(time.perf_counter() - t0)
      samples += batch
    seconds = time.perf_counter() - start
    results.put({'role': 'sampler', 'index': index, 'samples': samples,
                 'seconds': seconds, 'latencies': latencies[1:]})
  except BaseException:  # pylint: disable=broad-except
    results.put({'role': 'sampler', 'index': index,
                 'error': traceback.format_exc()[-3000:]})


# ---------------------------------------------------------------- parent


def _rss_bytes(pid: int) -> int:
  with open(f'/proc/{pid}/status') as f:
    for line in f:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) * 1024
  raise RuntimeError(f'no VmRSS for pid {pid}')


def _percentiles_ms(latencies: List[float]) -> Optional[Dict[str, float]]:
  if not latencies:
    return None
  p50, p99 = np.percentile(np.asarray(latencies) * 1000, [50, 99])
  return {'p50': round(float(p50), 2), 'p99': round(float(p99), 2),
          'n': len(latencies)}


def _stop(processes: List[mp.Process]) -> None:
  """Ends the children this bench started: terminate, then kill."""
  for p in processes:
    if p.is_alive():
      p.terminate()
  for p in processes:
    p.join(5)
    if p.is_alive():
      p.kill()
      p.join(5)


def _wait_ready(processes: List[mp.Process], ready, results) -> None:
  """Waits until every child is ready; fails fast when one fails or dies."""
  deadline = time.monotonic() + _READY_TIMEOUT_S
  waiting = len(processes) - 1
  while waiting:
    try:
      ready.get(timeout=1.0)
      waiting -= 1
      continue
    except queue.Empty:
      pass
    try:  # A child that failed before it was ready put its error instead.
      failed = results.get_nowait()
      raise RuntimeError(f'a {failed["role"]} failed before it was ready:\n'
                         f'{failed.get("error", failed)}')
    except queue.Empty:
      pass
    dead = [p.name for p in processes if p.exitcode is not None]
    if dead:
      raise RuntimeError(f'child process(es) {dead} exited before the run')
    if time.monotonic() > deadline:
      raise RuntimeError(f'{waiting} child(ren) not ready within '
                         f'{_READY_TIMEOUT_S:g}s')


def _collect(processes: List[mp.Process], results,
             timeout_s: float) -> List[Dict[str, Any]]:
  """Every child's result; fails when one dies without one, or at timeout."""
  deadline = time.monotonic() + timeout_s
  outs = []
  while len(outs) < len(processes) - 1:
    try:
      outs.append(results.get(timeout=1.0))
      continue
    except queue.Empty:
      pass
    crashed = [p.name for p in processes[1:] if p.exitcode not in (None, 0)]
    if crashed:
      raise RuntimeError(f'child process(es) {crashed} died without a result')
    if time.monotonic() > deadline:
      raise RuntimeError(f'{len(processes) - 1 - len(outs)} child(ren) gave '
                         f'no result within {timeout_s:g}s')
  return outs


def _run(args, num_writers: int, num_samplers: int) -> Dict[str, Any]:
  """One configuration against a fresh server; every child ends here."""
  import reverb  # pylint: disable=g-import-not-at-top
  ctx = mp.get_context('spawn')
  max_size = 2 * args.max_items + num_writers * (args.write_batch + 1) + 1000
  cap = max(1, args.max_items // num_writers)
  processes: List[mp.Process] = []
  parent_conn, child_conn = ctx.Pipe()
  try:
    server = ctx.Process(target=_serve, args=(args, max_size, child_conn),
                         daemon=True)
    server.start()
    processes.append(server)
    if not parent_conn.poll(_READY_TIMEOUT_S):
      raise RuntimeError('the server process did not start in time')
    port, server_pid = parent_conn.recv()
    address = f'localhost:{port}'
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    for i in range(num_writers):
      processes.append(ctx.Process(
          target=_write, args=(i, address, args, cap, ready, go, results),
          daemon=True))
    for i in range(num_samplers):
      processes.append(ctx.Process(
          target=_sample, args=(i, address, args, ready, go, results),
          daemon=True))
    for p in processes[1:]:
      p.start()
    _wait_ready(processes, ready, results)
    rss_before = _rss_bytes(server_pid)
    go.set()
    outs = _collect(processes, results, args.seconds + _RESULT_GRACE_S)
    failed = [o['error'] for o in outs if 'error' in o]
    if failed:
      raise RuntimeError(f'{len(failed)} child(ren) failed:\n' + failed[0])
    rss_after = _rss_bytes(server_pid)
    info = reverb.Client(address).server_info(timeout=30)[TABLE]
  finally:
    try:
      parent_conn.send('stop')
    except (BrokenPipeError, OSError):
      pass
    if processes:
      processes[0].join(10)
    _stop(processes)

  w_outs = [o for o in outs if o['role'] == 'writer']
  s_outs = [o for o in outs if o['role'] == 'sampler']
  items = sum(o['items'] for o in w_outs)
  inserts = int(info.rate_limiter_info.insert_stats.completed)
  size = int(info.current_size)
  steps_per_item = 1 if args.item_kind == 'window' else args.episode_length
  grown = rss_after - rss_before
  run = {
      'writers': num_writers, 'samplers': num_samplers,
      'items_per_s': round(items / max(o['seconds'] for o in w_outs), 1),
      'samples_per_s': (round(sum(o['samples'] / o['seconds']
                                  for o in s_outs), 1) if s_outs else None),
      'insert_latency_ms': _percentiles_ms(
          sum((o['latencies'] for o in w_outs), [])),
      'sample_latency_ms': _percentiles_ms(
          sum((o['latencies'] for o in s_outs), [])),
      'server_rss_mb': {'before': round(rss_before / 2**20, 1),
                        'after': round(rss_after / 2**20, 1)},
      'server_bytes_per_item': round(grown / size, 1) if size else None,
      'server_bytes_per_step': (round(grown / (size * steps_per_item), 1)
                                if size else None),
      'items_confirmed_by_writers': items,
      'server_inserts': inserts,
      'table_size': size,
      'evicted': inserts - size,
      'server_samples': int(info.rate_limiter_info.sample_stats.completed),
      'writers_stopped_by': sorted({o['stopped_by'] for o in w_outs}),
  }
  run['nothing_lost'] = items == inserts == size
  print(f'W={num_writers} S={num_samplers}: {run}', file=sys.stderr)
  return run


def _raise_interrupt(signum, frame) -> None:
  del frame
  raise KeyboardInterrupt(f'signal {signum}')


def _configs(args) -> List[Tuple[int, int]]:
  """Reference first, then the main pair and the scaling series, no repeats."""
  wanted = [(1, 0), (args.writers, args.samplers)]
  wanted += [(int(w), 0) for w in args.scaling_writers.split(',') if w]
  wanted += [(1, int(s)) for s in args.scaling_samplers.split(',') if s]
  return list(dict.fromkeys(wanted))


def _machine() -> Dict[str, Any]:
  return {
      'cpu_count': os.cpu_count(),
      'cpus_usable': len(os.sched_getaffinity(0)),
      'loadavg_at_start': [round(x, 2) for x in os.getloadavg()],
      'platform': platform.platform(),
      'python': platform.python_version(),
      'reverb': importlib.metadata.version('dm-reverb'),
      'tensorflow': tf.__version__,
  }


def main() -> None:
  parser = argparse.ArgumentParser(
      description=__doc__.splitlines()[0],
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument('--seconds', type=float, default=20.0,
                      help='Timed seconds of each run (each configuration); '
                           'process start-up comes on top (~10-30 s a run).')
  parser.add_argument('--writers', type=int, default=2,
                      help='Writer processes of the main run.')
  parser.add_argument('--samplers', type=int, default=1,
                      help='Sampler processes of the main run.')
  parser.add_argument('--scaling_writers', default='1,2,4',
                      help='Writer counts of the write-scaling series (no '
                           'samplers); empty to skip.')
  parser.add_argument('--scaling_samplers', default='1,2',
                      help='Sampler counts of the read-scaling series (one '
                           'writer); empty to skip.')
  parser.add_argument('--item_kind', choices=('window', 'episode'),
                      default='window',
                      help='window: 2-step items, stride 1 (one per step, '
                           'WindowWriter, what pipelines.push writes by '
                           'default); episode: one item per episode '
                           '(EpisodeWriter, --feed_table and actors).')
  parser.add_argument('--obs_dim', type=int, default=17,
                      help='Float32 observation size (halfcheetah: 17; the '
                           'action is 6 float32).')
  parser.add_argument('--image_size', type=int, default=0,
                      help='Add a uint8 image of SIZE x SIZE x 3 to every '
                           'step (Open X-Embodiment: 256); 0: none.')
  parser.add_argument('--episode_length', type=int, default=1000,
                      help='Steps per episode (trajectories per episode '
                           'item).')
  parser.add_argument('--write_batch', type=int, default=100,
                      help='Window kind: steps per write call, each followed '
                           'by a flush that the insert latency times. The '
                           'episode kind writes one episode per call.')
  parser.add_argument('--sample_batch', type=int, default=None,
                      help='Items per sample batch (default: 256 windows, as '
                           "Acme's SAC, or 4 episodes).")
  parser.add_argument('--sample_api', choices=('dataset', 'client'),
                      default='dataset',
                      help='dataset: reverb.TrajectoryDataset batched (the '
                           'streaming feed, TF-Agents ReverbReplayBuffer); '
                           'client: one client.sample(num_samples=batch) '
                           'call per batch.')
  parser.add_argument('--sampler', default='uniform',
                      choices=('uniform', 'fifo', 'lifo', 'prioritized'),
                      help="The table's sampler (tables.make_table).")
  parser.add_argument('--max_items', type=int, default=None,
                      help='Writers stop once they wrote this many items in '
                           'all (the table is made larger, so nothing is '
                           'evicted). Default: what fills about 2 GiB of '
                           'server memory (data + ~2.5 KB per item), at '
                           'most 2,000,000.')
  parser.add_argument('--out', default=DEFAULT_OUT,
                      help='JSONL file the result line is appended to; '
                           'empty: print only.')
  args = parser.parse_args()
  for name in ('seconds', 'writers', 'obs_dim', 'episode_length',
               'write_batch'):
    if not getattr(args, name) > 0:
      parser.error(f'--{name} must be > 0, got {getattr(args, name)}')
  if args.samplers < 0 or args.image_size < 0:
    parser.error('--samplers and --image_size must be >= 0')
  if args.episode_length < 2:
    parser.error('--episode_length must be >= 2 (a window needs 2 steps)')
  if args.sample_batch is None:
    args.sample_batch = 256 if args.item_kind == 'window' else 4
  step_bytes = _raw_step_bytes(args)
  steps_per_item = 1 if args.item_kind == 'window' else args.episode_length
  if args.max_items is None:
    args.max_items = max(1, min(
        2_000_000, _DEFAULT_SERVER_BYTES
        // (step_bytes * steps_per_item + _ITEM_OVERHEAD_BYTES)))

  # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so that every
  # child is still ended in _run's finally.
  signal.signal(signal.SIGTERM, _raise_interrupt)
  started = datetime.datetime.now(datetime.timezone.utc)
  machine = _machine()
  runs = [_run(args, w, s) for w, s in _configs(args)]
  reference = runs[0]
  for run in runs:
    run['items_per_s_vs_reference'] = round(
        run['items_per_s'] / reference['items_per_s'], 3)
  cores = machine['cpus_usable']
  result = {
      'bench': 'load',
      'command': ' '.join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
      'date': started.isoformat(timespec='seconds'),
      'machine': machine,
      'item_kind': args.item_kind,
      'obs_dim': args.obs_dim, 'action_dim': ACTION_DIM,
      'image_size': args.image_size,
      'episode_length': args.episode_length,
      'raw_step_bytes': step_bytes,
      'raw_item_bytes': step_bytes * (2 if args.item_kind == 'window'
                                      else args.episode_length),
      'steps_stored_per_item': steps_per_item,
      'write_batch': args.write_batch if args.item_kind == 'window' else 1,
      'sample_batch': args.sample_batch, 'sample_api': args.sample_api,
      'sampler': args.sampler, 'seconds_per_run': args.seconds,
      'max_items': args.max_items,
      'reference': 'writers=1, samplers=0',
      'runs': runs,
      'nothing_lost': all(r['nothing_lost'] for r in runs),
      'note': (f'{cores} usable cores shared by the server, the writers and '
               'the samplers (and anything else running): the figures show '
               "Reverb's and the toolkit's per-process cost and contention on "
               'one machine, not the throughput of several machines.'),
  }
  line = json.dumps(result)
  print(line)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, 'a') as f:
      f.write(line + '\n')
  if not result['nothing_lost']:
    sys.exit('bench/load.py: items lost: see the counts in the JSON line')


if __name__ == '__main__':
  main()
