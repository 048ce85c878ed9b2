"""Learners that fail: each failure ends with one short line naming its cause.

In training (rlds_reverb.learners.run / loop): an op error becomes the op's
own message with the phase and the step, a non-finite loss stops training at
its step.
"""

import os
import pathlib
import subprocess
import sys

import pytest
import tensorflow as tf

from rlds_reverb import recording
from rlds_reverb.learners import loop
from rlds_reverb.learners import run
from conftest import _dqn  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')


def _train(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-m', 'pipelines.train', *args], cwd=REPO, env=ENV,
      capture_output=True, text=True, timeout=timeout, check=False)


def _error_line(proc: subprocess.CompletedProcess) -> str:
  assert proc.returncode != 0, proc.stdout
  assert 'Traceback' not in proc.stderr, proc.stderr
  errors = [l for l in proc.stderr.splitlines() if l.startswith('train: error')]
  assert len(errors) == 1, proc.stderr
  return errors[0]


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
  line = _error_line(_train(
      '--agent', 'td3_bc', '--dataset', data, '--root_dir',
      str(tmp_path / 'run'), '--steps', '50', '--batch_size', '16',
      '--eval_episodes', '1', '--critic_learning_rate', '1e30',
      '--actor_learning_rate', '1e30'))
  assert line.startswith('train: error: offline training stopped at '
                         'gradient step '), line
  assert 'inf or nan' in line or 'loss became' in line, line
  assert len(line) < 300 and 'File "' not in line, line
