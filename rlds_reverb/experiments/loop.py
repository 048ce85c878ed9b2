"""The learner's state and its bookkeeping: steps, checkpoints, logs, curves.

A `Learner` owns one TF-Agents agent and everything that must survive an
interruption: the agent (networks, targets, optimizers, train step) and the
environment-step counter go into a `tf.train.Checkpoint`; evaluation
results are appended to `eval.jsonl`, from which the PNG curve is redrawn,
so a resumed run continues the same curve. Gradient steps run several per
`tf.function` call, which removes most of the per-step Python overhead.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Any, Callable, Iterator

import tensorflow as tf

from rlds_reverb.experiments import curves

CHECKPOINT_DIR = 'checkpoints'
EVAL_LOG = 'eval.jsonl'
CURVE_PNG = 'learning_curve.png'
TENSORBOARD_DIR = 'tensorboard'


class NonFiniteLossError(FloatingPointError):
  """A gradient step's loss was nan or inf; the message names the step."""


class Learner:
  """Trains `agent` from an experience iterator, with checkpoints and logs.

  Attributes:
    agent: the TF-Agents agent.
    env_steps: environment steps taken so far (online; 0 offline).
    root_dir: where checkpoints, logs and the curve go.
  """

  def __init__(self, agent: Any, root_dir: str, *,
               summary_interval: int = 1000, max_checkpoints: int = 2,
               train_step_fn: Callable[[Any], tf.Tensor] | None = None,
               **extra_state: Any):
    """`train_step_fn(batch) -> loss` replaces `agent.train(batch).loss`
    (prioritized replay: the replay variant's train step); `extra_state` goes
    into the checkpoint with the agent."""
    self.agent = agent
    self._train_step_fn = train_step_fn or (
        lambda batch: agent.train(batch).loss)
    self.root_dir = root_dir
    self.env_steps = tf.Variable(0, dtype=tf.int64, name='env_steps')
    self.checkpoint = tf.train.Checkpoint(
        agent=agent, env_steps=self.env_steps, **extra_state)
    self.manager = tf.train.CheckpointManager(
        self.checkpoint, os.path.join(root_dir, CHECKPOINT_DIR),
        max_to_keep=max_checkpoints)
    self.summary_writer = tf.summary.create_file_writer(
        os.path.join(root_dir, TENSORBOARD_DIR))
    self._summary_interval = summary_interval
    self._train_fn = None
    # How the curve is drawn (set_curve, or the last log_eval).
    self._curve: dict | None = None

  def set_train_step(self, train_step_fn: Callable[[Any], tf.Tensor]
                     ) -> None:
    """Replaces the train step (before the first `train`)."""
    self._train_step_fn = train_step_fn
    self._train_fn = None

  @property
  def train_step(self) -> int:
    return int(self.agent.train_step_counter.numpy())

  def restore(self) -> bool:
    """Restores the latest checkpoint in root_dir, if there is one, and
    drops the evaluation records of a dead run beyond it.

    A run that died after evaluating past its last checkpoint left records
    that the resumed run will write again, from other weights:
    `trim_eval_log` keeps the records up to the restored steps (none for a
    run that restores nothing) and redraws the curve.
    """
    latest = self.manager.latest_checkpoint
    if latest is not None:
      # The optimizers' variables are made at the first train step and get
      # their values then (deferred restore). A run that stops before it,
      # such as a resume refused for a missing replay, would otherwise end
      # with pages of TensorFlow warnings below its error line.
      self.checkpoint.restore(latest).expect_partial()
    self.trim_eval_log()
    return latest is not None

  def trim_eval_log(self) -> int:
    """Keeps the eval records whose steps the learner has reached (both its
    gradient and its env steps), and no cut last line; redraws the curve.
    Returns how many records were dropped."""
    path = os.path.join(self.root_dir, EVAL_LOG)
    if not os.path.exists(path):
      return 0
    with open(path, 'rb') as f:
      content = f.read()
    records = self.eval_records()
    train_step, env_steps = self.train_step, int(self.env_steps.numpy())
    kept = [r for r in records if r.get('train_step', 0) <= train_step
            and r.get('env_steps', 0) <= env_steps]
    if len(kept) == len(records) and content.endswith(b'\n'):
      return 0
    tmp = path + '.tmp'
    with open(tmp, 'w') as f:
      f.writelines(json.dumps(r) + '\n' for r in kept)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
    dropped = len(records) - len(kept)
    if dropped:
      print(f'{path}: dropped {dropped} evaluation record(s) beyond the '
            f'checkpoint resumed from (gradient step {train_step}, env step '
            f'{env_steps}); those steps are evaluated again',
            file=sys.stderr)
    curve = os.path.join(self.root_dir, CURVE_PNG)
    if kept and self._curve is not None:
      self._draw_curve(**self._curve)
    elif os.path.exists(curve):  # Drawn from records that are gone.
      os.remove(curve)
    return dropped

  def set_curve(self, *, x: str, title: str, y: str = 'average_return'
                ) -> None:
    """How the PNG curve is drawn (`log_eval` and `trim_eval_log`)."""
    self._curve = dict(x=x, title=title, y=y)

  def save(self) -> str:
    return self.manager.save(checkpoint_number=self.train_step)

  def train(self, source: Iterator[Any] | Callable[[], Any],
            num_steps: int) -> float:
    """Runs `num_steps` gradient steps; returns the last total loss.

    `source` is an in-graph feed (`rlds_reverb.replay.feeds`: called for
    each batch inside the same `tf.function` as the step) or an iterator
    of batches (a streaming `tf.data` reader).

    Raises:
      NonFiniteLossError: a step's loss was nan or inf (training stops at
        that step; no later step runs).
    """
    if self._train_fn is None:
      agent, interval = self.agent, self._summary_interval
      # Autograph converts only this loop: converting every function the
      # step calls (TF-Agents' and ours, none of which needs it) costs
      # most of a short run's start-up.
      as_is = tf.autograph.experimental.do_not_convert

      @tf.function
      def train_steps(source, n):
        loss = tf.constant(0.0)
        for _ in tf.range(n):
          with tf.summary.record_if(
              tf.equal(agent.train_step_counter % interval, 0)):
            batch = as_is(source)() if callable(source) else next(source)
            loss = as_is(self._train_step_fn)(batch)
          # A non-finite loss ends the call at the step that made it
          # (one scalar check per step).
          if not tf.math.is_finite(loss):
            break
        return loss

      self._train_fn = train_steps
    with self.summary_writer.as_default():
      loss = float(self._train_fn(source, tf.constant(num_steps)))
    if not math.isfinite(loss):
      raise NonFiniteLossError(
          f'the loss became {loss} at gradient step {self.train_step}')
    return loss

  def write_scalars(self, values: dict[str, float], step: int,
                    prefix: str) -> None:
    with self.summary_writer.as_default():
      for name, value in values.items():
        if value is not None:
          tf.summary.scalar(f'{prefix}/{name}', value, step=step)
    self.summary_writer.flush()

  def eval_records(self) -> list[dict]:
    return self.read_eval_log(self.root_dir)

  @staticmethod
  def read_eval_log(root_dir: str) -> list[dict]:
    """The eval records of the run in `root_dir` (empty if none yet); see
    `read_eval_file`."""
    return read_eval_file(os.path.join(root_dir, EVAL_LOG))

  def log_eval(self, record: dict, *, x: str, title: str,
               y: str = 'average_return') -> dict:
    """Appends an eval record, writes it to TensorBoard, redraws the PNG."""
    record = {'train_step': self.train_step,
              'env_steps': int(self.env_steps.numpy()),
              'time': round(time.time(), 1), **record}
    os.makedirs(self.root_dir, exist_ok=True)
    # One write of the whole line, on disk before anything reads it: a
    # crash leaves at most a cut last line, which readers skip.
    with open(os.path.join(self.root_dir, EVAL_LOG), 'a') as f:
      f.write(json.dumps(record) + '\n')
      f.flush()
      os.fsync(f.fileno())
    self.write_scalars({k: v for k, v in record.items()
                        if isinstance(v, (int, float)) and k != 'time'},
                       step=record[x], prefix='eval')
    self.set_curve(x=x, title=title, y=y)
    self._draw_curve(**self._curve)
    return record

  def _draw_curve(self, *, x: str, title: str, y: str) -> None:
    curves.plot_curves({title: self.eval_records()},
                       os.path.join(self.root_dir, CURVE_PNG), x=x, y=y,
                       title=title, x_label=x.replace('_', ' '),
                       y_label=y.replace('_', ' ') +
                       ' (greedy, eval episodes)')


def read_eval_file(path: str) -> list[dict]:
  """The eval records in an eval.jsonl at `path` (empty if it is missing):
  a run's own, or a copy kept beside a figure.

  A last line cut short (a crash while it was written) is skipped with a
  warning on stderr; `Learner.trim_eval_log` removes it.

  Raises:
    ValueError: a line before the last is not a JSON record.
  """
  if not os.path.exists(path):
    return []
  with open(path) as f:
    lines = f.read().split('\n')
  records = []
  for number, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except ValueError as e:
      if number < len(lines):  # Not the last line: a damaged log.
        raise ValueError(f'{path} line {number} is not a JSON record: '
                         f'{e}') from e
      print(f'{path}: skipping its last line, cut short (a crash while '
            'it was written)', file=sys.stderr)
  return records
