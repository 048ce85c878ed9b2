"""What the pipelines' command lines share: errors, flags, waiting for Ctrl-C,
and a quiet stderr.

No flags are defined here: absl's `--help` lists the flags of the main module
only, so each pipeline defines its own.

Quiet stderr, in two steps, for every pipeline:
  1. importing this module sets environment defaults that silence
     TensorFlow's and gRPC's C++ start-up logs (TF_CPP_MIN_LOG_LEVEL=3,
     GRPC_VERBOSITY=ERROR), so a pipeline imports it before tensorflow,
     reverb or anything that imports them:

       from pipelines import cli  # First: quiets C++ logs before TF loads.

  2. `quiet_logging()`, called in `main` once flags are parsed, keeps absl
     logs at WARNING, hides third-party Python warnings (the library's own
     stay, one line each: `serve: warning: ...`) and drops the log lines that
     Reverb's C++ code writes to stderr with no level to filter on
     ("[reverb/cc/...] Started replay server on port 8000").
`--verbosity N` (any N; or `-v N`) turns all of it off: every log comes back.
Variables set by the caller (TF_CPP_MIN_LOG_LEVEL=0 ...) are kept.
"""

import atexit
import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import tokenize
from typing import Callable, List, NoReturn, Optional
import warnings


def verbosity_requested(argv: Optional[List[str]] = None) -> bool:
  """Whether the command line sets absl's --verbosity (or -v): show all logs.

  Read from the raw arguments, since the environment defaults must be set at
  import, before flags are parsed.
  """
  for arg in (sys.argv[1:] if argv is None else argv):
    if arg == '--':
      break
    if arg.split('=', 1)[0] in ('--verbosity', '-v', '--v'):
      return True
  return False


def _quiet_native_logs_by_default() -> None:
  if verbosity_requested():
    return
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  os.environ.setdefault('GRPC_VERBOSITY', 'ERROR')


# Before tensorflow is imported, here or by the importer.
_quiet_native_logs_by_default()

# pylint: disable=g-import-not-at-top,wrong-import-position
from absl import flags
from absl import logging
import gin
import tensorflow as tf

from rlds_reverb.storage import tables
# pylint: enable=g-import-not-at-top,wrong-import-position

# Exceptions that mean bad input or an unusable environment, not a bug: a
# pipeline prints them as one line and exits 1 instead of a traceback.
USER_ERRORS = (ValueError, RuntimeError, OSError, tf.errors.OpError)


def quiet_logging() -> None:
  """Quiets stderr unless --verbosity is given (call in main).

  TFDS and the library log at INFO, which would bury the progress bar and
  the summary: absl logs are kept at WARNING. Third-party Python warnings
  are hidden; this library's are printed as `<prog>: warning: <message>`
  (so `InsecureServerWarning` always shows). Reverb's C++ log lines are
  dropped from stderr (`_filter_native_stderr`). `--verbosity N` keeps all
  of these as they are.
  """
  if flags.FLAGS['verbosity'].present:
    return
  logging.set_verbosity(logging.WARNING)
  warnings.simplefilter('ignore')
  warnings.filterwarnings('default', module=r'(rlds_reverb|pipelines)(\.|$)')
  warnings.filterwarnings('always', category=tables.InsecureServerWarning)
  warnings.showwarning = _show_warning
  _filter_native_stderr()


def _show_warning(message, category, filename, lineno, file=None,
                  line=None) -> None:
  del category, filename, lineno, line
  stream = file or sys.stderr
  try:
    print(f'{_prog}: warning: {" ".join(str(message).split())}', file=stream,
          flush=True)
  except OSError:  # As warnings' own: a closed stderr is not worth dying for.
    pass


# The program name that warnings are printed with (`flags_parser` sets it).
_prog = os.path.splitext(os.path.basename(sys.argv[0] or 'python'))[0]

# Reverb's C++ code logs with std::clog, unconditionally: each line starts
# with the source file, "[reverb/cc/platform/default/server.cc:71] ...".
# Its fatal errors ("... Check failed: ...") are kept.
_NATIVE_LOG_PREFIX = b'[reverb/cc/'
_FILTER_SOURCE = r"""
import os, signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
PREFIX, KEEP = %r, b'Check failed'
def write(data):
  while data:
    data = data[os.write(1, data):]
pending = b''
while True:
  try:
    chunk = os.read(0, 65536)
  except OSError:
    break
  if not chunk:
    break
  pending += chunk
  *lines, pending = pending.split(b'
')
  out = [l + b'
' for l in lines if not l.startswith(PREFIX) or KEEP in l]
  if pending and not (pending.startswith(PREFIX) or
                      PREFIX.startswith(pending)):
    out.append(pending)  # A partial line that is not Reverb's: show it now.
    pending = b''
  try:
    write(b''.join(out))
  except OSError:
    break
if pending and (not pending.startswith(PREFIX) or KEEP in pending):
  write(pending)
""" % (_NATIVE_LOG_PREFIX,)
# Names the pipe that stderr goes into once filtered, so that processes
# started from here that inherit it do not filter it again.
_FILTERED_ENV = 'RLDS_REVERB_STDERR_FILTER'


def _stderr_id() -> str:
  stat = os.fstat(2)
  return f'{stat.st_dev}:{stat.st_ino}'


def _filter_native_stderr() -> None:
  """Drops Reverb's C++ log lines from this process's stderr (fd 2).

  They cannot be turned off (Reverb has no log level), so fd 2 becomes a pipe
  into a small filter process that passes everything else on to the real
  stderr. A process of its own, not a thread: it drains the pipe even if
  this one crashes or is killed, so no fatal message is lost; it leaves the
  process group, so Ctrl-C does not end it before the pipeline's summary.
  Python's own `sys.stderr` (errors, warnings, progress bars) writes to the
  real stderr directly and keeps its terminal. At exit, fd 2 is given back
  and the filter drained.
  """
  try:
    if os.environ.get(_FILTERED_ENV) == _stderr_id():
      return
    sys.stderr.flush()
    real = os.dup(2)
    read_end, write_end = os.pipe()
    filter_process = subprocess.Popen(
        [sys.executable, '-I', '-S', '-c', _FILTER_SOURCE], stdin=read_end,
        stdout=real, stderr=subprocess.DEVNULL, close_fds=True,
        start_new_session=True)
  except OSError:
    return  # No stderr to filter (or no room for a process): leave it be.
  os.close(read_end)
  sys.stderr = io.TextIOWrapper(
      os.fdopen(os.dup(real), 'wb', buffering=0), encoding='utf-8',
      errors='backslashreplace', line_buffering=True, write_through=True)
  handler = logging.get_absl_handler().python_handler
  if handler.stream is sys.__stderr__:
    handler.stream = sys.stderr
  os.dup2(write_end, 2)
  os.close(write_end)
  os.environ[_FILTERED_ENV] = _stderr_id()

  def restore() -> None:
    try:
      sys.stderr.flush()
    except (OSError, ValueError):
      pass
    os.dup2(real, 2)  # Closes this process's end of the pipe.
    try:
      filter_process.wait(timeout=2)  # Children may hold the pipe open.
    except subprocess.TimeoutExpired:
      pass

  atexit.register(restore)


def one_line(error: BaseException) -> str:
  """The error's message with its whitespace (newlines too) collapsed."""
  is_op_error = isinstance(error, tf.errors.OpError)
  message = error.message if is_op_error else str(error)
  return ' '.join(message.split()) or type(error).__name__


def fail(prog: str, error: BaseException, code: int = 1) -> NoReturn:
  """Exits with `prog: error: <message>` as the one line on stderr."""
  sys.stderr.flush()
  print(f'{prog}: error: {one_line(error)}', file=sys.stderr, flush=True)
  sys.exit(code)


def exit_now(line: Optional[str], code: int, *, fresh_line: bool = False
             ) -> NoReturn:
  """Prints `line` on stderr and ends the process without interpreter
  teardown, whatever its threads are doing: one may be blocked in Reverb's
  C++ sampler, and after a lost server its client threads can abort the
  teardown (exit -6 instead of `code`). `fresh_line`: start on a line of
  its own (after a progress bar left mid-line). `line` None: print nothing."""
  try:
    sys.stdout.flush()
    sys.stderr.flush()
    if line is not None:
      print(f'\n{line}' if fresh_line else line, file=sys.stderr, flush=True)
  except (OSError, ValueError):
    pass
  os._exit(code)  # pylint: disable=protected-access


def fail_now(prog: str, error: BaseException, code: int = 1) -> NoReturn:
  """`fail`, ending the process at once (`exit_now`)."""
  exit_now(f'{prog}: error: {one_line(error)}', code)


def flags_parser(prog: str) -> Callable[[List[str]], List[str]]:
  """Returns an `app.run` flags parser with one-line errors and --help exit 0.

  absl's own prints flag errors on two lines and exits 1 after --help.
  """

  global _prog
  _prog = prog

  def parse(argv: List[str]) -> List[str]:
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      fail(prog, e, code=2)
    except SystemExit as e:
      # Parsing exits only for absl's --help flags, with 1 after printing the
      # usage; asking for help is not an error.
      sys.exit(0 if e.code == 1 else e.code)

  return parse


def parse_sequence_length(text: str) -> Optional[int]:
  """'2' -> 2; '0' or 'none' -> None (whole episodes as items).

  Raises:
    ValueError: If `text` is neither a positive integer, '0' nor 'none'.
  """
  if text.strip().lower() in ('0', 'none'):
    return None
  try:
    value = int(text)
  except ValueError:
    value = 0
  if value < 1:
    raise ValueError(
        f'sequence length must be a positive integer, or 0 or none for whole '
        f'episodes, got {text!r}')
  return value


def is_sequence_length(text: str) -> bool:
  """Flag validator for `parse_sequence_length`."""
  try:
    parse_sequence_length(text)
  except ValueError:
    return False
  return True


def wait_until_interrupted(
    on_ready: Optional[Callable[[], None]] = None) -> None:
  """Blocks until the process gets SIGINT (Ctrl-C) or SIGTERM, then returns.

  For a pipeline whose job is to keep a Reverb server up. Not
  `reverb.Server.wait()`: that ignores SIGTERM, the signal `kill` and process
  managers send, so the process would die without the chance to checkpoint.
  Call from the main thread (Python only delivers signals there).

  Args:
    on_ready: Called once both signals are caught, e.g. to print the address:
      whoever reacts to that output by sending a signal gets a clean stop.
  """
  def _interrupt(signum, frame):
    del signum, frame
    raise KeyboardInterrupt

  # SIGINT too: a process started in the background by a script inherits
  # SIGINT ignored, and Python then never raises KeyboardInterrupt for it.
  previous = {sig: signal.signal(sig, _interrupt)
              for sig in (signal.SIGINT, signal.SIGTERM)}
  try:
    if on_ready is not None:
      on_ready()
    while True:
      # Short sleeps: the kernel may deliver the signal to one of Reverb's
      # threads, and Python's handler then runs only once the main thread
      # wakes up (a serve process once slept through Ctrl-C this way).
      time.sleep(0.5)
  except KeyboardInterrupt:
    pass
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


class Signals:
  """SIGINT and SIGTERM raise KeyboardInterrupt, and are remembered.

  Also in a background job, which inherits SIGINT ignored. Remembered
  because Python prints and drops an exception raised inside a `__del__`
  or a callback ("Exception ignored in ..."), and tf.data runs such
  deleters between a pipeline's episodes: a Ctrl-C that lands there would
  be lost. Loops call `check` at each unit of work.
  """

  def __init__(self):
    self.received: Optional[str] = None
    self._previous = {sig: signal.signal(sig, self._handle)
                      for sig in (signal.SIGINT, signal.SIGTERM)}

  def _handle(self, signum, frame) -> None:
    del frame
    self.received = signal.Signals(signum).name
    raise KeyboardInterrupt

  def check(self) -> None:
    """Raises KeyboardInterrupt if a signal came, whether or not the one
    its handler raised got through."""
    if self.received is not None:
      raise KeyboardInterrupt

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)


class InterruptGuard:
  """Ctrl-C ends a pipeline even while the main thread is blocked in C++.

  Python runs its SIGINT handler (KeyboardInterrupt) in the main thread,
  between bytecodes: a main thread waiting inside Reverb's C++ sampler on a
  dead server never gets there. The C-level handler still writes the signal
  number to the wakeup fd: a thread reads it and, if the main thread has not
  reached its KeyboardInterrupt handler (`handled`) `grace_s` later, prints
  `prog: error: message` and exits 130 itself.
  """

  def __init__(self, prog: str, message: str, grace_s: float = 5.0):
    self.handled = False
    self._line, self._grace_s = f'{prog}: error: {message}', grace_s
    # A background job inherits SIGINT ignored; Ctrl-C must work anyway.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    self._read, write = socket.socketpair()
    write.setblocking(False)
    self._write = write  # Kept open for the process's lifetime.
    signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
    threading.Thread(target=self._watch, name='interrupt guard',
                     daemon=True).start()

  def _watch(self) -> None:
    while True:
      data = self._read.recv(64)
      if not data:
        return
      if signal.SIGINT in data:
        time.sleep(self._grace_s)
        if not self.handled:
          exit_now(self._line, 130, fresh_line=True)


def parse_gin(prog: str, files: List[str], bindings: List[str]) -> None:
  """Applies gin files and bindings; a bad one is a usage error (exit 2)."""
  for path in files:
    if not os.path.isfile(path):  # Before gin, which logs the miss too.
      fail(prog, ValueError(f'--gin_file {path}: no such file'), code=2)
  try:
    gin.parse_config_files_and_bindings(files, bindings, skip_unknown=False)
  except (ValueError, SyntaxError, OSError, ImportError,
          tokenize.TokenError) as e:
    fail(prog, ValueError(f'gin: {one_line(e)}'), code=2)
