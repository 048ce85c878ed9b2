"""rlds_reverb.agents.offline.iql and awac: the expectile loss by hand, critics
fit and actors clone a fixed batch (either actor), the Gaussian actor is
CORL's, checkpoints restore every variable, TD errors per item, PER
weights reach the critic losses, IQL's actor rate decays.
"""
# pylint: disable=protected-access

import os

import gin
import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from rlds_reverb.agents import factory
from rlds_reverb.agents.offline import awac
from rlds_reverb.agents.offline import iql
from rlds_reverb.agents.offline import offline_agent
from rlds_reverb.experiments import run
from conftest import _fixed_batch  # pylint: disable=g-bad-import-order

BATCH = 64
MAKERS = {'iql': iql.make_iql, 'awac': awac.make_awac}
# The loss parts each agent's PER weights scale.
WEIGHTED_PARTS = {'iql': ('value_loss', 'critic_loss'),
                  'awac': ('critic_loss',)}


def make(kind, seed=0, train_steps=1000, actor='squashed'):
  run.seed_everything(seed)  # also the actor's Keras initialisers
  time_step_spec = ts.time_step_spec(
      tensor_spec.TensorSpec([17], tf.float32, name='observation'))
  action_spec = tensor_spec.BoundedTensorSpec([6], tf.float32, -1, 1)
  # Resolved, as registry.make_agent hands it to the makers.
  config = factory.AgentConfig(
      actor_learning_rate=3e-4, critic_learning_rate=3e-4,
      actor_layers=(256, 256), critic_layers=(256, 256), gamma=0.99,
      target_update_tau=0.005, reward_scale_factor=1.0,
      train_steps=train_steps, seed=seed)
  method_config = (iql.IqlConfig(actor=actor) if kind == 'iql'
                   else awac.AwacConfig(actor=actor))
  return MAKERS[kind](time_step_spec, action_spec, config, None,
                      method_config)


def all_variables(agent):
  """Networks, target networks and optimizer state, in a fixed order."""
  networks = [agent._actor_network, agent._q_network,
              agent._target_q_network]
  optimizers = [agent._actor_optimizer, agent._q_optimizer]
  if hasattr(agent, '_value_network'):
    networks.append(agent._value_network)
    optimizers.append(agent._value_optimizer)
  variables = [v for n in networks for v in n.variables]
  variables += [v for o in optimizers for v in o.variables()]
  return variables + [agent.train_step_counter]


def test_expectile_loss_by_hand():
  diff = tf.constant([2.0, -1.0, 0.5, -3.0])
  # expectile 0.7: positive diffs weigh 0.7, negative 0.3.
  # (0.7*4 + 0.3*1 + 0.7*0.25 + 0.3*9) / 4 = (2.8 + 0.3 + 0.175 + 2.7) / 4
  #                                        = 5.975 / 4 = 1.49375
  assert float(iql.expectile_loss(diff, 0.7)) == pytest.approx(1.49375)
  # Weights [1, 0, 2, 0]: (2.8 + 0 + 0.35 + 0) / 4 = 0.7875
  assert float(iql.expectile_loss(
      diff, 0.7, tf.constant([1.0, 0.0, 2.0, 0.0]))) == pytest.approx(0.7875)
  # At 0.5 it is half the MSE: (4 + 1 + 0.25 + 9) / 4 / 2 = 1.78125
  assert float(iql.expectile_loss(diff, 0.5)) == pytest.approx(1.78125)


def data_log_likelihood(agent, batch):
  """Mean log pi(a | s) of the batch's actions under the agent's actor."""
  step = agent.transition(batch)
  return float(tf.reduce_mean(agent.action_distribution(
      step.observation).log_prob(agent.inside_bounds(step.action))))


@pytest.mark.parametrize('actor', offline_agent.ACTORS)
@pytest.mark.parametrize('kind', ['iql', 'awac'])
def test_critic_fits_and_actor_clones_a_fixed_batch(kind, actor):
  # The total loss need not fall: the advantage weights grow as the
  # critics fit. The critic loss falls and the data actions' likelihood
  # rises under either actor.
  agent = make(kind, actor=actor)
  batch = _fixed_batch(BATCH)  # [B, 2] Trajectory, HalfCheetah-shaped
  tf.nest.assert_same_structure(batch, agent.training_data_spec)
  train = tf.function(agent.train, autograph=False)
  likelihood_before = data_log_likelihood(agent, batch)
  critic_losses = [float(train(batch).extra.critic_loss)
                   for _ in range(60)]
  assert np.all(np.isfinite(critic_losses))
  first, last = np.mean(critic_losses[:10]), np.mean(critic_losses[-10:])
  assert last < first, (first, last)
  likelihood_after = data_log_likelihood(agent, batch)
  assert likelihood_after > likelihood_before + 0.1, (
      likelihood_before, likelihood_after)
  assert int(agent.train_step_counter.numpy()) == 60


@pytest.mark.parametrize('kind', ['iql', 'awac'])
def test_gaussian_actor_is_corls(kind):
  """State-independent std (log std clamped at [-20, 2]), tanh mean for
  IQL and a free mean for AWAC, and no tanh Jacobian in the likelihood of
  an action near the bounds."""
  # Not the default: the published rows used TF-Agents' squashed actor.
  assert (iql.IqlConfig().actor, awac.AwacConfig().actor) == (
      'squashed', 'squashed')
  agent = make(kind, actor='gaussian')
  obs = tf.constant(np.random.default_rng(1).normal(size=(5, 17)),
                    tf.float32)
  distribution = agent.action_distribution(obs)
  scale = distribution.stddev().numpy()
  np.testing.assert_allclose(scale, np.ones_like(scale))  # log std 0
  np.testing.assert_allclose(scale, scale[:1].repeat(5, 0))  # per state
  projection = agent._actor_network._projection_networks
  projection._bias.bias.assign(tf.fill([6], 5.0))
  np.testing.assert_allclose(agent.action_distribution(obs).stddev(),
                             np.exp(2.0), rtol=1e-5)  # clamped at 2
  projection._bias.bias.assign(tf.zeros([6]))
  if kind == 'iql':
    mean = distribution.mean().numpy()
    assert np.all(np.abs(mean) < 1.0)
  # log N(0.9999; mean, 1), summed over 6 dimensions, by hand.
  action = tf.fill([5, 6], 0.9999)
  mean = distribution.mean()
  by_hand = tf.reduce_sum(-0.5 * tf.square(action - mean)
                          - 0.5 * np.log(2 * np.pi), axis=-1)
  np.testing.assert_allclose(distribution.log_prob(action), by_hand,
                             rtol=1e-5)


@pytest.mark.parametrize('kind', ['iql', 'awac'])
def test_checkpoint_restores_every_variable(kind, tmp_path):
  agent = make(kind, seed=0)
  batch = _fixed_batch(BATCH)
  train = tf.function(agent.train, autograph=False)
  for _ in range(3):
    train(batch)
  path = tf.train.Checkpoint(agent=agent).save(
      os.path.join(str(tmp_path), 'ckpt'))

  fresh = make(kind, seed=1)
  # Adam makes its slots on the first update; make them now, so that the
  # restore has somewhere to put the saved moments.
  pairs = [('_actor_optimizer', '_actor_network'),
           ('_q_optimizer', '_q_network'),
           ('_value_optimizer', '_value_network')]
  for optimizer, network in pairs:
    if hasattr(fresh, optimizer):
      getattr(fresh, optimizer)._create_all_weights(
          getattr(fresh, network).trainable_variables)
  want, got = all_variables(agent), all_variables(fresh)
  assert len(want) == len(got)
  assert any(not np.array_equal(w.numpy(), g.numpy())
             for w, g in zip(want, got))  # the seeds differ
  tf.train.Checkpoint(agent=fresh).restore(path).assert_consumed()
  for w, g in zip(want, got):
    np.testing.assert_array_equal(w.numpy(), g.numpy(), err_msg=w.name)


@pytest.mark.parametrize('kind', ['iql', 'awac'])
def test_td_error_per_item_and_zero_weights(kind):
  agent = make(kind)
  batch = _fixed_batch(BATCH)
  info = agent.train(batch, weights=tf.ones(BATCH))
  td_error = info.extra.td_error.numpy()
  assert td_error.shape == (BATCH,)
  assert np.all(np.isfinite(td_error)) and td_error.max() > 0

  info = agent.train(batch, weights=tf.zeros(BATCH))
  for part in WEIGHTED_PARTS[kind]:
    assert float(getattr(info.extra, part)) == 0.0, part
  assert float(info.extra.actor_loss) != 0.0  # the actor is unweighted
  assert info.extra.td_error.numpy().max() > 0


def test_iql_actor_rate_decays_to_zero_over_train_steps():
  agent = make('iql', train_steps=4)
  optimizer = agent._actor_optimizer
  rate = lambda: float(optimizer._decayed_lr(tf.float32))
  assert rate() == pytest.approx(3e-4)
  train = tf.function(agent.train, autograph=False)
  batch = _fixed_batch(BATCH)
  train(batch)
  train(batch)
  # Cosine: 3e-4 * (1 + cos(pi * 2 / 4)) / 2 = 1.5e-4
  assert rate() == pytest.approx(1.5e-4, rel=1e-5)
  train(batch)
  train(batch)
  assert rate() == pytest.approx(0.0, abs=1e-12)
  # The critics keep their constant rate.
  assert float(agent._q_optimizer._decayed_lr(tf.float32)) == (
      pytest.approx(3e-4))


def test_gin_binds_the_method_settings():
  gin.clear_config()
  try:
    gin.parse_config_files_and_bindings(
        [], ['IqlConfig.expectile = 0.9', 'AwacConfig.awac_lambda = 1.0'],
        skip_unknown=False)
    assert make('iql')._config.expectile == 0.9
    assert make('awac')._config.awac_lambda == 1.0
  finally:
    gin.clear_config()


def test_settings_follow_corl():
  assert (iql.IqlConfig().expectile, iql.IqlConfig().temperature,
          iql.IqlConfig().max_exp_advantage) == (0.7, 3.0, 100.0)
  assert awac.AwacConfig().awac_lambda == pytest.approx(1 / 3)
  assert awac.AwacConfig().max_exp_weight == 100.0


def test_iql_actor_rate_rises_again_after_its_period():
  """PyTorch's CosineAnnealingLR, as CORL's IQL: fine-tuning past the
  offline phase does not leave the actor at a zero rate."""
  from rlds_reverb.agents.offline import iql as iql_lib  # pylint: disable=g-import-not-at-top
  schedule = iql_lib.PeriodicCosine(1.0, 4)
  assert [round(float(schedule(s)), 6) for s in (0, 2, 4, 6, 8)] == [
      1.0, 0.5, 0.0, 0.5, 1.0]


def test_unknown_actor_is_named():
  with pytest.raises(ValueError, match="unknown actor 'beta'.*squashed, "
                     'gaussian'):
    make('iql', actor='beta')
