"""A2C's RMSprop (agents/onpolicy/rmsprop.py) against PyTorch's update rule
written out in numpy, and the config switch between it and Keras'."""

import numpy as np
import pytest
import tensorflow as tf

from rlds_reverb.agents.onpolicy import ppo
from rlds_reverb.agents.onpolicy import rmsprop

LR, RHO, EPS = 7e-4, 0.99, 1e-5


def _torch_rule(weights, gradients):
  """PyTorch's RMSprop (no momentum, not centred), step by step."""
  w, v = weights.copy(), np.zeros_like(weights)
  for g in gradients:
    v = RHO * v + (1 - RHO) * g * g
    w = w - LR * g / (np.sqrt(v) + EPS)
  return w


def _apply(optimizer, weights, gradients):
  variable = tf.Variable(weights)
  for g in gradients:
    optimizer.apply_gradients([(tf.constant(g), variable)])
  return variable.numpy()


def test_steps_equal_pytorchs_rule_over_gradients_of_many_scales():
  rng = np.random.default_rng(0)
  weights = rng.normal(size=[64]).astype(np.float64)
  # Root mean squares from 1e-8 to 1: below, near and above epsilon.
  scales = np.logspace(-8, 0, 64)
  gradients = [rng.normal(size=[64]) * scales for _ in range(20)]
  got = _apply(rmsprop.TorchRMSprop(LR, rho=RHO, epsilon=EPS),
               weights, gradients)
  np.testing.assert_allclose(got, _torch_rule(weights, gradients),
                             rtol=1e-6)  # lr is held in float32.


def test_small_gradients_take_far_longer_steps_than_keras_rmsprop():
  # The failure it fixes: Keras' sqrt(v + eps) floor shrinks the step of a
  # weight whose gradients are ~1e-6 by about sqrt(eps) / 1e-6 ~ 3,000x.
  weights = np.zeros([4])
  gradients = [np.full([4], 1e-6)] * 10
  ours = -_apply(rmsprop.TorchRMSprop(LR, rho=RHO, epsilon=EPS),
                 weights, gradients)
  keras = -_apply(tf.keras.optimizers.RMSprop(LR, rho=RHO, epsilon=EPS),
                  weights, gradients)
  assert np.all(ours > 100 * keras), (ours, keras)
  # For large gradients epsilon hardly matters: both agree within 1 %.
  big = [np.full([4], 1.0)] * 10
  np.testing.assert_allclose(
      _apply(rmsprop.TorchRMSprop(LR, rho=RHO, epsilon=EPS), weights, big),
      _apply(tf.keras.optimizers.RMSprop(LR, rho=RHO, epsilon=EPS),
             weights, big), rtol=1e-2)


@pytest.mark.parametrize('in_sqrt, expected', [
    (False, rmsprop.TorchRMSprop), (True, tf.keras.optimizers.RMSprop)])
def test_a2c_takes_the_seeds_rmsprop_unless_asked_for_keras(in_sqrt,
                                                             expected):
  config = ppo.PpoConfig(algorithm='a2c', rmsprop_epsilon_in_sqrt=in_sqrt)
  optimizer = ppo.make_optimizer(config)
  assert type(optimizer) is expected  # pylint: disable=unidiomatic-typecheck
  assert optimizer.epsilon == config.optimizer_epsilon
  assert optimizer.rho == config.rmsprop_alpha


def test_rmsprop_steps_tool_reads_a_checkpoints_second_moments(tmp_path):
  from tools import rmsprop_steps  # pylint: disable=import-outside-toplevel
  # v = 0 gives Keras' floor: sqrt(eps) / eps; a large v gives 1.
  np.testing.assert_allclose(rmsprop_steps.step_ratios(
      np.array([0.0, 1e6]), EPS), [np.sqrt(EPS) / EPS, 1.0], rtol=1e-6)
  small = tf.Variable(np.zeros([3, 4], np.float32))
  large = tf.Variable(np.zeros([5], np.float32))
  optimizer = tf.keras.optimizers.RMSprop(LR, rho=RHO, epsilon=EPS)
  optimizer.apply_gradients([(tf.fill([3, 4], 1e-7), small),
                             (tf.fill([5], 10.0), large)])
  prefix = tf.train.Checkpoint(optimizer=optimizer,
                               weights=[small, large]).save(
                                   str(tmp_path / 'ckpt'))
  line = rmsprop_steps.summarize(prefix, EPS)
  assert line['weights'] == 17
  by_size = {v['size']: v for v in line['per_variable']}
  expected = np.sqrt((1 - RHO) * 1e-14 + EPS) / (
      np.sqrt((1 - RHO) * 1e-14) + EPS)
  assert by_size[12]['median_step_ratio'] == round(expected, 1)
  assert by_size[5]['median_step_ratio'] == 1.0
  assert line['median_step_ratio'] == round(expected, 1)  # 12 of 17.
