"""rlds_reverb.learners.loop: the learner's checkpoint restores every weight,
optimizer slot and step counter.
"""

import numpy as np
import pytest
import tensorflow as tf

from rlds_reverb.learners import agents
from rlds_reverb.learners import loop
from conftest import _fixed_batch  # pylint: disable=g-bad-import-order


def _optimized_variables(agent):
  """optimizer attribute -> the variables it trains."""
  # pylint: disable=protected-access
  actor = agents.actor_network(agent).trainable_variables
  found = {'_optimizer': actor} if hasattr(agent, '_optimizer') else {
      '_actor_optimizer': actor,
      '_critic_optimizer': (agent._critic_network_1.trainable_variables +
                            agent._critic_network_2.trainable_variables)}
  if hasattr(agent, '_alpha_optimizer'):
    found['_alpha_optimizer'] = [agent._log_alpha]
  return {name: (getattr(agent, name), variables)
          for name, variables in found.items()}


def _state(agent):
  """Agent variables by position; Adam slots and step count per variable."""
  state = {f'agent/{i}': v.numpy() for i, v in enumerate(agent.variables)}
  for name, (optimizer, variables) in _optimized_variables(agent).items():
    state[f'{name}/iterations'] = optimizer.iterations.numpy()
    for i, variable in enumerate(variables):
      for slot in ('m', 'v'):
        state[f'{name}/{slot}/{i}'] = optimizer.get_slot(variable,
                                                         slot).numpy()
  return state


@pytest.mark.parametrize('kind', ['bc', 'td3_bc', 'cql_sac'])
def test_checkpoint_restores_weights_and_optimizer_state(kind, specs,
                                                        tmp_path):
  make = lambda: agents.make_agent(kind, specs.time_step_spec,
                                   specs.action_spec)
  batch = _fixed_batch(32)
  agent = make()
  learner = loop.Learner(agent, str(tmp_path))
  iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
  learner.train(iterator, 7)
  learner.env_steps.assign(123)
  learner.save()
  saved = _state(agent)
  assert sum('/m/' in k for k in saved) > 4

  fresh = make()
  restored = loop.Learner(fresh, str(tmp_path))
  assert restored.restore()
  # Slots appear on first use; restoring fills them as they are made.
  for optimizer, variables in _optimized_variables(fresh).values():
    optimizer._create_all_weights(variables)  # pylint: disable=protected-access
  assert restored.train_step == 7
  assert int(restored.env_steps.numpy()) == 123
  got = _state(fresh)
  assert got.keys() == saved.keys()
  for name, value in saved.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)
  if kind == 'bc':  # Deterministic: the next step is identical too.
    learner.train(iterator, 1)
    restored.train(iter(tf.data.Dataset.from_tensors(batch).repeat()), 1)
    for name, value in _state(agent).items():
      np.testing.assert_allclose(_state(fresh)[name], value, rtol=1e-6,
                                 err_msg=name)
