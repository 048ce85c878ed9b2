"""Agents on image observations: the Nature DQN encoder in TF-Agents' DQN
(plain and dueling) trains on frame stacks drawn from the memory, and its
numpy export acts as the TF network does (same Q-values, same greedy
actions, through a save and a load)."""

import numpy as np
import pytest
import tensorflow as tf
import tree
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

import rlds_reverb
from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import dqn
from rlds_reverb.agents import factory
from rlds_reverb.agents import image_networks
from rlds_reverb.agents import registry
from rlds_reverb.replay import memory as memory_lib
import rlds_fixtures as fx  # pylint: disable=g-bad-import-order
from conftest import converted_episodes  # pylint: disable=g-bad-import-order

K = 4
ACTIONS = 6


def _frames_memory():
  rng = np.random.default_rng(0)
  episodes = fx.episodes_with_lengths([12, 9], terminal=[True, False])
  for episode in episodes:
    n = len(episode['reward'])
    episode['observation'] = rng.integers(0, 256, (n, 84, 84), np.uint8)
    episode['action'] = rng.integers(0, ACTIONS, n).astype(np.int64)
  spec, converted = converted_episodes(fx.make_rlds(episodes))
  return memory_lib.from_episodes(spec, converted, frame_stack=K)


def _clear(values: np.ndarray) -> np.ndarray:
  """Rows whose best output leads the next by more than float noise: there
  two implementations of the same network must pick the same action."""
  top = np.sort(values, axis=-1)
  clear = top[:, -1] - top[:, -2] > 1e-3
  assert clear.sum() >= len(values) // 2, values
  return clear


def _specs():
  observation = tf.TensorSpec([K, 84, 84], tf.uint8, name='observation')
  action = tensor_spec.BoundedTensorSpec((), tf.int64, 0, ACTIONS - 1,
                                         name='action')
  return ts.time_step_spec(observation), action


def test_dqn_trains_on_stacks_and_its_numpy_export_acts_alike(tmp_path):
  # Dueling: its encoder is TF-Agents' EncodingNetwork with the Nature
  # layers, as the plain QNetwork's (which the Pong run of test_atari.py
  # trains); the export also merges the dueling head.
  dueling = True
  memory = _frames_memory()
  time_step_spec, action_spec = _specs()
  assert memory.transition_spec().observation == tf.TensorSpec(
      [K, 84, 84], tf.uint8)
  tf.random.set_seed(0)
  agent = registry.make_agent(
      'dqn', time_step_spec, action_spec,
      factory.AgentConfig(dueling=dueling, dqn_learning_rate=1e-3))
  net = agent._q_network  # pylint: disable=protected-access
  convs = [v for v in net.trainable_variables if 'conv2d' in v.name]
  assert [tuple(v.shape) for v in convs if len(v.shape) == 4] == [
      (8, 8, K, 32), (4, 4, 32, 64), (3, 3, 64, 64)]
  before = [v.numpy().copy() for v in net.trainable_variables]
  train = tf.function(lambda: agent.train(memory.sample(16)).loss)
  losses = [float(train()) for _ in range(3)]
  assert all(np.isfinite(losses))
  assert any(not np.allclose(b, v.numpy())
             for b, v in zip(before, net.trainable_variables))

  policy = dqn.export_q_policy(agent, action_spec)
  assert policy.conv_strides == [4, 2, 1]
  assert policy.obs_scale == pytest.approx(image_networks.PIXEL_SCALE)
  path = str(tmp_path / 'q.npz')
  policy.save(path)
  loaded = numpy_policy.load(path)
  stacks = memory.read(tf.constant(np.arange(8))).observation.numpy()
  q_tf = net(tf.constant(stacks))[0].numpy()
  # pylint: disable=protected-access
  np.testing.assert_allclose(loaded._last_layer(stacks), q_tf, rtol=1e-4,
                             atol=1e-5)
  clear = _clear(q_tf)
  np.testing.assert_array_equal(loaded.greedy(stacks)[clear],
                                np.argmax(q_tf, -1)[clear])


def test_numpy_conv_is_keras_conv():
  rng = np.random.default_rng(1)
  x = rng.standard_normal((2, 11, 9, 3)).astype(np.float32)
  for kernel_size, stride in ((3, 1), (4, 2), (5, 3)):
    layer = tf.keras.layers.Conv2D(4, kernel_size, stride)
    want = layer(x).numpy()
    got = numpy_policy.conv2d(x, layer.kernel.numpy(), layer.bias.numpy(),
                              stride)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_image_policy_names_a_wrong_observation():
  time_step_spec, action_spec = _specs()
  agent = registry.make_agent('dqn', time_step_spec, action_spec,
                              factory.AgentConfig())
  policy = dqn.export_q_policy(agent, action_spec)
  with pytest.raises(ValueError,
                     match=r'image stacks \[batch\] \+ \[4, 84, 84\]'):
    policy.greedy(np.zeros((1, 3, 84, 84), np.uint8))


def test_saved_model_of_an_image_policy_acts_as_the_numpy_one(tmp_path):
  from rlds_reverb.agents import saved_policy  # pylint: disable=g-import-not-at-top
  time_step_spec, action_spec = _specs()
  tf.random.set_seed(3)
  agent = registry.make_agent('dqn', time_step_spec, action_spec,
                              factory.AgentConfig(dueling=True))
  policy = dqn.export_q_policy(agent, action_spec)
  assert policy.input_shape == [K, 84, 84]
  paths = saved_policy.save(policy, str(tmp_path / 'saved'))
  act = saved_policy.load_act(str(tmp_path / 'saved'))
  stacks = np.random.default_rng(4).integers(0, 256, (6, K, 84, 84),
                                              np.uint8)
  clear = _clear(policy._last_layer(stacks))  # pylint: disable=protected-access
  np.testing.assert_array_equal(act(stacks)[clear],
                                policy.greedy(stacks)[clear])
  assert 'greedy' in paths and 'collect' in paths


def test_cnn_actor_critic_updates_and_exports_its_actor():
  algorithm = 'ppo'  # A2C's update differs in its loss only.
  from rlds_reverb.agents import actor_critic  # pylint: disable=g-import-not-at-top
  from rlds_reverb.agents.onpolicy import ppo  # pylint: disable=g-import-not-at-top
  tf.random.set_seed(5)
  model = actor_critic.CnnActorCritic((K, 84, 84), num_actions=ACTIONS)
  rng = np.random.default_rng(6)
  n = 32
  observation = rng.integers(0, 256, (n, K, 84, 84), np.uint8)
  # Returns the critic can fit: the mean brightness of the newest frame.
  target = observation[:, -1].mean(axis=(1, 2)) / 255.0 * 4.0 - 2.0
  batch = {'observation': observation,
           'action': rng.integers(0, ACTIONS, n).astype(np.int64),
           'log_prob': np.full(n, -np.log(ACTIONS), np.float32),
           'advantage': rng.standard_normal(n).astype(np.float32),
           'return': target.astype(np.float32),
           'value': np.zeros(n, np.float32)}
  updater = ppo.Updater(model, ppo.PpoConfig(
      algorithm=algorithm, epochs=2, minibatches=2, learning_rate=1e-4,
      lr_decay=False))
  first = updater(batch, 1.0, seed=0)
  for step in range(1, 6):
    last = updater(batch, 1.0, seed=step)
  assert last['value_loss'] < first['value_loss']
  assert int(model.train_step_counter.numpy()) == 24

  policy = actor_critic.export(model, np.int64(0), np.int64(ACTIONS - 1))
  assert policy.head == 'categorical' and policy.input_shape == [K, 84, 84]
  logits = model.actor(model.trunk(observation[:8])).numpy()
  # pylint: disable=protected-access
  np.testing.assert_allclose(policy._last_layer(observation[:8]), logits,
                             rtol=1e-4, atol=1e-5)
  clear = _clear(logits)
  np.testing.assert_array_equal(policy.greedy(observation[:8])[clear],
                                np.argmax(logits, -1)[clear])
  # The in-process collector's TF sampler draws what the numpy policy
  # draws from the same generator state.
  sample = model.sampler(np.int64(0))
  tf_actions, tf_log_probs = sample(observation, np.random.default_rng(9))
  np_actions, np_log_probs = policy.sample(observation,
                                           np.random.default_rng(9))
  np.testing.assert_array_equal(tf_actions, np_actions)
  np.testing.assert_allclose(tf_log_probs, np_log_probs, atol=1e-5)


def test_colour_stacks_reach_the_channels_frame_major_in_every_runtime(
    tmp_path):
  """[k, H, W, C] stacks become [H, W, k * C] channels, frame 0's colours
  first, the same in the Keras network, the numpy policy and the
  SavedModel."""
  from rlds_reverb.agents import actor_critic  # pylint: disable=g-import-not-at-top
  from rlds_reverb.agents import saved_policy  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(7)
  stacks = rng.integers(0, 256, (5, 2, 36, 36, 3), np.uint8)
  channels = tf.keras.Sequential(
      image_networks.stack_to_channels([2, 36, 36, 3]))(stacks).numpy()
  want = np.concatenate([stacks[:, 0], stacks[:, 1]], axis=-1) / 255.0
  np.testing.assert_allclose(channels, want, rtol=1e-6)
  tf.random.set_seed(8)
  model = actor_critic.CnnActorCritic((2, 36, 36, 3), num_actions=ACTIONS)
  model.actor(model.trunk(stacks[:1]))
  for weight in model.actor.trainable_weights:  # Init gain 0.01: widen the
    weight.assign(weight * 300.0)  # margins so greedy actions are clear.
  logits = model.actor(model.trunk(stacks)).numpy()
  policy = actor_critic.export(model, np.int64(0), np.int64(ACTIONS - 1))
  assert policy.input_shape == [2, 36, 36, 3]
  # pylint: disable=protected-access
  np.testing.assert_allclose(policy._last_layer(stacks), logits, rtol=1e-4,
                             atol=1e-5)
  saved_policy.save(policy, str(tmp_path / 'saved'))
  act = saved_policy.load_act(str(tmp_path / 'saved'))
  clear = _clear(logits)
  np.testing.assert_array_equal(act(stacks)[clear],
                                np.argmax(logits, -1)[clear])
