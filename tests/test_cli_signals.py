"""`pipelines.cli.Signals`: a Ctrl-C that Python drops is not lost.

Python prints and drops an exception raised inside a `__del__`
("Exception ignored in ..."); tf.data runs such deleters between a push's
episodes, so a Ctrl-C landing there would be lost (the likely cause of a
push that ran to its end, exit 0, after its Ctrl-C in one CI run). The
handler remembers the signal, and the push's per-episode check raises it
again.
"""

import os
import signal

import pytest

from pipelines import cli


class _SignalsItself:
  """Sends `signum` to this process while being deleted: the handler's
  KeyboardInterrupt is raised inside `__del__`, where Python drops it."""

  def __init__(self, signum: int):
    self.signum = signum

  def __del__(self):
    os.kill(os.getpid(), self.signum)
    # Bytecodes after the kill: the handler runs here, inside __del__.
    self.after = True


@pytest.mark.parametrize('signum, name', [(signal.SIGINT, 'SIGINT'),
                                          (signal.SIGTERM, 'SIGTERM')])
def test_a_signal_dropped_inside_a_deleter_is_raised_by_check(signum, name):
  signals = cli.Signals()
  try:
    signals.check()  # Nothing yet: no exception.
    victim = _SignalsItself(signum)
    del victim  # The KeyboardInterrupt is dropped: execution goes on here.
    assert signals.received == name
    with pytest.raises(KeyboardInterrupt):
      signals.check()
  finally:
    signals.restore()


def test_a_signal_outside_a_deleter_raises_at_once():
  signals = cli.Signals()
  try:
    with pytest.raises(KeyboardInterrupt):
      os.kill(os.getpid(), signal.SIGINT)
      for _ in range(1000):  # Bytecodes for the handler to run between.
        pass
  finally:
    signals.restore()
  assert signals.received == 'SIGINT'
