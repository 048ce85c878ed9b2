"""`python -m pipelines.<name> ARGS` for CLI tests that end before any work.

A usage error, a refused input or `--help` is decided in well under a
second, but a fresh interpreter first spends several seconds of CPU
importing TensorFlow, TF-Agents, Reverb, MuJoCo and the library: with some
sixty such tests that start-up was the largest single share of the CI run.
Here one interpreter per test process imports those once (never
`pipelines.*`, which defines absl flags), and each run is a fork of it that
executes the pipeline module as `__main__` with `runpy`, as `python -m`
does: its own flags, argv, cwd, environment, stdout and stderr files, exit
code. The module under test and everything it imports that the preload
lacks are imported afresh in the child. Runs that train, serve or are
stopped by signals stay real subprocesses (`pipeline_process`), so
interpreter start-up itself is still covered;
`test_preloaded_cli.py` checks that both give the same result.

    proc = preloaded_cli.run('train', '--agent', 'nope', cwd=REPO, env=ENV)

returns a `subprocess.CompletedProcess`, as `subprocess.run(...,
capture_output=True, text=True)` would.
"""

import atexit
import json
import os
import pathlib
import select
import subprocess
import sys
import tempfile
import threading
import time
from typing import Mapping, Optional

REPO = pathlib.Path(__file__).resolve().parents[1]
# What every pipeline imports before its own code runs.
PRELOAD = ('tensorflow', 'tf_agents.agents', 'tf_agents.environments',
           'reverb', 'tensorflow_datasets', 'rlds', 'gymnasium', 'mujoco',
           'gin', 'absl.app', 'absl.flags', 'rlds_reverb.data.datasets',
           'rlds_reverb.agents.factory', 'rlds_reverb.experiments.offline',
           'rlds_reverb.experiments.online', 'rlds_reverb.experiments.onpolicy')
# A preloading interpreter that has not answered by then is replaced.
START_TIMEOUT_S = 180


def _serve() -> None:
  """The preloaded interpreter: one JSON request per stdin line, one JSON
  reply per stdout line; EOF on stdin (the test process ended) ends it."""
  import importlib  # pylint: disable=g-import-not-at-top
  sys.path.append(str(REPO))  # The library, whatever the working directory.
  for name in PRELOAD:
    importlib.import_module(name)
  replies = sys.stdout
  print(json.dumps({'ready': os.getpid()}), file=replies, flush=True)
  for line in sys.stdin:
    request = json.loads(line)
    replies.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
      _child(request)  # Never returns.
    deadline = time.monotonic() + request['timeout_s']
    while True:
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        break
      if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status = None
        break
      time.sleep(0.01)
    reply = {'timed_out': status is None,
             'returncode': (None if status is None else
                            os.waitstatus_to_exitcode(status))}
    print(json.dumps(reply), file=replies, flush=True)


def _child(request: dict) -> None:
  """Runs one pipeline as `python -m` would, then exits with its code."""
  import logging  # pylint: disable=g-import-not-at-top
  import runpy  # pylint: disable=g-import-not-at-top
  import traceback  # pylint: disable=g-import-not-at-top
  code = 1
  try:
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request['stdout']), (2, request['stderr'])):
      os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
    # `python -m`: the working directory first, then PYTHONPATH.
    sys.path[0:1] = [request['cwd'], *filter(
        None, request['env'].get('PYTHONPATH', '').split(os.pathsep))]
    sys.argv = [request['module'], *request['args']]
    try:
      runpy.run_module(request['module'], run_name='__main__',
                       alter_sys=True)
      code = 0
    except SystemExit as e:  # As the interpreter turns it into a status.
      if e.code is None:
        code = 0
      elif isinstance(e.code, int):
        code = e.code
      else:
        print(e.code, file=sys.stderr)
        code = 1
    except BaseException:  # pylint: disable=broad-except
      traceback.print_exc()
      code = 1
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    logging.shutdown()
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # pylint: disable=broad-except
        pass
    os._exit(code)  # pylint: disable=protected-access


class _Preloaded:
  """The preloading interpreter of this test process, started on first use."""

  def __init__(self, env: Mapping[str, str]):
    self._stderr = tempfile.TemporaryFile()
    self._proc = subprocess.Popen(
        [sys.executable, __file__], cwd=REPO, env=dict(env),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)
    # A late 'ready' line would otherwise be read as the first run's reply.
    reply = self._reply(START_TIMEOUT_S)
    if not (reply and 'ready' in reply):
      self.close()
      raise RuntimeError(
          f'the preloaded interpreter did not start within {START_TIMEOUT_S}'
          f' s (it answered {reply!r})')

  def _reply(self, timeout_s: float) -> Optional[dict]:
    ready, _, _ = select.select([self._proc.stdout], [], [], timeout_s)
    if not ready:
      return None
    line = self._proc.stdout.readline()
    if not line:
      self._stderr.seek(0)
      raise RuntimeError('the preloaded interpreter ended: ' +
                         self._stderr.read().decode(errors='replace')[-3000:])
    return json.loads(line)

  def alive(self) -> bool:
    return self._proc.poll() is None

  def run(self, request: dict) -> Optional[dict]:
    self._proc.stdin.write((json.dumps(request) + '\n').encode())
    self._proc.stdin.flush()
    # The server kills a child past its timeout; a little more for that.
    return self._reply(request['timeout_s'] + 30)

  def close(self) -> None:
    self._proc.kill()
    self._proc.wait()


_LOCK = threading.Lock()
_PRELOADED: list = []


def _close() -> None:
  for preloaded in _PRELOADED:
    preloaded.close()


atexit.register(_close)


def run(module: str, *args: str, cwd: os.PathLike, env: Mapping[str, str],
        timeout_s: float = 180) -> subprocess.CompletedProcess:
  """`python -m pipelines.MODULE ARGS` in a fork of the preloaded
  interpreter; raises `subprocess.TimeoutExpired` past `timeout_s`."""
  argv = [sys.executable, '-m', f'pipelines.{module}', *args]
  with _LOCK, tempfile.TemporaryDirectory() as scratch:
    if not (_PRELOADED and _PRELOADED[0].alive()):
      _PRELOADED[:] = [_Preloaded(env)]
    out, err = os.path.join(scratch, 'stdout'), os.path.join(scratch, 'stderr')
    for path in (out, err):
      open(path, 'w').close()  # pylint: disable=consider-using-with
    reply = _PRELOADED[0].run({
        'module': f'pipelines.{module}', 'args': list(args),
        'cwd': str(cwd), 'env': dict(env), 'stdout': out, 'stderr': err,
        'timeout_s': timeout_s})
    if reply is None:  # The server itself hung: start a new one next time.
      _PRELOADED.pop().close()
    if reply is None or reply['timed_out']:
      raise subprocess.TimeoutExpired(argv, timeout_s)
    with open(out, encoding='utf-8', errors='replace') as f:
      stdout = f.read()
    with open(err, encoding='utf-8', errors='replace') as f:
      stderr = f.read()
  return subprocess.CompletedProcess(argv, reply['returncode'], stdout, stderr)


if __name__ == '__main__':
  _serve()
