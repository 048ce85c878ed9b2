"""ReBRAC and Cal-QL (rlds_reverb.agents.offline.rebrac / cal_ql) and the
returns-to-go feed Cal-QL's bound reads (replay.feeds.ReturnToGoFeed)."""

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from rlds_reverb.agents.offline import cal_ql
from rlds_reverb.agents.offline import rebrac
from rlds_reverb.replay import feeds
from rlds_reverb.replay import memory as memory_lib

OBS, ACT, BATCH = 5, 3, 64
_OBSERVATION_SPEC = tf.TensorSpec([OBS], tf.float32)
_ACTION_SPEC = tensor_spec.BoundedTensorSpec([ACT], tf.float32, -1.0, 1.0)
_SMALL = dict(actor_layers=(32, 32), critic_layers=(32, 32), gamma=0.99,
              target_update_tau=0.005)


def _rebrac(seed=0, **config):
  return rebrac.RebracAgent(
      ts.time_step_spec(_OBSERVATION_SPEC), _ACTION_SPEC,
      actor_learning_rate=1e-3, critic_learning_rate=1e-3,
      config=rebrac.RebracConfig(**config), seed=seed,
      train_step_counter=tf.Variable(0, dtype=tf.int64), **_SMALL)


def _cal_ql(seed=0, **config):
  return cal_ql.CalQlAgent(
      ts.time_step_spec(_OBSERVATION_SPEC), _ACTION_SPEC,
      actor_learning_rate=3e-4, critic_learning_rate=3e-4,
      alpha_learning_rate=3e-4, config=cal_ql.CalQlConfig(**config),
      seed=seed, train_step_counter=tf.Variable(0, dtype=tf.int64), **_SMALL)


def _batch(seed=0, size=BATCH):
  rng = np.random.default_rng(seed)
  return trajectory.Trajectory(
      step_type=tf.zeros([size, 2], tf.int32),
      observation=tf.constant(rng.normal(size=(size, 2, OBS)), tf.float32),
      action=tf.constant(rng.uniform(-1, 1, (size, 2, ACT)), tf.float32),
      policy_info=(), next_step_type=tf.ones([size, 2], tf.int32),
      reward=tf.constant(rng.normal(size=(size, 2)), tf.float32),
      discount=tf.ones([size, 2], tf.float32))


def _variables(agent):
  return [v.numpy() for v in sorted(agent.variables,
                                    key=lambda v: v.name)] + [
      v.numpy() for v in agent._actor_optimizer.variables()]  # pylint: disable=protected-access


# ------------------------------------------------------------------ ReBRAC

def test_rebrac_actor_bc_term_is_zero_when_the_action_matches():
  agent = _rebrac()
  observation = _batch().observation[:, 0]
  action, _ = agent._actor_network(observation)  # pylint: disable=protected-access
  _, bc = agent.actor_loss(observation, action)
  assert float(bc) == pytest.approx(0.0, abs=1e-12)
  # The fresh actor's actions are near 0 (small last layer): a data action
  # of all ones is |a|^2 = ACT away.
  _, bc = agent.actor_loss(observation, tf.ones_like(action))
  assert float(bc) == pytest.approx(ACT, rel=0.05)


def test_rebrac_critic_bc_term_is_zero_when_the_next_action_matches():
  """With no smoothing noise, a dataset next action equal to the target
  actor's gives the target without the penalty (critic_bc_coef 0)."""
  agent = _rebrac(policy_noise=0.0)
  batch = agent.transition(_batch())

  def target(coefficient, next_data_action):
    agent.config.critic_bc_coef = coefficient
    return agent.critic_target(batch, next_data_action).numpy()

  next_action, _ = agent._target_actor_network(batch.next_observation)  # pylint: disable=protected-access
  np.testing.assert_array_equal(target(10.0, next_action),
                                target(0.0, next_action))
  # Another next action lowers the target by gamma * beta_2 * |a'_pi - a'|^2.
  other = tf.ones_like(next_action)
  expected = 0.99 * 10.0 * np.sum((next_action.numpy() - 1.0)**2, axis=-1)
  np.testing.assert_allclose(target(0.0, other) - target(10.0, other),
                             expected, rtol=1e-3)


def test_rebrac_critic_loss_falls_on_a_fixed_batch():
  agent = _rebrac()
  experience = _batch()
  train = tf.function(agent.train, autograph=False)
  losses = [float(train(experience).extra.critic_loss) for _ in range(200)]
  assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
  assert int(agent.train_step_counter) == 200
  info = train(experience)
  assert info.extra.td_error.shape == (BATCH,)
  assert np.all(np.isfinite(info.extra.td_error.numpy()))


def test_rebrac_checkpoint_restores_identical_weights(tmp_path):
  agent = _rebrac(seed=0)
  for _ in range(3):
    agent.train(_batch())
  path = tf.train.Checkpoint(agent=agent).save(str(tmp_path / 'ckpt'))
  fresh = _rebrac(seed=7)
  assert not all(np.array_equal(a, b) for a, b in
                 zip(_variables(agent), _variables(fresh)))
  tf.train.Checkpoint(agent=fresh).restore(path).assert_consumed()
  for a, b in zip(_variables(agent), _variables(fresh)):
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------ Cal-QL

def test_calibrated_q_is_the_larger_of_q_and_the_return():
  q = tf.constant([[1.0, -2.0], [5.0, 0.5]])
  np.testing.assert_array_equal(
      cal_ql.calibrated_q(q, tf.constant([0.0, 3.0])).numpy(),
      [[1.0, 0.0], [5.0, 3.0]])


def test_cal_ql_bound_lifts_the_policy_q_values():
  """A return-to-go far above every Q lifts all policy Q-values to it, so
  the CQL gap is about G - log pi + log(2n); far below, the gap is CQL's."""
  agent = _cal_ql()
  batch = agent.transition(_batch())
  q_data, _ = agent._critic_network((batch.observation, batch.action))  # pylint: disable=protected-access

  def gap(returns, calibrated=True):
    agent.config.calibrated = calibrated
    agent._rng.reset_from_seed(3)  # pylint: disable=protected-access
    return agent.cql_term(batch.observation, batch.next_observation, q_data,
                          tf.fill([BATCH], returns))

  high, lifted = gap(1e4)
  assert float(lifted) == 1.0
  # logsumexp of 2n values near 1e4 (the log pi are O(1)): 1e4 + O(10).
  assert np.all(np.abs(high.numpy() + q_data.numpy() - 1e4) < 50)
  low, lifted = gap(-1e4)
  assert float(lifted) == 0.0
  uncalibrated, _ = gap(1e4, calibrated=False)
  np.testing.assert_allclose(low.numpy(), uncalibrated.numpy(), rtol=1e-5)


def test_cal_ql_losses_fall_on_a_fixed_batch():
  agent = _cal_ql()
  experience = _batch()
  returns = tf.constant(np.random.default_rng(1).normal(size=BATCH),
                        tf.float32)
  train = tf.function(lambda e, g: agent.train(e, mc_return=g),
                      autograph=False)
  infos = [train(experience, returns) for _ in range(150)]
  critic = [float(i.extra.td_loss + i.extra.cql_loss) for i in infos]
  assert np.mean(critic[-10:]) < np.mean(critic[:10])
  assert int(agent.train_step_counter) == 150
  assert infos[-1].extra.td_error.shape == (BATCH,)


def test_cal_ql_checkpoint_restores_identical_weights(tmp_path):
  agent = _cal_ql(seed=0)
  for _ in range(2):
    agent.train(_batch(), mc_return=tf.zeros([BATCH]))
  path = tf.train.Checkpoint(agent=agent).save(str(tmp_path / 'ckpt'))
  fresh = _cal_ql(seed=5)
  tf.train.Checkpoint(agent=fresh).restore(path).assert_consumed()
  for a, b in zip(_variables(agent), _variables(fresh)):
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------- returns-to-go feed

def _spec():
  return trajectory.Trajectory(
      step_type=tf.TensorSpec([], tf.int32), observation=_OBSERVATION_SPEC,
      action=tf.TensorSpec([ACT], tf.float32), policy_info=(),
      next_step_type=tf.TensorSpec([], tf.int32),
      reward=tf.TensorSpec([], tf.float32),
      discount=tf.TensorSpec([], tf.float32))


def _episode(rewards, terminal=False):
  """RLDS-converted episode: len(rewards) transitions + the final step."""
  length = len(rewards) + 1
  step_type = np.ones(length, np.int32)
  step_type[0], step_type[-1] = 0, 2
  discount = np.ones(length, np.float32)
  if terminal:
    discount[-2] = 0.0
  return trajectory.Trajectory(
      step_type=step_type,
      observation=np.arange(length * OBS, dtype=np.float32).reshape(
          length, OBS),
      action=np.zeros((length, ACT), np.float32), policy_info=(),
      next_step_type=np.concatenate([step_type[1:], [0]]).astype(np.int32),
      reward=np.asarray(list(rewards) + [0.0], np.float32), discount=discount)


def test_return_to_go_feed_matches_hand_computed_returns():
  memory = memory_lib.TransitionMemory(_spec(), 20)
  memory.add([_episode([1.0, 2.0, 3.0]), _episode([4.0, 5.0],
                                                  terminal=True)])
  feed = feeds.ReturnToGoFeed(memory, 256, gamma=0.5, reward_scale=2.0)
  # Episode 1 (rows 0-2): G2 = 2*3 = 6, G1 = 4 + 0.5*6 = 7, G0 = 2 + 3.5.
  # Episode 2 (rows 4-5): G5 = 10, G4 = 8 + 0.5*1*10 = 13 (its discount
  # before the terminal step is 0, which only stops what follows G5).
  expected = {0: 5.5, 1: 7.0, 2: 6.0, 4: 13.0, 5: 10.0}
  returns = feed.returns.numpy()
  for row, value in expected.items():
    assert returns[row] == pytest.approx(value)
  _, sampled = feed()
  assert sampled.shape == (256,)
  assert set(np.round(sampled.numpy(), 4)) == {5.5, 7.0, 6.0, 13.0, 10.0}
  # An episode added later gets its returns (the memory wraps over row 0).
  added = memory.add([_episode([1.0, 1.0])])
  feed.on_added(added)
  new = feed.returns.numpy()[added.new_rows]
  np.testing.assert_allclose(new, [2.0 + 0.5 * 2.0, 2.0])


def test_return_to_go_feed_pairs_each_transition_with_its_own_return():
  memory = memory_lib.TransitionMemory(_spec(), 20)
  memory.add([_episode([1.0, 2.0, 3.0])])
  feed = feeds.ReturnToGoFeed(memory, 64, gamma=1.0)
  batch, sampled = feed()
  first_step = batch.observation[:, 0, 0].numpy().astype(int) // OBS
  by_step = {0: 6.0, 1: 5.0, 2: 3.0}
  np.testing.assert_allclose(sampled.numpy(),
                             [by_step[i] for i in first_step])
