"""GAIL's pieces (rlds_reverb.agents.onpolicy.gail)."""

import numpy as np
import pytest
import rlds
import tensorflow as tf

import rlds_fixtures as fx
from rlds_reverb.agents.onpolicy import gail
from rlds_reverb.agents.onpolicy import normalization

OBS, ACT = 3, 2


def numpy_logits(disc, inputs):
  """The discriminator's forward pass in float64 numpy from its weights."""
  x = np.asarray(inputs, np.float64)
  layers = disc.network.layers
  for i, layer in enumerate(layers):
    x = x @ layer.kernel.numpy().astype(np.float64) + layer.bias.numpy()
    if i < len(layers) - 1:
      x = np.tanh(x)
  return x[:, 0]


def pairs(rng, n, action_value=None):
  obs = rng.normal(size=(n, OBS)).astype(np.float32)
  if action_value is None:
    act = rng.normal(size=(n, ACT)).astype(np.float32)
  else:
    act = np.full((n, ACT), action_value, np.float32)
  return obs, act


# ------------------------------------------------------------- discriminator

def test_gradient_penalty_matches_central_finite_differences():
  disc = gail.Discriminator(OBS, ACT, hidden=(8, 8), seed=3,
                            gradient_penalty_weight=7.0)
  rng = np.random.default_rng(0)
  expert_obs, expert_act = pairs(rng, 6)
  policy_obs, policy_act = pairs(rng, 6)
  expert_obs *= 3.0  # gradient norms spread around 1, not all below it
  alpha = np.array([0.0, 0.1, 0.35, 0.5, 0.9, 1.0], np.float32)
  got = float(disc.gradient_penalty(expert_obs, expert_act, policy_obs,
                                    policy_act, alpha=alpha))

  expert = np.concatenate([expert_obs, expert_act], 1).astype(np.float64)
  policy = np.concatenate([policy_obs, policy_act], 1).astype(np.float64)
  mixed = alpha[:, None] * expert + (1 - alpha[:, None]) * policy
  # The float64 forward is the module's: compare logits first.
  np.testing.assert_allclose(
      numpy_logits(disc, mixed),
      disc.logits(mixed[:, :OBS].astype(np.float32),
                  mixed[:, OBS:].astype(np.float32)).numpy(),
      rtol=1e-5, atol=1e-5)
  h = 1e-6
  gradient = np.zeros_like(mixed)
  for j in range(mixed.shape[1]):
    step = np.zeros(mixed.shape[1])
    step[j] = h
    gradient[:, j] = (numpy_logits(disc, mixed + step) -
                      numpy_logits(disc, mixed - step)) / (2 * h)
  norms = np.linalg.norm(gradient, axis=1)
  assert norms.min() < 1 < norms.max() or np.ptp(norms) > 0.05
  want = 7.0 * np.mean((norms - 1.0)**2)
  # float32 network against float64 differences (error ~1e-9).
  assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
  # alpha as [B, 1] is the same; alpha 1 is the penalty at the expert pairs.
  assert float(disc.gradient_penalty(
      expert_obs, expert_act, policy_obs, policy_act,
      alpha=alpha[:, None])) == pytest.approx(got, rel=1e-6)
  at_expert = float(disc.gradient_penalty(expert_obs, expert_act, policy_obs,
                                          policy_act, alpha=np.ones(6)))
  assert float(disc.gradient_penalty(
      expert_obs, expert_act, expert_obs, expert_act)) == pytest.approx(
          at_expert, rel=1e-5)


def test_gradient_penalty_needs_batches_of_one_size():
  disc = gail.Discriminator(OBS, ACT, hidden=(4,))
  rng = np.random.default_rng(0)
  with pytest.raises(ValueError, match='5 rows and the policy batch 4'):
    disc.gradient_penalty(*pairs(rng, 5), *pairs(rng, 4))
  with pytest.raises(ValueError, match='5 rows and the policy batch 4'):
    disc.train_step(*pairs(rng, 5), *pairs(rng, 4))


def test_reward_is_the_logit_log_d_minus_log_one_minus_d():
  disc = gail.Discriminator(OBS, ACT, hidden=(16, 16), seed=1)
  rng = np.random.default_rng(1)
  obs, act = pairs(rng, 32)
  reward = disc.reward(obs, act)
  z = numpy_logits(disc, np.concatenate([obs, act], 1))
  assert np.abs(z).max() < 10  # moderate: the naive form is exact here
  d = 1.0 / (1.0 + np.exp(-z))
  np.testing.assert_allclose(reward, np.log(d) - np.log(1.0 - d),
                             rtol=1e-4, atol=1e-5)
  assert reward.dtype == np.float32 and reward.shape == (32,)
  # Huge logits: sigmoid saturates, the seed's form would give +-inf.
  last = disc.network.layers[-1]
  last.bias.assign([1e4])
  big = disc.reward(obs, act)
  last.bias.assign([-1e4])
  small = disc.reward(obs, act)
  assert np.all(np.isfinite(big)) and np.all(np.isfinite(small))
  assert big.min() > 9e3 and small.max() < -9e3
  with np.errstate(divide='ignore'):
    naive = np.log(np.float32(1.0)) - np.log(1.0 - np.float32(1.0))
  assert np.isinf(naive)  # what the identity avoids


def test_loss_is_the_seeds_cross_entropy_by_hand():
  # One hidden unit reading action[0]: logit = 2 tanh(a0) + 0.5.
  disc = gail.Discriminator(1, 1, hidden=(1,), gradient_penalty_weight=0.0)
  hidden_layer, out = disc.network.layers
  hidden_layer.kernel.assign([[0.0], [1.0]])
  hidden_layer.bias.assign([0.0])
  out.kernel.assign([[2.0]])
  out.bias.assign([0.5])
  expert_act = np.array([[0.3], [-1.2]], np.float32)
  policy_act = np.array([[2.0], [0.0]], np.float32)
  obs = np.array([[5.0], [-5.0]], np.float32)  # ignored by the weights
  total, parts = disc.loss(obs, expert_act, obs, policy_act)

  def logit(a):
    return 2.0 * np.tanh(np.float64(a[:, 0])) + 0.5

  # BCE(label 1) = log(1 + e^-z), BCE(label 0) = log(1 + e^z).
  expert_loss = np.mean(np.log1p(np.exp(-logit(expert_act))))
  policy_loss = np.mean(np.log1p(np.exp(logit(policy_act))))
  assert float(parts['expert_loss']) == pytest.approx(expert_loss, rel=1e-5)
  assert float(parts['policy_loss']) == pytest.approx(policy_loss, rel=1e-5)
  assert float(parts['gradient_penalty']) == 0.0
  assert float(total) == pytest.approx(expert_loss + policy_loss, rel=1e-5)
  # A penalty weight adds the penalty to the total.
  disc.gradient_penalty_weight = 10.0
  total, parts = disc.loss(obs, expert_act, obs, policy_act,
                           alpha=np.array([0.25, 0.75]))
  assert float(parts['gradient_penalty']) > 0
  assert float(total) == pytest.approx(
      expert_loss + policy_loss + float(parts['gradient_penalty']), rel=1e-5)


def test_train_step_learns_to_tell_expert_from_policy():
  disc = gail.Discriminator(OBS, ACT, seed=0)
  assert isinstance(disc.optimizer, tf.keras.optimizers.Adam)
  assert float(disc.optimizer.learning_rate) == pytest.approx(3e-4)
  assert [layer.units for layer in disc.network.layers] == [100, 100, 1]
  rng = np.random.default_rng(2)
  first = None
  for _ in range(150):
    step = disc.train_step(*pairs(rng, 32, 1.0), *pairs(rng, 32, -1.0))
    first = first or step
  assert set(step) == {'loss', 'expert_loss', 'policy_loss',
                       'gradient_penalty'}
  assert all(isinstance(v, float) for v in step.values())
  assert step['loss'] < 0.5 * first['loss']
  expert = disc.reward(*pairs(rng, 256, 1.0))
  policy = disc.reward(*pairs(rng, 256, -1.0))
  assert expert.mean() > policy.mean() + 2.0
  assert int(disc.optimizer.iterations) == 150


# --------------------------------------------------------------- expert data

def coded_episode(episode: int, length: int) -> dict:
  """Observation [episode, step, 1], action [episode, step]: each pair says
  where it came from. The is_last step's action is junk (-1)."""
  t = np.arange(length)
  obs = np.stack([np.full(length, episode), t, np.ones(length)], 1)
  act = np.stack([np.full(length, episode), t], 1).astype(np.float32)
  act[-1] = -1.0
  return {
      rlds.OBSERVATION: obs.astype(np.float64),
      rlds.ACTION: act,
      rlds.REWARD: np.zeros(length, np.float32),
      rlds.DISCOUNT: np.ones(length, np.float32),
      rlds.IS_FIRST: t == 0,
      rlds.IS_LAST: t == length - 1,
      rlds.IS_TERMINAL: t == length - 1,
  }


def coded_rlds(lengths):
  dataset = None
  for i, n in enumerate(lengths):
    one = tf.data.Dataset.from_tensors(
        {rlds.STEPS: tf.data.Dataset.from_tensor_slices(coded_episode(i, n))})
    dataset = one if dataset is None else dataset.concatenate(one)
  return dataset


LENGTHS = (23, 30, 9, 41, 12)


@pytest.mark.parametrize('num_trajectories,subsample,seed',
                         [(3, 4, 0), (4, 7, 5), (5, 1, 1), (2, 20, 3)])
def test_expert_pairs_keep_every_kth_step_of_the_first_episodes(
    num_trajectories, subsample, seed):
  obs, act = gail.expert_pairs(coded_rlds(LENGTHS),
                               num_trajectories=num_trajectories,
                               subsample=subsample, seed=seed)
  assert obs.dtype == np.float32 and act.dtype == np.float32
  assert obs.shape[1:] == (3,) and act.shape[1:] == (2,)
  # Each action belongs to its own observation's step (never is_last's).
  np.testing.assert_array_equal(act, obs[:, :2])
  starts = np.random.default_rng(seed).integers(0, subsample,
                                                size=num_trajectories)
  want = [(e, t) for e in range(num_trajectories)
          for t in range(starts[e], LENGTHS[e] - 1, subsample)]
  got = [(int(e), int(t)) for e, t in obs[:, :2]]
  assert got == want
  assert len(obs) == sum(len(range(starts[e], LENGTHS[e] - 1, subsample))
                         for e in range(num_trajectories))
  for e in range(num_trajectories):
    steps = obs[obs[:, 0] == e, 1].astype(int)
    assert np.all(steps < LENGTHS[e] - 1)  # the is_last step never
    if len(steps):
      assert 0 <= steps[0] < subsample
      assert np.all(np.diff(steps) == subsample)
  assert set(obs[:, 0].astype(int)) <= set(range(num_trajectories))


def test_expert_pairs_offsets_vary_with_the_seed():
  data = coded_rlds(LENGTHS)
  offsets = {tuple(gail.expert_pairs(data, num_trajectories=5, subsample=6,
                                     seed=seed)[0][:3, 1])
             for seed in range(6)}
  assert len(offsets) > 1
  again = gail.expert_pairs(data, num_trajectories=5, subsample=6, seed=4)
  first = gail.expert_pairs(data, num_trajectories=5, subsample=6, seed=4)
  np.testing.assert_array_equal(again[0], first[0])


def test_expert_pairs_subsample_one_keeps_every_transition():
  obs, _ = gail.expert_pairs(coded_rlds(LENGTHS), num_trajectories=5,
                             subsample=1)
  assert len(obs) == sum(n - 1 for n in LENGTHS)


def test_expert_pairs_errors():
  data = coded_rlds(LENGTHS)
  with pytest.raises(ValueError, match='has only 5 episodes'):
    gail.expert_pairs(data, num_trajectories=6)
  for bad in (0, -1, 1.5, True):
    with pytest.raises(ValueError, match='num_trajectories'):
      gail.expert_pairs(data, num_trajectories=bad)
    with pytest.raises(ValueError, match='subsample'):
      gail.expert_pairs(data, subsample=bad)
  discrete = fx.make_rlds(fx.episodes_with_lengths([5, 6], discrete=True))
  with pytest.raises(ValueError, match='continuous actions'):
    gail.expert_pairs(discrete, num_trajectories=2)
  dict_obs = fx.make_rlds(fx.episodes_with_lengths([5, 6],
                                                   dict_observation=True))
  with pytest.raises(ValueError, match='observations are dicts'):
    gail.expert_pairs(dict_obs, num_trajectories=2)
  with pytest.raises(ValueError, match='too short for subsample 50'):
    gail.expert_pairs(coded_rlds([2, 2]), num_trajectories=2, subsample=50)


# ------------------------------------------------------------ reward scaling

def test_reward_normalizer_divides_by_the_running_return_std():
  rng = np.random.default_rng(4)
  gamma = 0.9
  rollouts = [rng.normal(1.0, 2.0, size=(7, 3)) for _ in range(3)]
  endings = [rng.random((7, 3)) < 0.2 for _ in range(3)]
  endings[0][2, 1] = True
  norm = gail.RewardNormalizer(3)
  got = [norm(r, e, gamma) for r, e in zip(rollouts, endings)]

  # Directly: the returns written out, fed to a RunningMeanStd step by step.
  stats = normalization.RunningMeanStd(())
  running = np.zeros(3)
  for rewards, ended, scaled in zip(rollouts, endings, got):
    for t in range(len(rewards)):
      running = np.array([running[i] * gamma + rewards[t, i]
                          for i in range(3)])
      stats.update(running)
      np.testing.assert_allclose(
          scaled[t], rewards[t] / np.sqrt(stats.var + 1e-8), rtol=1e-6)
      running = np.where(ended[t], 0.0, running)
  assert got[0].dtype == np.float32
  np.testing.assert_allclose(norm.running_return, running)
  assert norm.returns.count == pytest.approx(stats.count)


def test_reward_normalizer_restarts_the_return_after_an_ending():
  norm = gail.RewardNormalizer(2)
  rewards = np.array([[1.0, 1.0], [2.0, 2.0], [4.0, 4.0]])
  ended = np.array([[False, False], [True, False], [False, False]])
  norm(rewards[:2], ended[:2], 0.5)
  # Copy 0 ended at step 1: its return restarts; copy 1's goes on, and the
  # return is kept across calls.
  np.testing.assert_allclose(norm.running_return, [0.0, 2.5])
  norm(rewards[2:], ended[2:], 0.5)
  np.testing.assert_allclose(norm.running_return, [4.0, 5.25])
  with pytest.raises(ValueError, match='num_envs = 2'):
    norm(np.zeros((3, 3)), np.zeros((3, 3), bool), 0.5)
  with pytest.raises(ValueError, match='ended has shape'):
    norm(np.zeros((3, 2)), np.zeros((2, 2), bool), 0.5)
  with pytest.raises(ValueError, match='gamma'):
    norm(np.zeros((3, 2)), np.zeros((3, 2), bool), 1.5)
  with pytest.raises(ValueError, match='num_envs'):
    gail.RewardNormalizer(0)


# ------------------------------------------------------------------- warm-up

def test_warmup_epochs():
  assert [gail.warmup_epochs(i) for i in range(12)] == [100] * 10 + [5, 5]
  assert gail.warmup_epochs(2, warmup_updates=3, warmup_epochs=7,
                            epochs=2) == 7
  assert gail.warmup_epochs(3, warmup_updates=3, warmup_epochs=7,
                            epochs=2) == 2
  assert gail.warmup_epochs(0, warmup_updates=0) == 5
  for kwargs, name in ((dict(update_index=-1), 'update_index'),
                       (dict(update_index=1.0), 'update_index'),
                       (dict(update_index=0, warmup_updates=-1),
                        'warmup_updates'),
                       (dict(update_index=0, warmup_epochs=0),
                        'warmup_epochs'),
                       (dict(update_index=0, epochs=0), 'epochs')):
    with pytest.raises(ValueError, match=name):
      gail.warmup_epochs(**kwargs)
