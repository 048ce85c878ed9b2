"""D4RL's dataset kinds from the shipped behaviour policies
(`recording.generate_dataset(dataset_kind=...)`): episode counts, the step
spec, medium-expert as the two datasets one after the other, and the
shipped medium-replay schedule."""

import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from rlds_reverb.data import behaviour_policies
from rlds_reverb.data import recording
from conftest import _episodes  # pylint: disable=g-bad-import-order

_LIMIT = 20  # env steps per episode in these tests


@pytest.fixture(name='shipped')
def _shipped(tmp_path, monkeypatch):
  """A policy folder with a medium and an expert (the shipped medium and
  the shipped final policy stand in)."""
  source = behaviour_policies.env_dir('HalfCheetah-v5')
  folder = tmp_path / 'policies' / source.name
  folder.mkdir(parents=True)
  shutil.copy(source / 'medium.npz', folder / 'medium.npz')
  shutil.copy(source / 'final.npz', folder / 'expert.npz')
  monkeypatch.setattr(behaviour_policies, 'POLICY_DIR',
                      tmp_path / 'policies')
  return folder


def _generate(out, kind, policy='random', episodes=2):
  return recording.generate_dataset(
      'HalfCheetah-v5', policy, episodes, str(out), seed=3, num_envs=2,
      max_episode_steps=_LIMIT, dataset_kind=kind, show_progress=False)


def test_medium_expert_is_medium_then_expert(shipped, tmp_path):
  del shipped
  both = _generate(tmp_path / 'me', 'medium-expert')
  assert (both.num_episodes, both.num_env_steps) == (4, 4 * _LIMIT)
  medium = _generate(tmp_path / 'm', 'policy', 'medium')
  expert = _generate(tmp_path / 'e', 'policy', 'expert')
  assert both.mean_return == pytest.approx(
      (medium.mean_return + expert.mean_return) / 2, rel=1e-5)
  episodes = _episodes(both.out_dir)
  halves = _episodes(medium.out_dir) + _episodes(expert.out_dir)
  for got, want in zip(episodes, halves):
    for key in ('observation', 'action', 'reward', 'is_terminal', 'is_last'):
      np.testing.assert_array_equal(got[key], want[key])
  # The d4rl_mujoco_halfcheetah/v2 step spec, as every generated dataset.
  builder = tfds.builder_from_directory(both.dataset_dir)
  steps = builder.info.features['steps']
  assert steps['observation'].shape == (17,)
  assert steps['action'].shape == (6,)
  assert set(steps['infos'].keys()) == {'qpos', 'qvel', 'action_log_probs'}
  assert builder.info.splits['train'].num_examples == 4


def test_medium_expert_needs_both_policies(shipped, tmp_path):
  (shipped / 'expert.npz').unlink()
  with pytest.raises(ValueError, match="unknown policy 'expert'"):
    _generate(tmp_path / 'me', 'medium-expert')
  assert not any((tmp_path / 'me').glob('*'))


def test_medium_replay_follows_the_shipped_schedule(tmp_path):
  """The shipped schedule: 10k random steps, then 10k per snapshot."""
  schedule = behaviour_policies.replay_schedule('HalfCheetah-v5')
  assert schedule[0] == {'policy': 'random', 'env_steps': 10_000}
  assert all(s['env_steps'] == 10_000 for s in schedule)
  for segment in schedule[1:]:
    assert behaviour_policies.load_policy(behaviour_policies.replay_policy_path(
        'HalfCheetah-v5', segment['policy']), 'HalfCheetah-v5')
  with open(behaviour_policies.env_dir('HalfCheetah-v5') / 'replay' /
            'schedule.json') as f:
    source = __import__('json').load(f)['source']
  # Medium-replay stops where medium was taken.
  assert sum(s['env_steps'] for s in schedule) == source['medium_step']


def test_shipped_roles_load_and_act():
  names = behaviour_policies.shipped_names('HalfCheetah-v5')
  assert {'medium', 'final'} <= set(names)
  for name in names:
    policy = behaviour_policies.load_policy(name, 'HalfCheetah-v5')
    assert (policy.observation_size, policy.action_size) == (17, 6)
