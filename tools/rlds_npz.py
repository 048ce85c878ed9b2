"""An RLDS dataset as flat step arrays in one npz, for peer libraries.

Peers (d3rlpy, through a separate interpreter without TensorFlow) read the
same episodes as the project's learners through this file: one row per RLDS
step, episodes back to back, with the step fields of the contract
(docs/contract.md) under their RLDS names: observation, action, reward,
is_first, is_last, is_terminal. A last step holds the final observation; its
action and reward carry no meaning (the reader decides what to do with it).

  python -m tools.rlds_npz --dataset data/halfcheetah_v5_medium --out FILE.npz
"""

import argparse
import os
import sys

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import rlds
import tqdm

from rlds_reverb.data import datasets

FIELDS = (rlds.OBSERVATION, rlds.ACTION, rlds.REWARD, rlds.IS_FIRST,
          rlds.IS_LAST, rlds.IS_TERMINAL)
_ALL_STEPS = (1 << 31) - 1


def export(dataset: str, out: str, split: str = 'train') -> dict[str, int]:
  """Writes the steps of `dataset` to `out`; returns the counts written."""
  episodes = datasets.load(dataset, split=split, download=False)
  columns: dict[str, list[np.ndarray]] = {name: [] for name in FIELDS}
  count = 0
  for episode in tqdm.tqdm(episodes, desc='export', unit='episode',
                           file=sys.stderr):
    # One batch holds the whole episode (the int32 bound convert.py uses),
    # so no episode is cut short.
    steps = next(iter(episode[rlds.STEPS].batch(_ALL_STEPS)))
    if isinstance(steps[rlds.OBSERVATION], dict):
      raise ValueError(f'{dataset}: episode {count} has dict observations '
                       '(goal data); only array observations are exported')
    for name in FIELDS:
      columns[name].append(np.asarray(steps[name]))
    count += 1
  if not count:
    raise ValueError(f'{dataset}: no episodes to export')
  arrays = {name: np.concatenate(parts) for name, parts in columns.items()}
  np.savez(out, **arrays)
  return {'episodes': count, 'steps': int(arrays[rlds.REWARD].shape[0])}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--dataset', required=True,
                      help='local TFDS-format directory or TFDS name')
  parser.add_argument('--out', required=True, help='npz file to write')
  parser.add_argument('--split', default='train', help='TFDS split spec')
  args = parser.parse_args()
  print(export(args.dataset, args.out, args.split), file=sys.stderr)


if __name__ == '__main__':
  main()
