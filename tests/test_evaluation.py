"""rlds_reverb.acting.evaluation against hand-run MuJoCo episodes."""

import gymnasium as gym
import numpy as np
import pytest

from rlds_reverb.acting import envs
from rlds_reverb.acting import evaluation

ENV_ID = 'HalfCheetah-v5'


def test_evaluation_returns_d4rl_normalised_score():
  act = lambda obs: np.full((len(obs), 6), 0.3, np.float32)
  result = evaluation.evaluate(act, ENV_ID, num_episodes=2, seed=5)
  # The same episodes by hand.
  expected = []
  for i in range(2):
    env = gym.make(ENV_ID)
    env.reset(seed=5 + i)
    total, done = 0.0, False
    while not done:
      _, reward, terminated, truncated, _ = env.step(np.full(6, 0.3))
      total += reward
      done = terminated or truncated
    expected.append(total)
  np.testing.assert_allclose(result.returns, expected, rtol=1e-6)
  assert result.lengths == [1000, 1000]
  low, high = -280.178953, 12135.0
  assert result.normalized_score == pytest.approx(
      100 * (np.mean(expected) - low) / (high - low))
  assert envs.normalized_score(ENV_ID, low) == pytest.approx(0.0)
  assert envs.normalized_score(ENV_ID, high) == pytest.approx(100.0)
  assert envs.normalized_score('CartPole-v1', 10.0) is None


def test_env_kwargs_reach_every_episodes_env():
  # HalfCheetah never ends before its limit, so the lengths are the limit
  # given through env_kwargs, not the env's own 1,000.
  act = lambda obs: np.zeros((len(obs), 6), np.float32)
  result = evaluation.evaluate(act, ENV_ID, num_episodes=2, seed=0,
                               env_kwargs={'max_episode_steps': 7})
  assert result.lengths == [7, 7]


def test_atari_sticky_actions_follow_the_kwarg():
  ale = lambda **kw: envs.make_env('ALE/Pong-v5', **kw).unwrapped.ale
  assert ale().getFloat('repeat_action_probability') == pytest.approx(0.25)
  assert ale(repeat_action_probability=0.0).getFloat(
      'repeat_action_probability') == 0.0
