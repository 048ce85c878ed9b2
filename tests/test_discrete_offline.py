"""Offline learners for discrete actions (RL Unplugged's Atari baselines):
behaviour cloning recovers the data's action rule, CQL(H) pushes down the
Q-values of actions the data never took (plain DQN does not), and an
offline run on recorded Pong frames trains, evaluates and exports an image
policy. Real TF-Agents DqnAgents, a real Reverb server, real ale-py Pong."""

import numpy as np
import pytest
import tensorflow as tf
import tree
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

import rlds_reverb
from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.agents.offline import discrete
from rlds_reverb.data import recording
from rlds_reverb.experiments import offline
from rlds_reverb.replay import memory as memory_lib
import rlds_fixtures as fx  # pylint: disable=g-bad-import-order
from conftest import converted_episodes  # pylint: disable=g-bad-import-order

OBS = 4


def _rule(observation: np.ndarray) -> np.ndarray:
  """The behaviour policy of the data: action 1 where obs[2] > 0."""
  return (observation[..., 2] > 0).astype(np.int64)


def _memory(seed=0):
  rng = np.random.default_rng(seed)
  episodes = fx.episodes_with_lengths([20] * 30, obs_dim=OBS, seed=seed)
  for episode in episodes:
    n = len(episode['reward'])
    episode['observation'] = rng.standard_normal((n, OBS)).astype(np.float32)
    episode['action'] = _rule(episode['observation'])
    episode['reward'] = np.ones(n, np.float32)
  spec, converted = converted_episodes(fx.make_rlds(episodes))
  return memory_lib.from_episodes(spec, converted)


def _agent(name, **method):
  tf.random.set_seed(0)
  observation = tf.TensorSpec([OBS], tf.float32, name='observation')
  action = tensor_spec.BoundedTensorSpec((), tf.int64, 0, 1, name='action')
  config = factory.AgentConfig(q_layers=(64, 64), dqn_learning_rate=1e-3,
                               gamma=0.9, target_update_period=50)
  method_config = discrete.DiscreteCqlConfig(**method) if method else None
  return registry.make_agent(name, ts.time_step_spec(observation), action,
                             config, method_config=method_config)


def _train(agent, memory, steps):
  train = tf.function(lambda: agent.train(memory.sample(64)).loss)
  return [float(train()) for _ in range(steps)]


def test_discrete_bc_recovers_the_data_rule():
  memory = _memory()
  agent = _agent('discrete_bc')
  losses = _train(agent, memory, 300)
  assert losses[-1] < 0.5 * losses[0]
  held_out = np.random.default_rng(9).standard_normal((500, OBS)).astype(
      np.float32)
  logits = agent._q_network(held_out)[0].numpy()  # pylint: disable=protected-access
  # Bound: the rule is a half-space of the inputs; an MLP after 300
  # steps of 64 gets all but a margin around it right.
  assert np.mean(np.argmax(logits, -1) == _rule(held_out)) > 0.9


def _gap(agent, memory):
  """Mean of Q(s, a_data) - Q(s, the other action) over the data."""
  steps = memory.read(tf.constant(memory.transition_rows()))
  q = agent._q_network(steps.observation)[0].numpy()  # pylint: disable=protected-access
  taken = steps.action.numpy()
  rows = np.arange(len(q))
  return float(np.mean(q[rows, taken] - q[rows, 1 - taken]))


def test_cql_pushes_down_actions_the_data_never_took():
  memory = _memory(1)
  cql = _agent('discrete_cql', alpha=1.0)
  plain = _agent('discrete_cql', alpha=0.0)  # DQN's loss alone.
  _train(cql, memory, 300)
  _train(plain, memory, 300)
  cql_gap, plain_gap = _gap(cql, memory), _gap(plain, memory)
  # Every action of the data is taken in every state where it applies,
  # so DQN's targets say nothing about the other action: its gap stays
  # near where the initialisation left it. CQL's term alone drives it up.
  assert cql_gap > 1.0 and cql_gap > plain_gap + 1.0, (cql_gap, plain_gap)


def test_discrete_agents_refuse_continuous_actions():
  observation = tf.TensorSpec([OBS], tf.float32)
  action = tensor_spec.BoundedTensorSpec((2,), tf.float32, -1, 1)
  with pytest.raises(ValueError, match='needs one discrete action'):
    registry.make_agent('discrete_bc', ts.time_step_spec(observation),
                        action)


def test_offline_cql_on_recorded_pong_exports_an_image_policy(tmp_path):
  data = tmp_path / 'pong'
  recording.generate_dataset('ALE/Pong-v5', 'random', 2, str(data), seed=1,
                             max_episode_steps=40, show_progress=False)
  summary = offline.train_offline(offline.OfflineConfig(
      agent='discrete_cql', env='ALE/Pong-v5', dataset=str(data),
      root_dir=str(tmp_path / 'run'), train_steps=20, batch_size=8,
      eval_interval=20, checkpoint_interval=20, eval_episodes=1),
                                  show_progress=False)
  assert summary['train_steps'] == 20 and summary['transitions'] == 80
  assert -21 <= summary['offline_return'] <= 21
  policy = numpy_policy.load(str(tmp_path / 'run' / 'policy_offline.npz'))
  assert policy.input_shape == [4, 84, 84] and policy.head == 'q_argmax'
  with pytest.raises(ValueError, match='needs discrete actions'):
    offline.train_offline(offline.OfflineConfig(
        agent='discrete_bc', env='HalfCheetah-v5', dataset=str(data),
        root_dir=str(tmp_path / 'other'), train_steps=1),
                          show_progress=False)


@pytest.mark.parametrize('kind', ['dqn', 'discrete_bc', 'discrete_cql'])
def test_the_synced_policy_acts_with_the_trained_encoder(kind):
  """Evaluation and actors act through a numpy copy that each sync
  refreshes: on frame stacks the copy's convolutions must follow the
  learner's too, not only its Dense layers (else a trained learner acts
  with its initial encoder)."""
  from rlds_reverb.agents import dqn  # pylint: disable=g-import-not-at-top
  from rlds_reverb.experiments import run  # pylint: disable=g-import-not-at-top
  tf.random.set_seed(0)
  frames = tensor_spec.BoundedTensorSpec((4, 84, 84), tf.uint8, 0, 255)
  action = tensor_spec.BoundedTensorSpec((), tf.int64, 0, 5)
  agent = registry.make_agent(kind, ts.time_step_spec(frames), action,
                              factory.AgentConfig(seed=0))
  policy = dqn.export_q_policy(agent, action)
  rng = np.random.default_rng(0)
  for variable in agent._q_network.trainable_variables:  # pylint: disable=protected-access
    variable.assign(variable + rng.normal(
        0, 0.05, variable.shape).astype(np.float32))  # "Training".
  stacks = rng.integers(0, 256, (16, 4, 84, 84), dtype=np.uint8)
  want = agent._q_network(tf.constant(stacks))[0].numpy()  # pylint: disable=protected-access
  assert not np.allclose(policy._last_layer(stacks), want, atol=1e-3)  # pylint: disable=protected-access
  run.sync_policy(policy, agent, kind)
  np.testing.assert_allclose(policy._last_layer(stacks), want, rtol=1e-4,  # pylint: disable=protected-access
                             atol=1e-4)
