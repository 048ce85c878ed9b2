"""Learners that fail: each failure ends with one short line naming its cause.

In training (rlds_reverb.experiments.run / loop): an op error becomes the op's
own message with the phase and the step, a non-finite loss stops training at
its step. On a remote table (pipelines.train --reverb_address): a killed
server ends the learner within a bound, or with --reconnect is waited for
(and Ctrl-C still ends it).
"""

import io
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest
import tensorflow as tf
import tqdm

from rlds_reverb.data import recording
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import run
from conftest import _dqn  # pylint: disable=g-bad-import-order
from pipeline_process import error_line  # pylint: disable=g-bad-import-order
from pipeline_process import reserved_port  # pylint: disable=g-bad-import-order
import preloaded_cli  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')


def _train(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
  """A short run that fails: a fork of the preloaded interpreter
  (tests/preloaded_cli.py) spares it the start-up of a fresh one."""
  return preloaded_cli.run('train', *args, cwd=REPO, env=ENV,
                           timeout_s=timeout)


@tf.function(input_signature=[tf.TensorSpec(None), tf.TensorSpec((), tf.int32)])
def _reshape_steps(x, n):
  loss = tf.constant(0.0)
  for _ in tf.range(n):
    loss = tf.reduce_sum(tf.reshape(x, [3, 5]))
  return loss


def _op_error() -> tf.errors.OpError:
  try:
    _reshape_steps(tf.ones([4]), tf.constant(2))
  except tf.errors.OpError as e:
    return e
  raise AssertionError('no error')


def test_op_error_summary_keeps_the_ops_own_message():
  error = _op_error()
  assert 'Detected at node' in error.message and 'File' in error.message
  assert run.op_error_summary(error) == (
      'Input to reshape is a tensor with 4 values, but the requested shape '
      'has 15')
  long = tf.errors.InvalidArgumentError(None, None, 'assertion failed: ' +
                                        'x' * 1000)
  assert len(run.op_error_summary(long)) == 300
  assert run.op_error_summary(long).startswith('assertion failed: xxx')


def test_run_phases_names_the_phase_and_step_of_an_op_error():
  clock = [0]

  def phase(position):
    clock[0] = position + 10
    if clock[0] == 30:
      _reshape_steps(tf.ones([4]), tf.constant(1))

  with pytest.raises(run.TrainingError) as raised:
    run.run_phases(lambda: clock[0], 100, phase, [], what='offline training',
                   unit='gradient step')
  assert str(raised.value) == (
      'offline training stopped at gradient step 30: Input to reshape is a '
      'tensor with 4 values, but the requested shape has 15')
  assert isinstance(raised.value.__cause__, tf.errors.InvalidArgumentError)


def test_non_finite_loss_stops_training_at_its_step(cartpole, tmp_path):
  agent = _dqn(cartpole)
  learner = loop.Learner(agent, str(tmp_path))

  def step(batch):
    del batch
    agent.train_step_counter.assign_add(1)
    return tf.where(agent.train_step_counter >= 3, float('nan'), 1.0)

  learner.set_train_step(step)
  with pytest.raises(loop.NonFiniteLossError,
                     match='the loss became nan at gradient step 3'):
    learner.train(lambda: tf.zeros([1]), 10)
  assert learner.train_step == 3  # No step after the one that failed.


def test_training_failure_is_one_short_line(tmp_path):
  data = str(tmp_path / 'hc')
  recording.generate_dataset('HalfCheetah-v5', 'random', 2, data, seed=1,
                             max_episode_steps=30, show_progress=False)
  # Learning rates that blow the networks up in a step or two.
  line = error_line(_train(
      '--agent', 'td3_bc', '--dataset', data, '--root_dir',
      str(tmp_path / 'run'), '--steps', '50', '--batch_size', '16',
      '--eval_episodes', '1', '--critic_learning_rate', '1e30',
      '--actor_learning_rate', '1e30'), 'train')
  assert line.startswith('train: error: offline training stopped at '
                         'gradient step '), line
  assert 'inf or nan' in line or 'loss became' in line, line
  assert len(line) < 300 and 'File "' not in line, line


# A learner on a remote table whose server is killed (loopback only).


class _Lines:
  """A subprocess's stderr (or stdout), line by line, read by a thread."""

  def __init__(self, stream):
    self.lines = []
    self._thread = threading.Thread(target=self._read, args=(stream,),
                                    daemon=True)
    self._thread.start()

  def _read(self, stream):
    for line in stream:
      self.lines.append(line.rstrip('\n'))

  def wait_for(self, text: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
      for line in list(self.lines):
        if text in line:
          return line
      time.sleep(0.2)
    raise AssertionError(f'no {text!r} in {timeout_s}s: {self.lines[-20:]}')


def _serve(data, port, checkpoints):
  process = subprocess.Popen(
      [sys.executable, '-m', 'pipelines.serve', '--dataset', data, '--port',
       str(port), '--checkpoint_dir', checkpoints], cwd=REPO, env=ENV,
      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  _Lines(process.stdout).wait_for('serving table', 120)
  return process


def _wait_for_file(path, process, timeout_s=120):
  deadline = time.monotonic() + timeout_s
  while not os.path.exists(path):
    assert process.poll() is None, process.stderr.read()
    assert time.monotonic() < deadline, f'no {path}'
    time.sleep(0.2)


def test_killed_server_ends_a_streaming_learner_or_is_waited_for(tmp_path):
  """kill -9 of the server: one learner fails within a bound naming the
  address; one with --reconnect waits, says what it found on the server's
  return, and ends on Ctrl-C with its one line (exit 130)."""
  from rlds_reverb.data import datasets  # pylint: disable=g-import-not-at-top
  from rlds_reverb.storage import push  # pylint: disable=g-import-not-at-top
  import reverb  # pylint: disable=g-import-not-at-top
  data = str(tmp_path / 'hc')
  recording.generate_dataset('HalfCheetah-v5', 'random', 2, data, seed=1,
                             max_episode_steps=30, show_progress=False)
  port, checkpoints = reserved_port(), str(tmp_path / 'ckpt')
  address = f'localhost:{port}'
  server = _serve(data, port, checkpoints)
  learners = []
  try:
    client = reverb.Client(address)
    push.push_rlds_to_table(datasets.load(data), client, 'rlds')
    client.checkpoint()
    size = client.server_info()['rlds'].current_size
    common = ['--agent', 'bc', '--feed', 'stream', '--reverb_address',
              address, '--steps', '10000000', '--eval_interval', '10000000',
              '--checkpoint_interval', '10000000', '--batch_size', '16']
    for name, extra in (('fail', []), ('wait', ['--reconnect',
                                                '--reconnect_timeout_s',
                                                '120'])):
      root = str(tmp_path / name)
      process = subprocess.Popen(
          [sys.executable, '-m', 'pipelines.train', *common, '--root_dir',
           root, *extra], cwd=REPO, env=ENV, stdout=subprocess.DEVNULL,
          stderr=subprocess.PIPE, text=True)
      learners.append(process)
      _wait_for_file(os.path.join(root, 'config.json'), process)
    failing, waiting = learners
    waiting_err = _Lines(waiting.stderr)
    server.kill()  # kill -9
    server.wait()
    killed = time.monotonic()
    _, err = failing.communicate(timeout=60)
    assert time.monotonic() - killed < 40
    assert failing.returncode == 1, err
    errors = [l for l in err.splitlines() if 'error' in l]
    assert len(errors) == 1 and 'Traceback' not in err, err
    assert errors[0].startswith('train: error:'), err
    assert errors[0].startswith(f'train: error: Reverb server at {address} '),\
        errors[0]
    assert "sampling table 'rlds'" in errors[0], errors[0]

    waiting_err.wait_for(f'lost Reverb server at {address} while sampling '
                         "table 'rlds'; waiting up to 120s", 40)
    server = _serve(data, port, checkpoints)  # Same port, its checkpoint.
    back = waiting_err.wait_for('is back after', 60)
    assert f"table 'rlds' holds {size} items, as before the loss" in back
    assert waiting.poll() is None
    waiting.send_signal(signal.SIGINT)
    assert waiting.wait(timeout=30) == 130
    time.sleep(0.5)  # The reader thread takes the last lines.
    assert waiting_err.lines[-1] == ('train: error: interrupted; rerun the '
                                     'same command to resume from '
                                     f'{tmp_path / "wait"}'), waiting_err.lines
  finally:
    for process in learners + [server]:
      if process.poll() is None:
        process.kill()
        process.wait()


def _counted_learner(cartpole, tmp_path, step=None):
  """A learner whose step only counts (or is `step(agent)`), and the list
  of the step counts its graph calls were asked for."""
  agent = _dqn(cartpole)
  learner = loop.Learner(agent, str(tmp_path))
  learner.set_train_step(
      step(agent) if step else
      lambda batch: (agent.train_step_counter.assign_add(1),
                     tf.constant(1.0))[1])
  calls = []
  train = learner.train
  learner.train = lambda source, n: (calls.append(n), train(source, n))[1]
  return learner, calls


def test_offline_phases_return_to_python_at_least_every_cap(cartpole,
                                                            tmp_path):
  # Ctrl-C and the progress bar act between graph calls: a phase never runs
  # more than the cap, and the triggers still fire exactly on their steps.
  learner, calls = _counted_learner(cartpole, tmp_path)
  fired = []
  phase = run.OfflinePhase(learner, lambda: tf.zeros([1]), 25, (10,),
                           max_steps_per_call=4)
  run.run_phases(lambda: learner.train_step, 25, phase,
                 [run.Every(10, fired.append)])
  assert calls == [4, 4, 2, 4, 4, 2, 4, 1]
  assert fired == [10, 20, 25]
  assert learner.train_step == 25


def test_slow_steps_get_short_calls_sized_by_the_measured_rate(cartpole,
                                                              tmp_path):
  # A learner at about 20 steps/s with a 0.25 s budget: after the first
  # two calls (one traces, neither is timed yet) each call holds at most
  # 5 steps, so Ctrl-C and the bar wait a budget, not the 1000-step cap.
  # Sleeping never takes less than asked, so the bound holds on any
  # machine; a loaded one only makes the calls shorter.
  def slow_step(agent):
    def step(batch):
      del batch
      tf.py_function(lambda: time.sleep(0.05), [], [])
      agent.train_step_counter.assign_add(1)
      return tf.constant(1.0)
    return step

  learner, calls = _counted_learner(cartpole, tmp_path, slow_step)
  fired = []
  phase = run.OfflinePhase(learner, lambda: tf.zeros([1]), 60, (25,),
                           seconds_per_call=0.25)
  run.run_phases(lambda: learner.train_step, 60, phase,
                 [run.Every(25, fired.append)])
  assert calls[:2] == [run.FIRST_STEPS_PER_CALL] * 2, calls
  assert 1 <= min(calls[2:]) and max(calls[2:]) <= 5, calls
  assert fired == [25, 50, 60]
  assert learner.train_step == 60 == sum(calls)
  assert phase.steps_per_second <= 20.0


def test_without_a_budget_each_call_runs_the_cap(cartpole, tmp_path):
  learner, calls = _counted_learner(cartpole, tmp_path)
  phase = run.OfflinePhase(learner, lambda: tf.zeros([1]), 30, (),
                           max_steps_per_call=12, seconds_per_call=None)
  run.run_phases(lambda: learner.train_step, 30, phase, [])
  assert calls == [12, 12, 6]
  with pytest.raises(ValueError, match='seconds_per_call must be > 0'):
    run.OfflinePhase(learner, None, 30, (), seconds_per_call=0.0)
  with pytest.raises(ValueError, match='max_steps_per_call must be >= 1'):
    run.OfflinePhase(learner, None, 30, (), max_steps_per_call=0)


def test_the_bar_prints_no_more_often_than_its_mininterval(cartpole,
                                                           tmp_path):
  # Each call sets the loss on the bar; with calls of a few seconds a
  # refresh per call would put a line into a log every few seconds, past
  # what TQDM_MININTERVAL (here an hour) allows. Only the first draw and
  # the close print.
  learner, _ = _counted_learner(cartpole, tmp_path)
  out = io.StringIO()
  with tqdm.tqdm(total=30, file=out, mininterval=3600, unit='grad step',
                 desc='bar') as bar:
    phase = run.OfflinePhase(learner, lambda: tf.zeros([1]), 30, (),
                             bar=bar, max_steps_per_call=3)
    run.run_phases(lambda: learner.train_step, 30, phase, [], bar)
  draws = out.getvalue().count('bar:')
  assert draws == 2, out.getvalue()
  assert 'loss=1' in out.getvalue()  # The close shows the last postfix.
