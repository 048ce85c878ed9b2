"""rlds_reverb.acting.numpy_policy: sampling log-probs equal TF-Agents',
epsilon-greedy exploration, policy files.
"""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.trajectories import time_step as ts

from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.agents import dqn
from rlds_reverb.agents import export
from conftest import _dqn  # pylint: disable=g-bad-import-order
from conftest import chi_square  # pylint: disable=g-bad-import-order
from conftest import chi_square_bound  # pylint: disable=g-bad-import-order


def test_sampled_actions_have_the_tf_agents_log_prob(specs):
  agent = registry.make_agent('sac', specs.time_step_spec, specs.action_spec)
  policy = export.from_network(factory.actor_network(agent),
                               'tanh_normal', specs.action_spec)
  obs = np.random.default_rng(1).normal(size=(16, 17)).astype(np.float32)
  actions, log_probs = policy.sample(obs, np.random.default_rng(2))
  distribution = agent.collect_policy.distribution(
      ts.restart(tf.constant(obs), batch_size=16)).action
  np.testing.assert_allclose(log_probs, distribution.log_prob(actions),
                             rtol=1e-4, atol=1e-4)
  assert np.all(np.abs(actions) <= 1.0)


def test_epsilon_greedy_explores_at_the_given_rate(cartpole):
  policy = dqn.export_q_policy(_dqn(cartpole), cartpole.action_spec)
  obs = np.zeros((4000, 4), np.float32)  # Same state: one greedy action.
  greedy = policy.greedy(obs[:1])[0]
  actions, log_probs = policy.epsilon_greedy(obs, np.random.default_rng(0),
                                             0.3)
  # Greedy with probability 0.7 + 0.3 / 2; 6 sigma of a binomial.
  share = np.mean(actions == greedy)
  assert abs(share - 0.85) < 6 * np.sqrt(0.85 * 0.15 / 4000)
  np.testing.assert_allclose(np.exp(log_probs),
                             np.where(actions == greedy, 0.85, 0.15))
  same, _ = policy.epsilon_greedy(obs, np.random.default_rng(0), 0.0)
  assert np.all(same == greedy)
  assert dqn.epsilon(0, 100, 0.04) == 1.0
  assert dqn.epsilon(50, 100, 0.04) == pytest.approx(0.52)
  assert dqn.epsilon(500, 100, 0.04) == pytest.approx(0.04)


def test_uniform_mixture_draws_its_frequencies_and_log_probs():
  """(1 - eps) pi + eps / n, sampled: chi-square of 30,000 draws against
  the mixture under `chi_square_bound` (exceeded with probability < 1e-6
  by a correct sampler), and each draw's log-prob is the mixture's."""
  pi = np.array([0.7, 0.2, 0.1])
  mixed = numpy_policy.mix_uniform(np.log(np.tile(pi, (30_000, 1))), 0.3)
  want = 0.7 * pi + 0.1
  np.testing.assert_allclose(np.exp(mixed[0]), want)
  actions, log_probs = numpy_policy.sample_categorical(
      mixed, np.int64(0), np.random.default_rng(4))
  counts = np.bincount(actions, minlength=3)
  assert chi_square(counts, 30_000 * want) < chi_square_bound(2)
  np.testing.assert_allclose(log_probs, np.log(want[actions]))


def test_policy_file_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='no policy file'):
    numpy_policy.load(str(tmp_path / 'missing.npz'))
  np.savez(tmp_path / 'other.npz', x=np.zeros(2))
  with pytest.raises(ValueError, match='not a policy file'):
    numpy_policy.load(str(tmp_path / 'other.npz'))


def test_tanh_mean_gaussian_samples_around_its_squashed_mean():
  """IQL's head: greedy is the tanh mean scaled to the bounds; samples
  are N(that mean, exp(log_std)) and unclipped. 20,000 draws: the sample
  mean is within 5 standard errors (0.5 / sqrt(20000) * 5 = 0.018) of the
  greedy action, the sample std within 3 % of 0.5."""
  rng = np.random.default_rng(0)
  policy = numpy_policy.NumpyPolicy(
      head='tanh_mean_gaussian',
      kernels=[rng.normal(size=(4, 2)).astype(np.float32)],
      biases=[np.array([3.0, -0.2], np.float32)],
      action_low=np.array([-2.0, -1.0], np.float32),
      action_high=np.array([1.0, 1.0], np.float32),
      log_std=np.log(np.full(2, 0.5, np.float32)))
  obs = np.zeros((20_000, 4), np.float32)
  greedy = policy.greedy(obs[:1])[0]
  # center + magnitude * tanh(bias): (-0.5 + 1.5 tanh 3, tanh -0.2).
  np.testing.assert_allclose(greedy, [-0.5 + 1.5 * np.tanh(3.0),
                                      np.tanh(-0.2)], rtol=1e-5)
  actions, log_probs = policy.sample(obs, rng)
  np.testing.assert_allclose(actions.mean(0), greedy, atol=0.018)
  np.testing.assert_allclose(actions.std(0), 0.5, rtol=0.03)
  assert actions.max() > 1.0  # unclipped: the env clips
  # The log-density of each draw, by hand.
  z = (actions.astype(np.float64) - greedy) / 0.5
  by_hand = np.sum(-0.5 * z**2 - 0.5 * np.log(2 * np.pi) - np.log(0.5), -1)
  np.testing.assert_allclose(log_probs, by_hand, atol=1e-4)
  with pytest.raises(ValueError, match='log_std goes with the heads'):
    numpy_policy.NumpyPolicy(
        head='tanh_mean_gaussian', kernels=policy.kernels,
        biases=policy.biases, action_low=policy.action_low,
        action_high=policy.action_high)
