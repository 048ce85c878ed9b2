r"""Runs a Reverb server with a table for an RLDS dataset's trajectories.

So that pushing and training can run in processes of their own:

  python -m pipelines.serve --dataset DIR --port 8000 --checkpoint_dir /tmp/ckpt
  python -m pipelines.push --dataset DIR --reverb_address localhost:8000
  (a learner reads localhost:8000 with TF-Agents' ReverbReplayBuffer)

The table signature is the dataset's trajectory spec with a time dimension
(only the spec is read, not the data). Prints `serving table <table> on
localhost:<port>` once the server is up and runs until Ctrl-C or SIGTERM;
with --checkpoint_dir it starts from the latest checkpoint there and writes a
new one on the way out.
"""

import os

# TensorFlow's C++ start-up chatter would bury the one-line errors this tool
# prints. The caller can override.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import reverb

from pipelines import cli
from rlds_reverb import convert
from rlds_reverb import datasets
from rlds_reverb import tables

_PROG = 'serve'

_DATASET = flags.DEFINE_string(
    'dataset', None, 'RLDS data whose trajectory spec the table stores: a '
    'TFDS name with optional config (d4rl_mujoco_halfcheetah/v2-medium) or a '
    'directory in TFDS format, e.g. the --out of pipelines.generate. Only its '
    'spec is read. Required.')
_SPLIT = flags.DEFINE_string('split', 'train', 'TFDS split to take the spec '
                             'from.')
_DATA_DIR = flags.DEFINE_string(
    'data_dir', None, "TFDS data dir for TFDS names (default: TFDS' own, "
    '~/tensorflow_datasets).')
_DOWNLOAD = flags.DEFINE_bool(
    'download', True, 'For TFDS names: download and prepare the data if it is '
    'not in --data_dir (TFDS needs prepared data even for the spec).')
_PORT = flags.DEFINE_integer(
    'port', None, 'Port to serve on; default: a free one, printed at start.',
    lower_bound=1, upper_bound=65535)
_TABLE = flags.DEFINE_string(
    'table', tables.DEFAULT_TABLE, 'Name of the table; pass the same --table '
    'to pipelines.push and the learner.')
_SEQUENCE_LENGTH = flags.DEFINE_string(
    'sequence_length', '2', 'Trajectories per item the writers will use (0 '
    'or none: whole episodes). Only checked: the signature has an open time '
    'dimension, so the table takes items of any length.')
flags.register_validator(
    _SEQUENCE_LENGTH, cli.is_sequence_length,
    message='must be a positive integer, or 0 or none for whole episodes')
_MAX_SIZE = flags.DEFINE_integer(
    'max_size', 2_000_000, 'Most items the table holds; beyond it the oldest '
    'are evicted. A table restored from --checkpoint_dir keeps its own.',
    lower_bound=1)
_SAMPLER = flags.DEFINE_enum(
    'sampler', 'uniform', tables.SAMPLERS, 'How learners draw items; '
    "'prioritized' draws in proportion to priority**--alpha.")
_ALPHA = flags.DEFINE_float(
    'alpha', 0.6, "Priority exponent of --sampler=prioritized.",
    lower_bound=0.0)
_CHECKPOINT_DIR = flags.DEFINE_string(
    'checkpoint_dir', None, 'Start from the latest Reverb checkpoint in this '
    'directory (if any) and write a new one there on Ctrl-C / SIGTERM. '
    'Default: nothing outlives the process.')


def start(dataset: str, *, split: str = 'train', data_dir: str | None = None,
          download: bool = True, table: str = tables.DEFAULT_TABLE,
          sequence_length: int | None = 2, max_size: int = 2_000_000,
          sampler: str = 'uniform', alpha: float = 0.6,
          port: int | None = None, checkpoint_dir: str | None = None
          ) -> tuple[reverb.Server, int]:
  """Starts the server; returns it with the size its table starts with.

  Raises:
    datasets.DatasetNotFoundError, datasets.DatasetNotAvailableError: See
      `datasets.load`.
    ValueError: A bad table argument, or a checkpoint whose table differs
      from the dataset's spec.
    OSError: `port` is in use.
  """
  spec = convert.create_trajectory_data_spec(
      datasets.load(dataset, split=split, data_dir=data_dir,
                    download=download))
  server = tables.start_table_server(
      table, spec, port=port, checkpoint_dir=checkpoint_dir,
      max_size=max_size, sequence_length=sequence_length, sampler=sampler,
      alpha=alpha)
  return server, tables.get_table_info(server.localhost_client(),
                                       table).current_size


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(_PROG, ValueError(f'unexpected arguments: {" ".join(argv[1:])}'),
             code=2)
  if _DATASET.value is None:
    cli.fail(_PROG, ValueError('--dataset is required'), code=2)
  cli.quiet_logging()
  try:
    server, size = start(
        _DATASET.value, split=_SPLIT.value, data_dir=_DATA_DIR.value,
        download=_DOWNLOAD.value, table=_TABLE.value,
        sequence_length=cli.parse_sequence_length(_SEQUENCE_LENGTH.value),
        max_size=_MAX_SIZE.value, sampler=_SAMPLER.value, alpha=_ALPHA.value,
        port=_PORT.value, checkpoint_dir=_CHECKPOINT_DIR.value)
  except cli.USER_ERRORS as e:
    cli.fail(_PROG, e)
  try:
    restored = f' (restored from {_CHECKPOINT_DIR.value})' if size else ''
    print(f'{_PROG}: table {_TABLE.value!r} holds {size} items{restored}')
    cli.wait_until_interrupted(on_ready=lambda: print(
        f'serving table {_TABLE.value} on localhost:{server.port}',
        flush=True))
    client = server.localhost_client()
    size = tables.get_table_info(client, _TABLE.value).current_size
    if _CHECKPOINT_DIR.value:
      print(f'{_PROG}: wrote checkpoint {tables.checkpoint(client)} '
            f'({size} items)', flush=True)
    else:
      print(f'{_PROG}: stopped; {size} items dropped (no --checkpoint_dir)',
            flush=True)
  finally:
    server.stop()
    # Drop the reference now: reverb.Server.__del__ run at interpreter exit
    # prints a traceback.
    del server


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser(_PROG))
