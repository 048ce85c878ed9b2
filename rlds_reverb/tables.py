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

Talking to a server that may be gone: a `reverb.Client` waits for an answer
forever and deaf to Ctrl-C. `call_with_deadline` bounds any blocking client
call and turns a dead server into one `ServerUnavailableError` naming the
address and what was in flight; `get_table_info` and `checkpoint` use it.

Security: Reverb 0.14 has no authentication and binds every interface
([::]:port) whatever one asks; `start_server` says so with an
`InsecureServerWarning` naming the real listening address (docs/security.md).
"""

import errno
import ipaddress
import math
import numbers
import os
import socket
import struct
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, TypeVar
import warnings

import reverb
from reverb import reverb_types
from reverb.platform import checkpointers_lib
import tensorflow as tf
import tree
from tf_agents.specs import tensor_spec

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

# Seconds a client call on a server may take before the server counts as
# gone: table info, pings. A checkpoint writes every item to disk, so it gets
# longer (once the server has answered a ping within DEFAULT_TIMEOUT_S).
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_CHECKPOINT_TIMEOUT_S = 600.0

# Where the docs say how to keep a server's port private.
SECURITY_DOC = 'docs/security.md'

# How often a deadline wait wakes up: the longest a Ctrl-C waits for.
_POLL_S = 0.1

_T = TypeVar('_T')


class TableNotFoundError(KeyError, ValueError):
  """A table name that the Reverb server does not have.

  A `KeyError` because it is a failed lookup and a `ValueError` because the
  name usually comes from a bad argument; `str()` gives the plain message
  (a bare `KeyError` would quote it).
  """

  def __str__(self) -> str:
    return str(self.args[0]) if self.args else ''


class ServerUnavailableError(ConnectionError):
  """A Reverb server that does not answer: down, unreachable or hung.

  Raised by `call_with_deadline` (and so by `get_table_info`, `checkpoint`
  and `connect`) with one line that names the address and what was in
  flight.
  """


class InsecureServerWarning(UserWarning):
  """A server that anyone who reaches its port can use (no authentication).

  Warned by `start_server` whenever the server listens on a non-loopback
  address, which Reverb 0.14 always does. Silence it with
  `warnings.simplefilter('ignore', tables.InsecureServerWarning)` once the
  port is fenced off (docs/security.md).
  """


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
  _check_host(host)
  if port is not None:
    if (isinstance(port, bool) or not isinstance(port, numbers.Integral)
        or not 0 < port < 65536):
      raise ValueError(f'port must be an integer in [1, 65535], got {port!r}.')
    # gRPC binds with SO_REUSEPORT, so a second server on a busy port starts
    # "fine" and the two split the clients between them. Refuse instead.
    _check_port_free(port)
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
  _warn_if_exposed(server.port, host)
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


def parse_address(address: str) -> Tuple[str, int]:
  """Splits 'host:port' (or '[ipv6]:port') into the host and the port.

  Args:
    address: A server address, e.g. 'localhost:8000', '10.0.0.5:8000',
      '[::1]:8000'.

  Returns:
    (host, port), the host without IPv6 brackets.

  Raises:
    ValueError: If `address` is not 'host:port': no port, a port outside
      [1, 65535], no host, spaces, an unbracketed IPv6 address or a host that
      is neither a host name nor an IP address; the message is one line.
  """

  def bad(reason: str) -> ValueError:
    return ValueError(f'address must be "host:port" (e.g. localhost:8000), '
                      f'got {address!r}: {reason}')

  if not isinstance(address, str) or not address:
    raise bad('empty')
  if any(c.isspace() for c in address):
    raise bad('it contains spaces')
  host, colon, port = address.rpartition(':')
  if not colon:
    raise bad('no port')
  if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
    raise bad(f'the port must be an integer in [1, 65535], not {port!r}')
  if not host:
    raise bad('no host')
  if host.startswith('[') and host.endswith(']'):
    host = host[1:-1]
    if not _is_ip(host) or ':' not in host:
      raise bad(f'[{host}] is not an IPv6 address')
  elif ':' in host:
    raise bad('an IPv6 host goes in brackets, e.g. [::1]:8000')
  else:
    _check_host(host, bad)
  return host, int(port)


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
  _check_listening(address, timeout_s)
  timeout = max(1, math.ceil(timeout_s))
  client = reverb.Client(address)
  try:
    _server_info(client, timeout, 'connecting')
  except ServerUnavailableError as e:
    if isinstance(e.__cause__, reverb.errors.DeadlineExceededError) or (
        e.__cause__ is None):
      raise ServerUnavailableError(
          f'cannot reach Reverb server at {address}: no answer within '
          f'{timeout}s (is a server running there?)') from e
    raise ServerUnavailableError(
        f'cannot reach Reverb server at {address}: {_reason(e.__cause__)}'
    ) from e
  except Exception as e:  # pylint: disable=broad-except
    # Whatever gRPC met instead of a Reverb server (an HTTP proxy, another
    # service) surfaces as one of several exception types.
    raise ServerUnavailableError(
        f'cannot reach Reverb server at {address}: {_reason(e)}') from e
  return client


def call_with_deadline(fn: Callable[[], _T], *, timeout_s: Optional[float],
                       what: str, address: str) -> _T:
  """Runs a blocking Reverb client call, waiting at most `timeout_s`.

  Reverb's client calls (flush, insert, sample, checkpoint, ...) wait for a
  dead server forever, inside C++ where Ctrl-C cannot reach them. This runs
  `fn` on a daemon thread and waits for it in short, interruptible steps:

      main thread     start ──wait 0.1 s──wait──...──┬── result / error
      daemon thread   fn() ─────────────────────────┘   (or left behind
                                                          when time is up)

  On timeout the call is left running on its thread (Reverb offers no way to
  cancel it) and `ServerUnavailableError` says, in one line, which server did
  not answer and what was in flight:

      Reverb server at localhost:8000 did not answer within 10s while
      checkpointing table 'rlds' (server down?)

  gRPC's UNAVAILABLE errors (a dropped connection: "Socket closed",
  "failed to connect to all addresses", `tf.errors.UnavailableError`) and
  Reverb's own `DeadlineExceededError` become the same error type, with the
  original as `__cause__`; other errors pass through unchanged.

  Args:
    fn: The call, without arguments, e.g. `lambda: writer.flush()`.
    timeout_s: Seconds to wait; None waits forever (still interruptible).
    what: What the call does, for the message: 'checkpointing table 'rlds''.
    address: The server's address, for the message.

  Returns:
    What `fn` returns.

  Raises:
    ValueError: If `timeout_s` is neither None nor positive.
    ServerUnavailableError: If `fn` does not return within `timeout_s` or
      fails because the server is unreachable.
    KeyboardInterrupt: On Ctrl-C while waiting (the call is left behind).
    Exception: Whatever else `fn` raises.
  """
  return _call_with_deadline(fn, timeout_s, what, address)


def _call_with_deadline(fn: Callable[[], _T], timeout_s: Optional[float],
                        what: str, address: str, grace_s: float = 0.0) -> _T:
  """`call_with_deadline`, waiting `grace_s` longer than `timeout_s` says.

  For calls with a deadline of their own (`server_info(timeout=...)`), which
  should be the one that ends them.
  """
  if timeout_s is not None and not timeout_s > 0:
    raise ValueError(f'timeout_s must be > 0 or None, got {timeout_s!r}.')
  done = threading.Event()
  outcome = {}

  def run() -> None:
    try:
      outcome['value'] = fn()
    except BaseException as e:  # pylint: disable=broad-except
      outcome['error'] = e
    finally:
      done.set()

  threading.Thread(target=run, name=f'reverb: {what}', daemon=True).start()
  deadline = (None if timeout_s is None else
              time.monotonic() + timeout_s + grace_s)
  while not done.is_set():
    if deadline is None:
      done.wait(_POLL_S)
      continue
    left = deadline - time.monotonic()
    if left <= 0:
      raise ServerUnavailableError(_no_answer(address, timeout_s, what))
    done.wait(min(_POLL_S, left))
  error = outcome.get('error')
  if error is None:
    return outcome['value']
  if isinstance(error, (reverb.errors.DeadlineExceededError,
                        tf.errors.DeadlineExceededError)):
    raise ServerUnavailableError(
        _no_answer(address, timeout_s, what)) from error
  if is_unavailable(error):
    raise ServerUnavailableError(
        f'Reverb server at {address} is unavailable while {what}: '
        f'{_reason(error)} (server down?)') from error
  raise error


def is_unavailable(error: BaseException) -> bool:
  """Whether `error` is gRPC's UNAVAILABLE: the server went away.

  Reverb's Python client turns that status into a bare `RuntimeError` with
  gRPC's text, so the text is what tells it apart; TensorFlow ops raise
  `tf.errors.UnavailableError`.
  """
  if isinstance(error, (ServerUnavailableError, tf.errors.UnavailableError)):
    return True
  if type(error) is not RuntimeError:  # pylint: disable=unidiomatic-typecheck
    return False
  text = str(error).lower()
  return any(phrase in text for phrase in _UNAVAILABLE_PHRASES)


# gRPC's texts for UNAVAILABLE, as Reverb's RuntimeError carries them.
_UNAVAILABLE_PHRASES = (
    'socket closed', 'connections to all backends failing',
    'failed to connect to all addresses', 'connection reset by peer',
    'connection refused', 'broken pipe', 'transport closed', 'goaway',
    'endpoint closing', 'unavailable', 'stream removed')


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
  infos = _server_info(client, timeout_s, f'reading the info of table '
                       f'{table!r}')
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
  names = sorted(_server_info(client, ping_s, 'starting a checkpoint'))
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


def listening_addresses(port: int) -> Optional[List[str]]:
  """The addresses where a TCP socket listens on `port` on this machine.

  Read from /proc/net/tcp and /proc/net/tcp6 (Linux), so it is what the
  kernel does, not what a program says: a Reverb server on port 8000 gives
  ['[::]:8000'] (every interface, IPv4 too).

  Returns:
    'ip:port' strings ('[ipv6]:port' for IPv6), sorted; None where /proc is
    not there to read.
  """
  found = set()
  readable = False
  for name, family in (('tcp', socket.AF_INET), ('tcp6', socket.AF_INET6)):
    try:
      with open(f'/proc/net/{name}') as f:
        lines = f.readlines()[1:]
    except OSError:
      continue
    readable = True
    for line in lines:
      fields = line.split()
      if len(fields) < 4 or fields[3] != _TCP_LISTEN:
        continue
      address, _, hex_port = fields[1].partition(':')
      if int(hex_port, 16) != port:
        continue
      # The kernel prints each 32-bit word of the address in host order.
      packed = b''.join(struct.pack('=I', int(address[i:i + 8], 16))
                        for i in range(0, len(address), 8))
      ip = socket.inet_ntop(family, packed)
      found.add(f'[{ip}]:{port}' if family == socket.AF_INET6 else
                f'{ip}:{port}')
  return sorted(found) if readable else None


_TCP_LISTEN = '0A'  # The LISTEN state in /proc/net/tcp*.


def is_loopback_address(address: str) -> bool:
  """Whether an 'ip:port' from `listening_addresses` is loopback only."""
  host = address.rpartition(':')[0].strip('[]')
  ip = ipaddress.ip_address(host)
  mapped = getattr(ip, 'ipv4_mapped', None)
  return (mapped or ip).is_loopback


def _warn_if_exposed(port: int, host: str) -> None:
  """Warns if the server on `port` listens beyond loopback (it does)."""
  addresses = listening_addresses(port)
  if addresses is None:  # No /proc: what Reverb 0.14's C++ server binds.
    addresses = [f'[::]:{port}']
  exposed = [a for a in addresses if not is_loopback_address(a)]
  if not exposed:
    return
  where = ('all interfaces' if any(_is_wildcard(a) for a in exposed) else
           'non-loopback addresses')
  asked = '' if _is_wildcard_host(host) else f', not only on {host}'
  warnings.warn(InsecureServerWarning(
      f'the Reverb server listens on {where} ({", ".join(exposed)}){asked}: '
      'Reverb cannot bind a single interface and has no authentication, so '
      f'anyone who can reach port {port} can read, insert or reset its '
      f'tables; see {SECURITY_DOC} to restrict access'), stacklevel=3)


def _is_wildcard(address: str) -> bool:
  return ipaddress.ip_address(
      address.rpartition(':')[0].strip('[]')).is_unspecified


def _is_wildcard_host(host: str) -> bool:
  return host.strip('[]') in ('', '0.0.0.0', '::')


def _check_host(host: Any, bad: Optional[Callable[[str], Exception]] = None
                ) -> None:
  """Raises ValueError unless `host` is a host name or an IP address."""
  if bad is None:
    bad = lambda reason: ValueError(  # pylint: disable=g-long-lambda
        f'host must be a host name or IP address, got {host!r}: {reason}')
  if not isinstance(host, str) or not host:
    raise bad('empty')
  name = host[1:-1] if host.startswith('[') and host.endswith(']') else host
  if _is_ip(name):
    return
  labels = name.rstrip('.').split('.')
  if len(name) > 253 or not all(
      label and len(label) <= 63 and not label.startswith('-')
      and all(c.isalnum() or c in '-_' for c in label) and label.isascii()
      for label in labels):
    raise bad('not a host name or IP address')


def _server_info(client: reverb.Client, timeout_s: Optional[float],
                 what: str) -> dict:
  """`client.server_info()` within `timeout_s` (Reverb's deadline too).

  Tried twice if the first try meets a dropped connection: the first call on
  a channel whose server restarted fails so, and gRPC reconnects for the
  next one.
  """
  native = None if timeout_s is None else max(1, math.ceil(timeout_s))
  call = lambda: _call_with_deadline(  # pylint: disable=g-long-lambda
      lambda: client.server_info(timeout=native), native, what,
      client.server_address, grace_s=1.0)
  try:
    return call()
  except ServerUnavailableError as e:
    if not is_unavailable(e.__cause__):
      raise
  return call()


def _no_answer(address: str, timeout_s: Optional[float], what: str) -> str:
  return (f'Reverb server at {address} did not answer within '
          f'{timeout_s:g}s while {what} (server down?)')


def _reason(error: BaseException) -> str:
  """The first line of an error's text, or its type."""
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


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
  """'uniform', 'prioritized(alpha=0.6)', 'heap(min)' from KeyDistributionOptions."""
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


def _check_listening(address: str, timeout_s: float) -> None:
  """Raises ServerUnavailableError at once if nothing listens at a local/IP
  address.

  gRPC would retry a refused connection until the deadline. Host names other
  than localhost are left to gRPC: resolving them here could outlast
  `timeout_s`.
  """
  host, _, port = address.rpartition(':')
  host = host.strip('[]')
  if not port.isdigit() or not (host == 'localhost' or _is_ip(host)):
    return
  try:
    socket.create_connection((host, int(port)), timeout=timeout_s).close()
  except OSError as e:
    reason = e.strerror or str(e) or type(e).__name__
    raise ServerUnavailableError(
        f'cannot reach Reverb server at {address}: {reason.lower()} (is a '
        'server running there?)') from e


def _is_ip(host: str) -> bool:
  try:
    ipaddress.ip_address(host)
  except ValueError:
    return False
  return True


def _check_port_free(port: int) -> None:
  """Raises OSError if a socket listens on `port` (any address).

  A port that only holds connections in TIME_WAIT (left by a server stopped
  with clients connected) is free: gRPC binds with SO_REUSEADDR and reuses
  it, and so does this probe; without it a restart would be refused for a
  minute.
  """
  listening = listening_addresses(port)
  if listening:
    raise OSError(f'cannot start a Reverb server on port {port}: the port is '
                  f'already in use (listening: {", ".join(listening)})')
  # Where /proc is missing, a bind tells. gRPC listens on [::] (dual stack),
  # which a plain IPv4 bind collides with; SO_REUSEADDR still collides with
  # a listener (and SO_REUSEPORT, which would not, is left off).
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      probe.bind(('', port))
    except OSError as e:
      if e.errno == errno.EADDRINUSE:
        raise OSError(f'cannot start a Reverb server on port {port}: the '
                      'port is already in use') from e
      raise
