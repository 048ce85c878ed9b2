"""Prioritized replay (rlds_reverb.replay.per) on a real Reverb server.

Statistical checks use fixed seeds where we draw, and bounds whose false-alarm
probability is about 1e-6 where Reverb draws (its sampler takes no seed).
"""

import numpy as np
import pytest
import reverb
import tensorflow as tf
import tree
from tf_agents.trajectories import trajectory

from rlds_reverb.replay import per
from rlds_reverb.storage import tables
from rlds_reverb.acting import collect
from rlds_reverb.acting import envs
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import run
from conftest import _dqn  # pylint: disable=g-bad-import-order
from conftest import _fixed_batch  # pylint: disable=g-bad-import-order

TABLE = 'per'
# Chi-square quantile 1 - 1e-6 with 7 degrees of freedom (Wilson-Hilferty).
CHI2_7DOF_1E6 = 41.9


@pytest.fixture(scope='module')
def data_spec(cartpole):
  return run.trajectory_spec(cartpole)


def _server(data_spec, max_size=1000, alpha=0.6):
  return tables.start_server([per.make_table(TABLE, data_spec,
                                             max_size=max_size, alpha=alpha)])


def _write(client, priorities, first_index=0):
  """One 2-step item per priority; item i has observations all equal to i."""
  with client.trajectory_writer(num_keep_alive_refs=2) as writer:
    for offset, priority in enumerate(priorities):
      index = float(first_index + offset)
      for step_type in (1, 1):
        writer.append(trajectory.Trajectory(
            step_type=np.int32(step_type),
            observation=np.full(4, index, np.float32),
            action=np.int64(0), policy_info=(), next_step_type=np.int32(1),
            reward=np.float32(index), discount=np.float32(1.0)))
      writer.create_item(TABLE, float(priority),
                         tree.map_structure(lambda c: c[-2:], writer.history))
    writer.flush()


def _draw(server, data_spec, batches, batch_size=1000):
  """(item indices, SampleInfo fields as numpy) of `batches` batches."""
  dataset = per.dataset(f'localhost:{server.port}', TABLE, data_spec,
                        batch_size)
  indices, infos = [], []
  for experience, info in dataset.take(batches):
    indices.append(experience.observation[:, 0, 0].numpy().astype(int))
    infos.append(tree.map_structure(lambda x: x.numpy(), info))
  merged = tree.map_structure(lambda *xs: np.concatenate(xs), *infos)
  return np.concatenate(indices), merged


def _priorities_by_index(server, data_spec, count):
  """Current priority of each item, read from samples covering them all."""
  indices, info = _draw(server, data_spec, 4, 500)
  found = {int(i): float(p) for i, p in zip(indices, info.priority)}
  assert len(found) == count, f'not every item was drawn: {sorted(found)}'
  return np.array([found[i] for i in range(count)])


def test_sampled_frequencies_and_probabilities_follow_p_to_the_alpha(
    data_spec):
  priorities = np.array([0.1, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0])
  server = _server(data_spec, alpha=0.6)
  try:
    _write(server.localhost_client(), priorities)
    indices, info = _draw(server, data_spec, batches=30)
  finally:
    server.stop()
  expected = per.expected_probabilities(priorities, 0.6)
  # Each sample reports exactly P(i) and N.
  np.testing.assert_allclose(info.probability, expected[indices], rtol=1e-9)
  assert set(info.table_size) == {len(priorities)}
  np.testing.assert_allclose(info.priority, priorities[indices])
  # The draws follow P(i): chi-square against the expected counts.
  counts = np.bincount(indices, minlength=len(priorities))
  expected_counts = expected * len(indices)
  chi2 = float(np.sum((counts - expected_counts) ** 2 / expected_counts))
  assert chi2 < CHI2_7DOF_1E6, (counts, expected_counts.round(), chi2)


def test_alpha_zero_is_uniform(data_spec):
  server = _server(data_spec, alpha=0.0)
  try:
    _write(server.localhost_client(), [0.1, 10.0, 1000.0])
    _, info = _draw(server, data_spec, batches=1, batch_size=50)
  finally:
    server.stop()
  np.testing.assert_allclose(info.probability, 1 / 3)


def test_importance_weights_match_the_formula_exactly():
  priorities = np.array([0.5, 1.0, 2.0, 4.0])
  probability = per.expected_probabilities(priorities, 0.6)
  sampled = np.array([0, 3, 3, 1, 2])
  for beta in (0.0, 0.4, 0.7, 1.0):
    got = per.importance_weights(tf.constant(probability[sampled]),
                                 tf.constant([4] * 5, tf.int64), beta).numpy()
    raw = (4 * probability[sampled]) ** -beta
    np.testing.assert_allclose(got, raw / raw.max(), rtol=1e-6)
    assert got.dtype == np.float32 and got.max() == pytest.approx(1.0)
  # The rarest item gets the largest weight.
  weights = per.importance_weights(tf.constant(probability[sampled]),
                                   tf.constant([4] * 5, tf.int64), 1.0)
  assert int(np.argmax(weights)) == 0


def test_priorities_add_eps_and_are_capped():
  got = per.priorities_from_td_errors(
      tf.constant([0.0, -0.5, 2.0, -1e6]), eps=0.01, priority_cap=50.0)
  np.testing.assert_allclose(got.numpy(), [0.01, 0.51, 2.01, 50.0])
  assert got.dtype == tf.float64


def test_beta_schedule_endpoints():
  assert float(per.beta(0, 0.4, 1000)) == pytest.approx(0.4)
  assert float(per.beta(500, 0.4, 1000)) == pytest.approx(0.7)
  assert float(per.beta(1000, 0.4, 1000)) == pytest.approx(1.0)
  assert float(per.beta(10_000, 0.4, 1000)) == pytest.approx(1.0)


@pytest.mark.parametrize('field, value, message', [
    ('alpha', -0.1, 'alpha must be >= 0'),
    ('beta0', 1.5, r'beta0 must be in \[0, 1\]'),
    ('beta_steps', 0, 'beta_steps must be >= 1'),
    ('eps', 0.0, 'eps must be > 0'),
    ('priority_cap', 1e-9, 'priority_cap must be >= eps')])
def test_bad_per_config_is_refused(field, value, message):
  with pytest.raises(ValueError, match=message):
    per.PerConfig(**{field: value})


def test_new_items_come_in_at_the_running_maximum(data_spec):
  max_priority = per.MaxPriority()
  assert max_priority() == per.INITIAL_MAX_PRIORITY
  max_priority.observe(tf.constant([0.2, 0.5]))  # Lower: no change.
  assert max_priority() == 1.0
  max_priority.observe(tf.constant([3.0, 2.0]))
  assert max_priority() == 3.0
  server = _server(data_spec)
  try:
    collector = collect.Collector('CartPole-v1', server.localhost_client(),
                                  TABLE, seed=0, priority=max_priority)
    collector.collect(60, collect.random_act(np.asarray(0), np.asarray(1)))
    collector.close()
    _, info = _draw(server, data_spec, batches=1, batch_size=100)
  finally:
    server.stop()
  np.testing.assert_array_equal(info.priority, 3.0)


def test_updates_land_on_the_right_keys(data_spec):
  server = _server(data_spec)
  try:
    _write(server.localhost_client(), [1.0] * 6)
    indices, info = _draw(server, data_spec, batches=1, batch_size=300)
    key_of = {int(i): k for i, k in zip(indices, info.key)}
    updater = per.PriorityUpdater(f'localhost:{server.port}', TABLE)
    tf.function(updater.update)(tf.constant([key_of[0], key_of[4]],
                                            tf.uint64),
                                tf.constant([5.0, 0.25], tf.float64))
    np.testing.assert_allclose(_priorities_by_index(server, data_spec, 6),
                               [5.0, 1.0, 1.0, 1.0, 0.25, 1.0])
  finally:
    server.stop()


def test_evicted_keys_do_not_break_an_update(data_spec):
  server = _server(data_spec, max_size=4)
  try:
    client = server.localhost_client()
    _write(client, [1.0] * 4)
    indices, info = _draw(server, data_spec, batches=1, batch_size=200)
    old_keys = np.unique(info.key)
    _write(client, [1.0] * 3, first_index=4)  # Evicts items 0, 1, 2.
    key_of = {int(i): k for i, k in zip(indices, info.key)}
    updater = per.PriorityUpdater(f'localhost:{server.port}', TABLE)
    updater.update(tf.constant(old_keys, tf.uint64),
                   tf.constant([7.0] * len(old_keys), tf.float64))
    assert tables.get_table_info(client, TABLE).current_size == 4
    now_indices, now_info = _draw(server, data_spec, batches=1,
                                  batch_size=400)
    priority = dict(zip(now_indices.tolist(), now_info.priority.tolist()))
    assert sorted(priority) == [3, 4, 5, 6]
    assert priority[3] == 7.0 and key_of[3] in old_keys  # The live one.
    assert priority[4] == priority[5] == priority[6] == 1.0
  finally:
    server.stop()


def test_a_uniform_table_is_refused_for_prioritized_replay(data_spec):
  server = tables.start_server([tables.make_table(TABLE, data_spec,
                                                  max_size=10)])
  try:
    with pytest.raises(ValueError, match=f"table '{TABLE}' samples uniform"):
      per.check_prioritized(server.localhost_client(), TABLE)
  finally:
    server.stop()
  server = _server(data_spec, alpha=0.7)
  try:
    assert per.check_prioritized(server.localhost_client(), TABLE) == 0.7
  finally:
    server.stop()


def _filled_cartpole_server(data_spec, steps=600):
  server = _server(data_spec, max_size=10_000)
  collector = collect.Collector('CartPole-v1', server.localhost_client(),
                                TABLE, seed=1)
  collector.collect(steps, collect.random_act(np.asarray(0), np.asarray(1)))
  collector.close()
  return server


def test_train_step_sets_priorities_from_dqn_td_errors(cartpole, data_spec):
  server = _filled_cartpole_server(data_spec)
  try:
    agent = _dqn(cartpole)
    experience, info = next(iter(per.dataset(
        f'localhost:{server.port}', TABLE, data_spec, 64)))
    # TD errors of the networks before the step: what the step reports.
    td_before = agent._loss(  # pylint: disable=protected-access
        experience, gamma=agent._gamma).extra.td_error.numpy()  # pylint: disable=protected-access
    config = per.PerConfig(eps=1e-3, priority_cap=1.5, beta_steps=100_000)
    max_priority = per.MaxPriority()
    step = per.PrioritizedTrainStep.for_reverb(
        agent, per.PriorityUpdater(f'localhost:{server.port}', TABLE),
        config, max_priority)
    tf.function(step, autograph=False)((experience, info))
    expected = np.minimum(np.abs(td_before) + 1e-3, 1.5)
    sampled = {}
    for key, priority in zip(info.key.numpy(), expected):
      sampled[int(key)] = priority
    _, after = _draw(server, data_spec, batches=10, batch_size=500)
    seen = {int(k): p for k, p in zip(after.key, after.priority)
            if int(k) in sampled}
    assert len(seen) > 10
    for key, priority in seen.items():
      assert priority == pytest.approx(sampled[key], rel=1e-5)
    assert max_priority() == pytest.approx(max(1.0, expected.max()))
  finally:
    server.stop()


def test_importance_weights_reach_the_dqn_loss(cartpole, data_spec):
  server = _filled_cartpole_server(data_spec)
  try:
    experience, _ = next(iter(per.dataset(
        f'localhost:{server.port}', TABLE, data_spec, 32)))
  finally:
    server.stop()
  agent = _dqn(cartpole)
  assert float(agent.train(experience, weights=tf.zeros(32)).loss) == 0.0
  assert float(agent.train(experience, weights=tf.ones(32)).loss) > 0.0


def test_an_agent_without_td_errors_is_named():
  specs = envs.env_specs('HalfCheetah-v5')
  agent = registry.make_agent('bc', specs.time_step_spec, specs.action_spec,
                            factory.AgentConfig(actor_layers=(8,)))
  info = agent.train(_fixed_batch(8))
  with pytest.raises(ValueError, match='has no td_error'):
    per.td_errors(info)


def test_short_prioritized_dqn_run_lowers_the_td_error_on_a_fixed_batch(
    cartpole, data_spec, tmp_path):
  server = _filled_cartpole_server(data_spec, steps=1000)
  try:
    address = f'localhost:{server.port}'
    # A fixed target network: the TD error is a regression error then.
    agent = _dqn(cartpole, target_update_period=10_000)
    fixed, _ = next(iter(per.dataset(address, TABLE, data_spec, 256)))
    td = lambda: float(np.mean(np.abs(agent._loss(  # pylint: disable=protected-access
        fixed, gamma=agent._gamma).extra.td_error.numpy())))  # pylint: disable=protected-access
    before = td()
    max_priority = per.MaxPriority()
    learner = loop.Learner(
        agent, str(tmp_path),
        train_step_fn=per.PrioritizedTrainStep.for_reverb(
            agent, per.PriorityUpdater(address, TABLE),
            per.PerConfig(beta_steps=300), max_priority))
    learner.train(iter(per.dataset(address, TABLE, data_spec, 64)), 300)
    after = td()
  finally:
    server.stop()
  assert learner.train_step == 300
  assert after < 0.5 * before, (before, after)
  assert max_priority() > 0
