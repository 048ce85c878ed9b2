r"""How much longer PyTorch's RMSprop steps are than Keras' on a run's state.

  python -m tools.rmsprop_steps --checkpoint runs/a2c/checkpoints/ckpt-15000 \
      [--epsilon 1e-5]

Reads the RMSprop second moments v of an A2C checkpoint and prints one
JSON line: per weight, the ratio of PyTorch's step lr g / (sqrt(v) + eps)
to Keras' lr g * rsqrt(v + eps), its median and 10th/90th percentiles over
all weights and per variable, and each variable's median root mean square
gradient sqrt(v). A ratio near 1 means the two agree; far above 1, Keras'
epsilon floor holds the weight back (docs/onpolicy.md, "A2C's optimiser").
"""

import argparse
import json
import re
import sys
from typing import Optional, Sequence

import numpy as np

# An optimizer's slots in a TF2 checkpoint; slot 0 is its step counter.
_SLOT = re.compile(r'^optimizer/_variables/(\d+)/\.ATTRIBUTES/VARIABLE_VALUE$')


def step_ratios(velocity: np.ndarray, epsilon: float) -> np.ndarray:
  """PyTorch's step over Keras' for the same gradient, per weight."""
  velocity = velocity.astype(np.float64)
  return np.sqrt(velocity + epsilon) / (np.sqrt(velocity) + epsilon)


def summarize(checkpoint: str, epsilon: float) -> dict:
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  reader = tf.train.load_checkpoint(checkpoint)
  slots = sorted((int(m.group(1)), name)
                 for name in reader.get_variable_to_shape_map()
                 if (m := _SLOT.match(name)) and int(m.group(1)) > 0)
  if not slots:
    raise ValueError(f'{checkpoint} holds no optimizer slots')
  per_variable, ratios = [], []
  for _, name in slots:
    velocity = reader.get_tensor(name)
    ratio = step_ratios(velocity, epsilon).ravel()
    ratios.append(ratio)
    per_variable.append({
        'shape': list(velocity.shape), 'size': int(velocity.size),
        'median_rms_gradient': float(f'{np.median(np.sqrt(velocity)):.3g}'),
        'median_step_ratio': round(float(np.median(ratio)), 1)})
  everything = np.concatenate(ratios)
  return {'checkpoint': checkpoint, 'epsilon': epsilon,
          'weights': int(everything.size),
          'median_step_ratio': round(float(np.median(everything)), 1),
          'p10_step_ratio': round(float(np.percentile(everything, 10)), 1),
          'p90_step_ratio': round(float(np.percentile(everything, 90)), 1),
          'per_variable': per_variable}


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = argparse.ArgumentParser(
      description=__doc__.split('\n\n', 1)[0].strip())
  parser.add_argument('--checkpoint', required=True,
                      help='an A2C checkpoint prefix, e.g. '
                      'ROOT_DIR/checkpoints/ckpt-15000 (RMSprop slots: '
                      'one second moment per trainable variable)')
  parser.add_argument('--epsilon', type=float, default=1e-5,
                      help="RMSprop's epsilon (the run's "
                      '--optimizer_epsilon)')
  args = parser.parse_args(argv)
  try:
    print(json.dumps(summarize(args.checkpoint, args.epsilon)))
  except (ValueError, OSError) as e:
    print(f'rmsprop_steps: error: {e}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main())
