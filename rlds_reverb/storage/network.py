"""Reaching Reverb servers: addresses, deadlines, who can connect.

A `reverb.Client` waits for a dead server forever, inside C++ where Ctrl-C
cannot reach it, and Reverb 0.14's server listens on every interface with no
authentication. This module is what `tables` (and any caller of a client)
uses against both:

  addresses   `parse_address` ('host:port', one-line ValueError), fast
              refusal of a port where nothing listens (`check_listening`);
  deadlines   `call_with_deadline` runs any blocking client call with a
              bound and turns a dead server into one
              `ServerUnavailableError` that names the address and what was
              in flight; `server_info` is the deadline-bound ping;
  exposure    `listening_addresses` reads what the kernel listens on, and
              `warn_if_exposed` warns (`InsecureServerWarning`) when that is
              more than loopback, pointing to docs/security.md;
              `check_port_free` refuses a port that has a listener but not
              one that only holds connections in TIME_WAIT.

`tables` re-exports the names that its callers need (`tables.
call_with_deadline`, `tables.ServerUnavailableError`, ...).
"""

import errno
import ipaddress
import math
import socket
import struct
import threading
import time
from typing import Any, Callable, List, Optional, Tuple, TypeVar
import warnings

import reverb
import tensorflow as tf

# Seconds a client call on a server may take before the server counts as
# gone: table info, pings.
DEFAULT_TIMEOUT_S = 10.0

# Where the docs say how to keep a server's port private.
SECURITY_DOC = 'docs/security.md'

# How often a deadline wait wakes up: the longest a Ctrl-C waits for.
_POLL_S = 0.1

_T = TypeVar('_T')


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
    check_host(host, bad)
  return host, int(port)


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
        f'{first_line(error)} (server down?)') from error
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


def warn_if_exposed(port: int, host: str) -> None:
  """Warns if the server on `port` listens beyond loopback, as Reverb does.

  Call right after the server starts (`tables.start_server` does): the
  warning, an `InsecureServerWarning` attributed to the caller's caller,
  names the addresses found by `listening_addresses` ([::]:port where /proc
  cannot tell) and `host`, what clients were meant to use.
  """
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


def check_host(host: Any, bad: Optional[Callable[[str], Exception]] = None
                ) -> None:
  """Raises ValueError unless `host` is a host name or an IP address.

  Args:
    host: 'localhost', 'reverb-0.internal', '10.0.0.5', '::1' or '[::1]'.
    bad: Makes the error from a reason; default "host must be ...".
  """
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


def server_info(client: reverb.Client, timeout_s: Optional[float],
                 what: str) -> dict:
  """`client.server_info()` within `timeout_s`: the ping with a deadline.

  Reverb's own deadline (whole seconds) ends the call; the outer one of
  `call_with_deadline`, a second later, only if it does not. Tried twice if
  the first try meets a dropped connection: the first call on a channel
  whose server restarted fails so, and gRPC reconnects for the next one.

  Args:
    client: A client of the server.
    timeout_s: Seconds to wait (rounded up); None waits forever.
    what: What the call is for, for the error: 'connecting'.

  Returns:
    {table name: TableInfo}.

  Raises:
    ServerUnavailableError: If the server does not answer in time.
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


def first_line(error: BaseException) -> str:
  """The first line of an error's text, or its type."""
  text = str(error).strip()
  return text.splitlines()[0] if text else type(error).__name__


def check_listening(address: str, timeout_s: float) -> None:
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


def check_port_free(port: int) -> None:
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
