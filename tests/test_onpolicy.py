"""rlds_reverb.experiments.onpolicy with GAIL: demonstrations, rewards, freeze."""

import os

import numpy as np
import pytest
import tensorflow as tf

from rlds_reverb.data import recording
from rlds_reverb.acting import envs
from rlds_reverb.experiments import loop
from rlds_reverb.agents.onpolicy import normalization
from rlds_reverb.experiments import onpolicy
from rlds_reverb.agents.onpolicy import ppo

ROLLOUT = 256


@pytest.fixture(scope='module')
def expert(tmp_path_factory):
  """Four short episodes of the shipped final HalfCheetah policy."""
  out = tmp_path_factory.mktemp('expert') / 'hc'
  recording.generate_dataset('HalfCheetah-v5', 'final', 4, str(out), seed=1,
                             max_episode_steps=100, show_progress=False)
  return str(out)


def gail_run(root_dir, expert_dir, **overrides):
  agent_config = ppo.defaults_for('ppo', False, rollout_steps=ROLLOUT,
                                  minibatches=4, epochs=1)
  settings = dict(env='HalfCheetah-v5', root_dir=str(root_dir),
                  env_steps=4 * ROLLOUT, eval_interval=4 * ROLLOUT,
                  eval_episodes=1, checkpoint_interval=4 * ROLLOUT,
                  ppo_config=agent_config, gail_dataset=expert_dir,
                  gail_subsample=5, gail_batch_size=32,
                  gail_warmup_updates=2, gail_warmup_epochs=3, gail_epochs=1)
  return onpolicy.OnPolicyConfig(**{**settings, **overrides})


def test_demonstrations_are_subsampled_and_checked(expert):
  specs = envs.env_specs('HalfCheetah-v5')
  config = gail_run('unused', expert, gail_trajectories=3, gail_subsample=5)
  observations, actions = onpolicy.load_demonstrations(config, specs)
  # 3 episodes of 100 transitions, every 5th: 20 each.
  assert observations.shape == (60, 17) and actions.shape == (60, 6)
  assert np.all(np.abs(actions) <= 1.0)
  with pytest.raises(ValueError, match='discrete'):
    onpolicy.load_demonstrations(config, envs.env_specs('CartPole-v1'))
  with pytest.raises(ValueError, match='Hopper-v5 has'):
    onpolicy.load_demonstrations(config, envs.env_specs('Hopper-v5'))


def test_gail_rewards_replace_the_envs_and_statistics_freeze(
    expert, tmp_path, monkeypatch):
  seen = []

  class Spy(onpolicy.GailRewards):
    def __call__(self, rollout, update_index):
      env_rewards = rollout['reward'].copy()
      rewards, metrics = super().__call__(rollout, update_index)
      seen.append((update_index, env_rewards, rewards, metrics,
                   self._norm.update_observations))
      return rewards, metrics

  monkeypatch.setattr(onpolicy, 'GailRewards', Spy)
  onpolicy.train_onpolicy(gail_run(tmp_path / 'run', expert),
                          show_progress=False)
  assert [s[0] for s in seen] == [0, 1, 2, 3]
  for _, env_rewards, rewards, metrics, _ in seen:
    assert rewards.shape == env_rewards.shape == (ROLLOUT, 1)
    assert not np.allclose(rewards, env_rewards)
    assert {'expert_loss', 'policy_loss', 'gradient_penalty',
            'policy_reward', 'expert_reward'} <= set(metrics)
  # Frozen from update 2 on (gail_warmup_updates=2, the seed's j >= 10):
  # rollouts 0, 1 and 2 moved the statistics.
  assert [s[4] for s in seen] == [True, True, False, False]
  norm = normalization.Normalization((17,), 1, gamma=0.99)
  tf.train.Checkpoint(normalization=norm.variables).restore(
      tf.train.latest_checkpoint(str(tmp_path / 'run' / loop.CHECKPOINT_DIR))
  ).expect_partial()
  norm.load()
  # The reset observation and three rollouts' observations, nothing after.
  assert norm.observations.count == pytest.approx(1 + 3 * ROLLOUT + 1e-4)


def test_the_discriminator_learns_to_tell_expert_from_policy(
    expert, tmp_path, monkeypatch):
  records = []

  class Spy(onpolicy.GailRewards):
    def __call__(self, rollout, update_index):
      rewards, metrics = super().__call__(rollout, update_index)
      records.append(metrics)
      return rewards, metrics

  monkeypatch.setattr(onpolicy, 'GailRewards', Spy)
  onpolicy.train_onpolicy(
      gail_run(tmp_path / 'run', expert, gail_warmup_epochs=30),
      show_progress=False)
  # After its warm-up the expert's pairs earn more than the random policy's.
  assert records[1]['expert_reward'] > records[1]['policy_reward'] + 1.0
  assert os.path.exists(tmp_path / 'run' / 'policy.npz')


def test_gail_settings_are_checked():
  with pytest.raises(ValueError, match='gail_subsample'):
    onpolicy.check(onpolicy.OnPolicyConfig(env='x', root_dir='r',
                                           gail_subsample=0))
  with pytest.raises(ValueError, match='gail_warmup_updates'):
    onpolicy.check(onpolicy.OnPolicyConfig(env='x', root_dir='r',
                                           gail_warmup_updates=-1))


def test_recurrent_learner_sees_what_the_actor_saw(tmp_path, monkeypatch):
  """Each update's first pass, unrolled from the rollout's initial states,
  gives the log-probabilities the numpy actor sampled with: the states are
  carried across rollouts, reset where episodes start, and recorded."""
  checked = []
  update = ppo.Updater.__call__

  def checking_update(self, batch, progress_left, seed):
    log_prob, _, _ = self._evaluate(  # pylint: disable=protected-access
        {key: tf.constant(value) for key, value in batch.items()})
    checked.append((batch['episode_start'].sum(),
                    np.abs(batch['initial_state']).max(),
                    np.max(np.abs(log_prob.numpy() -
                                  batch['log_prob'].reshape(-1)))))
    return update(self, batch, progress_left, seed)

  monkeypatch.setattr(ppo.Updater, '__call__', checking_update)
  agent_config = ppo.defaults_for('ppo', True, recurrent=True, num_envs=4,
                                  rollout_steps=40, minibatches=2, epochs=2)
  onpolicy.train_onpolicy(onpolicy.OnPolicyConfig(
      env=envs.PARTIAL_CARTPOLE, root_dir=str(tmp_path), env_steps=4 * 160,
      eval_interval=640, eval_episodes=2, ppo_config=agent_config),
                          show_progress=False)
  assert len(checked) == 4
  starts, state, error = zip(*checked)
  assert all(s > 4 for s in starts)  # episodes end inside each rollout
  assert state[0] == 0 and all(s > 0 for s in state[1:])  # carried over
  assert max(error) < 1e-4, error


def test_recurrent_policy_exported_acts_like_the_model(tmp_path):
  agent_config = ppo.defaults_for('ppo', False, recurrent=True, num_envs=2,
                                  rollout_steps=64, minibatches=2, epochs=1)
  onpolicy.train_onpolicy(onpolicy.OnPolicyConfig(
      env='HalfCheetah-v5', root_dir=str(tmp_path), env_steps=128,
      eval_interval=128, eval_episodes=1, ppo_config=agent_config),
                          show_progress=False)
  from rlds_reverb.acting import recurrent_policy  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'policy.npz')
  assert recurrent_policy.is_recurrent_file(path)
  policy = recurrent_policy.load(path)
  assert policy.head == 'gaussian' and policy.obs_clip == 10.0
  specs = envs.env_specs('HalfCheetah-v5')
  model = onpolicy.make_model(specs, agent_config)
  tf.train.Checkpoint(agent=model).restore(tf.train.latest_checkpoint(
      str(tmp_path / loop.CHECKPOINT_DIR))).expect_partial()
  raw = np.random.default_rng(0).normal(size=(3, 5, 17)).astype(np.float32)
  normalised = np.clip((raw - policy.obs_mean) / policy.obs_std, -10, 10)
  states = model.unroll(normalised, np.zeros((3, 5)), model.initial_state(3))
  want = np.clip(model.actor(tf.reshape(states, [15, -1])).numpy(), -1, 1)
  got = np.stack([policy.greedy(raw[:, t]) for t in range(5)], 1)
  np.testing.assert_allclose(got.reshape(15, 6), want, atol=1e-4)
