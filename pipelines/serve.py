r"""Runs a Reverb server with a table for an RLDS dataset's trajectories.

So that pushing and training can run in processes of their own:

  python -m pipelines.serve --dataset DIR --port 8000 --checkpoint_dir /tmp/ckpt
  python -m pipelines.push --dataset DIR --reverb_address localhost:8000
  python -m pipelines.train --agent bc --reverb_address localhost:8000 \
      --feed stream

  # An episode table, for the learners' in-memory feed (train's default).
  python -m pipelines.serve --dataset DIR --port 8000 --feed_table
  python -m pipelines.push --dataset DIR --reverb_address localhost:8000 \
      --feed_table
  python -m pipelines.train --agent bc --reverb_address localhost:8000

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
from pipelines import common_flags
from rlds_reverb import convert
from rlds_reverb import datasets
from rlds_reverb import tables
from rlds_reverb.replay import episode_table

_PROG = 'serve'

flags.adopt_module_key_flags(common_flags)
_PORT = flags.DEFINE_integer(
    'port', None, 'Port to serve on; default: a free one, printed at start.',
    lower_bound=1, upper_bound=65535)
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
_FEED_TABLE = flags.DEFINE_bool(
    'feed_table', False, "Make the table for learners' in-memory feed: one "
    'item per episode, read once per pass by the learner (min-heap sampler), '
    'written unread (pipelines.push --feed_table); --sequence_length, '
    '--sampler and --alpha do not apply, --max_size counts episodes.')
# What an episode table fixes: whole episodes, min-heap.
_NOT_WITH_FEED_TABLE = (_SEQUENCE_LENGTH, _SAMPLER, _ALPHA)


def start(dataset: str, *, split: str = 'train', data_dir: str | None = None,
          download: bool = True, table: str = tables.DEFAULT_TABLE,
          sequence_length: int | None = 2, max_size: int = 2_000_000,
          sampler: str = 'uniform', alpha: float = 0.6,
          port: int | None = None, checkpoint_dir: str | None = None,
          feed_table: bool = False) -> tuple[reverb.Server, int]:
  """Starts the server; returns it with the size its table starts with.

  With `feed_table`, the table is an episode table of at most `max_size`
  episodes (`episode_table.make_table`); `sequence_length`, `sampler` and
  `alpha` are not used.

  Raises:
    datasets.DatasetNotFoundError, datasets.DatasetNotAvailableError: See
      `datasets.load`.
    ValueError: A bad table argument, or a checkpoint whose table differs
      from the dataset's spec or is (or is not) an episode table against
      `feed_table`.
    OSError: `port` is in use.
  """
  spec = convert.create_trajectory_data_spec(
      datasets.load(dataset, split=split, data_dir=data_dir,
                    download=download))
  if feed_table:
    server = tables.start_table_server(
        table, spec, port=port, checkpoint_dir=checkpoint_dir,
        table=episode_table.make_table(table, spec, max_episodes=max_size))
  else:
    server = tables.start_table_server(
        table, spec, port=port, checkpoint_dir=checkpoint_dir,
        max_size=max_size, sequence_length=sequence_length, sampler=sampler,
        alpha=alpha)
  client = server.localhost_client()
  try:
    # A table restored from checkpoint_dir keeps the kind it was made with.
    episode_table.check_table_kind(client, table, episodes=feed_table)
  except ValueError as e:
    server.stop()
    del server  # Not left to the traceback: its __del__ at exit would fail.
    raise ValueError(f'the checkpoint in {checkpoint_dir} restored another '
                     f'kind of table: {e}') from e
  return server, tables.get_table_info(client, table).current_size


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(_PROG, ValueError(f'unexpected arguments: {" ".join(argv[1:])}'),
             code=2)
  if common_flags.DATASET.value is None:
    cli.fail(_PROG, ValueError('--dataset is required'), code=2)
  if _FEED_TABLE.value:
    for flag in _NOT_WITH_FEED_TABLE:
      if flag.present:
        cli.fail(_PROG, ValueError(
            f'--{flag.name} does not apply to --feed_table (its table holds '
            'whole episodes, sampled by a min-heap)'), code=2)
  cli.quiet_logging()
  table = common_flags.TABLE.value
  try:
    server, size = start(
        common_flags.DATASET.value, split=common_flags.SPLIT.value,
        data_dir=common_flags.DATA_DIR.value,
        download=common_flags.DOWNLOAD.value, table=table,
        sequence_length=cli.parse_sequence_length(_SEQUENCE_LENGTH.value),
        max_size=_MAX_SIZE.value, sampler=_SAMPLER.value, alpha=_ALPHA.value,
        port=_PORT.value, checkpoint_dir=_CHECKPOINT_DIR.value,
        feed_table=_FEED_TABLE.value)
  except cli.USER_ERRORS as e:
    cli.fail(_PROG, e)
  try:
    restored = f' (restored from {_CHECKPOINT_DIR.value})' if size else ''
    print(f'{_PROG}: table {table!r} holds {size} items{restored}')
    cli.wait_until_interrupted(on_ready=lambda: print(
        f'serving table {table} on localhost:{server.port}',
        flush=True))
    client = server.localhost_client()
    size = tables.get_table_info(client, table).current_size
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
