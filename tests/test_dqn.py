"""rlds_reverb.agents.dqn: the exported Q-policy equals the Q-network
(plain and dueling); DQN and discrete-action checks.
"""

import numpy as np
import pytest

from rlds_reverb.acting import envs
from rlds_reverb.agents import registry
from rlds_reverb.agents import dqn
from rlds_reverb.experiments import online
from conftest import _dqn  # pylint: disable=g-bad-import-order


@pytest.mark.parametrize('dueling', [False, True])
def test_numpy_q_policy_is_the_q_network(cartpole, dueling):
  agent = _dqn(cartpole, dueling=dueling)
  policy = dqn.export_q_policy(agent, cartpole.action_spec)
  obs = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
  q_values, _ = agent._q_network(obs)  # pylint: disable=protected-access
  np.testing.assert_allclose(policy._last_layer(obs), q_values.numpy(),  # pylint: disable=protected-access
                             rtol=1e-4, atol=1e-5)
  np.testing.assert_array_equal(policy.greedy(obs),
                                np.argmax(q_values.numpy(), axis=1))
  if dueling:
    assert isinstance(agent._q_network, dqn.DuelingQNetwork)  # pylint: disable=protected-access


def test_dqn_refuses_continuous_actions():
  specs = envs.env_specs('HalfCheetah-v5')
  with pytest.raises(ValueError, match='dqn needs one discrete action'):
    registry.make_agent('dqn', specs.time_step_spec, specs.action_spec)
  with pytest.raises(ValueError, match='needs discrete actions'):
    online.check_agent_fits_env('dqn', specs)
  with pytest.raises(ValueError, match='has discrete actions'):
    online.check_agent_fits_env('sac', envs.env_specs('CartPole-v1'))
