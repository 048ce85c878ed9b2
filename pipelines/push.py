r"""Pushes an RLDS dataset into a Reverb table as TF-Agents trajectories.

Examples:

  # Embedded server: push, print the summary, exit (the table goes with it).
  python -m pipelines.push --dataset data/halfcheetah_random_demo

  # Keep the table: checkpoint it, or keep the server up for a learner.
  python -m pipelines.push --dataset DIR --checkpoint_dir /tmp/ckpt
  python -m pipelines.push --dataset DIR --serve

  # Into a server of its own process (python -m pipelines.serve ...).
  python -m pipelines.push --dataset DIR --reverb_address localhost:8000

  # Whole episodes, for a learner's in-memory feed (pipelines.train's
  # default), into a table that pipelines.serve --feed_table made.
  python -m pipelines.push --dataset DIR --feed_table \
      --reverb_address localhost:8000

  # The server died or lost items: restart it from its checkpoint, then push
  # only the episodes its table does not hold.
  python -m pipelines.push --dataset DIR --reverb_address localhost:8000 \
      --resume

  # Four worker processes, each a contiguous quarter of the split; the
  # parent holds the barriers (docs/push.md, "Several processes").
  python -m pipelines.push --dataset DIR --reverb_address localhost:8000 \
      --num_workers 4

Prints a progress bar on stderr, then one JSON line and one readable line of
totals on stdout. Bad input ends the run with one line on stderr, exit code 1
(2 for bad flags, 130 for Ctrl-C); the JSON line is printed in every case.
"""

import contextlib
import dataclasses
import json
import os
import re
import sys
import time
from typing import Any, Iterator, List, Optional

# TensorFlow's C++ start-up chatter would bury the one-line errors and the
# summary this tool prints. The caller can override.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags
import reverb
import tensorflow as tf
import tqdm

from pipelines import cli
from pipelines import common_flags
from rlds_reverb.data import convert
from rlds_reverb.data import datasets
from rlds_reverb.storage import push
from rlds_reverb.storage import shard_workers
from rlds_reverb.storage import shards as shards_lib
from rlds_reverb.storage import tables
from rlds_reverb.replay import episode_table

_PROG = 'push'
# What to do once the table may hold items that no recorded point names.
_RESTART = 'restart the server from its checkpoint and rerun with --resume'
DEFAULT_MAX_SIZE = 2_000_000

_PUSH_FLAGS = common_flags.define_push_flags()
flags.adopt_module_key_flags(common_flags)
_CONNECT_TIMEOUT_S = flags.DEFINE_float(
    'connect_timeout_s', 5.0, 'Give up on --reverb_address when the server '
    'does not answer within this many seconds.', lower_bound=0.001)
_SEQUENCE_LENGTH = flags.DEFINE_string(
    'sequence_length', '2', 'Trajectories per item, as the sequence_length '
    "of TF-Agents' ReverbAddTrajectoryObserver; 0 or none: one item per "
    "episode (TF-Agents' ReverbAddEpisodeObserver).")
flags.register_validator(
    _SEQUENCE_LENGTH, cli.is_sequence_length,
    message='must be a positive integer, or 0 or none for whole episodes')
_STRIDE_LENGTH = flags.DEFINE_integer(
    'stride_length', 1, 'Steps between the starts of consecutive items (1: '
    'overlapping windows). Ignored for whole episodes.', lower_bound=1)
_PRIORITY = flags.DEFINE_float(
    'priority', 1.0, 'Priority of every item written (matters for a '
    'prioritized table).', lower_bound=0.0)
_NUM_THREADS = flags.DEFINE_integer(
    'num_threads', 2, 'Writer threads (of each worker process). They overlap '
    "with reading and with each other (Reverb's writer releases the GIL). 1 "
    "writes items in exactly TF-Agents' order; with more, episodes' items may "
    'interleave.', lower_bound=1)
_NUM_WORKERS = flags.DEFINE_integer(
    'num_workers', 1, 'Worker processes: N > 1 splits the episodes of --split '
    '(or the first --max_episodes) into N contiguous ranges, each pushed by a '
    'process of its own (split[a:b]); this process holds the barriers '
    '(checks the table holds the sum of what the workers confirmed, '
    'checkpoints, records one state file) and prints the totals. --resume '
    'continues every shard where it was recorded.', lower_bound=1)
# Internal: set by a sharded push on its worker processes.
_SHARD_INDEX = flags.DEFINE_integer(
    'shard_index', -1, 'Internal (set by --num_workers on its workers): this '
    'process pushes that shard and talks the barrier protocol on '
    'stdin/stdout.')
_SHARD_OFFSET = flags.DEFINE_integer(
    'shard_offset', 0, 'Internal: index in the whole split of the first '
    'episode of this worker\'s --split slice.', lower_bound=0)
_ZERO_TERMINAL_DISCOUNT = flags.DEFINE_bool(
    'zero_terminal_discount', False, 'Zero the discount of the step that '
    'leads into a terminal state, so TD targets do not bootstrap through it '
    '(truncated endings keep theirs). Off: the data is stored as TF-Agents '
    'converts it. With --feed_table it is on unless given as '
    '--nozero_terminal_discount: learners train on that table as it is.')
_MAX_SIZE = flags.DEFINE_integer(
    'max_size', DEFAULT_MAX_SIZE, 'Embedded server only: most items the table '
    'holds. A push that would exceed it is refused unless --allow_eviction '
    '(then the oldest are evicted, and the summary says how many).',
    lower_bound=1)
_SAMPLER = flags.DEFINE_enum(
    'sampler', 'uniform', list(tables.SAMPLERS), 'Embedded server only: how '
    "learners draw items. 'prioritized' is prioritized replay (see "
    'rlds_reverb.replay.per): items drawn in proportion to priority**--alpha, all '
    'pushed at --priority (1.0: the starting maximum priority).')
_ALPHA = flags.DEFINE_float(
    'alpha', 0.6, 'Embedded server only: priority exponent of --sampler '
    'prioritized (0 is uniform).', lower_bound=0.0)
_CHECKPOINT_DIR = flags.DEFINE_string(
    'checkpoint_dir', None, 'Embedded server only: start from the latest '
    'Reverb checkpoint in this directory (if any) and write a new one there '
    'when the push is done (and again on exit with --serve). A restored '
    'table keeps its own --max_size.')
_SERVE = flags.DEFINE_bool(
    'serve', False, 'Embedded server only: after the push keep the server up, '
    'print its address and wait for Ctrl-C (or SIGTERM), so learners in '
    'other processes can read the table.')

_FEED_TABLE = flags.DEFINE_bool(
    'feed_table', False, "Make/write the table for learners' in-memory feed: "
    'one item per episode, read once per pass by the learner (min-heap '
    'sampler), written unread; --sequence_length, --sampler, --alpha and '
    '--priority do not apply. With --reverb_address the table must be one '
    'that pipelines.serve --feed_table made.')

_SERVER_TIMEOUT_S = flags.DEFINE_float(
    'server_timeout_s', 10.0, 'Deadline of every wait for the server '
    '(confirming written items, table sizes): a server that dies mid-push '
    'ends the push within about this many seconds, with one line that says '
    'what was confirmed and what was in flight. Checkpoints get 6x this '
    '(at least 60 s).', lower_bound=0.001)
_CHECKPOINT_EVERY = flags.DEFINE_integer(
    'checkpoint_every', 100, 'With a state file (--reverb_address, or '
    '--state_file): every N episodes wait until the server confirmed all '
    'items, check that the table holds what this push expects, have the '
    'server write a checkpoint and record in the state file which episodes '
    'it durably holds; 0: only at the end.', lower_bound=0)
_STATE_FILE = flags.DEFINE_string(
    'state_file', None, 'JSON record of which episodes the table durably '
    'holds, for --resume. Default with --reverb_address: '
    'push_state/<table>_<dataset>_<split>.json in the working directory; '
    'embedded: none (needs --checkpoint_dir, where the table survives).')
_RESUME = flags.DEFINE_bool(
    'resume', False, 'Continue the push recorded in the state file: check '
    'it is the same dataset, split, table and item settings, check the '
    'table holds exactly a recorded size (restart the server from its '
    'checkpoint first), skip the episodes it holds, push the rest.')
_ALLOW_EVICTION = flags.DEFINE_bool(
    'allow_eviction', False, 'Push even when the table is too small for the '
    'data (its oldest items are evicted, and the summary counts them). '
    'Without it such a push is refused: up front when the episodes '
    'outnumber the free room, else before the first episode that would not '
    'fit.')
_ALLOW_NONFINITE = flags.DEFINE_bool(
    'allow_nonfinite', False, 'Write episodes with NaN/inf values or '
    'discounts outside [0, 1]. Without it the push stops at the first such '
    'episode, before writing any of it, naming episode, step and field.')

_EMBEDDED_ONLY = (_MAX_SIZE, _SAMPLER, _ALPHA, _CHECKPOINT_DIR, _SERVE)
# What an episode table fixes: whole episodes, min-heap, written unread.
_NOT_WITH_FEED_TABLE = (_SEQUENCE_LENGTH, _SAMPLER, _PRIORITY, _ALPHA)


@dataclasses.dataclass(frozen=True)
class PushConfig:
  """What to push and where; each field is the flag of the same name."""
  dataset: str
  split: str = 'train'
  data_dir: Optional[str] = None
  download: bool = True
  reverb_address: str = ''
  connect_timeout_s: float = 5.0
  table: str = tables.DEFAULT_TABLE
  sequence_length: Optional[int] = 2
  stride_length: int = 1
  max_episodes: int = 0
  priority: float = 1.0
  zero_terminal_discount: bool = False
  num_threads: int = 2
  num_workers: int = 1
  shard_index: int = -1
  shard_offset: int = 0
  max_size: int = DEFAULT_MAX_SIZE
  sampler: str = 'uniform'
  alpha: float = 0.6
  checkpoint_dir: Optional[str] = None
  serve: bool = False
  feed_table: bool = False
  server_timeout_s: float = 10.0
  checkpoint_every: int = 100
  state_file: Optional[str] = None
  resume: bool = False
  allow_eviction: bool = False
  allow_nonfinite: bool = False

  def fingerprint(self, episodes: Optional[int]) -> dict:
    """What a resumed push must share with the one it continues."""
    dataset = (os.path.abspath(self.dataset) if os.path.isdir(self.dataset)
               else self.dataset)
    return dict(dataset=dataset, split=self.split,
                max_episodes=self.max_episodes, episodes=episodes,
                table=self.table, feed_table=self.feed_table,
                sequence_length=self.sequence_length,
                stride_length=self.stride_length, priority=self.priority,
                zero_terminal_discount=self.zero_terminal_discount)


def default_state_file(config: PushConfig) -> str:
  """push_state/<table>_<dataset>_<split>.json, in the working directory."""
  name = os.path.basename(os.path.normpath(config.dataset)) or 'dataset'
  slug = re.sub(r'[^A-Za-z0-9._-]+', '_', f'{config.table}_{name}_'
                f'{config.split}').strip('_')
  return os.path.join('push_state', f'{slug}.json')


@dataclasses.dataclass
class Target:
  """The table being written: a client, and the server if it is ours."""
  client: reverb.Client
  address: str
  server: Optional[reverb.Server] = None


@dataclasses.dataclass
class PushReport:
  """The totals a push prints; `to_json` is the machine-readable line."""
  episodes: int
  steps: int
  items: int
  terminated: int
  truncated: int
  seconds: float
  steps_per_second: float
  table: str
  address: str
  table_size: int
  empty_episodes: int = 0
  evicted: int = 0
  checkpoint: Optional[str] = None
  error: Optional[str] = None
  # Episodes [first_episode, confirmed_episodes) of the dataset were
  # confirmed by the server (first_episode > 0: a resumed push).
  first_episode: int = 0
  confirmed_episodes: int = 0
  state_file: Optional[str] = None

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self))

  def to_text(self) -> str:
    text = (f'{_PROG}: {self.episodes} episodes ({self.terminated} terminated, '
            f'{self.truncated} truncated), {self.steps} steps -> {self.items} '
            f'items in {self.seconds:.2f} s ({self.steps_per_second:.0f} '
            f'steps/s); table {self.table!r} at {self.address} holds '
            f'{self.table_size} items')
    if self.first_episode:
      text += f' (resumed at episode {self.first_episode})'
    if self.evicted:
      text += (f'; {self.evicted} items evicted (--allow_eviction): a bigger '
               'table keeps them')
    if self.empty_episodes:
      text += f'; {self.empty_episodes} empty episodes held no step'
    return text


def load_dataset(config: PushConfig) -> tuple[tf.data.Dataset, Any]:
  """Returns the episodes to push and their trajectory spec.

  Raises:
    datasets.DatasetNotFoundError: Unknown name, or no dataset at the path.
    datasets.DatasetNotAvailableError: Known name, data not available.
    ValueError: Unknown split, or data that is not RLDS.
  """
  dataset = datasets.load(config.dataset, split=config.split,
                          data_dir=config.data_dir, download=config.download)
  spec = convert.create_trajectory_data_spec(dataset)
  if config.max_episodes:
    dataset = dataset.take(config.max_episodes)
  return dataset, spec


@contextlib.contextmanager
def open_table(config: PushConfig, spec: Any) -> Iterator[Target]:
  """Yields the target table, checked against `spec`; stops our server after.

  Raises:
    ConnectionError: Nothing answers at `config.reverb_address`.
    tables.TableNotFoundError: The server has no `config.table`.
    ValueError: The table's signature does not match `spec`, or the table
      is an episode table and `config.feed_table` is off, or the other way
      round (see `episode_table.check_table_kind`).
    OSError, ValueError: The embedded server cannot start or restores a
      table of another signature (see `tables.start_table_server`).
  """
  if config.reverb_address:
    client = tables.connect(config.reverb_address,
                            timeout_s=config.connect_timeout_s)
    tables.check_signature(client, config.table, spec)
    episode_table.check_table_kind(client, config.table,
                                   episodes=config.feed_table)
    yield Target(client, config.reverb_address)
    return
  if config.feed_table:
    server = tables.start_table_server(
        config.table, spec, checkpoint_dir=config.checkpoint_dir,
        table=episode_table.make_table(config.table, spec,
                                       max_episodes=config.max_size))
  else:
    server = tables.start_table_server(
        config.table, spec, checkpoint_dir=config.checkpoint_dir,
        max_size=config.max_size, sequence_length=config.sequence_length,
        sampler=config.sampler, alpha=config.alpha)
  target = Target(server.localhost_client(), f'localhost:{server.port}',
                  server)
  try:
    try:
      # A table restored from --checkpoint_dir keeps the kind it was made
      # with.
      episode_table.check_table_kind(target.client, config.table,
                                     episodes=config.feed_table)
    except ValueError as e:
      raise ValueError(f'the checkpoint in {config.checkpoint_dir} restored '
                       f'another kind of table: {e}') from e
    yield target
  finally:
    target.server = None
    server.stop()
    # Drop the last reference now: reverb.Server.__del__ run at interpreter
    # exit prints a traceback.
    del server


def make_ledger(config: PushConfig, target: Target,
                dataset: Optional[tf.data.Dataset],
                fingerprint: Optional[dict] = None) -> push.PushLedger:
  """The ledger of this push: state file, checkpoints, size checks.

  Raises:
    push.ResumeError: See `push.PushLedger`; with advice on the flags.
    push.ServerUnavailableError: The server does not answer in time.
  """
  if fingerprint is None:
    cardinality = int(dataset.cardinality())
    fingerprint = config.fingerprint(cardinality if cardinality >= 0
                                     else None)
  try:
    return push.PushLedger(
        target.client, config.table, fingerprint=fingerprint,
        state_path=config.state_file or None, resume=config.resume,
        checkpoints=bool(config.reverb_address or config.checkpoint_dir),
        timeout_s=config.server_timeout_s)
  except push.ResumeError as e:
    if config.resume:
      raise
    raise push.ResumeError(
        f'{e}: finish it with --resume, or delete the file to push again '
        'from the start (the table keeps what it holds: duplicates)') from e


def _advice(error: BaseException, config: PushConfig,
            ledger: Optional[push.PushLedger]) -> BaseException:
  """The library's error with what to do about it, in flags."""
  if isinstance(error, push.TableFullError):
    bigger = ('push into a bigger table (pipelines.serve --max_size)'
              if config.reverb_address else 'a bigger --max_size')
    return push.TableFullError(f'{error}; pass --allow_eviction or {bigger}')
  if ledger is None or not config.state_file:
    return error
  if isinstance(error, push.ServerUnavailableError):
    return push.ServerUnavailableError(
        f'{error}; {ledger.durable()}: {_RESTART}')
  if isinstance(error, push.ItemsLostError):  # Its text ends on durable().
    return push.ItemsLostError(f'{error}: restart the server from that '
                               'checkpoint and rerun with --resume')
  return error


def push_dataset(dataset: tf.data.Dataset, target: Target,
                 config: PushConfig, stats: push.PushStats,
                 signals: Optional[cli.Signals] = None) -> PushReport:
  """Pushes `dataset` into the target table with a progress bar on stderr.

  A `push.PushLedger` checks the table's size at each barrier and at the
  end; with a state file it checkpoints the server every
  `config.checkpoint_every` episodes and records what is durable (and a
  resumed push skips what the table holds). `stats` is filled in as
  episodes are written; when the push fails part-way the JSON summary of
  what was written (with an "error") is printed to stdout before the error
  propagates.

  Raises:
    tf.errors.InvalidArgumentError: An invalid episode (see
      `push.push_rlds_to_table`).
    validate.InvalidDataError: NaN/inf or a bad discount (unless
      `config.allow_nonfinite`).
    push.TableFullError, push.ServerUnavailableError, push.ItemsLostError,
      push.ResumeError: See `push.push_rlds_to_table`, `push.PushLedger`.
  """
  ledger = make_ledger(config, target, dataset)
  if ledger.first_episode:
    dataset = dataset.skip(ledger.first_episode)
  stats.first_episode = stats.confirmed_position = ledger.first_episode
  with tqdm.tqdm(desc=f'{_PROG} {config.table}', unit='step') as bar:

    def progress(steps: int) -> None:
      # After each episode: a signal whose KeyboardInterrupt was dropped
      # still ends the push here.
      if signals is not None:
        signals.check()
      bar.update(steps)

    try:
      push.push_rlds_to_table(
          dataset, target.client, config.table,
          sequence_length=config.sequence_length,
          stride_length=config.stride_length, priority=config.priority,
          zero_terminal_discount=config.zero_terminal_discount, stats=stats,
          progress=progress, num_workers=config.num_threads,
          validate=not config.allow_nonfinite,
          allow_eviction=config.allow_eviction,
          timeout_s=config.server_timeout_s,
          checkpoint_every=(config.checkpoint_every if config.state_file
                            else 0),
          on_barrier=ledger.on_barrier, first_episode=ledger.first_episode)
    except (*cli.USER_ERRORS, KeyboardInterrupt) as e:
      bar.close()
      error = _advice(e, config, ledger)
      with contextlib.suppress(Exception):  # Keep the push's error.
        print(make_report(stats, target, config, ledger,
                          error if not isinstance(e, KeyboardInterrupt)
                          else None).to_json(), flush=True)
      if error is e:
        raise
      raise error from None
  report = make_report(stats, target, config, ledger)
  report.checkpoint = ledger.last_checkpoint
  return report


def make_report(stats: push.PushStats, target: Target, config: PushConfig,
                ledger: Optional[push.PushLedger] = None,
                error: Optional[BaseException] = None) -> PushReport:
  """The report of what `stats` counted, with the table's size now (None
  when the server does not answer within the deadline)."""
  size = None
  if not isinstance(error, push.ServerUnavailableError):  # Else no wait.
    with contextlib.suppress(Exception):
      size = push.table_info(target.client, config.table,
                             config.server_timeout_s).current_size
  return PushReport(
      episodes=stats.episodes, steps=stats.steps, items=stats.items,
      terminated=stats.terminated, truncated=stats.truncated,
      seconds=round(stats.seconds, 3),
      steps_per_second=round(stats.steps_per_second, 1), table=config.table,
      address=target.address, table_size=size,
      empty_episodes=stats.empty_episodes,
      evicted=(ledger.evicted(stats, size)
               if ledger is not None and size is not None else 0),
      error=cli.one_line(error) if error else None,
      first_episode=stats.first_episode,
      confirmed_episodes=stats.confirmed_position,
      state_file=config.state_file or None)


def serve(target: Target, config: PushConfig) -> None:
  """Keeps our server up until Ctrl-C/SIGTERM; checkpoints it before exit."""
  cli.wait_until_interrupted(on_ready=lambda: print(
      f'serving table {config.table} on {target.address} (Ctrl-C to stop)',
      flush=True))
  if config.checkpoint_dir:
    print(f'{_PROG}: wrote checkpoint {tables.checkpoint(target.client)}',
          flush=True)


# ------------------------------------------------------ --num_workers N > 1


def push_shard(config: PushConfig) -> None:
  """A worker of a sharded push: pushes its --split slice into
  --reverb_address, printing barrier lines (see `rlds_reverb.storage.shards`) and,
  at the end, its JSON summary on stdout; an error is one JSON line with
  "shard_error" (the parent prints it), exit 1 (130 for Ctrl-C)."""
  index = config.shard_index
  stats = push.PushStats()
  target = None
  error, code = None, 0

  def on_barrier(barrier_stats: push.PushStats, reason: str) -> None:
    print(shards_lib.barrier_line(index, barrier_stats, reason), flush=True)
    if reason == 'every':
      line = sys.stdin.readline()
      if line.strip() != shards_lib.GO:
        raise RuntimeError('the parent process went away at a barrier')

  try:
    dataset, spec = load_dataset(config)
    with open_table(config, spec) as target:
      # Its stderr is a pipe the parent relays line by line: a refresh
      # every few seconds, each a line of its own there.
      with tqdm.tqdm(desc=f'{_PROG} {config.table} shard {index}',
                     unit='step', mininterval=2.0, ascii=True) as bar:
        push.push_rlds_to_table(
            dataset, target.client, config.table,
            sequence_length=config.sequence_length,
            stride_length=config.stride_length, priority=config.priority,
            zero_terminal_discount=config.zero_terminal_discount,
            stats=stats, progress=bar.update,
            num_workers=config.num_threads,
            validate=not config.allow_nonfinite,
            allow_eviction=config.allow_eviction,
            timeout_s=config.server_timeout_s,
            checkpoint_every=config.checkpoint_every, on_barrier=on_barrier,
            first_episode=config.shard_offset)
      report = make_report(stats, target, config)
  except KeyboardInterrupt:
    error, code = RuntimeError('interrupted'), 130
  except cli.USER_ERRORS as e:
    error, code = e, 1
  if error is not None:
    report = make_report(stats, target, config, error=error) if target else (
        PushReport(stats.episodes, stats.steps, stats.items, stats.terminated,
                   stats.truncated, stats.seconds, 0.0, config.table,
                   config.reverb_address, None,
                   error=cli.one_line(error)))
  summary = dataclasses.asdict(report)
  summary[shards_lib.ERROR_KEY] = cli.one_line(error) if error else None
  print(json.dumps(summary), flush=True)
  if error is not None:  # As in `main`: no teardown after a failed push.
    cli.exit_now(None, code)
  sys.exit(code)


def _child_args(config: PushConfig, shard: shards_lib.Shard,
                address: str) -> List[str]:
  """The command line of the worker of `shard` (flags from `config`)."""
  args = ['--dataset', config.dataset,
          '--split', f'{config.split}[{shard.position}:{shard.stop}]',
          '--reverb_address', address,
          f'--connect_timeout_s={config.connect_timeout_s!r}',
          '--table', config.table,
          f'--stride_length={config.stride_length}',
          f'--num_threads={config.num_threads}', '--num_workers=1',
          f'--server_timeout_s={config.server_timeout_s!r}',
          f'--checkpoint_every='
          f'{config.checkpoint_every if config.state_file else 0}',
          '--state_file=', f'--shard_index={shard.index}',
          f'--shard_offset={shard.position}',
          '--zero_terminal_discount' if config.zero_terminal_discount else
          '--nozero_terminal_discount']
  if config.feed_table:
    args.append('--feed_table')
  else:
    args += [f'--sequence_length={config.sequence_length or 0}',
             f'--priority={config.priority!r}']
  if config.data_dir:
    args += ['--data_dir', config.data_dir]
  if not config.download:
    args.append('--nodownload')
  if config.allow_eviction:
    args.append('--allow_eviction')
  if config.allow_nonfinite:
    args.append('--allow_nonfinite')
  return args


def push_sharded(config: PushConfig) -> int:
  """`--num_workers N`: pushes the split in N worker processes; returns the
  exit code (0, 1 on an error, 130 on Ctrl-C) after printing the summary."""
  start_time = time.perf_counter()
  try:
    base = datasets.load(config.dataset, split=config.split,
                         data_dir=config.data_dir, download=config.download)
    spec = convert.create_trajectory_data_spec(base)
    episodes = int(base.cardinality())
    if episodes < 0:
      raise ValueError(f'the episode count of split {config.split!r} is '
                       'unknown: --num_workers needs it to shard')
    if config.max_episodes:
      episodes = min(episodes, config.max_episodes)
    ranges = shards_lib.split_ranges(episodes, config.num_workers)
    with open_table(config, spec) as target:
      fingerprint = dict(config.fingerprint(episodes),
                         num_workers=config.num_workers)
      ledger = make_ledger(config, target, None, fingerprint)
      shards = shards_lib.shards_from_point(ledger.start, ranges)
      return _run_workers(config, target, ledger, shards, start_time)
  except KeyboardInterrupt:
    cli.fail(_PROG, RuntimeError('interrupted before the workers started'),
             code=130)
  except cli.USER_ERRORS as e:
    cli.fail(_PROG, e)


def _lost(error: Exception, ledger: push.PushLedger,
          shards: List[shards_lib.Shard]) -> str:
  """The line of a barrier that failed: what is not durable, what to do."""
  text = str(error)
  if 'not durably stored' not in text:
    text += ('; not durably stored: ' +
             shards_lib.not_durable(shards, ledger.state.last_checkpointed))
  return f'{text}; {ledger.durable()}: {_RESTART}'


def _run_workers(config: PushConfig, target: Target,
                 ledger: push.PushLedger, shards: List[shards_lib.Shard],
                 start_time: float) -> int:
  def failure_note() -> str:
    if not config.state_file:
      return ''
    return ('; not durably stored: ' + shards_lib.not_durable(
        shards, ledger.state.last_checkpointed) + f'; {ledger.durable()}')

  outcome = shard_workers.run_workers(
      shards, lambda shard: [sys.executable, '-m', 'pipelines.push',
                             *_child_args(config, shard, target.address)],
      ledger, config.table, lost=lambda e: _lost(e, ledger, shards),
      failure_note=failure_note,
      stop_timeout_s=3 * config.server_timeout_s + 30)
  failed, interrupted = outcome.failed, outcome.interrupted
  unrecorded = outcome.unrecorded
  summary = _sharded_summary(config, target, ledger, shards, start_time,
                             failed)
  print(json.dumps(summary))
  print(f'{_PROG}: {config.num_workers} workers: {summary["episodes"]} '
        f'episodes, {summary["steps"]} steps -> {summary["items"]} items in '
        f'{summary["seconds"]:.2f} s; table {config.table!r} at '
        f'{target.address} holds {summary["table_size"]} items', flush=True)
  if failed is None and not interrupted:
    if ledger.last_checkpoint:
      print(f'{_PROG}: wrote checkpoint {ledger.last_checkpoint}', flush=True)
    if config.serve:
      serve(target, config)
    return 0
  if interrupted:
    resume = (' (--resume pushes the rest)' if config.state_file else '')
    if unrecorded:  # --resume then needs the table as a point recorded it.
      resume = f'{unrecorded}: {ledger.durable()}: {_RESTART}'
    print(f'{_PROG}: error: interrupted after {summary["episodes"]} '
          f'episodes, {summary["items"]} items written'
          f'{resume}', file=sys.stderr, flush=True)
    return 130
  print(f'{_PROG}: error: {failed}{unrecorded}', file=sys.stderr, flush=True)
  return 1


def _sharded_summary(config: PushConfig, target: Target,
                     ledger: push.PushLedger,
                     shards: List[shards_lib.Shard], start_time: float,
                     error: Optional[str]) -> dict:
  """The parent's JSON summary: totals summed over the workers, per shard."""
  reports = [s.report or {} for s in shards]
  total = lambda key: sum(r.get(key) or 0 for r in reports)
  size = None
  with contextlib.suppress(Exception):
    size = ledger.size()
  seconds = time.perf_counter() - start_time
  steps = total('steps')
  return dict(
      episodes=total('episodes'), steps=steps, items=total('items'),
      terminated=total('terminated'), truncated=total('truncated'),
      seconds=round(seconds, 3),
      steps_per_second=round(steps / seconds, 1) if seconds else 0.0,
      table=config.table, address=target.address, table_size=size,
      empty_episodes=total('empty_episodes'),
      checkpoint=ledger.last_checkpoint, error=error,
      confirmed_episodes=sum(s.confirmed - s.start for s in shards),
      state_file=config.state_file or None, num_workers=config.num_workers,
      shards=[s.figures() for s in shards])


def config_from_flags() -> PushConfig:
  """Reads the flags; fails on values that absl's own checks let through."""
  if common_flags.DATASET.value is None:
    cli.fail(_PROG, ValueError('--dataset is required'), code=2)
  reverb_address = _PUSH_FLAGS.reverb_address.value
  if _FEED_TABLE.value:
    for flag in _NOT_WITH_FEED_TABLE:
      if flag.present:
        cli.fail(_PROG, ValueError(
            f'--{flag.name} does not apply to --feed_table (its table holds '
            'whole episodes, sampled by a min-heap, written unread)'), code=2)
  if reverb_address:
    for flag in _EMBEDDED_ONLY:
      if flag.present:
        cli.fail(_PROG, ValueError(
            f'--{flag.name} applies to the embedded server only, not to '
            f'--reverb_address (see pipelines.serve for its counterpart)'),
                 code=2)
  feed_table = _FEED_TABLE.value
  state_file = _STATE_FILE.value
  if not reverb_address and state_file and not _CHECKPOINT_DIR.value:
    cli.fail(_PROG, ValueError(
        '--state_file with the embedded server needs --checkpoint_dir: '
        'without it the table dies with this process'), code=2)
  if _RESUME.value and not (reverb_address or state_file):
    cli.fail(_PROG, ValueError(
        '--resume needs a state file: --reverb_address (default '
        'push_state/...), or --state_file with --checkpoint_dir'), code=2)
  config = PushConfig(
      dataset=common_flags.DATASET.value, split=common_flags.SPLIT.value,
      data_dir=common_flags.DATA_DIR.value,
      download=common_flags.DOWNLOAD.value, reverb_address=reverb_address,
      connect_timeout_s=_CONNECT_TIMEOUT_S.value,
      table=common_flags.TABLE.value,
      sequence_length=(None if feed_table else
                       cli.parse_sequence_length(_SEQUENCE_LENGTH.value)),
      stride_length=_STRIDE_LENGTH.value,
      max_episodes=_PUSH_FLAGS.max_episodes.value,
      priority=episode_table.UNREAD if feed_table else _PRIORITY.value,
      # Learners train on a feed table as it is: the terminal fix is on
      # there unless the flag turns it off.
      zero_terminal_discount=(
          _ZERO_TERMINAL_DISCOUNT.value
          if flags.FLAGS['zero_terminal_discount'].present or not feed_table
          else True),
      num_threads=_NUM_THREADS.value, num_workers=_NUM_WORKERS.value,
      shard_index=_SHARD_INDEX.value, shard_offset=_SHARD_OFFSET.value,
      max_size=_MAX_SIZE.value,
      sampler=_SAMPLER.value, alpha=_ALPHA.value,
      checkpoint_dir=_CHECKPOINT_DIR.value, serve=_SERVE.value,
      feed_table=feed_table, server_timeout_s=_SERVER_TIMEOUT_S.value,
      checkpoint_every=_CHECKPOINT_EVERY.value, state_file=state_file,
      resume=_RESUME.value, allow_eviction=_ALLOW_EVICTION.value,
      allow_nonfinite=_ALLOW_NONFINITE.value)
  if _NUM_WORKERS.value > 1:
    if re.search(r'[\[+]', common_flags.SPLIT.value):
      cli.fail(_PROG, ValueError(
          '--num_workers > 1 takes a whole split (it slices it itself), got '
          f'--split {common_flags.SPLIT.value!r}'), code=2)
    if _SHARD_INDEX.value >= 0:
      cli.fail(_PROG, ValueError('--shard_index is for --num_workers 1'),
               code=2)
  if reverb_address and state_file is None:
    config = dataclasses.replace(config,
                                 state_file=default_state_file(config))
  return config


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(_PROG, ValueError(f'unexpected arguments: {" ".join(argv[1:])}'),
             code=2)
  cli.quiet_logging()
  config = config_from_flags()
  # Ctrl-C and SIGTERM end a push with its summary (exit 130), also when
  # the process was started in the background with SIGINT ignored.
  signals = cli.Signals()
  if config.shard_index >= 0:
    push_shard(config)
    return
  if config.num_workers > 1:
    sys.exit(push_sharded(config))
  stats = push.PushStats()
  try:
    dataset, spec = load_dataset(config)
    with open_table(config, spec) as target:
      report = push_dataset(dataset, target, config, stats, signals)
      print(report.to_json())
      print(report.to_text(), flush=True)
      if report.checkpoint:
        print(f'{_PROG}: wrote checkpoint {report.checkpoint}', flush=True)
      if config.serve:
        serve(target, config)
  except KeyboardInterrupt:
    resume = (f' ({push.episode_range(0, stats.confirmed_position)} '
              'confirmed: --resume pushes the rest)'
              if config.state_file and stats.confirmed_position else '')
    if stats.stop_unrecorded:
      resume = _unrecorded_stop(stats)
    # Without teardown: the interrupted writer's C++ threads can abort it
    # (exit -6 instead of 130); what was confirmed is already on disk.
    cli.fail_now(_PROG, RuntimeError(
        f'interrupted after {stats.episodes} episodes, {stats.items} items '
        f'written{resume}'), code=130)
  except cli.USER_ERRORS as e:
    if stats.stop_unrecorded:  # Said before the error, which stays last.
      print(f'{_PROG}: {_unrecorded_stop(stats)[2:]}', file=sys.stderr)
    cli.fail_now(_PROG, e)


def _unrecorded_stop(stats: push.PushStats) -> str:
  return f'; the stop was not recorded ({stats.stop_unrecorded}): {_RESTART}'


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser(_PROG))
