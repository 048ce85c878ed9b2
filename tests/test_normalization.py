"""rlds_reverb.agents.onpolicy.normalization: VecNormalize's statistics."""

import numpy as np
import pytest
import tensorflow as tf

from rlds_reverb.agents.onpolicy import normalization


def test_running_statistics_equal_those_of_all_batches():
  rng = np.random.default_rng(0)
  batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (1, 7, 64, 3)]
  stats = normalization.RunningMeanStd((4,))
  for batch in batches:
    stats.update(batch)
  everything = np.concatenate(batches)
  # The 1e-4 starting count weighs (mean 0, var 1) in: off by ~1e-6.
  np.testing.assert_allclose(stats.mean, everything.mean(0), atol=1e-4)
  np.testing.assert_allclose(stats.var, everything.var(0), rtol=1e-4)


def test_observations_normalised_and_clipped_updating_only_when_asked():
  norm = normalization.Normalization((2,), 1, gamma=0.99,
                                     observation_clip=1.5)
  data = np.array([[0.0, 10.0], [2.0, 10.0], [4.0, 10.0]], np.float32)
  out = norm.observation(data, update=True)
  mean, std = norm.statistics()
  np.testing.assert_allclose(mean, [2.0, 10.0], atol=1e-3)
  np.testing.assert_allclose(out[:, 0], np.clip([-1.2247, 0.0, 1.2247],
                                                -1.5, 1.5), atol=1e-3)
  # A constant feature stays near 0 (the 1e-4 starting count of
  # baselines' statistics leaves a small offset, never a blow-up).
  assert np.all(np.abs(out[:, 1]) < 0.05)
  far = norm.observation(np.array([[100.0, 10.0]]))
  assert far[0, 0] == pytest.approx(1.5)  # clipped
  np.testing.assert_allclose(norm.statistics()[0], mean)  # no update
  assert far.dtype == np.float32


def test_rewards_scaled_by_the_std_of_the_discounted_return():
  gamma = 0.5
  norm = normalization.Normalization((1,), 2, gamma=gamma, reward_clip=100.0)
  returns = []
  running = np.zeros(2)
  steps = [([1.0, 2.0], [False, True]), ([3.0, 4.0], [True, False]),
           ([5.0, 6.0], [False, False])]
  for rewards, ended in steps:
    running = running * gamma + np.array(rewards)
    returns.append(running.copy())
    scaled = norm.reward(np.array(rewards), np.array(ended))
    running[np.array(ended)] = 0.0
    want = normalization.RunningMeanStd(())
    want.update(np.concatenate(returns))
    np.testing.assert_allclose(scaled, np.array(rewards) / want.std,
                               rtol=1e-4)


def test_off_means_untouched():
  norm = normalization.Normalization((3,), 2, gamma=0.9, observation_clip=0,
                                     reward_clip=0)
  obs = np.array([[1e6, -1e6, 3.0]])
  np.testing.assert_array_equal(norm.observation(obs, update=True), obs)
  np.testing.assert_array_equal(norm.reward(np.array([5.0, -7.0]),
                                            np.array([False, False])),
                                [5.0, -7.0])
  assert norm.statistics() is None


def test_statistics_survive_a_checkpoint(tmp_path):
  norm = normalization.Normalization((3,), 2, gamma=0.9)
  rng = np.random.default_rng(1)
  for _ in range(5):
    norm.observation(rng.normal(5.0, 3.0, size=(2, 3)), update=True)
    norm.reward(rng.normal(size=2), np.array([False, True]))
  norm.save()
  path = tf.train.Checkpoint(norm=norm.variables).save(str(tmp_path / 'c'))
  fresh = normalization.Normalization((3,), 2, gamma=0.9)
  tf.train.Checkpoint(norm=fresh.variables).restore(path)
  fresh.load()
  for attr in ('mean', 'var', 'count'):
    np.testing.assert_array_equal(getattr(fresh.observations, attr),
                                  getattr(norm.observations, attr))
    np.testing.assert_array_equal(getattr(fresh.returns, attr),
                                  getattr(norm.returns, attr))
  probe = rng.normal(size=(4, 3))
  np.testing.assert_array_equal(fresh.observation(probe),
                                norm.observation(probe))
