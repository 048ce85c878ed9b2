"""rlds_reverb.agents.factory: the TF-Agents agents, trained on fixed
batches (losses fall, TD3+BC imitates, CQL's warm-up, TD errors per item).
"""

import numpy as np
import pytest
import tensorflow as tf

from rlds_reverb.replay import per
from rlds_reverb.acting import envs
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from conftest import _fixed_batch  # pylint: disable=g-bad-import-order


@pytest.mark.parametrize('kind, loss_field', [
    ('bc', None), ('td3_bc', 'critic_loss'), ('cql_sac', 'critic_loss')])
def test_loss_falls_on_a_fixed_batch(kind, loss_field, specs):
  tf.random.set_seed(0)
  agent = registry.make_agent(kind, specs.time_step_spec, specs.action_spec,
                            factory.AgentConfig(cql_bc_steps=0))
  batch = _fixed_batch()
  train = tf.function(agent.train, autograph=False)

  def loss():
    info = train(batch)
    return float(info.loss if loss_field is None else
                 getattr(info.extra, loss_field))

  # Seeds 0-2 fell below 0.21 of the first losses by step 30 and below 0.1
  # by step 40 (bc, td3_bc; cql_sac below 0.12 by step 20).
  first = np.mean([loss() for _ in range(3)])
  for _ in range(37):
    loss()
  last = np.mean([loss() for _ in range(3)])
  assert last < 0.5 * first, (first, last)


def test_td3_bc_actor_imitates_when_the_q_term_is_off(specs):
  agent = registry.make_agent('td3_bc', specs.time_step_spec, specs.action_spec,
                            factory.AgentConfig(td3_bc_alpha=0.0))
  batch = _fixed_batch(32)
  train = tf.function(agent.train, autograph=False)
  actor = factory.actor_network(agent)
  error = lambda: float(tf.reduce_mean(tf.square(
      actor(batch.observation[:, 0])[0] - batch.action[:, 0])))
  before = error()
  for _ in range(300):
    train(batch)
  assert error() < 0.2 * before


def test_cql_behaviour_cloning_warm_up_follows_the_config(specs):
  # A short budget needs a shorter warm-up than the D4RL config's 10k.
  agent = registry.make_agent('cql_sac', specs.time_step_spec,
                            specs.action_spec,
                            factory.AgentConfig(cql_bc_steps=7))
  assert agent._num_bc_steps == 7  # pylint: disable=protected-access
  default = registry.make_agent('cql_sac', specs.time_step_spec,
                              specs.action_spec)
  assert default._num_bc_steps == 10_000  # pylint: disable=protected-access


def test_unknown_and_on_policy_agents_are_refused(specs):
  with pytest.raises(ValueError, match="unknown agent 'nope'; one of: sac,"):
    registry.make_agent('nope', specs.time_step_spec, specs.action_spec)
  with pytest.raises(ValueError, match="'ppo' is built by the on-policy"):
    registry.make_agent('ppo', specs.time_step_spec, specs.action_spec)


@pytest.mark.parametrize('kind', ['sac', 'td3', 'td3_bc', 'cql_sac'])
def test_critic_learners_report_td_errors_and_take_weights(kind):
  specs = envs.env_specs('HalfCheetah-v5')
  agent = registry.make_agent(
      kind, specs.time_step_spec, specs.action_spec,
      factory.AgentConfig(actor_layers=(32,), critic_layers=(32,),
                         cql_bc_steps=0))
  batch = _fixed_batch(32)
  info = agent.train(batch, weights=tf.ones(32))
  td_error = info.extra.td_error.numpy()
  assert td_error.shape == (32,)
  assert np.all(np.isfinite(td_error)) and np.all(td_error >= 0)
  assert td_error.max() > 0
  assert float(per.td_errors(info).numpy().sum()) == pytest.approx(
      float(td_error.sum()))
  zero = agent.train(batch, weights=tf.zeros(32))
  # TF-Agents' own loss fields are still there, next to td_error.
  assert float(zero.extra.critic_loss) == pytest.approx(0.0, abs=1e-6)
