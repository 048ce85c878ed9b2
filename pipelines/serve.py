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
localhost:<port>` once the server is up and runs until Ctrl-C or SIGTERM.
With --checkpoint_dir it starts from the latest checkpoint there (and says
which, from when, and which of its settings differ from the flags), writes
one every --checkpoint_interval seconds and one on the way out.

Reverb 0.14 listens on every interface ([::]:port) with no authentication,
whatever --host says: each start warns with the real listening address on
stderr (docs/security.md says how to fence the port off).
"""

# Before anything imports tensorflow: quiets the C++ start-up logs.
from pipelines import cli  # pylint: disable=g-bad-import-order

import datetime  # pylint: disable=g-import-not-at-top,wrong-import-order
import socket
import sys
import threading
import time
from typing import Any, Callable, List, NamedTuple, Optional

from absl import app
from absl import flags
import reverb

from pipelines import common_flags
from rlds_reverb.data import convert
from rlds_reverb.data import datasets
from rlds_reverb.storage import tables
from rlds_reverb.acting import envs
from rlds_reverb.acting import remote
from rlds_reverb.experiments import online
from rlds_reverb.experiments import onpolicy
from rlds_reverb.experiments import run
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import rollout_queue
from rlds_reverb.replay import variables

_PROG = 'serve'

flags.adopt_module_key_flags(common_flags)
_PORT = flags.DEFINE_integer(
    'port', None, 'Port to serve on; default: a free one, printed at start.',
    lower_bound=1, upper_bound=65535)
_HOST = flags.DEFINE_string(
    'host', 'localhost', 'Host name or IP that clients use to reach the '
    'server; printed in the address. Reverb 0.14 cannot bind one interface: '
    'the server listens on all of them ([::]:PORT) whatever this says, and '
    'every start warns so (see docs/security.md to restrict access).')
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
    'directory (if any), write one there every --checkpoint_interval seconds '
    'and on Ctrl-C / SIGTERM. Default: nothing outlives the process.')
_CHECKPOINT_INTERVAL = flags.DEFINE_float(
    'checkpoint_interval', 600.0, 'Seconds between checkpoints to '
    '--checkpoint_dir while serving (0: only on the way out), so a crash or '
    'kill -9 loses at most this much. Each rewrites the whole table; Reverb '
    'keeps the latest only.', lower_bound=0.0)
_FEED_TABLE = flags.DEFINE_bool(
    'feed_table', False, "Make the table for learners' in-memory feed: one "
    'item per episode, read once per pass by the learner (min-heap sampler), '
    'written unread (pipelines.push --feed_table); --sequence_length, '
    '--sampler and --alpha do not apply, --max_size counts episodes.')
_ENV = flags.DEFINE_string(
    'env', None, 'Instead of --dataset: serve the tables of a distributed '
    'online run in this gymnasium env (e.g. HalfCheetah-v5): the episode '
    'table that pipelines.act processes write (--table, default '
    f'{remote.EPISODE_TABLE!r}; --max_size counts episodes) and the weights '
    f'table {variables.TABLE!r} the learner (pipelines.train --num_actors 0) '
    'publishes into. See docs/distributed.md.')
_ROLLOUTS = flags.DEFINE_bool(
    'rollouts', False, 'With --env: serve the tables of PPO / A2C actor '
    f'processes instead: the rollout queue {onpolicy.ROLLOUT_TABLE!r} that '
    'pipelines.act --agent ppo/a2c/acktr write (each rollout read once by the '
    'learner) and the weights table the learner (pipelines.train --agent '
    'ppo --num_actors 0) publishes its weights and statistics into. '
    '--table and --max_size do not apply.')
# What an episode table fixes: whole episodes, min-heap.
_NOT_WITH_FEED_TABLE = (_SEQUENCE_LENGTH, _SAMPLER, _ALPHA)


class Served(NamedTuple):
  """A started server and what it started from."""
  server: reverb.Server
  size: int  # Items in the table at start.
  restored_from: Optional[str]  # The checkpoint restored, if any.
  differences: List[str]  # Restored settings that differ from those asked.


def start(dataset: str, *, split: str = 'train', data_dir: str | None = None,
          download: bool = True, table: str = tables.DEFAULT_TABLE,
          sequence_length: int | None = 2, max_size: int = 2_000_000,
          sampler: str = 'uniform', alpha: float = 0.6,
          port: int | None = None, host: str = 'localhost',
          checkpoint_dir: str | None = None,
          feed_table: bool = False) -> Served:
  """Starts the server, restoring the latest checkpoint in `checkpoint_dir`.

  With `feed_table`, the table is an episode table of at most `max_size`
  episodes (`episode_table.make_table`); `sequence_length`, `sampler` and
  `alpha` are not used.

  Raises:
    datasets.DatasetNotFoundError, datasets.DatasetNotAvailableError: See
      `datasets.load`.
    ValueError: A bad table argument or `host`, or a checkpoint whose table
      differs from the dataset's spec or is (or is not) an episode table
      against `feed_table`.
    OSError: `port` is in use.
  """
  spec = convert.create_trajectory_data_spec(
      datasets.load(dataset, split=split, data_dir=data_dir,
                    download=download))
  if feed_table:
    wanted = episode_table.make_table(table, spec, max_episodes=max_size)
  else:
    wanted = tables.make_table(table, spec, max_size=max_size,
                               sequence_length=sequence_length,
                               sampler=sampler, alpha=alpha)
  wanted_info = wanted.info
  restored_from = (tables.latest_checkpoint(checkpoint_dir)
                   if checkpoint_dir else None)
  server = tables.start_table_server(
      table, spec, port=port, host=host, checkpoint_dir=checkpoint_dir,
      table=wanted)
  # A table restored from checkpoint_dir keeps the kind it was made with.
  return _checked(
      server, table, wanted_info, checkpoint_dir, restored_from,
      'another kind of table',
      lambda client: episode_table.check_table_kind(client, table,
                                                    episodes=feed_table))


def _checked(server: reverb.Server, table: str, wanted_info: Any,
             checkpoint_dir: Optional[str], restored_from: Optional[str],
             restored_what: str,
             check: Callable[[reverb.Client], None]) -> Served:
  """`Served` once `check` accepts what the server holds (a restored
  checkpoint may not fit); otherwise the server is stopped."""
  client = server.localhost_client()
  try:
    check(client)
  except ValueError as e:
    server.stop()
    del server  # Not left to the traceback: its __del__ at exit would fail.
    raise ValueError(f'the checkpoint in {checkpoint_dir} restored '
                     f'{restored_what}: {e}') from e
  info = tables.get_table_info(client, table)
  differences = (tables.table_differences(info, wanted_info)
                 if restored_from else [])
  return Served(server, info.current_size, restored_from, differences)


def start_for_env(env: str, *, table: str = remote.EPISODE_TABLE,
                  max_episodes: int = 1_000_000, port: int | None = None,
                  host: str = 'localhost',
                  checkpoint_dir: str | None = None,
                  rollouts: bool = False) -> Served:
  """Starts the tables of a distributed online run in `env`: the episode
  table actors write and the weights table the learner publishes into;
  with `rollouts`, PPO / A2C's rollout queue (`table` and `max_episodes`
  unused) instead of the episode table.

  Raises:
    ValueError: Unknown env, a bad table argument or `host`, or a
      checkpoint whose tables do not fit `env`.
    OSError: `port` is in use.
  """
  specs = envs.env_specs(env)
  if rollouts:
    onpolicy.check_env(specs)
    table = onpolicy.ROLLOUT_TABLE
    wanted = onpolicy.make_actor_tables()
  else:
    wanted = online.make_actor_tables(env, table=table,
                                      max_episodes=max_episodes)
  wanted_info = wanted[0].info
  restored_from = (tables.latest_checkpoint(checkpoint_dir)
                   if checkpoint_dir else None)
  server = tables.start_server(wanted, port=port, host=host,
                               checkpoint_dir=checkpoint_dir)

  def check(client: reverb.Client) -> None:
    if rollouts:
      rollout_queue.check_queue(client, table)
    else:
      tables.check_signature(client, table, run.trajectory_spec(specs))
      episode_table.check_table_kind(client, table, episodes=True)
    variables.check_table(client)

  return _checked(server, table, wanted_info, checkpoint_dir, restored_from,
                  f'tables that do not fit {env}', check)


def client_address(host: str, port: int) -> str:
  """The address to print for clients: `host`, or this machine's name for
  a wildcard host; IPv6 in brackets."""
  if host in ('0.0.0.0', '::', '[::]'):
    host = socket.gethostname()
  if ':' in host and not host.startswith('['):
    host = f'[{host}]'
  return f'{host}:{port}'


def _when(path: str) -> str:
  """'2026-11-23 19:39:28 UTC, 4 min ago'."""
  written = tables.checkpoint_time(path)
  stamp = datetime.datetime.fromtimestamp(written, datetime.timezone.utc)
  return (f'{stamp:%Y-%m-%d %H:%M:%S} UTC, '
          f'{_duration(max(0.0, time.time() - written))} ago')


def _duration(seconds: float) -> str:
  if seconds < 120:
    return f'{seconds:.0f} s'
  if seconds < 7200:
    return f'{seconds / 60:.0f} min'
  return f'{seconds / 3600:.1f} h'


def _say(text: str) -> None:
  print(f'{_PROG}: {text}', flush=True)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(_PROG, ValueError(f'unexpected arguments: {" ".join(argv[1:])}'),
             code=2)
  if (common_flags.DATASET.value is None) == (_ENV.value is None):
    cli.fail(_PROG, ValueError('pass --dataset (a table for its data) or '
                               '--env (the tables of a distributed online '
                               'run), one of them'), code=2)
  if _ENV.value is not None:
    for flag in (*_NOT_WITH_FEED_TABLE, _FEED_TABLE):
      if flag.present:
        cli.fail(_PROG, ValueError(
            f'--{flag.name} does not apply to --env (its episode table holds '
            'whole episodes, sampled by a min-heap)'), code=2)
  if _ROLLOUTS.value:
    if _ENV.value is None:
      cli.fail(_PROG, ValueError('--rollouts goes with --env (the tables of '
                                 'PPO / A2C actor processes in that env)'),
               code=2)
    for flag in (common_flags.TABLE, _MAX_SIZE):
      if flag.present:
        cli.fail(_PROG, ValueError(
            f'--{flag.name} does not apply to --rollouts (the queue is '
            f'{onpolicy.ROLLOUT_TABLE!r}; actors keep it short)'), code=2)
  if _FEED_TABLE.value:
    for flag in _NOT_WITH_FEED_TABLE:
      if flag.present:
        cli.fail(_PROG, ValueError(
            f'--{flag.name} does not apply to --feed_table (its table holds '
            'whole episodes, sampled by a min-heap)'), code=2)
  if (_CHECKPOINT_INTERVAL.present and _CHECKPOINT_INTERVAL.value > 0
      and not _CHECKPOINT_DIR.value):
    cli.fail(_PROG, ValueError('--checkpoint_interval needs --checkpoint_dir '
                               '(where the checkpoints go)'), code=2)
  cli.quiet_logging()
  table = common_flags.TABLE.value
  if _ENV.value is not None and not common_flags.TABLE.present:
    table = onpolicy.ROLLOUT_TABLE if _ROLLOUTS.value else remote.EPISODE_TABLE
  checkpoint_dir = _CHECKPOINT_DIR.value
  try:
    if _ENV.value is not None:
      served = start_for_env(
          _ENV.value, table=table, max_episodes=_MAX_SIZE.value,
          port=_PORT.value, host=_HOST.value, checkpoint_dir=checkpoint_dir,
          rollouts=_ROLLOUTS.value)
    else:
      served = start(
          common_flags.DATASET.value, split=common_flags.SPLIT.value,
          data_dir=common_flags.DATA_DIR.value,
          download=common_flags.DOWNLOAD.value, table=table,
          sequence_length=cli.parse_sequence_length(_SEQUENCE_LENGTH.value),
          max_size=_MAX_SIZE.value, sampler=_SAMPLER.value, alpha=_ALPHA.value,
          port=_PORT.value, host=_HOST.value, checkpoint_dir=checkpoint_dir,
          feed_table=_FEED_TABLE.value)
  except cli.USER_ERRORS as e:
    cli.fail(_PROG, e)
  server = served.server
  started = time.monotonic()
  periodic = None
  try:
    restored = (f' (restored from {checkpoint_dir})' if served.restored_from
                else '')
    _say(f'table {table!r} holds {served.size} items{restored}')
    if served.restored_from:
      _say(f'restored checkpoint {served.restored_from} (written '
           f'{_when(served.restored_from)})')
    if served.differences:
      _say(f'the restored table {table!r} keeps its checkpointed settings, '
           f'which differ from the flags: {"; ".join(served.differences)}')
    client = server.localhost_client()
    if checkpoint_dir and _CHECKPOINT_INTERVAL.value > 0:
      periodic = _start_periodic(client, table, _CHECKPOINT_INTERVAL.value)
    cli.wait_until_interrupted(on_ready=lambda: print(
        f'serving table {table} on {client_address(_HOST.value, server.port)}',
        flush=True))
    _stop(client, table, served.size, started, periodic, checkpoint_dir)
  except KeyboardInterrupt:  # A second Ctrl-C, while stopping.
    latest = checkpoint_dir and tables.latest_checkpoint(checkpoint_dir)
    print(f'{_PROG}: error: interrupted while stopping; the latest complete '
          f'checkpoint is {latest or "none"}', file=sys.stderr, flush=True)
    sys.exit(130)
  finally:
    server.stop()
    # Drop the reference now: reverb.Server.__del__ run at interpreter exit
    # prints a traceback.
    del server


def _start_periodic(client: reverb.Client, table: str,
                    interval_s: float) -> tables.PeriodicCheckpointer:
  """Checkpoints every `interval_s` on a thread, printing each one."""
  lock = threading.Lock()  # One line at a time from the thread.

  def written(path: str) -> None:
    try:
      size = tables.get_table_info(client, table).current_size
    except Exception:  # pylint: disable=broad-except
      size = '?'
    with lock:
      _say(f'wrote checkpoint {path} ({size} items)')

  def failed(error: BaseException) -> None:
    with lock:
      print(f'{_PROG}: warning: periodic checkpoint failed: '
            f'{cli.one_line(error)}', file=sys.stderr, flush=True)

  return tables.PeriodicCheckpointer(client, interval_s,
                                     on_checkpoint=written, on_error=failed)


def _stop(client: reverb.Client, table: str, size_at_start: int,
          started: float, periodic: Optional[tables.PeriodicCheckpointer],
          checkpoint_dir: Optional[str]) -> None:
  """Prints the summary, then writes the last checkpoint (the last line)."""
  if periodic is not None:
    periodic.stop()
  size = tables.get_table_info(client, table).current_size
  count = f'; {periodic.count} periodic checkpoints' if periodic else ''
  _say(f'stopped after {_duration(time.monotonic() - started)}: table '
       f'{table!r} holds {size} items ({size_at_start} at start){count}')
  if checkpoint_dir:
    _say(f'wrote checkpoint {tables.checkpoint(client)} ({size} items)')
  else:
    _say(f'{size} items dropped (no --checkpoint_dir)')


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser(_PROG))
