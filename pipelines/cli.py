"""What the pipelines' command lines share: errors, flags, waiting for Ctrl-C.

No flags are defined here: absl's `--help` lists the flags of the main module
only, so each pipeline defines its own.
"""

import signal
import sys
import time
from typing import Callable, List, NoReturn, Optional

from absl import flags
from absl import logging
import tensorflow as tf

# Exceptions that mean bad input or an unusable environment, not a bug: a
# pipeline prints them as one line and exits 1 instead of a traceback.
USER_ERRORS = (ValueError, RuntimeError, OSError, tf.errors.OpError)


def quiet_logging() -> None:
  """Logs WARNING and up unless --verbosity is given (call in main).

  TFDS and the library log at INFO, which would bury the progress bar and
  the summary; `--verbosity 0` brings those logs back.
  """
  if not flags.FLAGS['verbosity'].present:
    logging.set_verbosity(logging.WARNING)


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


def flags_parser(prog: str) -> Callable[[List[str]], List[str]]:
  """Returns an `app.run` flags parser with one-line errors and --help exit 0.

  absl's own prints flag errors on two lines and exits 1 after --help.
  """

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
      time.sleep(3600)
  except KeyboardInterrupt:
    pass
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
