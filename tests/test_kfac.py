"""K-FAC (agents/onpolicy/kfac.py) against exact computations.

The Kronecker factors of a layer whose input is the same for every sample
are exact: the empirical Fisher of per-sample gradients g_n a^T is
(a a^T) (x) mean(g_n g_n^T). The tests build that Fisher from per-sample
gradients taken one sample at a time, compare the damped natural gradient
with a dense solve, and check one whole step (trust region, momentum).
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from rlds_reverb.agents import actor_critic
from rlds_reverb.agents.onpolicy import kfac
from rlds_reverb.agents.onpolicy import ppo
from rlds_reverb.experiments import onpolicy


def _sampled_fisher(model, observations, actions, noise):
  """Captures and each layer's per-sample Fisher loss gradient by its
  output (of the batch's mean Fisher loss, as the updater takes it)."""
  with tf.GradientTape(persistent=True) as tape:
    out, value, log_std, captures = kfac.forward(model, observations, tape)
    log_prob, _ = actor_critic.policy_terms(out, actions, log_std)
    fisher = -tf.reduce_mean(log_prob) - tf.reduce_mean(
        tf.square(value - tf.stop_gradient(value + noise)))
  grads = tape.gradient(fisher, [c.output for c in captures])
  return captures, grads


def _per_sample_gradients(model, observations, actions, noise,
                          layers=None):
  """Per layer (those at `layers`; None: all): [n, params], row n the
  gradient of sample n's Fisher loss (row-major [in+1, out])."""
  rows = []
  for i in range(observations.shape[0]):
    with tf.GradientTape() as tape:
      out, value, log_std, captures = kfac.forward(
          model, observations[i:i + 1])
      log_prob, _ = actor_critic.policy_terms(out, actions[i:i + 1], log_std)
      loss = -log_prob[0] - tf.square(
          value[0] - tf.stop_gradient(value[0] + noise[i]))
    grads = tape.gradient(loss, kfac.variables_of(captures))
    rows.append([kfac.as_matrix(c, g).numpy().ravel()
                 for j, (c, g) in enumerate(zip(
                     captures, kfac.group(grads, captures)))
                 if layers is None or j in layers])
  return [np.stack(layer) for layer in zip(*rows)]


@pytest.mark.parametrize('discrete', [True, False])
def test_factors_equal_the_fisher_of_one_input(discrete):
  rng = np.random.default_rng(0)
  kwargs = {'num_actions': 3} if discrete else {'action_size': 2}
  model = actor_critic.ActorCritic(4, hidden=(5,), initial_log_std=-0.3,
                                   **kwargs)
  n = 12
  observations = tf.constant(np.repeat(rng.normal(size=(1, 4)), n, 0),
                             tf.float32)
  actions = (rng.integers(0, 3, n) if discrete
             else rng.normal(size=(n, 2)).astype(np.float32))
  noise = tf.constant(rng.normal(size=n), tf.float32)
  captures, grads = _sampled_fisher(model, observations, actions, noise)
  exact = [v.T @ v / n for v in _per_sample_gradients(
      model, observations, actions, noise)]
  # actor 2 Dense, critic 2 Dense, and the log std block if Gaussian.
  assert len(captures) == (4 if discrete else 5)
  for capture, grad, want in zip(captures, grads, exact):
    a, g = kfac.factors(capture, grad, n)
    np.testing.assert_allclose(np.kron(a.numpy(), g.numpy()), want,
                               rtol=1e-4, atol=1e-6)


def test_factors_estimate_the_true_fisher_of_a_categorical_policy():
  """With actions drawn from the policy, the output layer's K-FAC block
  is a Monte Carlo estimate of sum_a pi(a) grad log pi(a) grad log pi(a)^T.
  At 20,000 draws its relative (Frobenius) error was 0.005 on average over
  30 seeds (std 0.003, largest 0.014); the bound is 0.05."""
  tf.keras.utils.set_random_seed(1)
  rng = np.random.default_rng(1)
  model = actor_critic.ActorCritic(3, hidden=(4,), num_actions=3)
  observation = rng.normal(size=(1, 3)).astype(np.float32)
  probs = tf.nn.softmax(model.actor(observation))[0].numpy()
  n = 20_000
  actions = rng.choice(3, size=n, p=probs / probs.sum())
  captures, grads = _sampled_fisher(
      model, tf.constant(np.repeat(observation, n, 0)), actions,
      tf.zeros([n]))
  a, g = kfac.factors(captures[1], grads[1], n)  # the logits layer
  estimate = np.kron(a.numpy(), g.numpy())
  true = 0.0
  for action in range(3):
    with tf.GradientTape() as tape:
      out, _, _, caps = kfac.forward(model, tf.constant(observation))
      log_prob = tf.nn.log_softmax(out)[0, action]
    grad = tape.gradient(log_prob, list(caps[1].variables))
    vector = kfac.as_matrix(caps[1], grad).numpy().ravel()
    true = true + probs[action] * np.outer(vector, vector)
  error = np.linalg.norm(estimate - true) / np.linalg.norm(true)
  assert error < 0.05


def test_conv_factors_read_patches_in_the_kernels_order():
  """sum over positions of g_t a_t^T from the captured patches is the
  kernel's (and bias's) gradient, for each of the Nature convolutions; and
  where a convolution has one output position its block is exact."""
  rng = np.random.default_rng(2)
  model = actor_critic.CnnActorCritic((2, 36, 36), num_actions=3)
  observations = tf.constant(rng.integers(0, 255, (3, 2, 36, 36)), tf.uint8)
  weights = tf.constant(rng.normal(size=(3, 3)), tf.float32)
  with tf.GradientTape(persistent=True) as tape:
    out, _, _, captures = kfac.forward(model, observations, tape)
    loss = tf.reduce_sum(out * weights)
  convs = [c for c in captures if c.kind == 'conv']
  assert [c.output.shape[1] for c in convs] == [8, 3, 1]
  for capture in convs:
    output_grad = tape.gradient(loss, capture.output)
    grads = tape.gradient(loss, list(capture.variables))
    patches = kfac._patches(capture).numpy()  # pylint: disable=protected-access
    patches = np.concatenate([patches, np.ones((len(patches), 1))], 1)
    rows = output_grad.numpy().reshape(len(patches), -1)
    np.testing.assert_allclose(patches.T @ rows,
                               kfac.as_matrix(capture, grads).numpy(),
                               rtol=1e-4, atol=1e-4)
  # Conv 3 (one position), on one repeated frame stack.
  repeated = tf.repeat(observations[:1], 4, axis=0)
  actions = rng.integers(0, 3, 4)
  noise = tf.constant(rng.normal(size=4), tf.float32)
  captures, grads = _sampled_fisher(model, repeated, actions, noise)
  per_sample, = _per_sample_gradients(model, repeated, actions, noise,
                                      layers=(2,))
  a, g = (x.numpy() for x in kfac.factors(captures[2], grads[2], 4))
  # Its block has 36,928^2 entries: compare F x with (A (x) G) x =
  # vec(A X G) on random probes X instead.
  for _ in range(3):
    probe = rng.normal(size=(a.shape[0], g.shape[0]))
    fisher_x = per_sample.T @ (per_sample @ probe.ravel()) / 4
    np.testing.assert_allclose((a @ probe @ g).ravel(), fisher_x,
                               rtol=1e-3, atol=1e-3 * np.abs(fisher_x).max())


def test_natural_gradient_equals_a_damped_dense_solve():
  rng = np.random.default_rng(3)
  model = actor_critic.ActorCritic(3, hidden=(4,), num_actions=2)
  captures = kfac.forward(model, tf.zeros([1, 3]))[3]
  optimizer = kfac.KfacOptimizer(damping=0.05)
  optimizer.build(captures)
  grads, want = [], []
  for block in optimizer.blocks:
    for side in ('a', 'g'):
      n = block[side].shape[0]
      root = rng.normal(size=(n, n))
      block[side].assign(root @ root.T / n)
    grad = rng.normal(size=block['velocity'].shape).astype(np.float32)
    grads.append(tf.constant(grad))
    fisher = np.kron(block['a'].numpy(), block['g'].numpy())
    want.append(np.linalg.solve(fisher + 0.05 * np.eye(len(fisher)),
                                grad.ravel()).reshape(grad.shape))
  optimizer._refresh_eigenbases()  # pylint: disable=protected-access
  for got, expected in zip(optimizer.natural_gradients(grads), want):
    np.testing.assert_allclose(got.numpy(), expected, rtol=2e-3, atol=2e-4)


@pytest.mark.parametrize('kl_clip', [1e-6, 1e4])
def test_one_step_moves_by_the_clipped_natural_gradient(kl_clip):
  """First step: factors from this batch, eigenbases refreshed, nu =
  min(1, sqrt(kl_clip / (lr^2 V.grad))), and W -= lr (1 - momentum) nu V."""
  rng = np.random.default_rng(4)
  model = actor_critic.ActorCritic(3, hidden=(4,), num_actions=2)
  n = 32
  observations = tf.constant(rng.normal(size=(n, 3)), tf.float32)
  actions = rng.integers(0, 2, n)
  noise = tf.constant(rng.normal(size=n), tf.float32)
  captures, output_grads = _sampled_fisher(model, observations, actions,
                                           noise)
  loss_grads = [tf.constant(rng.normal(size=v.shape), tf.float32)
                for v in kfac.variables_of(captures)]
  grouped = kfac.group(loss_grads, captures)
  before = [v.numpy() for v in kfac.variables_of(captures)]
  steps, vg = [], 0.0
  for capture, grad, grads in zip(captures, output_grads, grouped):
    a, g = (x.numpy().astype(np.float64)
            for x in kfac.factors(capture, grad, n))
    matrix = kfac.as_matrix(capture, grads).numpy().astype(np.float64)
    fisher = np.kron(a, g) + 0.01 * np.eye(a.shape[0] * g.shape[0])
    step = np.linalg.solve(fisher, matrix.ravel()).reshape(matrix.shape)
    steps.append(step)
    vg += float(np.sum(step * matrix))
  optimizer = kfac.KfacOptimizer(0.25, kl_clip=kl_clip)
  stats = optimizer.apply(captures, grouped, output_grads, n)
  nu = min(1.0, np.sqrt(kl_clip / (0.25 ** 2 * vg)))
  assert float(stats['kfac_nu']) == pytest.approx(nu, rel=1e-3)
  assert (nu < 1.0) == (kl_clip < 1.0)
  after = [v.numpy() for v in kfac.variables_of(captures)]
  moved = kfac.group([b - a for a, b in zip(before, after)], captures)
  for capture, delta, step in zip(captures, moved, steps):
    got = kfac.as_matrix(capture, [tf.constant(d) for d in delta]).numpy()
    np.testing.assert_allclose(got, -0.25 * 0.1 * nu * step, rtol=2e-3,
                               atol=1e-7)


def test_acktr_updates_lower_a_fixed_rollouts_loss():
  rng = np.random.default_rng(5)
  model = actor_critic.ActorCritic(5, hidden=(16,), action_size=2)
  config = ppo.defaults_for('acktr', False)
  updater = ppo.Updater(model, config)
  updater.build()
  n = 256
  observation = rng.normal(size=(n, 5)).astype(np.float32)
  batch = {
      'observation': observation,
      'action': rng.normal(size=(n, 2)).astype(np.float32),
      'log_prob': np.zeros(n, np.float32),
      'advantage': rng.normal(size=n).astype(np.float32),
      'return': (3.0 * np.tanh(observation @ np.linspace(-1, 1, 5))
                 ).astype(np.float32),
      'value': np.zeros(n, np.float32),
  }
  first = updater(batch, 1.0, seed=0)
  for step in range(1, 30):
    last = updater(batch, 1.0, seed=step)
  assert last['value_loss'] < 0.5 * first['value_loss']
  assert last['policy_loss'] < first['policy_loss']
  assert 0.0 < last['kfac_nu'] <= 1.0
  assert int(model.train_step_counter.numpy()) == 30


def test_acktr_refuses_what_kfac_cannot_take():
  with pytest.raises(ValueError, match='acktr takes feed-forward'):
    ppo.defaults_for('acktr', True, recurrent=True)
  with pytest.raises(ValueError, match='one step per rollout'):
    ppo.defaults_for('acktr', True, epochs=4)
  model = actor_critic.RecurrentActorCritic(3, num_actions=2)
  with pytest.raises(ValueError, match='feed-forward models'):
    kfac.forward(model, tf.zeros([1, 3]))
  with pytest.raises(ValueError, match='damping must be > 0'):
    kfac.KfacOptimizer(damping=0.0)


def test_an_acktr_run_resumes_with_its_factors(tmp_path):
  """CartPole, 8 copies x 20 steps a rollout: two updates, a checkpoint,
  then a resumed run's third update continues the optimizer's count and
  starts from the saved factors (a fresh optimizer would restart at 1)."""
  root = str(tmp_path / 'acktr')

  def train(env_steps, updates):
    return onpolicy.train_onpolicy(onpolicy.OnPolicyConfig(
        env='CartPole-v1', agent='acktr', root_dir=root,
        env_steps=env_steps, eval_interval=env_steps, eval_episodes=1,
        checkpoint_interval=160), show_progress=False,
                                   on_update=updates.append)

  def saved(name):
    path = tf.train.latest_checkpoint(os.path.join(root, 'checkpoints'))
    return tf.train.load_variable(path, f'optimizer/{name}/'
                                  '.ATTRIBUTES/VARIABLE_VALUE')

  first, second = [], []
  train(320, first)
  factor = saved('blocks/0/a')
  assert int(saved('iterations')) == 2 and np.abs(factor).max() > 0
  train(480, second)
  assert [u['env_steps'] for u in second] == [480]
  assert int(saved('iterations')) == 3
  # One more update folds a batch in at decay 0.99: close to the saved.
  np.testing.assert_allclose(saved('blocks/0/a'), factor, rtol=0.05,
                             atol=0.05 * np.abs(factor).max())
  assert 0.0 < second[0]['kfac_nu'] <= 1.0
