"""rlds_reverb.acting.vector_rollouts: fixed-length rollouts of real envs."""

import numpy as np
import pytest

from rlds_reverb.acting import envs
from rlds_reverb.acting import vector_rollouts


def uniform(low, high, rng):
  def act(obs, starts):
    del starts
    n = obs.shape[0]
    return (rng.uniform(low, high, (n,) + low.shape).astype(np.float32),
            np.zeros(n))
  return act


def test_truncated_steps_keep_their_real_final_observation():
  # Pendulum never terminates; its time limit cuts every episode at 200.
  specs = envs.env_specs('Pendulum-v1')
  rollouts = vector_rollouts.VectorRollouts('Pendulum-v1', num_envs=2,
                                            rollout_steps=150, seed=3)
  rng = np.random.default_rng(0)
  act = uniform(specs.action_low, specs.action_high, rng)
  first, returns1, _ = rollouts.collect(act)
  second, returns2, lengths = rollouts.collect(act)
  assert sorted(first) == sorted(vector_rollouts.FIELDS)
  assert first['observation'].shape == (150, 2, 3)
  assert first['action'].shape == (150, 2, 1)
  assert not first['truncated'].any() and not returns1
  # The second rollout starts where the first stopped.
  np.testing.assert_array_equal(second['observation'][0],
                                first['next_observation'])
  assert not second['terminated'].any()
  np.testing.assert_array_equal(np.flatnonzero(second['truncated'][:, 0]),
                                [49])
  assert lengths == [200, 200] and len(returns2) == 2
  final = second['final_observation'][49]
  # The final observation is the env's, not the next episode's first one.
  assert np.all(final != 0) and not np.allclose(final,
                                                second['observation'][50])
  # cos^2 + sin^2 = 1: a real pendulum observation.
  np.testing.assert_allclose(final[:, 0]**2 + final[:, 1]**2, 1.0, rtol=1e-5)
  np.testing.assert_array_equal(second['final_observation'][:49], 0.0)
  np.testing.assert_array_equal(second['episode_start'][50], [True, True])
  np.testing.assert_array_equal(second['episode_start'][:50], False)
  # Returns are the raw rewards summed over both rollouts.
  total = first['reward'][:, 0].sum() + second['reward'][:50, 0].sum()
  assert returns2[0] == pytest.approx(total, rel=1e-5)


def test_terminated_steps_on_cartpole_and_what_the_policy_saw():
  seen = []

  def observe(obs, update=False):
    seen.append(update)
    return np.asarray(obs, np.float32) * 2.0

  rollouts = vector_rollouts.VectorRollouts('CartPole-v1', num_envs=3,
                                            rollout_steps=100, seed=0,
                                            observe=observe,
                                            scale_reward=lambda r, e: r * 0.5)
  rng = np.random.default_rng(1)
  observed = []

  starts_seen = []

  def act(obs, starts):
    observed.append(obs.copy())
    starts_seen.append(starts.copy())
    return rng.integers(0, 2, obs.shape[0]), np.full(obs.shape[0], np.log(.5))

  rollout, returns, lengths = rollouts.collect(act)
  assert rollout['terminated'].any() and not rollout['truncated'].any()
  np.testing.assert_array_equal(rollout['observation'], np.stack(observed))
  # The actor is told where episodes start (a recurrent one resets there).
  np.testing.assert_array_equal(rollout['episode_start'],
                                np.stack(starts_seen))
  assert rollout['episode_start'][0].all()
  np.testing.assert_array_equal(rollout['reward'], 0.5)
  assert rollout['action'].dtype == np.int64
  # A copy's next step after a termination starts a new episode.
  t, i = np.argwhere(rollout['terminated'])[0]
  assert rollout['episode_start'][t + 1, i]
  np.testing.assert_array_equal(rollout['final_observation'], 0.0)
  assert len(lengths) == rollout['terminated'].sum()
  assert returns == [float(n) for n in lengths]  # CartPole: 1 per step
  assert all(seen)  # every observation updates the statistics


def test_bad_arguments():
  with pytest.raises(ValueError, match='num_envs'):
    vector_rollouts.VectorRollouts('CartPole-v1', num_envs=0,
                                   rollout_steps=5)
  with pytest.raises(ValueError, match='flat'):
    vector_rollouts.VectorRollouts('FetchReach-v4', num_envs=1,
                                   rollout_steps=5)
