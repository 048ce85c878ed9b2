"""Tests for recording rollouts (rlds_reverb.data.recording).

Real MuJoCo envs and real TFDS writing/reading; tiny episodes keep it fast.
The `cheetah` fixture (conftest.py) records 3 HalfCheetah episodes once.
"""

import os
import pathlib
import platform
import re
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from rlds_reverb.data import datasets
from rlds_reverb.data import recording
from rlds_reverb.data import tfds_writer
from rlds_reverb.acting import envs as acting_envs
from rlds_reverb.acting import numpy_policy
from conftest import _episodes  # pylint: disable=g-bad-import-order
from conftest import CHEETAH_LIMIT as LIMIT  # pylint: disable=g-bad-import-order
from conftest import CHEETAH_SEED as SEED  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_summary_counts_what_was_written(cheetah):
  summary, episodes = cheetah
  assert (summary.num_episodes, summary.num_env_steps) == (3, 3 * LIMIT)
  assert len(episodes) == 3
  returns = [ep['reward'].sum() for ep in episodes]
  assert summary.mean_return == pytest.approx(np.mean(returns), rel=1e-5)


def test_on_disk_layout(cheetah):
  summary, _ = cheetah
  out = pathlib.Path(summary.out_dir)
  version_dir = out / 'halfcheetah_v5_random' / '1.0.0'
  assert summary.dataset_dir == str(version_dir)
  assert (out / tfds_writer.COMPLETE_MARKER).is_file()
  assert sorted(p.name for p in out.iterdir()) == [
      '.complete', 'halfcheetah_v5_random']
  names = {p.name for p in version_dir.iterdir()}
  assert {'dataset_info.json', 'features.json'} <= names
  assert any(n.startswith('halfcheetah_v5_random-train.tfrecord-') for n in names)
  builder = tfds.builder_from_directory(summary.dataset_dir)
  assert builder.info.splits['train'].num_examples == 3
  assert len(list(builder.as_dataset(split='train'))) == 3


def test_episode_flags_follow_rlds(cheetah):
  _, episodes = cheetah
  for ep in episodes:
    n = len(ep['is_first'])
    assert n == LIMIT + 1
    assert ep['is_first'].tolist() == [True] + [False] * LIMIT
    assert ep['is_last'].tolist() == [False] * LIMIT + [True]
    assert not ep['is_terminal'].any()  # HalfCheetah only truncates.
    np.testing.assert_array_equal(ep['discount'], np.ones(n))
    np.testing.assert_array_equal(ep['action'][-1], np.zeros(6))
    assert ep['reward'][-1] == 0.0
    assert np.all(np.isfinite(ep['observation']))
    assert np.all(np.abs(ep['action'][:-1]) <= 1.0)
    np.testing.assert_allclose(ep['infos/action_log_probs'][:-1],
                               -6 * np.log(2.0))


def test_step_features_equal_d4rl(cheetah):
  summary, _ = cheetah
  with datasets.gcs_disabled():
    d4rl = tfds.builder('d4rl_mujoco_halfcheetah/v2-random',
                        data_dir=os.path.join(summary.out_dir, 'no_d4rl'))
  ours = tfds.builder_from_directory(summary.dataset_dir)
  assert (ours.info.features['steps'].to_json_content() ==
          d4rl.info.features['steps'].to_json_content())
  assert (datasets.load(summary.out_dir).element_spec['steps'] ==
          d4rl.info.features['steps'].get_tensor_spec())


def test_episodes_replay_in_a_fresh_env(cheetah):
  """The first episode of sub-env i replays from reset(seed=SEED + i)."""
  _, episodes = cheetah
  env = gym.make('HalfCheetah-v5', max_episode_steps=LIMIT)
  for i, ep in enumerate(episodes[:2]):
    obs, _ = env.reset(seed=SEED + i)
    np.testing.assert_array_equal(ep['observation'][0], obs.astype(np.float32))
    for t in range(LIMIT):
      obs, reward, terminated, truncated, _ = env.step(ep['action'][t])
      np.testing.assert_array_equal(ep['observation'][t + 1],
                                    obs.astype(np.float32))
      assert ep['reward'][t] == np.float32(reward)
      assert not terminated and truncated == (t == LIMIT - 1)


def test_every_transition_replays_from_its_recorded_state(cheetah):
  """(qpos_t, qvel_t, a_t) -> (r_t, o_t+1, qpos_t+1): aligns all fields.

  Covers the third episode too, which started from an autoreset.
  """
  _, episodes = cheetah
  env = gym.make('HalfCheetah-v5').unwrapped
  env.reset(seed=0)
  for ep in episodes:
    assert not np.array_equal(ep['infos/qpos'][-1], ep['infos/qpos'][-2])
    for t in range(LIMIT):
      env.set_state(ep['infos/qpos'][t], ep['infos/qvel'][t])
      obs, reward, _, _, _ = env.step(ep['action'][t])
      np.testing.assert_allclose(ep['reward'][t], reward, rtol=1e-5, atol=1e-5)
      np.testing.assert_allclose(ep['observation'][t + 1], obs, rtol=1e-5,
                                 atol=1e-5)
      # Solver warm-starts differ from the recording run: tiny differences.
      np.testing.assert_allclose(ep['infos/qpos'][t + 1], env.data.qpos,
                                 atol=1e-6)


def test_terminated_episodes_end_in_terminal_steps(tmp_path):
  """InvertedPendulum falls fast under random actions: lengths vary."""
  recording.generate_dataset('InvertedPendulum-v5', 'random', 4,
                             str(tmp_path), seed=1, num_envs=3,
                             show_progress=False)
  episodes = _episodes(str(tmp_path))
  assert len(episodes) == 4
  assert len({len(ep['reward']) for ep in episodes}) > 1
  for ep in episodes:
    n = len(ep['reward'])
    assert 1 < n < 1001
    assert ep['is_terminal'].tolist() == [False] * (n - 1) + [True]
    assert ep['is_last'].tolist() == [False] * (n - 1) + [True]
    # The observation is (qpos, qvel): infos line up with it on every step.
    np.testing.assert_allclose(
        ep['observation'],
        np.concatenate([ep['infos/qpos'], ep['infos/qvel']], axis=1),
        rtol=1e-6, atol=1e-6)


def test_non_mujoco_box_env_has_no_physics_infos(tmp_path):
  recording.generate_dataset('Pendulum-v1', 'random', 2, str(tmp_path),
                             seed=0, max_episode_steps=5, show_progress=False)
  ds = datasets.load(str(tmp_path))
  steps = ds.element_spec['steps'].element_spec
  assert steps['observation'].shape == (3,)
  assert steps['action'].shape == (1,)
  assert set(steps['infos']) == {'action_log_probs'}
  episodes = _episodes(str(tmp_path))
  assert [len(ep['reward']) for ep in episodes] == [6, 6]
  np.testing.assert_allclose(episodes[0]['infos/action_log_probs'][:-1],
                             -np.log(4.0))


@pytest.mark.parametrize('kwargs, match', [
    ({'policy': 'greedy'}, "unknown policy 'greedy'"),
    ({'env_id': 'Pendulum-v1', 'policy': 'expert'},
     "unknown policy 'expert' for env 'Pendulum-v1'"),
    ({'env_id': 'NoSuchEnv-v0'}, "unknown env id 'NoSuchEnv-v0'"),
    ({'env_id': 'Blackjack-v1', 'max_episode_steps': 5},
     'observation space must be a Box'),
    ({'num_episodes': 0}, 'num_episodes must be > 0, got 0'),
    ({'num_envs': -1}, 'num_envs must be > 0, got -1'),
    ({'max_episode_steps': 0}, 'max_episode_steps must be > 0, got 0'),
    ({'seed': -1}, 'seed must be >= 0, got -1'),
    ({'num_env_steps': 100}, 'give one of num_episodes and num_env_steps'),
    ({'num_episodes': None}, 'give one of num_episodes and num_env_steps'),
    ({'num_episodes': None, 'num_env_steps': 0},
     'num_env_steps must be > 0, got 0'),
    ({'dataset_kind': 'medium-expert', 'epsilon': 0.1},
     'epsilon 0.1 mixes uniform discrete actions in'),
    ({'dataset_kind': 'medium-replay', 'epsilon': 0.1},
     "not of 'the replay snapshots' (medium-replay)"),
])
def test_bad_arguments_raise_before_writing(tmp_path, kwargs, match):
  args = {'env_id': 'HalfCheetah-v5', 'policy': 'random', 'num_episodes': 1,
          'out_dir': str(tmp_path / 'out')} | kwargs
  with pytest.raises(ValueError, match=re.escape(match)):
    recording.generate_dataset(**args, show_progress=False)
  assert not (tmp_path / 'out').exists()


def test_env_without_time_limit_needs_max_episode_steps(tmp_path):
  gym.register('NoLimitPendulum-v0',
               entry_point='gymnasium.envs.classic_control:PendulumEnv')
  with pytest.raises(ValueError, match='has no time limit'):
    recording.generate_dataset('NoLimitPendulum-v0', 'random', 1,
                               str(tmp_path / 'out'), show_progress=False)
  assert not (tmp_path / 'out').exists()


def test_unbounded_action_space_has_no_random_policy():
  with pytest.raises(ValueError, match='bounded action space'):
    recording.make_random_policy(gym.spaces.Box(-np.inf, np.inf, (2,)), 0)


def test_out_dir_overwrite_rules(tmp_path):
  out = tmp_path / 'out'
  kwargs = dict(seed=0, max_episode_steps=3, show_progress=False)
  recording.generate_dataset('Pendulum-v1', 'random', 1, str(out), **kwargs)
  with pytest.raises(FileExistsError, match='not empty'):
    recording.generate_dataset('Pendulum-v1', 'random', 2, str(out), **kwargs)
  summary = recording.generate_dataset('Pendulum-v1', 'random', 2, str(out),
                                       overwrite=True, **kwargs)
  assert summary.num_episodes == 2 and len(_episodes(str(out))) == 2
  # A non-empty dir that is not generated data is never deleted.
  precious = tmp_path / 'precious'
  precious.mkdir()
  (precious / 'notes.txt').write_text('keep me')
  with pytest.raises(FileExistsError, match='refusing to delete'):
    recording.generate_dataset('Pendulum-v1', 'random', 1, str(precious),
                               overwrite=True, **kwargs)
  assert (precious / 'notes.txt').read_text() == 'keep me'


def test_goal_env_records_dict_observations_that_fit_its_rewards(tmp_path):
  """FetchReach: the observation dict is stored per key, float32, and each
  recorded reward is the env's compute_reward of the achieved goal after
  the step and the episode's desired goal (so nothing is shifted)."""
  summary = recording.generate_dataset('FetchReach-v4', 'random', 3,
                                       str(tmp_path), seed=0, num_envs=2,
                                       max_episode_steps=10,
                                       show_progress=False)
  assert summary.num_episodes == 3 and summary.num_env_steps == 30
  steps_spec = datasets.load(str(tmp_path)).element_spec['steps'].element_spec
  assert {k: (v.shape, v.dtype) for k, v in
          steps_spec['observation'].items()} == {
              'observation': ((10,), tf.float32),
              'achieved_goal': ((3,), tf.float32),
              'desired_goal': ((3,), tf.float32)}
  env = acting_envs.make_env('FetchReach-v4')
  for episode in datasets.load(str(tmp_path)):
    steps = list(episode['steps'].as_numpy_iterator())
    achieved = np.stack([s['observation']['achieved_goal'] for s in steps])
    desired = np.stack([s['observation']['desired_goal'] for s in steps])
    rewards = np.array([s['reward'] for s in steps])
    assert len(steps) == 11
    np.testing.assert_array_equal(desired, np.broadcast_to(desired[0],
                                                           desired.shape))
    np.testing.assert_array_equal(
        rewards[:-1], env.unwrapped.compute_reward(achieved[1:], desired[1:],
                                                   {}))
  env.close()


def test_a_ppo_policy_records_the_actions_the_env_took(tmp_path):
  """A gaussian (PPO) head samples beyond the bounds; the data holds them
  clipped, with NaN log-probs where clipping happened."""
  rng = np.random.default_rng(0)
  policy = numpy_policy.NumpyPolicy(
      head='gaussian', kernels=[rng.normal(size=(17, 6)).astype(np.float32)],
      biases=[np.zeros(6, np.float32)], action_low=-np.ones(6, np.float32),
      action_high=np.ones(6, np.float32), activation='tanh',
      log_std=np.full(6, 1.0, np.float32))
  path = str(tmp_path / 'ppo.npz')
  policy.save(path)
  recording.generate_dataset('HalfCheetah-v5', path, 1, str(tmp_path / 'd'),
                             seed=0, max_episode_steps=30,
                             show_progress=False)
  steps = next(iter(datasets.load(str(tmp_path / 'd'))))['steps']
  batch = next(iter(steps.batch(100)))
  actions = batch['action'].numpy()[:-1]
  assert np.abs(actions).max() <= 1.0
  assert np.isclose(np.abs(actions), 1.0).any()  # some were clipped
  log_probs = batch['infos']['action_log_probs'].numpy()[:-1]
  clipped = np.isclose(np.abs(actions), 1.0).any(axis=-1)
  assert np.isnan(log_probs[clipped]).all()
  assert np.isfinite(log_probs[~clipped]).all()


def test_a_step_budget_of_whole_time_limited_episodes_is_an_episode_count(
    tmp_path):
  """10 episodes of 10 steps: the same data as num_episodes=10, whatever
  the sub-env count (the reservation keeps extra sub-envs idle)."""
  args = dict(seed=5, num_envs=4, max_episode_steps=10, show_progress=False)
  by_count = recording.generate_dataset('HalfCheetah-v5', 'random', 10,
                                        str(tmp_path / 'count'), **args)
  by_steps = recording.generate_dataset('HalfCheetah-v5', 'random', None,
                                        str(tmp_path / 'steps'),
                                        num_env_steps=100, **args)
  assert (by_steps.num_episodes, by_steps.num_env_steps) == (10, 100)
  for got, want in zip(_episodes(by_steps.out_dir),
                       _episodes(by_count.out_dir), strict=True):
    np.testing.assert_array_equal(got['observation'], want['observation'])
    np.testing.assert_array_equal(got['action'], want['action'])


def test_a_step_budget_records_whole_terminating_episodes(tmp_path):
  """Hopper falls at random: the budget is met with whole episodes, by
  less than one time limit over, and every episode ends as it ended."""
  budget, limit = 300, 50
  summary = recording.generate_dataset(
      'Hopper-v5', 'random', None, str(tmp_path), num_env_steps=budget,
      seed=2, num_envs=3, max_episode_steps=limit, show_progress=False)
  episodes = _episodes(str(tmp_path))
  lengths = [len(ep['reward']) - 1 for ep in episodes]
  assert sum(lengths) == summary.num_env_steps
  assert budget <= summary.num_env_steps < budget + limit
  assert summary.num_episodes == len(episodes) > budget // limit
  for ep, length in zip(episodes, lengths):
    assert ep['is_last'][-1] and not ep['is_last'][:-1].any()
    # Short episodes fell (terminal); full ones hit the time limit.
    assert ep['is_terminal'][-1] == (length < limit)


# Prints a fingerprint of a float32 product (which BLAS kernel ran) and one
# of the actions the shipped Hopper medium policy records over 2,000 steps.
_FINGERPRINTS = """
import hashlib
import gymnasium as gym
import numpy as np
from rlds_reverb.data import behaviour_policies
rng = np.random.default_rng(0)
a = rng.standard_normal((4, 256)).astype(np.float32)
b = rng.standard_normal((256, 256)).astype(np.float32)
print(hashlib.sha256((a @ b).tobytes()).hexdigest())
env = gym.make('Hopper-v5')
act = behaviour_policies.as_recording_policy(
    behaviour_policies.load_policy('medium', 'Hopper-v5'),
    env.observation_space, env.action_space, 0, 'medium')
observation, _ = env.reset(seed=0)
actions = hashlib.sha256()
for _ in range(2000):
  action, _ = act(observation[None])
  actions.update(action.tobytes())
  observation, _, terminated, truncated, _ = env.step(action[0])
  if terminated or truncated:
    observation, _ = env.reset()
print(actions.hexdigest())
"""


@pytest.mark.skipif(platform.machine().lower() not in ('x86_64', 'amd64'),
                    reason='OPENBLAS_CORETYPE names x86 kernels')
def test_a_recording_does_not_depend_on_the_blas_kernel():
  """The same seed records the same actions whichever BLAS kernel the CPU
  gets (OpenBLAS picks one per CPU model; OPENBLAS_CORETYPE forces one):
  in float32 the policy's last bits, and from them the episodes, differed."""
  prints = {}
  for kernel in ('Prescott', 'Sandybridge'):
    done = subprocess.run(
        [sys.executable, '-c', _FINGERPRINTS], cwd=REPO, check=True,
        capture_output=True, text=True, timeout=300,
        env={**os.environ, 'OPENBLAS_CORETYPE': kernel})
    prints[kernel] = done.stdout.split()
  (product_a, actions_a), (product_b, actions_b) = prints.values()
  assert product_a != product_b  # the two kernels did run
  assert actions_a == actions_b
