"""rlds_reverb.agents.onpolicy.gae against references computed another way.

The reference sums A_t = sum_l (gamma lambda)^l delta_{t+l} directly over
the rest of each episode segment, with each delta written out from the
step's ending; the module runs the backward recursion. Rollouts mix
terminal and truncated endings, episodes crossing the rollout's end, and
env copies that end at different steps.
"""

import numpy as np
import pytest

from rlds_reverb.agents.onpolicy import gae

GAMMA, LAM = 0.9, 0.8


def reference(rewards, values, next_values, terminated, truncated,
              final_values, gamma, lam, proper=True):
  t_steps, n = rewards.shape
  adv = np.zeros((t_steps, n))
  for i in range(n):
    deltas = []
    for t in range(t_steps):
      if terminated[t, i]:
        future = 0.0
      elif truncated[t, i]:
        future = final_values[t, i] if proper else 0.0
      elif t + 1 < t_steps:
        future = values[t + 1, i]
      else:
        future = next_values[i]
      deltas.append(rewards[t, i] + gamma * future - values[t, i])
    for t in range(t_steps):
      total, weight = 0.0, 1.0
      for u in range(t, t_steps):
        total += weight * deltas[u]
        if terminated[u, i] or truncated[u, i]:
          break
        weight *= gamma * lam
      adv[t, i] = total
  return adv, adv + values


def rollout(seed=0, t_steps=7, n=3):
  rng = np.random.default_rng(seed)
  rewards = rng.normal(size=(t_steps, n))
  values = rng.normal(size=(t_steps, n))
  next_values = rng.normal(size=n)
  final_values = rng.normal(size=(t_steps, n))
  terminated = np.zeros((t_steps, n), bool)
  truncated = np.zeros((t_steps, n), bool)
  terminated[2, 0] = True   # copy 0: ends at 2, new episode runs past T
  truncated[4, 1] = True    # copy 1: cut off at 4
  terminated[1, 2] = True   # copy 2: terminal, then truncated at the end
  truncated[t_steps - 1, 2] = True
  return rewards, values, next_values, terminated, truncated, final_values


@pytest.mark.parametrize('proper', [True, False])
@pytest.mark.parametrize('lam', [LAM, 1.0, 0.0])
def test_matches_the_direct_sum_over_each_episode(proper, lam):
  r, v, nv, term, trunc, fv = rollout()
  adv, ret = gae.advantages(r, v, nv, term, trunc, gamma=GAMMA, lam=lam,
                            final_values=fv, proper_time_limits=proper)
  want_adv, want_ret = reference(r, v, nv, term, trunc, fv, GAMMA, lam,
                                 proper)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_hand_computed_values_of_each_ending():
  # One copy, three steps: a step that goes on, a truncated one, a terminal.
  r = np.array([[1.0], [2.0], [3.0]])
  v = np.array([[0.5], [0.25], [0.125]])
  fv = np.array([[0.0], [4.0], [0.0]])  # V(final obs) of the truncated step
  term = np.array([[False], [False], [True]])
  trunc = np.array([[False], [True], [False]])
  adv, ret = gae.advantages(r, v, np.array([9.0]), term, trunc, gamma=0.5,
                            lam=0.5, final_values=fv)
  d2 = 3.0 - 0.125                   # terminal: no future
  d1 = 2.0 + 0.5 * 4.0 - 0.25        # truncated: bootstraps on V(final)
  d0 = 1.0 + 0.5 * 0.25 - 0.5        # goes on into step 1
  np.testing.assert_allclose(adv[:, 0], [d0 + 0.25 * d1, d1, d2], rtol=1e-6)
  np.testing.assert_allclose(ret[:, 0], adv[:, 0] + v[:, 0], rtol=1e-6)
  # The rollout's end bootstraps on next_values when nothing ended.
  adv, _ = gae.advantages(r[:1], v[:1], np.array([9.0]), term[:1] * False,
                          trunc[:1] * False, gamma=0.5, lam=0.5)
  np.testing.assert_allclose(adv[0, 0], 1.0 + 0.5 * 9.0 - 0.5, rtol=1e-6)


def test_truncation_off_is_terminal_and_differs():
  r, v, nv, term, trunc, fv = rollout(seed=3)
  proper, _ = gae.advantages(r, v, nv, term, trunc, gamma=GAMMA, lam=LAM,
                             final_values=fv)
  as_terminal, _ = gae.advantages(r, v, nv, term | trunc,
                                  np.zeros_like(trunc), gamma=GAMMA, lam=LAM)
  off, _ = gae.advantages(r, v, nv, term, trunc, gamma=GAMMA, lam=LAM,
                          final_values=fv, proper_time_limits=False)
  np.testing.assert_allclose(off, as_terminal, rtol=1e-6)
  assert not np.allclose(proper[4, 1], off[4, 1])


def test_a_step_both_terminated_and_truncated_is_terminal():
  r, v, nv, term, trunc, fv = rollout()
  both = term.copy()
  adv, _ = gae.advantages(r, v, nv, term, trunc | both, gamma=GAMMA,
                          lam=LAM, final_values=fv)
  want, _ = gae.advantages(r, v, nv, term, trunc, gamma=GAMMA, lam=LAM,
                           final_values=fv)
  np.testing.assert_allclose(adv, want, rtol=1e-6)


def test_bad_input_is_refused():
  r, v, nv, term, trunc, fv = rollout()
  with pytest.raises(ValueError, match='final_values'):
    gae.advantages(r, v, nv, term, trunc, gamma=GAMMA, lam=LAM)
  with pytest.raises(ValueError, match='values has shape'):
    gae.advantages(r, v[:-1], nv, term, trunc, gamma=GAMMA, lam=LAM,
                   final_values=fv)
  with pytest.raises(ValueError, match='next_values'):
    gae.advantages(r, v, nv[:-1], term, trunc, gamma=GAMMA, lam=LAM,
                   final_values=fv)
  with pytest.raises(ValueError, match=r'rewards must be \[T, N\]'):
    gae.advantages(r[:, 0], v, nv, term, trunc, gamma=GAMMA, lam=LAM)
