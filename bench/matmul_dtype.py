"""Matmul throughput of float32 against bfloat16 at the critics' shapes.

What `AgentConfig.critic_dtype='bfloat16'` can gain at most on this CPU:
a chain of three [rows, 256] x [256, 256] matmuls (a 3x256 critic's hidden
layers) in one `tf.function`, inputs already in the dtype, one thread.
rows: 256 (a batch), 1024 (ReBRAC's batch), 7680 (Cal-QL's 30 sampled
actions per state of a 256 batch). The reference is float32 at the same
shape, same run: `vs_float32` is bfloat16's GFLOP/s over it.

Prints one JSON line.

  taskset -c 1 python bench/matmul_dtype.py [--seconds 2]
"""

import argparse
import json
import os
import platform
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import tensorflow as tf  # pylint: disable=g-import-not-at-top

ROWS = (256, 1024, 7680)
WIDTH = 256
LAYERS = 3


def gflops(rows: int, dtype: tf.DType, seconds: float) -> float:
  x = tf.cast(tf.random.normal([rows, WIDTH]), dtype)
  w = tf.cast(tf.random.normal([WIDTH, WIDTH]) / WIDTH ** 0.5, dtype)

  @tf.function
  def chain(x, w):
    for _ in range(LAYERS):
      x = tf.matmul(x, w)
    return x[0, 0]

  chain(x, w).numpy()
  calls, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    chain(x, w).numpy()
    calls += 1
  elapsed = time.perf_counter() - start
  return 2 * LAYERS * rows * WIDTH * WIDTH * calls / elapsed / 1e9


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--seconds', type=float, default=2.0,
                      help='timed seconds per shape and dtype')
  args = parser.parse_args()
  tf.config.threading.set_intra_op_parallelism_threads(1)
  tf.config.threading.set_inter_op_parallelism_threads(1)
  shapes = {}
  for rows in ROWS:
    full = gflops(rows, tf.float32, args.seconds)
    half = gflops(rows, tf.bfloat16, args.seconds)
    shapes[str(rows)] = {'float32_gflops': round(full),
                         'bfloat16_gflops': round(half),
                         'vs_float32': round(half / full, 2)}
  print(json.dumps({
      'bench': 'matmul_dtype', 'reference': 'float32, same shape, same run',
      'shape': f'[rows, {WIDTH}] x [{WIDTH}, {WIDTH}], {LAYERS} in a chain',
      'threads': 1, 'machine': f'{platform.machine()}, {os.cpu_count()} cores',
      'tensorflow': tf.__version__, 'date': time.strftime('%Y-%m-%d'),
      'rows': shapes}))


if __name__ == '__main__':
  main()
