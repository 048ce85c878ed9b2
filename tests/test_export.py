"""rlds_reverb.agents.export: every agent's actor, read into a numpy policy,
acts as TF-Agents' greedy policy.
"""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.policies import greedy_policy
from tf_agents.trajectories import time_step as ts

from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.agents import export


@pytest.mark.parametrize(
    'kind', [k for k in registry.AGENTS if registry.get(k).head not in (None, 'q_argmax')])
def test_numpy_policy_is_the_tf_agents_greedy_policy(kind, specs, tmp_path):
  agent = registry.make_agent(kind, specs.time_step_spec, specs.action_spec)
  policy = export.from_network(factory.actor_network(agent),
                               registry.get(kind).head, specs.action_spec)
  obs = np.random.default_rng(0).normal(size=(8, 17)).astype(np.float32)
  step = ts.restart(tf.constant(obs), batch_size=8)
  expected = greedy_policy.GreedyPolicy(agent.policy).action(step).action
  np.testing.assert_allclose(policy.greedy(obs), expected.numpy(), atol=1e-5)
  policy.save(str(tmp_path / 'p.npz'))
  loaded = numpy_policy.load(str(tmp_path / 'p.npz'))
  np.testing.assert_array_equal(loaded.greedy(obs), policy.greedy(obs))


@pytest.mark.parametrize('kind,config_class', [('iql', 'IqlConfig'),
                                               ('awac', 'AwacConfig')])
def test_actor_choice_picks_the_head_and_exports_its_std(kind, config_class,
                                                         specs):
  record = registry.get(kind)
  method = record.method_config
  assert method.__name__ == config_class
  obs = np.random.default_rng(1).normal(size=(8, 17)).astype(np.float32)
  step = ts.restart(tf.constant(obs), batch_size=8)
  gaussian_head = {'iql': 'tanh_mean_gaussian', 'awac': 'gaussian'}[kind]
  for actor, head in (('gaussian', gaussian_head), ('squashed', 'tanh_normal')):
    agent = registry.make_agent(kind, specs.time_step_spec,
                                specs.action_spec,
                                method_config=method(actor=actor))
    network = factory.actor_network(agent)
    assert export.network_head(network, record.head) == head
    policy = export.from_network(network, head, specs.action_spec)
    expected = greedy_policy.GreedyPolicy(agent.policy).action(step).action
    np.testing.assert_allclose(policy.greedy(obs), expected.numpy(),
                               atol=1e-5)
  # The Gaussian actor's std travels with the policy, and refreshes.
  agent = registry.make_agent(kind, specs.time_step_spec, specs.action_spec,
                              method_config=method(actor='gaussian'))
  network = factory.actor_network(agent)
  policy = export.from_network(network, gaussian_head, specs.action_spec)
  np.testing.assert_allclose(policy.log_std, np.zeros(6), atol=1e-7)
  network._projection_networks._bias.bias.assign(  # pylint: disable=protected-access
      tf.constant([-1.0, -2.0, 0.5, 1.0, 3.0, -30.0]))
  export.update_weights(policy, network)
  # Clamped to CORL's [-20, 2], as the TF distribution's scale is.
  np.testing.assert_allclose(policy.log_std, [-1, -2, 0.5, 1, 2, -20],
                             rtol=1e-6)
  scale = agent.action_distribution(tf.constant(obs)).stddev().numpy()
  np.testing.assert_allclose(np.log(scale[0]), policy.log_std, rtol=1e-5)
