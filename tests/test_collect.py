"""rlds_reverb.acting.collect: exploration with random actions."""

import numpy as np

from rlds_reverb.acting import collect


def test_random_actions_replace_the_given_share():
  low, high = -np.ones(4, np.float32), np.ones(4, np.float32)
  constant = lambda obs, rng: (np.full((len(obs), 4), 0.25, np.float32),
                               np.zeros(len(obs)))
  rng = np.random.default_rng(0)
  obs = np.zeros((20_000, 3))
  assert collect.with_random_actions(constant, 0.0, low, high) is constant
  actions, _ = collect.with_random_actions(constant, 0.3, low, high)(obs, rng)
  replaced = np.any(actions != 0.25, axis=1)
  assert abs(replaced.mean() - 0.3) < 5 * np.sqrt(0.3 * 0.7 / len(obs))
  assert np.all((actions >= low) & (actions <= high))
  actions, _ = collect.with_random_actions(constant, 1.0, low, high)(obs, rng)
  assert np.all(actions != 0.25)
