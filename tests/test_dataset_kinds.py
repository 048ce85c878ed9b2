"""D4RL's dataset kinds from the shipped behaviour policies
(`recording.generate_dataset(dataset_kind=...)`): episode counts, the step
spec, medium-expert as the two datasets one after the other, and the
shipped medium-replay schedule."""

import json
import shutil

import numpy as np
import pytest
import tensorflow_datasets as tfds

from rlds_reverb.data import behaviour_policies
from rlds_reverb.data import recording
from conftest import _episodes  # pylint: disable=g-bad-import-order

_LIMIT = 20  # env steps per episode in these tests
# The spread of the shipped medium policies' episode returns (Hopper-v5:
# its 1M-transition dataset, 2,206 episodes; Walker2d-v5: a 100k sample,
# 108 episodes; docs/datasets.md).
MEDIUM_RETURN_STD = {'Hopper-v5': 1249.0, 'Walker2d-v5': 675.0}


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
    source = json.load(f)['source']
  # Medium-replay stops where medium was taken.
  assert sum(s['env_steps'] for s in schedule) == source['medium_step']


def test_ship_from_run_takes_the_expert_at_the_step_asked(
    tmp_path, monkeypatch):
  """A run whose last evaluation caught a bad spell ships an earlier
  snapshot as its expert; later snapshots play no part."""
  source = behaviour_policies.env_dir('HalfCheetah-v5')
  run = tmp_path / 'run'
  (run / 'policies').mkdir(parents=True)
  evals = {10: 30.0, 20: 100.0, 30: 60.0, 40: 40.0}
  for step in evals:
    role = 'final' if step == 20 else 'medium'
    shutil.copy(source / f'{role}.npz',
                run / 'policies' / f'step_{step:08d}.npz')
  (run / 'eval.jsonl').write_text(''.join(
      json.dumps({'env_steps': s, 'average_return': r}) + '\n'
      for s, r in evals.items()))
  monkeypatch.setattr(behaviour_policies, 'POLICY_DIR', tmp_path / 'ship')
  with pytest.raises(ValueError, match=r'no evaluated snapshot at '
                     r'expert_step 25; evaluated ones: \[10, 20, 30, 40\]'):
    behaviour_policies.ship_from_run(str(run), 'HalfCheetah-v5',
                                     expert=True, expert_step=25)
  chosen = behaviour_policies.ship_from_run(
      str(run), 'HalfCheetah-v5', expert=True, expert_step=20,
      initial_collect_steps=10)
  # Medium: the greedy return closest to a third of the expert's 100.
  assert (chosen['final_step'], chosen['final_return']) == (20, 100.0)
  assert chosen['medium_step'] == 10
  shipped = tmp_path / 'ship' / source.name
  with np.load(shipped / 'expert.npz') as got, np.load(
      source / 'final.npz') as want:
    for key in want.files:
      np.testing.assert_array_equal(got[key], want[key])


def test_shipped_roles_load_and_act():
  names = behaviour_policies.shipped_names('HalfCheetah-v5')
  assert {'medium', 'final'} <= set(names)
  for name in names:
    policy = behaviour_policies.load_policy(name, 'HalfCheetah-v5')
    assert (policy.observation_size, policy.action_size) == (17, 6)


@pytest.mark.parametrize('env_id', sorted(MEDIUM_RETURN_STD))
def test_terminating_roles_record_as_d4rl_sizes_them(tmp_path, env_id):
  """The shipped medium and expert of an env that falls, recorded by
  transitions in TFDS's encoding: whole episodes, medium-expert the two
  halves one after the other, and medium's return near the level it was
  chosen at.

  Medium's episodes return MEDIUM_RETURN_STD apart (a hopper falls early
  or hops 1,000 steps); over the episodes of 10k transitions the mean
  stays within 4 standard errors of the shipped level (a false failure
  about 1 in 16,000 runs; the seed is fixed), which rules out random
  (about 20) and expert (above 3,000) data. The expert never falls in
  its first two episodes.
  """
  def generate(name, policy, budget, kind='policy'):
    return recording.generate_dataset(
        env_id, policy, None, str(tmp_path / name), seed=4, num_envs=2,
        num_env_steps=budget, dataset_kind=kind, encoding='tfds_d4rl',
        show_progress=False)

  budget = 2000
  both = generate('me', 'medium', budget, 'medium-expert')
  medium = generate('m', 'medium', budget)
  medium_episodes = _episodes(medium.out_dir)
  both_episodes = _episodes(both.out_dir)
  assert budget <= medium.num_env_steps < budget + 1000
  assert 2 * budget <= both.num_env_steps < 2 * budget + 2000
  for got, want in zip(both_episodes, medium_episodes):
    np.testing.assert_array_equal(got['observation'], want['observation'])
  expert_episodes = both_episodes[len(medium_episodes):]
  assert [len(ep['reward']) for ep in expert_episodes] == [1001, 1001]
  assert not any(ep['is_terminal'][-1] for ep in expert_episodes)
  with open(behaviour_policies.env_dir(env_id) / 'replay' /
            'schedule.json') as f:
    level = json.load(f)['source']['medium_stochastic_return']
  longer = generate('m10k', 'medium', 10_000)
  returns = [float(np.sum(ep['reward'])) for ep in _episodes(longer.out_dir)]
  bound = 4 * MEDIUM_RETURN_STD[env_id] / np.sqrt(len(returns))
  assert abs(np.mean(returns) - level) < bound, (returns, level, bound)
  # TFDS's encoding: discount 0.0 on every last step, 1.0 before it but on
  # the last real step of a terminated episode.
  for ep in medium_episodes:
    assert ep['discount'][-1] == 0.0
    assert ep['discount'][-2] == (0.0 if ep['is_terminal'][-1] else 1.0)
