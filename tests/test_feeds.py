"""In-graph feeds (rlds_reverb.replay.feeds): prioritized replay on the
memory's sum tree, its write-back to Reverb, mixed batches. (A whole
prioritized offline run that writes the priorities back is in
test_offline.py.)

Statistical bounds: chi-square below dof + 6 sd (a correct sampler exceeds
it with probability below 1e-6 for these dofs).
"""

import numpy as np
import pytest
import tensorflow as tf
import tree

from rlds_reverb.replay import per
from rlds_reverb.storage import tables
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.experiments import run
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from rlds_reverb.replay import memory as memory_lib
from conftest import chi_square  # pylint: disable=g-bad-import-order
from conftest import chi_square_bound  # pylint: disable=g-bad-import-order


def _episode(spec, length, seed=0, terminal=False):
  """A converted CartPole-shaped episode of `length` steps, values by step."""
  rng = np.random.default_rng(seed)
  step_type = np.ones(length, np.int32)
  step_type[0], step_type[-1] = 0, 2
  next_step_type = np.concatenate([step_type[1:], [0]]).astype(np.int32)
  discount = np.ones(length, np.float32)
  if terminal and length > 1:
    discount[-2] = 0.0
  return spec.__class__(
      step_type=step_type,
      observation=rng.standard_normal((length,) + tuple(
          spec.observation.shape), dtype=np.float32),
      action=rng.integers(0, 2, length).astype(np.int64), policy_info=(),
      next_step_type=next_step_type,
      reward=rng.standard_normal(length, dtype=np.float32),
      discount=discount)


def _memory(spec, lengths, capacity=None):
  memory = memory_lib.TransitionMemory(spec, capacity or sum(lengths))
  memory.add([_episode(spec, n, seed=i) for i, n in enumerate(lengths)],
             keys=list(range(100, 100 + len(lengths))))
  return memory


def test_draws_follow_p_to_the_alpha(cartpole):
  spec = run.trajectory_spec(cartpole)
  memory = _memory(spec, [9])  # Transitions at rows 0..7.
  config = per.PerConfig(alpha=0.6)
  feed = feeds.PrioritizedFeed(memory, 512, config)
  priorities = np.array([0.1, 0.5, 1.0, 2.0, 3.0, 0.2, 4.0, 0.05],
                        np.float32)
  feed.set_priorities(np.arange(8), priorities)

  # One traced draw called 200 times (a graph of 200 unrolled draws took
  # over a minute to trace).
  draw = tf.function(lambda: feed()[1].rows)
  rows = np.concatenate([draw().numpy() for _ in range(200)])
  counts = np.bincount(rows, minlength=memory.capacity)
  assert counts[8] == 0  # The last step starts no transition.
  expected = per.expected_probabilities(priorities, 0.6) * len(rows)
  assert chi_square(counts[:8], expected) < chi_square_bound(7)
  # The probabilities handed to the train step are exactly p^a / sum.
  _, info = feed()
  np.testing.assert_allclose(
      info.probability.numpy(),
      per.expected_probabilities(priorities, 0.6)[info.rows.numpy()],
      rtol=1e-5)
  assert int(info.num_transitions) == 8


def test_new_transitions_at_the_running_max_evicted_at_zero(cartpole):
  spec = run.trajectory_spec(cartpole)
  memory = memory_lib.TransitionMemory(spec, 10)
  feed = feeds.PrioritizedFeed(memory, 4, per.PerConfig(alpha=0.5))
  added = memory.add([_episode(spec, 4, 0), _episode(spec, 4, 1)])
  feed.on_added(added)
  np.testing.assert_allclose(feed.tree.values().numpy()[:8],
                             [1, 1, 1, 0, 1, 1, 1, 0])
  feed.update(tf.constant([1], tf.int32), tf.constant([9.0], tf.float64))
  assert feed.max_priority() == 9.0
  added = memory.add([_episode(spec, 4, 2)])  # Wraps to row 0.
  feed.on_added(added)
  leaves = feed.tree.values().numpy()
  np.testing.assert_allclose(leaves[:3], [3.0] * 3)  # 9 ** 0.5
  assert leaves[3] == 0
  np.testing.assert_allclose(leaves[4:7], [1.0] * 3)


def test_train_step_weights_and_updates_only_the_sampled_rows(cartpole):
  spec = run.trajectory_spec(cartpole)
  memory = _memory(spec, [30, 30])
  config = per.PerConfig(alpha=0.6, beta0=0.4, beta_steps=100)
  feed = feeds.PrioritizedFeed(memory, 8, config)
  feed.set_priorities(memory.transition_rows(), np.linspace(
      0.5, 3.0, int(memory.num_transitions)).astype(np.float32))
  agent = registry.make_agent('dqn', cartpole.time_step_spec,
                            cartpole.action_spec,
                            factory.AgentConfig(q_layers=(16,)))
  step = feed.train_step(agent)
  before = feed.tree.values().numpy()
  tf.random.set_seed(3)
  batch, info = feed()
  # The weights the step applies: (N P)^-beta / max, beta at step 0.
  n_p = 58 * info.probability.numpy().astype(np.float64)
  expected = (n_p ** -0.4) / (n_p ** -0.4).max()
  np.testing.assert_allclose(
      per.importance_weights(info.probability, info.num_transitions,
                             per.beta(0, 0.4, 100)).numpy(),
      expected, rtol=1e-5)
  loss = step((batch, info))
  assert np.isfinite(float(loss))
  after = feed.tree.values().numpy()
  changed = np.flatnonzero(~np.isclose(before, after))
  assert set(changed) <= set(info.rows.numpy().tolist())
  assert len(changed) > 0
  raw = feed.raw_priorities()[info.rows.numpy()]
  assert np.all(raw <= config.priority_cap) and np.all(raw > 0)
  assert feed.max_priority() >= raw.max() - 1e-5


def test_priorities_survive_a_reverb_checkpoint_and_restore(cartpole,
                                                            tmp_path):
  spec = run.trajectory_spec(cartpole)
  episodes = [_episode(spec, n, seed=i) for i, n in enumerate([5, 8, 1, 6])]
  checkpoints = str(tmp_path / 'reverb')

  def start():
    return tables.start_server(
        [episode_table.make_table('data', spec, max_episodes=100),
         feeds.make_priority_table('data')], checkpoint_dir=checkpoints)

  server = start()
  try:
    client = server.localhost_client()
    for episode in episodes:  # One writer per length: shapes are fixed.
      with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        writer.append(episode)
        writer.create_item('data', episode_table.UNREAD, tree.map_structure(
            lambda c: c[-1], writer.history))
    read = episode_table.EpisodeReader(client, 'data').read_all()
    memory = memory_lib.from_episodes(spec, [e.data for e in read],
                                      [e.key for e in read])
    feed = feeds.PrioritizedFeed(memory, 4, per.PerConfig())
    rng = np.random.default_rng(0)
    rows = memory.transition_rows()
    feed.set_priorities(rows, rng.uniform(0.1, 5, len(rows)))
    by_key = {k: feed.raw_priorities()[s:s + n - 1]
              for k, s, n in memory.episode_rows()}
    assert feeds.write_priorities(client, 'data', feed) == 4
    tables.checkpoint(client)
  finally:
    server.stop()
  server = start()  # Restored from the checkpoint.
  try:
    client = server.localhost_client()
    read = episode_table.EpisodeReader(client, 'data').read_all()
    memory = memory_lib.from_episodes(spec, [e.data for e in read[::-1]],
                                      [e.key for e in read[::-1]])
    feed = feeds.PrioritizedFeed(memory, 4, per.PerConfig())
    assert feeds.restore_priorities(client, 'data', feed) == 4
    for key, start_row, length in memory.episode_rows():
      np.testing.assert_allclose(
          feed.raw_priorities()[start_row:start_row + length - 1],
          by_key[key], rtol=1e-4)
    assert feed.max_priority() == pytest.approx(
        max(p.max() for p in by_key.values() if len(p)), rel=1e-4)
  finally:
    server.stop()


def test_mixed_feed_takes_each_part_from_its_memory(cartpole):
  spec = run.trajectory_spec(cartpole)
  first, second = _memory(spec, [5]), _memory(spec, [7])
  second.add([_episode(spec, 7, seed=9)])
  mixed = feeds.MixedFeed(feeds.UniformFeed(first, 3),
                          feeds.UniformFeed(second, 2))
  batch = mixed()
  assert batch.observation.shape[:2] == (5, 2)
  first_obs = first.read(tf.range(5)).observation.numpy()
  second_obs = second.read(tf.range(second.capacity)).observation.numpy()
  for row in batch.observation.numpy()[:3, 0]:
    assert any(np.array_equal(row, o) for o in first_obs)
  for row in batch.observation.numpy()[3:, 0]:
    assert any(np.array_equal(row, o) for o in second_obs)


def test_bad_feed_arguments(cartpole):
  memory = _memory(run.trajectory_spec(cartpole), [3])
  with pytest.raises(ValueError, match='batch_size'):
    feeds.UniformFeed(memory, 0)
  with pytest.raises(ValueError, match='n_step'):
    feeds.UniformFeed(memory, 4, n_step=0)
  with pytest.raises(ValueError, match='gamma'):
    feeds.UniformFeed(memory, 4, gamma=1.5)
