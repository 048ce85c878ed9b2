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
