"""The flags that pipelines.push, pipelines.serve and pipelines.train share.

Each pipeline imports this module and calls
`flags.adopt_module_key_flags(common_flags)`, so that its `--help` lists
these flags with its own (absl lists the main module's key flags only).

--dataset, --split, --data_dir, --download and --table are defined on
import: all three pipelines take them. --reverb_address and --max_episodes
only mean something to the pipelines that push data (push; train pushes its
--dataset into a table of its own): those call `define_push_flags()` before
adopting, so serve's `--help` does not list them.
"""

from typing import NamedTuple, Optional

from absl import flags

from rlds_reverb.storage import tables

DATASET = flags.DEFINE_string(
    'dataset', None, 'RLDS data: a TFDS name with optional config '
    '(d4rl_mujoco_halfcheetah/v2-medium), a directory in TFDS format (e.g. '
    'the --out of pipelines.generate), or minari:ID for a Minari dataset '
    '(minari:mujoco/halfcheetah/medium-v0; read from --data_dir or '
    "Minari's cache). push converts and writes it; serve "
    'reads only its spec (the table signature); train pushes it into a table '
    'of its own for the offline agents (online runs take none). Required by '
    'push and serve.')
SPLIT = flags.DEFINE_string(
    'split', 'train', 'TFDS split of --dataset, slicing allowed: '
    'train[:10%].')
DATA_DIR = flags.DEFINE_string(
    'data_dir', None, "TFDS data dir for TFDS names (default: TFDS' own, "
    "~/tensorflow_datasets); Minari's data root for minari:ID (default: "
    "$MINARI_DATASETS_PATH, else ~/.minari/datasets).")
DOWNLOAD = flags.DEFINE_bool(
    'download', True, 'For TFDS names: download and prepare the data if it is '
    'not in --data_dir (TFDS needs prepared data even for the spec). With '
    '--nodownload a missing dataset fails at once instead of after network '
    'time-outs on an offline machine.')
TABLE = flags.DEFINE_string(
    'table', tables.DEFAULT_TABLE, 'Name of the Reverb table: the one serve '
    'makes, push writes into and train reads at --reverb_address; pass the '
    "same name to all three. Its signature is the data's trajectory spec "
    'with a time dimension, as pipelines.serve makes it.')


class PushFlags(NamedTuple):
  """The flags of `define_push_flags`."""
  reverb_address: flags.FlagHolder
  max_episodes: flags.FlagHolder


_push_flags: Optional[PushFlags] = None


def define_push_flags() -> PushFlags:
  """Defines --reverb_address and --max_episodes (once; then returns them).

  For push and train, which write data into a table; call it before
  `flags.adopt_module_key_flags(common_flags)`.
  """
  global _push_flags
  if _push_flags is None:
    _push_flags = PushFlags(
        reverb_address=flags.DEFINE_string(
            'reverb_address', '', 'host:port of a running Reverb server '
            '(pipelines.serve, or pipelines.push --serve). push writes into '
            'its --table; train reads its offline data from that table '
            'instead of --dataset. Empty: push starts a server in its own '
            'process with a table made for the data; train uses --dataset, '
            'or runs online.'),
        max_episodes=flags.DEFINE_integer(
            'max_episodes', 0, 'Push (train: use) only the first N episodes '
            'of --dataset; 0: all.', lower_bound=0))
  return _push_flags
