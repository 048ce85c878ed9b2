"""Reverb servers and tables: construction, signatures and checkpoints.

A table made here stores TF-Agents trajectories with the signature that
TF-Agents' `ReverbReplayBuffer` and `ReverbAdd*Observer` expect: the data spec
from `convert.create_trajectory_data_spec` with one outer time dimension of
unknown size,

    data spec   Trajectory(observation=TensorSpec([17]), reward=TensorSpec([]))
    signature   Trajectory(observation=TensorSpec([None, 17]),
                           reward=TensorSpec([None]))

so one table takes items of any length: pairs of steps, longer windows or
whole episodes. Writers and readers find each other through the server, which
runs in the same process (`start_server`) or anywhere on the network
(`connect`). Checkpoints are Reverb's own (`DefaultCheckpointer`): a server
started on a checkpoint directory restores the latest checkpoint in it.

Servers that may be gone, and who can reach them (`network`, whose public
names are re-exported here): `get_table_info`, `checkpoint` and `connect`
have deadlines, and `call_with_deadline` gives one to any other blocking
client call, so a dead server raises one `ServerUnavailableError` line
naming the address and what was in flight. Reverb 0.14 has no
authentication and binds every interface ([::]:port) whatever one asks:
`start_server` says so with an `InsecureServerWarning` that names the real
listening address (docs/security.md).
"""

import math
import numbers
import os
import threading
import time
from typing import Any, Callable, List, Optional, Sequence

import reverb
from reverb import reverb_types
from reverb.platform import checkpointers_lib
import tensorflow as tf
import tree
from tf_agents.specs import tensor_spec

from rlds_reverb.storage import network

DEFAULT_TABLE = 'rlds'
SAMPLERS = ('uniform', 'fifo', 'lifo', 'prioritized')
REMOVERS = ('fifo', 'lifo', 'uniform')

# The first sentence of every signature error: TF-Agents' own message, word
# for word, so code that matches on it keeps working.
SIGNATURE_MISMATCH = (
    'Replay buffer table signature spec should match RLDS data spec.'
)

# At most this many differences are spelled out in a signature error.
_MAX_LISTED_DIFFERENCES = 6

# Seconds a checkpoint may take: it writes every item to disk, so more than
# the DEFAULT_TIMEOUT_S that the server has to answer the ping before it.
DEFAULT_CHECKPOINT_TIMEOUT_S = 600.0

# From `network`, so that callers of `tables` need no second module.
DEFAULT_TIMEOUT_S = network.DEFAULT_TIMEOUT_S
SECURITY_DOC = network.SECURITY_DOC
ServerUnavailableError = network.ServerUnavailableError
InsecureServerWarning = network.InsecureServerWarning
call_with_deadline = network.call_with_deadline
is_unavailable = network.is_unavailable
parse_address = network.parse_address
listening_addresses = network.listening_addresses
is_loopback_address = network.is_loopback_address

# How often PeriodicCheckpointer.stop looks whether its thread is done.
_POLL_S = 0.1


class TableNotFoundError(KeyError, ValueError):
  """A table name that the Reverb server does not have.

  A `KeyError` because it is a failed lookup and a `ValueError` because the
  name usually comes from a bad argument; `str()` gives the plain message
  (a bare `KeyError` would quote it).
  """

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else ''


def make_table(
    name: str,
    data_spec: Any,
    *,
    max_size: int,
    sequence_length: Optional[int] = 2,
    sampler: str = 'uniform',
    remover: str = 'fifo',
    alpha: float = 0.6,
    min_size_to_sample: int = 1,
) -> reverb.Table:
  """Builds a table for TF-Agents trajectories of `data_spec`.

  The signature's outer dimension is left unknown (not `sequence_length`),
  because that is what TF-Agents compares against: `push_rlds_to_reverb`
  rejects a table whose signature is not `add_outer_dim(data_spec)`.

  Args:
    name: Table name, the key that writers and readers use.
    data_spec: Nest of `tf.TensorSpec` (or `ArraySpec`) for one trajectory,
      e.g. `convert.create_trajectory_data_spec(rlds_data)`.
    max_size: Most items the table holds; once full, `remover` picks the item
      that makes room for a new one.
    sequence_length: Steps per item the writers will use, or None for whole
      episodes. Checked here so that a bad value fails where it is set; the
      table itself takes items of any length.
    sampler: How items are drawn: 'uniform', 'fifo', 'lifo' or
      'prioritized' (probability proportional to priority**alpha).
    remover: Which item is removed when the table is full: 'fifo', 'lifo' or
      'uniform'.
    alpha: Priority exponent of the 'prioritized' sampler; 0 is uniform.
    min_size_to_sample: Sampling blocks until the table holds this many
      items (Reverb's `MinSize` rate limiter).

  Returns:
    A `reverb.Table`, to be served with `start_server`.

  Raises:
    ValueError: If `name` is empty.
    ValueError: If `data_spec` holds no specs.
    ValueError: If `max_size` is not a positive integer.
    ValueError: If `sequence_length` is neither None nor a positive integer.
    ValueError: If `sampler` or `remover` is not one of the names above.
    ValueError: If `alpha` is negative.
    ValueError: If `min_size_to_sample` is not in [1, max_size].
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f'name must be a non-empty string, got {name!r}.')
  if not tree.flatten(data_spec):
    raise ValueError(
        f'data_spec must hold at least one spec, got {data_spec!r}.')
  _check_positive_int('max_size', max_size)
  if sequence_length is not None:
    _check_positive_int('sequence_length', sequence_length,
                        allowed='a positive integer or None (whole episodes)')
  _check_choice('sampler', sampler, SAMPLERS)
  _check_choice('remover', remover, REMOVERS)
  if not alpha >= 0:
    raise ValueError(f'alpha must be >= 0, got {alpha!r}.')
  _check_positive_int('min_size_to_sample', min_size_to_sample,
                      allowed=f'an integer in [1, max_size={max_size}]')
  if min_size_to_sample > max_size:
    raise ValueError(
        f'min_size_to_sample must be an integer in [1, max_size={max_size}], '
        f'got {min_size_to_sample}: the table could never be sampled.')

  signature = tensor_spec.add_outer_dim(tensor_spec.from_spec(data_spec))
  return reverb.Table(
      name=name,
      sampler=_make_selector(sampler, alpha),
      remover=_make_selector(remover, alpha),
      max_size=max_size,
      rate_limiter=reverb.rate_limiters.MinSize(min_size_to_sample),
      signature=signature,
  )


def start_server(
    tables: Sequence[reverb.Table],
    *,
    port: Optional[int] = None,
    checkpoint_dir: Optional[str] = None,
    host: str = 'localhost',
) -> reverb.Server:
  """Starts a Reverb server in this process.

  With `checkpoint_dir`, checkpoints (see `checkpoint`) go there and the
  latest one in it is restored at start. Reverb restores each checkpointed
  table whole, configuration included: a restored table keeps the
  checkpoint's max_size, selectors and signature, not those of `tables`
  (`table_differences` lists them).

  Reverb 0.14 cannot bind one interface: its C++ server always listens on
  [::]:port, every interface, and has no authentication. `host` says where
  the server is meant to be reached ('localhost' by default); whatever it is,
  once the server is up this reads the real listening address
  (`listening_addresses`) and, if it is not loopback only, warns with an
  `InsecureServerWarning` that names it and points to docs/security.md.

  Args:
    tables: Tables to serve, e.g. from `make_table`.
    port: Port to serve on; None picks a free one (`server.port`).
    checkpoint_dir: Directory for checkpoints; None uses a temporary one, so
      nothing outlives the process.
    host: Host name or IP that clients are meant to use; see above.

  Returns:
    The running `reverb.Server`; call `stop()` when done.

  Raises:
    ValueError: If `tables` is empty.
    ValueError: If `port` is not in [1, 65535].
    ValueError: If `host` is not a host name or IP address.
    ValueError: If `checkpoint_dir` exists and is not a directory.
    ValueError: If the checkpoint holds a table that `tables` does not name.
    OSError: If `port` is already in use.
  """
  tables = list(tables)
  if not tables:
    raise ValueError('tables must name at least one reverb.Table, got none.')
  network.check_host(host)
  if port is not None:
    if (isinstance(port, bool) or not isinstance(port, numbers.Integral)
        or not 0 < port < 65536):
      raise ValueError(f'port must be an integer in [1, 65535], got {port!r}.')
    # gRPC binds with SO_REUSEPORT, so a second server on a busy port starts
    # "fine" and the two split the clients between them. Refuse instead.
    network.check_port_free(port)
  checkpointer = None
  if checkpoint_dir:
    if os.path.exists(checkpoint_dir) and not os.path.isdir(checkpoint_dir):
      raise ValueError(
          f'checkpoint_dir {checkpoint_dir!r} exists and is not a directory.')
    checkpointer = checkpointers_lib.DefaultCheckpointer(path=checkpoint_dir)
  try:
    server = reverb.Server(tables, port=None if port is None else int(port),
                           checkpointer=checkpointer)
  except ValueError as e:
    if checkpoint_dir and 'load table' in str(e):
      raise ValueError(
          f'cannot restore the checkpoint in {checkpoint_dir}: {e}') from e
    raise
  network.warn_if_exposed(server.port, host)
  return server


def start_table_server(
    name: str,
    data_spec: Any,
    *,
    port: Optional[int] = None,
    checkpoint_dir: Optional[str] = None,
    host: str = 'localhost',
    table: Optional[reverb.Table] = None,
    **table_kwargs: Any,
) -> reverb.Server:
  """Starts a server with one table for `data_spec` (`make_table`).

  What pipelines want from an embedded server: with `checkpoint_dir`, the
  table comes back from the latest checkpoint, and is checked to still hold
  trajectories of `data_spec`.

  Args:
    name: Table name.
    data_spec: Trajectory spec, as for `make_table`.
    port: See `start_server`.
    checkpoint_dir: See `start_server`.
    host: See `start_server`.
    table: A table made elsewhere for `data_spec` (e.g. by
      `replay.episode_table.make_table`), served instead of `make_table`'s;
      it must be called `name`, and `table_kwargs` must be empty.
    **table_kwargs: `make_table` keyword arguments (max_size is required).

  Returns:
    The running `reverb.Server`.

  Raises:
    ValueError: See `make_table` and `start_server`; also if the checkpoint
      holds a table `name` with another signature.
    ValueError: If `table` is given with `table_kwargs` or another name.
    OSError: If `port` is already in use.
  """
  if table is not None and (table_kwargs or table.name != name):
    raise ValueError(f'table must be called {name!r} and come without '
                     f'make_table arguments, got table {table.name!r} and '
                     f'{sorted(table_kwargs)}.')
  if table is None:
    table = make_table(name, data_spec, **table_kwargs)
  server = start_server([table], port=port, checkpoint_dir=checkpoint_dir,
                        host=host)
  try:
    check_signature(server.localhost_client(), name, data_spec)
  except ValueError as e:  # Only a restored table can differ.
    server.stop()
    del server  # Not left to the traceback: its __del__ at exit would fail.
    raise ValueError(f'the checkpoint in {checkpoint_dir} holds another table '
                     f'{name!r} than the data needs: {e}') from e
  return server


def connect(address: str, *, timeout_s: float = 5.0) -> reverb.Client:
  """Connects to a Reverb server and checks that it answers.

  A `reverb.Client` connects lazily and its calls wait for the server forever,
  so an address where nothing listens would hang the first write. This asks
  the server for its tables with a deadline instead; for 'localhost:port' and
  'ip:port' a refused TCP connection fails at once, without the wait, and so
  does an address that is not 'host:port'.

  Args:
    address: 'host:port' of the server.
    timeout_s: Seconds to wait for the answer (rounded up to whole seconds,
      which is what Reverb takes).

  Returns:
    A `reverb.Client` for `address`.

  Raises:
    ValueError: If `address` is not 'host:port' (`parse_address`) or
      `timeout_s` is not positive.
    ServerUnavailableError: (a `ConnectionError`) If no Reverb server answers
      at `address` in time.
  """
  parse_address(address)
  if not timeout_s > 0:
    raise ValueError(f'timeout_s must be > 0, got {timeout_s!r}.')
  network.check_listening(address, timeout_s)
  timeout = max(1, math.ceil(timeout_s))
  client = reverb.Client(address)
  try:
    network.server_info(client, timeout, 'connecting')
  except ServerUnavailableError as e:
    if isinstance(e.__cause__, reverb.errors.DeadlineExceededError) or (
        e.__cause__ is None):
      raise ServerUnavailableError(
          f'cannot reach Reverb server at {address}: no answer within '
          f'{timeout}s (is a server running there?)') from e
    raise ServerUnavailableError(
        f'cannot reach Reverb server at {address}: '
        f'{network.first_line(e.__cause__)}') from e
  except Exception as e:  # pylint: disable=broad-except
    # Whatever gRPC met instead of a Reverb server (an HTTP proxy, another
    # service) surfaces as one of several exception types.
    raise ServerUnavailableError(
        f'cannot reach Reverb server at {address}: '
        f'{network.first_line(e)}') from e
  return client


def get_table_info(client: reverb.Client, table: str, *,
                   timeout_s: Optional[float] = DEFAULT_TIMEOUT_S
                   ) -> reverb_types.TableInfo:
  """Returns the server's `TableInfo` (size, max_size, signature) of `table`.

  Args:
    client: A client of the server.
    table: Table name.
    timeout_s: Seconds the server has to answer; None waits forever.

  Raises:
    TableNotFoundError: If the server has no table named `table`.
    ServerUnavailableError: If the server does not answer within
      `timeout_s`.
  """
  infos = network.server_info(client, timeout_s,
                              f'reading the info of table {table!r}')
  if table not in infos:
    existing = ', '.join(repr(name) for name in sorted(infos)) or 'none'
    raise TableNotFoundError(
        f'no table {table!r} on the Reverb server at {client.server_address}; '
        f'its tables: {existing}')
  return infos[table]


def get_table_signature(client: reverb.Client, table: str) -> Any:
  """Returns the signature of `table` (None if it was made without one).

  Raises:
    TableNotFoundError: If the server has no table named `table`.
    ServerUnavailableError: If the server does not answer in
      `DEFAULT_TIMEOUT_S`.
  """
  return get_table_info(client, table).signature


def check_signature(client: reverb.Client, table: str, data_spec: Any) -> None:
  """Checks that `table` can store trajectories of `data_spec`, before writing.

  Nest structure, dtypes and shapes must agree with `add_outer_dim(data_spec)`.
  Unlike TF-Agents' check (`!=`), spec names and bounds may differ, since
  they do not change what is stored, and a table without a signature takes
  anything; `push.push_rlds_to_table` judges alike.

  Raises:
    TableNotFoundError: If the server has no table named `table`.
    ValueError: If the signature differs; the message starts with TF-Agents'
      sentence and then lists the differences.
  """
  actual = get_table_signature(client, table)
  if actual is None:
    return
  expected = tensor_spec.add_outer_dim(tensor_spec.from_spec(data_spec))
  differences = spec_differences(actual, expected)
  if differences:
    raise ValueError(f'{SIGNATURE_MISMATCH} Table {table!r} vs data: '
                     f'{"; ".join(differences)}.')


def checkpoint(client: reverb.Client, *,
               timeout_s: Optional[float] = DEFAULT_CHECKPOINT_TIMEOUT_S
               ) -> str:
  """Writes a checkpoint of every table on the server; returns its path.

  The checkpoint goes to the server's checkpoint directory (`start_server`'s
  `checkpoint_dir`, or a temporary one); a server started on that directory
  restores it. The server must first answer a ping within
  `DEFAULT_TIMEOUT_S` (or `timeout_s` if shorter), so a dead server fails in
  seconds even though writing a large table may take minutes.

  Args:
    client: A client of the server.
    timeout_s: Seconds the checkpoint may take; None waits forever.

  Raises:
    ServerUnavailableError: If the server does not answer the ping or does
      not finish the checkpoint within `timeout_s`.
  """
  ping_s = DEFAULT_TIMEOUT_S if timeout_s is None else min(
      timeout_s, DEFAULT_TIMEOUT_S)
  names = sorted(
      network.server_info(client, ping_s, 'starting a checkpoint'))
  what = (f'checkpointing table {names[0]!r}' if len(names) == 1 else
          f'checkpointing tables {", ".join(map(repr, names))}')
  return call_with_deadline(client.checkpoint, timeout_s=timeout_s, what=what,
                            address=client.server_address)


def latest_checkpoint(checkpoint_dir: str) -> Optional[str]:
  """The checkpoint that a server started on `checkpoint_dir` restores.

  Reverb's checkpointer names each checkpoint by the time it was written and
  marks a complete one with a DONE file; it restores the last complete one in
  name order, as this picks it.

  Returns:
    Its path, or None if the directory holds no complete checkpoint.
  """
  if not os.path.isdir(checkpoint_dir):
    return None
  for name in sorted(os.listdir(checkpoint_dir), reverse=True):
    path = os.path.join(checkpoint_dir, name)
    if os.path.isfile(os.path.join(path, 'DONE')):
      return path
  return None


def checkpoint_time(path: str) -> float:
  """When the checkpoint at `path` was completed (POSIX seconds)."""
  return os.path.getmtime(os.path.join(path, 'DONE'))


def table_differences(restored: reverb_types.TableInfo,
                      wanted: reverb_types.TableInfo) -> List[str]:
  """Lists the settings in which a restored table differs from the one asked.

  Reverb restores a checkpointed table with the settings it was checkpointed
  with, whatever the table passed to `start_server` says.

  Args:
    restored: The server's `TableInfo` (`get_table_info`).
    wanted: The info of the table passed to `start_server` (`table.info`).

  Returns:
    E.g. ["max_size 100 (asked 2000000)", "sampler fifo (asked uniform)"];
    empty if max_size, max_times_sampled, sampler, remover, rate limiter and
    signature agree.
  """
  differences = []
  for field in ('max_size', 'max_times_sampled'):
    found, asked = getattr(restored, field), getattr(wanted, field)
    if found != asked:
      differences.append(f'{field} {found} (asked {asked})')
  for field, label in (('sampler_options', 'sampler'),
                       ('remover_options', 'remover')):
    found = _describe_selector(getattr(restored, field))
    asked = _describe_selector(getattr(wanted, field))
    if found != asked:
      differences.append(f'{label} {found} (asked {asked})')
  found_limiter, asked_limiter = (
      _describe_rate_limiter(restored.rate_limiter_info),
      _describe_rate_limiter(wanted.rate_limiter_info))
  if found_limiter != asked_limiter:
    differences.append(
        f'rate limiter {found_limiter} (asked {asked_limiter})')
  if restored.signature is None or wanted.signature is None:
    if (restored.signature is None) != (wanted.signature is None):
      differences.append('signature ' + (
          'none (asked one)' if restored.signature is None else
          'set (asked none)'))
  else:
    differences += [f'signature: {d}' for d in
                    spec_differences(restored.signature, wanted.signature)]
  return differences


class PeriodicCheckpointer:
  """Checkpoints a server every `interval_s` seconds on a daemon thread.

  For a long-running server (`pipelines.serve`): a crash or `kill -9` then
  loses at most the last interval. The thread never blocks the caller, so
  signal handling and a final checkpoint on the way out stay prompt; `stop`
  waits for a checkpoint in progress (up to its deadline) so the two do not
  overlap.

  Attributes:
    count: Checkpoints written so far.
    last_path: Path of the last one written, or None.
    last_error: The last `ServerUnavailableError` (or other error) met, or
      None; the thread keeps trying at the next interval.
  """

  def __init__(self, client: reverb.Client, interval_s: float, *,
               on_checkpoint: Optional[Callable[[str], None]] = None,
               on_error: Optional[Callable[[BaseException], None]] = None,
               timeout_s: Optional[float] = DEFAULT_CHECKPOINT_TIMEOUT_S):
    """Starts the thread.

    Args:
      client: A client of the server.
      interval_s: Seconds between checkpoints (the first after one interval).
      on_checkpoint: Called on the thread with each checkpoint's path.
      on_error: Called on the thread with each failure.
      timeout_s: Deadline of each checkpoint (`checkpoint`).

    Raises:
      ValueError: If `interval_s` is not positive.
    """
    if not interval_s > 0:
      raise ValueError(f'interval_s must be > 0, got {interval_s!r}.')
    self._client = client
    self._interval_s = float(interval_s)
    self._on_checkpoint = on_checkpoint
    self._on_error = on_error
    self._timeout_s = timeout_s
    self._stop = threading.Event()
    self.count = 0
    self.last_path: Optional[str] = None
    self.last_error: Optional[BaseException] = None
    self._thread = threading.Thread(target=self._run, daemon=True,
                                    name='reverb periodic checkpoint')
    self._thread.start()

  def _run(self) -> None:
    while not self._stop.wait(self._interval_s):
      try:
        path = checkpoint(self._client, timeout_s=self._timeout_s)
      except Exception as e:  # pylint: disable=broad-except
        self.last_error = e
        if self._on_error is not None:
          self._on_error(e)
        continue
      self.count += 1
      self.last_path = path
      if self._on_checkpoint is not None:
        self._on_checkpoint(path)

  def stop(self, timeout_s: Optional[float] = None) -> None:
    """Stops the thread, waiting for a checkpoint in progress.

    Args:
      timeout_s: Most seconds to wait for it; default the checkpoint's own
        deadline (a second Ctrl-C ends the wait).
    """
    self._stop.set()
    wait_s = self._timeout_s if timeout_s is None else timeout_s
    deadline = None if wait_s is None else time.monotonic() + wait_s
    while self._thread.is_alive() and (
        deadline is None or time.monotonic() < deadline):
      self._thread.join(_POLL_S)


def spec_differences(table_spec: Any, data_spec: Any) -> List[str]:
  """Lists where two spec nests disagree in what they store.

  Args:
    table_spec: The spec found (on the table).
    data_spec: The spec wanted (from the data).

  Returns:
    Differences of structure, dtype or shape, such as
    "observation: table float32[None,17] vs data float32[None,3]" (at most 6,
    then how many more); empty if the nests store the same tensors.
  """
  table_leaves = _flatten_with_paths(table_spec)
  data_leaves = _flatten_with_paths(data_spec)
  differences: List[str] = []
  for path, spec in data_leaves.items():
    found = table_leaves.get(path)
    if found is None:
      differences.append(f'{path}: only in data ({_describe(spec)})')
    elif (found.dtype, found.shape) != (spec.dtype, spec.shape):
      differences.append(
          f'{path}: table {_describe(found)} vs data {_describe(spec)}')
  differences += [f'{path}: only in table ({_describe(spec)})'
                  for path, spec in table_leaves.items()
                  if path not in data_leaves]
  if not differences:
    try:  # Same paths, but a dict is not a namedtuple (nor flattened alike).
      tf.nest.assert_same_structure(table_spec, data_spec)
    except (TypeError, ValueError):
      differences.append(f'nest types differ: table {type(table_spec).__name__}'
                         f' vs data {type(data_spec).__name__}')
  if len(differences) > _MAX_LISTED_DIFFERENCES:
    more = len(differences) - _MAX_LISTED_DIFFERENCES
    differences = differences[:_MAX_LISTED_DIFFERENCES] + [f'{more} more']
  return differences


def _flatten_with_paths(nest: Any) -> dict:
  return {'/'.join(str(p) for p in path) or '<root>': leaf
          for path, leaf in tree.flatten_with_path(nest)}


def _describe(spec: Any) -> str:
  """'float32[None,17]'."""
  dims = ','.join('None' if d is None else str(d) for d in spec.shape.as_list())
  return f'{spec.dtype.name}[{dims}]'


def _make_selector(kind: str, alpha: float):
  if kind == 'uniform':
    return reverb.selectors.Uniform()
  if kind == 'fifo':
    return reverb.selectors.Fifo()
  if kind == 'lifo':
    return reverb.selectors.Lifo()
  return reverb.selectors.Prioritized(priority_exponent=alpha)


def _describe_selector(options: Any) -> str:
  """'uniform', 'prioritized(alpha=0.6)', 'heap(min)': a selector's options."""
  kind = options.WhichOneof('distribution')
  if kind == 'prioritized':
    return f'prioritized(alpha={options.prioritized.priority_exponent:g})'
  if kind == 'heap':
    return 'heap(min)' if options.heap.min_heap else 'heap(max)'
  return kind or 'none'


def _describe_rate_limiter(info: Any) -> str:
  """'min_size_to_sample=1, samples_per_insert=1, ...' of a RateLimiterInfo."""
  return (f'min_size_to_sample={info.min_size_to_sample}, '
          f'samples_per_insert={info.samples_per_insert:g}, '
          f'error_buffer=[{info.min_diff:g}, {info.max_diff:g}]')


def _check_positive_int(arg: str, value: Any,
                        allowed: str = 'a positive integer') -> None:
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < 1):
    raise ValueError(f'{arg} must be {allowed}, got {value!r}.')


def _check_choice(arg: str, value: Any, choices: Sequence[str]) -> None:
  if value not in choices:
    raise ValueError(
        f'{arg} must be one of {", ".join(map(repr, choices))}, got {value!r}.')


