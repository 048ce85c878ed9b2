"""PPO and A2C (rlds_reverb.agents.onpolicy.ppo, actor_critic, onpolicy)."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from rlds_reverb.acting import envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import actor_critic
from rlds_reverb.experiments import loop
from rlds_reverb.agents.onpolicy import normalization
from rlds_reverb.experiments import onpolicy
from rlds_reverb.agents.onpolicy import ppo


def continuous_model(seed=0):
  tf.keras.utils.set_random_seed(seed)
  model = actor_critic.ActorCritic(5, action_size=2, hidden=(16, 16))
  model.log_std.assign([-0.3, 0.2])
  return model


@pytest.mark.parametrize('discrete', [False, True])
def test_numpy_actor_samples_with_the_models_log_probs(discrete):
  tf.random.set_seed(1)
  model = (actor_critic.ActorCritic(5, num_actions=3, hidden=(16,))
           if discrete else continuous_model())
  low, high = ((np.int64(0), np.int64(2)) if discrete else
               (-np.ones(2, np.float32), np.ones(2, np.float32)))
  policy = actor_critic.export(model, low, high)
  obs = np.random.default_rng(0).normal(size=(64, 5)).astype(np.float32)
  actions, log_probs = policy.sample(obs, np.random.default_rng(1))
  want, _ = model.log_prob_and_entropy(tf.constant(obs), tf.constant(actions))
  np.testing.assert_allclose(log_probs, want.numpy(), rtol=1e-4, atol=1e-4)
  greedy = policy.greedy(obs)
  out = model.actor(obs).numpy()
  if discrete:
    np.testing.assert_array_equal(greedy, out.argmax(-1))
    # Sampled actions follow the softmax: a chi-square-free check of the
    # most likely action's share over many draws (5 sigma).
    probs = tf.nn.softmax(out[:1]).numpy()[0]
    draws, _ = policy.sample(np.repeat(obs[:1], 20_000, 0),
                             np.random.default_rng(2))
    share = np.mean(draws == 0)
    assert abs(share - probs[0]) < 5 * np.sqrt(probs[0] * (1 - probs[0])
                                               / 20_000)
  else:
    np.testing.assert_allclose(greedy, np.clip(out, -1, 1), rtol=1e-5,
                               atol=1e-6)
  # Saved and loaded, the policy acts the same.
  path = os.path.join(os.environ.get('TMPDIR', '/tmp'),
                      f'ppo_policy_{discrete}_{os.getpid()}.npz')
  policy.save(path)
  loaded = numpy_policy.load(path)
  os.remove(path)
  np.testing.assert_array_equal(loaded.greedy(obs), greedy)
  assert loaded.activation == 'tanh'


def tiny_batch(rng, n=32, discrete=False):
  obs = rng.normal(size=(n, 5)).astype(np.float32)
  action = (rng.integers(0, 3, n) if discrete else
            rng.normal(size=(n, 2)).astype(np.float32))
  return {'observation': obs, 'action': action,
          'log_prob': rng.normal(-2.0, 0.3, n).astype(np.float32),
          'advantage': rng.normal(size=n).astype(np.float32),
          'return': rng.normal(size=n).astype(np.float32),
          'value': rng.normal(size=n).astype(np.float32)}


@pytest.mark.parametrize('algorithm,clip_value', [('ppo', False),
                                                  ('ppo', True),
                                                  ('a2c', False)])
def test_losses_equal_a_hand_computation(algorithm, clip_value):
  model = continuous_model()
  config = ppo.PpoConfig(algorithm=algorithm, clip_value=clip_value,
                         value_coef=0.7, entropy_coef=0.01,
                         normalize_advantages=algorithm == 'ppo')
  updater = ppo.Updater(model, config)
  batch = tiny_batch(np.random.default_rng(0))
  loss, stats = updater._losses(  # pylint: disable=protected-access
      {k: tf.constant(v) for k, v in batch.items()}, tf.constant(0.2))
  log_prob, entropy = (t.numpy() for t in model.log_prob_and_entropy(
      batch['observation'], batch['action']))
  value = model.value(batch['observation']).numpy()
  adv = batch['advantage']  # (the update normalises before its steps)
  ratio = np.exp(log_prob - batch['log_prob'])
  if algorithm == 'ppo':
    policy_loss = -np.mean(np.minimum(ratio * adv,
                                      np.clip(ratio, 0.8, 1.2) * adv))
  else:
    policy_loss = -np.mean(log_prob * adv)
  error = (value - batch['return'])**2
  if clip_value:
    clipped = batch['value'] + np.clip(value - batch['value'], -0.2, 0.2)
    error = np.maximum(error, (clipped - batch['return'])**2)
  value_loss = error.mean()
  want = policy_loss + 0.7 * value_loss - 0.01 * entropy.mean()
  assert float(loss) == pytest.approx(want, rel=1e-4, abs=1e-5)
  assert float(stats['policy_loss']) == pytest.approx(policy_loss, rel=1e-4,
                                                      abs=1e-5)
  assert float(stats['clip_fraction']) == pytest.approx(
      np.mean(np.abs(ratio - 1) > 0.2))


def test_updates_on_a_fixed_rollout_lower_the_losses():
  model = continuous_model()
  config = ppo.PpoConfig(epochs=4, minibatches=4, learning_rate=1e-3,
                         lr_decay=False)
  updater = ppo.Updater(model, config)
  batch = tiny_batch(np.random.default_rng(3), n=256)
  # Returns the critic can fit: a fixed function of the observation.
  batch['return'] = np.tanh(batch['observation'] @ np.linspace(
      -1, 1, 5)).astype(np.float32) * 3.0
  first = updater(batch, 1.0, seed=0)
  for step in range(1, 10):
    last = updater(batch, 1.0, seed=step)
  assert last['value_loss'] < 0.5 * first['value_loss']
  assert last['policy_loss'] < first['policy_loss']
  # 10 updates of 4 epochs x 4 minibatches.
  assert int(model.train_step_counter.numpy()) == 160


def test_an_update_sees_advantages_normalised_over_the_rollout():
  batch = tiny_batch(np.random.default_rng(4), n=128)
  shifted = dict(batch, advantage=batch['advantage'] * 10.0 + 5.0)
  weights = []
  for data in (batch, shifted):
    model = continuous_model()
    ppo.Updater(model, ppo.PpoConfig(epochs=2, minibatches=4))(
        data, 1.0, seed=0)
    weights.append([w.numpy() for w in model.trainable_weights])
  for a, b in zip(*weights):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def small_run(root_dir, env='CartPole-v1', **overrides):
  return onpolicy.OnPolicyConfig(
      env=env, root_dir=str(root_dir), agent='ppo', env_steps=2560,
      eval_interval=2560, eval_episodes=2, seed=7, **overrides)


def test_same_seed_same_first_ten_losses(tmp_path):
  runs = []
  for name in ('a', 'b'):
    updates = []
    onpolicy.train_onpolicy(small_run(tmp_path / name), show_progress=False,
                            on_update=updates.append)
    runs.append([u['loss'] for u in updates])
  assert len(runs[0]) == 10  # 2560 env steps / (8 envs x 32 steps)
  assert runs[0] == runs[1]
  other = []
  onpolicy.train_onpolicy(
      onpolicy.OnPolicyConfig(**{**small_run(tmp_path / 'c').__dict__,
                                 'seed': 8}),
      show_progress=False, on_update=other.append)
  assert [u['loss'] for u in other] != runs[0]


def test_ppo_learns_cartpole_in_a_few_thousand_steps(tmp_path):
  config = onpolicy.OnPolicyConfig(
      env='CartPole-v1', root_dir=str(tmp_path), agent='ppo',
      env_steps=8192, eval_interval=8192, eval_episodes=5, seed=0)
  updates = []
  record = onpolicy.train_onpolicy(config, show_progress=False,
                                   on_update=updates.append)
  # A random policy lasts about 22 steps. The same seed lands elsewhere
  # on another CPU's arithmetic: seen above 150 on a Xeon, 146.6 on an
  # AVX2-only AMD EPYC (2026-11-27).
  assert record['average_return'] > 100
  early = np.mean([u['entropy'] for u in updates[:3]])
  late = np.mean([u['entropy'] for u in updates[-3:]])
  assert late < early  # the policy commits
  assert os.path.exists(tmp_path / loop.CURVE_PNG)
  policy = numpy_policy.load(str(tmp_path / 'policy.npz'))
  assert policy.head == 'categorical' and policy.obs_mean is None


def test_normalisation_is_checkpointed_and_exported(tmp_path):
  agent_config = ppo.defaults_for('ppo', False, num_envs=2, rollout_steps=64,
                                  minibatches=2, epochs=1)
  config = onpolicy.OnPolicyConfig(
      env='HalfCheetah-v5', root_dir=str(tmp_path), agent='ppo',
      env_steps=256, eval_interval=256, eval_episodes=1,
      checkpoint_interval=128, ppo_config=agent_config)
  onpolicy.train_onpolicy(config, show_progress=False)
  policy = numpy_policy.load(str(tmp_path / 'policy.npz'))
  assert policy.head == 'gaussian' and policy.obs_clip == 10.0
  # The checkpoint's statistics are the exported ones.
  norm = normalization.Normalization((17,), 2, gamma=0.99)
  checkpoint = tf.train.Checkpoint(normalization=norm.variables)
  checkpoint.restore(tf.train.latest_checkpoint(
      str(tmp_path / loop.CHECKPOINT_DIR))).expect_partial()
  norm.load()
  assert norm.observations.count == pytest.approx(256 + 2 + 1e-4)
  np.testing.assert_allclose(policy.obs_mean, norm.observations.mean,
                             rtol=1e-6)
  np.testing.assert_allclose(policy.obs_std, norm.observations.std,
                             rtol=1e-6)
  assert norm.returns.count > 1
  # The networks and Adam restore to what was saved.
  specs = envs.env_specs('HalfCheetah-v5')
  model = onpolicy.make_model(specs, agent_config)
  updater = ppo.Updater(model, agent_config)
  updater.optimizer.build(model.trainable_weights)
  tf.train.Checkpoint(agent=model, optimizer=updater.optimizer).restore(
      tf.train.latest_checkpoint(str(tmp_path / loop.CHECKPOINT_DIR))
  ).expect_partial()
  for kernel, layer in zip(policy.kernels, model.actor.layers):
    np.testing.assert_array_equal(kernel, layer.kernel.numpy())
  np.testing.assert_array_equal(policy.log_std, model.log_std.numpy())
  # 256 env steps: 2 rollouts of 2 x 64 steps, 2 minibatches, 1 epoch.
  assert int(updater.optimizer.iterations.numpy()) == 4
  assert int(model.train_step_counter.numpy()) == 4
  # Resumed with a larger budget, it goes on from 256 env steps.
  record = onpolicy.train_onpolicy(
      onpolicy.OnPolicyConfig(**{**config.__dict__, 'env_steps': 384}),
      show_progress=False)
  assert record['env_steps'] == 384
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['agent'] == 'ppo'


def test_discrete_actions_become_logit_indices():
  tf.keras.utils.set_random_seed(0)
  model = actor_critic.ActorCritic(2, num_actions=3, hidden=(8,))
  rollout = {
      'observation': np.zeros((4, 2, 2), np.float32),
      'action': np.array([[1, 3], [2, 2], [3, 1], [1, 1]], np.int64),
      'log_prob': np.zeros((4, 2), np.float32),
      'reward': np.ones((4, 2), np.float32),
      'terminated': np.zeros((4, 2), bool),
      'truncated': np.zeros((4, 2), bool),
      'final_observation': np.zeros((4, 2, 2), np.float32),
      'episode_start': np.zeros((4, 2), bool),
      'next_observation': np.zeros((2, 2), np.float32)}
  batch = onpolicy.learner_batch(model, rollout, ppo.PpoConfig(),
                                 action_low=np.int64(1))
  np.testing.assert_array_equal(batch['action'],
                                [0, 2, 1, 1, 2, 0, 0, 0])


def test_recurrent_defaults_take_whole_sequences():
  config = ppo.defaults_for('ppo', False, recurrent=True)
  assert config.num_envs == 1 and config.minibatches == 1
  config = ppo.defaults_for('ppo', False, recurrent=True, num_envs=8)
  assert config.minibatches == 8
  with pytest.raises(ValueError, match='must divide num_envs'):
    ppo.defaults_for('ppo', False, recurrent=True, num_envs=6,
                     minibatches=4)


def test_bad_configs_are_refused(tmp_path):
  with pytest.raises(ValueError, match='minibatches'):
    ppo.defaults_for('ppo', False, minibatches=3, rollout_steps=64)
  with pytest.raises(ValueError, match='algorithm'):
    ppo.defaults_for('trpo', False)
  with pytest.raises(ValueError, match='flat observations'):
    onpolicy.train_onpolicy(onpolicy.OnPolicyConfig(
        env='FetchReach-v4', root_dir=str(tmp_path / 'x')))
  assert not os.path.exists(tmp_path / 'x')
  with pytest.raises(ValueError, match='not the agent'):
    onpolicy.check(onpolicy.OnPolicyConfig(
        env='CartPole-v1', root_dir='r', agent='a2c',
        ppo_config=ppo.PpoConfig(algorithm='ppo')))


def test_mlp_settings_build_the_model_and_its_export_acts_like_it():
  """RL Zoo's HalfCheetah settings: ReLU, no orthogonal init, log std -2."""
  specs = envs.env_specs('HalfCheetah-v5')
  config = ppo.defaults_for('ppo', False, activation='relu',
                            orthogonal_init=False, initial_log_std=-2.0,
                            hidden=(8, 8))
  model = onpolicy.make_model(specs, config)
  assert model.actor.layers[0].activation is tf.keras.activations.relu
  np.testing.assert_array_equal(model.log_std.numpy(), np.full(6, -2.0))
  policy = actor_critic.export(model, specs.action_low, specs.action_high)
  assert policy.activation == 'relu'
  observations = np.random.default_rng(0).normal(
      size=(5, specs.observation_shape[0])).astype(np.float32)
  np.testing.assert_allclose(
      policy.greedy(observations),
      np.clip(model.actor(observations).numpy(), -1.0, 1.0), rtol=1e-5,
      atol=1e-5)
  with pytest.raises(ValueError, match="recurrent policy's layers are tanh"):
    ppo.defaults_for('ppo', False, recurrent=True, activation='relu')
