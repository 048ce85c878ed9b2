"""rlds_reverb.replay.tf_agents_buffer and episode_observer: the TF-Agents
replay buffer over an episode table, against TF-Agents' own
`ReverbReplayBuffer` on the same data, and `tf_agents.train.Learner`
training from it.

Statistical bounds: chi-square statistics below dof + 6 * sqrt(2 * dof)
(conftest.chi_square_bound), which a correct sampler exceeds with
probability well below 1e-4 at the dofs used here.
"""

import collections

import numpy as np
import pytest
import reverb
import tensorflow as tf
import tree
from tf_agents.agents.dqn import dqn_agent
from tf_agents.networks import q_network
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.replay_buffers import reverb_utils
from tf_agents.specs import tensor_spec
from tf_agents.train import learner as tf_learner
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory as trajectory_lib

import rlds_reverb
from rlds_reverb.replay import episode_observer
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import per
from rlds_reverb.replay import tf_agents_buffer
from rlds_reverb.storage import push
from conftest import _rlds  # pylint: disable=g-bad-import-order
from conftest import chi_square  # pylint: disable=g-bad-import-order
from conftest import chi_square_bound  # pylint: disable=g-bad-import-order

LENGTHS = [5, 7, 3, 1, 12]  # RLDS steps per episode (1: no transition)


@pytest.fixture(scope='module')
def data():
  return _rlds(LENGTHS, dtype=np.float32, obs_size=4, act_size=2)


@pytest.fixture(scope='module')
def server(data):
  """An episode table holding `data` (the push) and, for TF-Agents'
  buffer, queues of its 2- and 3-step windows (TF-Agents' observer)."""
  spec = rlds_reverb.create_trajectory_data_spec(data)
  signature = tensor_spec.add_outer_dim(spec)
  srv = reverb.Server([
      episode_table.make_table('episodes', spec, max_episodes=100),
      episode_table.make_table('observed', spec, max_episodes=100),
      reverb.Table.queue('windows2', 1000, signature=signature),
      reverb.Table.queue('windows3', 1000, signature=signature),
      reverb.Table(name='uniform2', sampler=reverb.selectors.Uniform(),
                   remover=reverb.selectors.Fifo(), max_size=1000,
                   rate_limiter=reverb.rate_limiters.MinSize(1),
                   signature=signature)])
  client = reverb.Client(f'localhost:{srv.port}')
  push.push_rlds_to_table(data, client, 'episodes', sequence_length=None,
                          priority=episode_table.UNREAD)
  for table, n in (('windows2', 2), ('windows3', 3), ('uniform2', 2)):
    observer = reverb_utils.ReverbAddTrajectoryObserver(
        client, table, sequence_length=n, stride_length=1)
    rlds_reverb.push_rlds_to_reverb(data, observer)
    observer.close()
  yield srv, client, spec
  srv.stop()


def _key(experience) -> bytes:
  return b''.join(np.asarray(x).tobytes() for x in tree.flatten(experience))


def _queue_items(client, table):
  size = client.server_info()[table].current_size
  return [s.data for s in client.sample(table, num_samples=size,
                                        emit_timesteps=False,
                                        unpack_as_table_signature=True)]


@pytest.mark.parametrize('num_steps', [2, 3])
def test_windows_equal_reverb_replay_buffer_items(server, num_steps):
  srv, client, spec = server
  buffer = tf_agents_buffer.MemoryReplayBuffer.uniform(client, 'episodes')
  theirs = reverb_replay_buffer.ReverbReplayBuffer(
      spec, f'windows{num_steps}', sequence_length=num_steps,
      local_server=srv)
  assert (buffer.as_dataset(8, num_steps=num_steps).element_spec ==
          theirs.as_dataset(8, num_steps=num_steps).element_spec)
  ours = [e for e, _ in buffer.as_dataset(
      num_steps=num_steps, single_deterministic_pass=True)]
  expected = _queue_items(client, f'windows{num_steps}')
  assert len(ours) == len(expected) == sum(
      max(n - num_steps + 1, 0) for n in LENGTHS)
  assert (collections.Counter(map(_key, ours)) ==
          collections.Counter(map(_key, expected)))


def test_uniform_draws_every_window_alike(server):
  _, client, _ = server
  buffer = tf_agents_buffer.MemoryReplayBuffer.uniform(client, 'episodes')
  windows = sum(max(n - 2, 0) for n in LENGTHS)
  tf.random.set_seed(1)
  experience, info = next(iter(buffer.as_dataset(20_000, num_steps=3)))
  assert experience.observation.shape == (20_000, 3, 4)
  assert set(np.unique(info.table_size)) == {windows}
  np.testing.assert_allclose(info.probability, 1.0 / windows)
  rows = info.key.numpy()[:, 0].astype(np.int64)
  counts = np.bincount(rows, minlength=buffer.memory.capacity)
  observed = counts[counts > 0]
  assert len(observed) == windows
  assert chi_square(observed, np.full(windows, 20_000 / windows)) < (
      chi_square_bound(windows - 1))
  # A window never crosses an episode: its steps are FIRST/MID, then any.
  step_type = experience.step_type.numpy()
  assert not np.any(step_type[:, :2] == 2)


def test_n_step_returns_in_two_step_items(server):
  _, client, _ = server
  gamma = 0.9
  plain = tf_agents_buffer.MemoryReplayBuffer.uniform(client, 'episodes')
  summed = tf_agents_buffer.MemoryReplayBuffer.uniform(
      client, 'episodes', n_step=3, gamma=gamma)
  one = list(plain.as_dataset(num_steps=2, single_deterministic_pass=True))
  three = list(summed.as_dataset(num_steps=2,
                                 single_deterministic_pass=True))
  assert len(three) == len(one)
  rewards = np.array([e.reward.numpy()[0] for e, _ in one])
  # Episodes come in the order the table gives them (which depends on
  # what earlier tests on this worker read of it); each episode's
  # transitions are consecutive rows, the last one's second step LAST.
  ends = [i for i, (e, _) in enumerate(one)
          if e.step_type.numpy()[1] == ts.StepType.LAST]
  assert len(ends) == len([n for n in LENGTHS if n > 1])
  starts = [0] + [end + 1 for end in ends[:-1]]
  for start, end in zip(starts, ends):
    length = end - start + 1
    for k in range(length):
      # Up to three rewards, never past the episode's end: the last
      # transition has one reward left.
      count = min(3, length - k)
      expected = sum(gamma**j * rewards[start + k + j] for j in range(count))
      np.testing.assert_allclose(three[start + k][0].reward.numpy()[0],
                                 expected, rtol=1e-5,
                                 err_msg=f'episode rows {start}-{end}, {k}')
    if length > 3:
      # A row's second step is step t + 3's observation.
      np.testing.assert_array_equal(
          three[start][0].observation.numpy()[1],
          one[start + 3][0].observation.numpy()[0])


def test_refusals(server):
  _, client, _ = server
  buffer = tf_agents_buffer.MemoryReplayBuffer.uniform(client, 'episodes')
  with pytest.raises(ValueError, match='num_steps=None'):
    buffer.as_dataset(8)
  with pytest.raises(NotImplementedError, match='EpisodeObserver'):
    buffer.add_batch(None)
  with pytest.raises(ValueError, match='not an episode table|samples'):
    tf_agents_buffer.MemoryReplayBuffer.uniform(client, 'uniform2')
  summed = tf_agents_buffer.MemoryReplayBuffer.uniform(
      client, 'episodes', n_step=3)
  with pytest.raises(ValueError, match='num_steps must be 2'):
    summed.as_dataset(8, num_steps=3)


def test_observer_writes_what_the_push_writes(server, data):
  _, client, _ = server
  observer = episode_observer.EpisodeObserver(client, 'observed')
  for trajectory in rlds_reverb.convert_rlds_to_trajectories(data):
    observer(tree.map_structure(lambda x: x.numpy()[None], trajectory))
  observer.close()
  assert observer.episodes == len(LENGTHS) and observer.dropped_steps == 0
  read = {}
  for table in ('episodes', 'observed'):
    # Episodes come back in heap order, not written order, once read.
    reader = episode_table.EpisodeReader(client, table)
    read[table] = collections.Counter(_key(e.data) for e in
                                      reader.read_all())
  assert read['observed'] == read['episodes']
  assert sum(read['observed'].values()) == len(LENGTHS)


def test_observer_writes_an_episode_cut_by_a_reset(server, data):
  """A new TF-Agents Actor resets its env: the episode under way gets no
  boundary, and ends at its last observation."""
  _, client, _ = server
  client.reset('observed')
  trajectories = [tree.map_structure(lambda x: x.numpy(), t) for t in
                  rlds_reverb.convert_rlds_to_trajectories(data)]
  first = LENGTHS[0]
  observer = episode_observer.EpisodeObserver(client, 'observed')
  for i, trajectory in enumerate(trajectories[:first + LENGTHS[1]]):
    if i != first - 1:  # The first episode's boundary never comes.
      observer(trajectory)
  observer.close()
  assert (observer.episodes, observer.cut_episodes,
          observer.dropped_steps) == (2, 1, 1)
  cut, whole = sorted(  # Shortest first: heap order is not write order.
      episode_table.EpisodeReader(client, 'observed').read_all(),
      key=lambda e: len(e.data.step_type))
  np.testing.assert_array_equal(cut.data.step_type, [0, 1, 1, 2])
  np.testing.assert_array_equal(cut.data.next_step_type, [1, 1, 2, 0])
  np.testing.assert_array_equal(
      cut.data.observation,
      np.stack([t.observation for t in trajectories[:first - 1]]))
  assert len(whole.data.step_type) == LENGTHS[1]
  client.reset('observed')


def test_observer_refuses_a_batch_of_envs(server, data):
  _, client, _ = server
  observer = episode_observer.EpisodeObserver(client, 'observed')
  trajectory = next(iter(rlds_reverb.convert_rlds_to_trajectories(data)))
  with pytest.raises(ValueError, match='one observer per env'):
    observer(tree.map_structure(lambda x: np.stack([x.numpy()] * 2),
                                trajectory))


def _cartpole_table(cartpole, episodes=20, length=30, seed=0):
  """A server with an episode table of random CartPole-shaped episodes."""
  spec = trajectory_lib.Trajectory(
      step_type=tf.TensorSpec([], tf.int32),
      observation=tf.TensorSpec([4], tf.float32),
      action=tf.TensorSpec([], tf.int64), policy_info=(),
      next_step_type=tf.TensorSpec([], tf.int32),
      reward=tf.TensorSpec([], tf.float32),
      discount=tf.TensorSpec([], tf.float32))
  srv = reverb.Server([episode_table.make_table('dqn', spec,
                                                max_episodes=1000),
                       tf_agents_buffer_priority_table('dqn')])
  client = reverb.Client(f'localhost:{srv.port}')
  rng = np.random.default_rng(seed)
  observer = episode_observer.EpisodeObserver(client, 'dqn')
  for _ in range(episodes):
    for t in range(length + 1):
      last = t == length
      observer(trajectory_lib.Trajectory(
          step_type=np.int32(0 if t == 0 else (2 if last else 1)),
          observation=rng.normal(size=4).astype(np.float32),
          action=np.int64(rng.integers(2)), policy_info=(),
          next_step_type=np.int32(0 if last else (2 if t == length - 1
                                                  else 1)),
          reward=np.float32(rng.normal()), discount=np.float32(1.0)))
  observer.close()
  del cartpole
  return srv, client


def tf_agents_buffer_priority_table(table):
  from rlds_reverb.replay import feeds  # pylint: disable=g-import-not-at-top
  return feeds.make_priority_table(table)


def _dqn_agent(cartpole):
  tf.random.set_seed(0)
  return dqn_agent.DqnAgent(
      cartpole.time_step_spec, cartpole.action_spec,
      q_network=q_network.QNetwork(cartpole.time_step_spec.observation,
                                   cartpole.action_spec,
                                   fc_layer_params=(16,)),
      optimizer=tf.keras.optimizers.Adam(1e-3),
      train_step_counter=tf.Variable(0, dtype=tf.int64))


def test_learner_trains_checkpoints_and_restores(cartpole, tmp_path):
  srv, client = _cartpole_table(cartpole)
  buffer = tf_agents_buffer.MemoryReplayBuffer.uniform(client, 'dqn')

  def make_learner():
    agent = _dqn_agent(cartpole)
    return agent, tf_learner.Learner(
        str(tmp_path), agent.train_step_counter, agent,
        experience_dataset_fn=lambda: buffer.as_dataset(32, num_steps=2),
        checkpoint_interval=10)

  agent, learner = make_learner()
  before = [v.numpy().copy() for v in agent._q_network.trainable_variables]  # pylint: disable=protected-access
  loss = learner.run(iterations=10)
  assert np.isfinite(loss.loss.numpy())
  assert learner.train_step_numpy == 10
  after = [v.numpy() for v in agent._q_network.trainable_variables]  # pylint: disable=protected-access
  assert any(not np.allclose(a, b) for a, b in zip(before, after))
  # The checkpoint trigger fired at 10: a new learner resumes there.
  agent2, learner2 = make_learner()
  assert learner2.train_step_numpy == 10
  for a, b in zip(after, agent2._q_network.trainable_variables):  # pylint: disable=protected-access
    np.testing.assert_allclose(a, b.numpy())
  learner2.run(iterations=5)
  assert learner2.train_step_numpy == 15
  srv.stop()


def test_in_graph_draws_feed_the_learner(cartpole, tmp_path):
  srv, client = _cartpole_table(cartpole)
  buffer = tf_agents_buffer.MemoryReplayBuffer.uniform(client, 'dqn')
  draws = buffer.as_draws(32, num_steps=2)
  assert draws.element_spec == buffer.as_dataset(32, num_steps=2).element_spec
  agent = _dqn_agent(cartpole)
  learner = tf_learner.Learner(str(tmp_path), agent.train_step_counter,
                               agent, experience_dataset_fn=lambda: draws)
  learner.run(iterations=5)
  assert learner.train_step_numpy == 5
  # Weighted, as for PER: a map of the draws, as of a dataset.
  prioritized = tf_agents_buffer.MemoryReplayBuffer.prioritized(
      client, 'dqn', batch_size=32,
      config=per.PerConfig(beta_steps=100))
  weighted = tf_agents_buffer.importance_weighted(
      prioritized.as_draws(32), prioritized, agent.train_step_counter)
  element, info = next(iter(weighted))
  assert element['weights'].shape == (32,)
  assert element['experience'].observation.shape == (32, 2, 4)
  srv.stop()


def test_prioritized_weights_and_updates_through_the_learner(cartpole,
                                                            tmp_path):
  srv, client = _cartpole_table(cartpole, episodes=4, length=10)
  batch = 16
  config = per.PerConfig(alpha=0.6, beta0=0.4, beta_steps=100)
  buffer = tf_agents_buffer.MemoryReplayBuffer.prioritized(
      client, 'dqn', batch_size=batch, config=config)
  agent = _dqn_agent(cartpole)
  experience, info = next(iter(buffer.as_dataset(batch, num_steps=2)))
  size = int(info.table_size[0, 0])
  assert size == 40
  # Every transition starts at the running maximum (1.0): uniform.
  np.testing.assert_allclose(info.probability.numpy(), 1.0 / size)
  weighted = tf_agents_buffer.importance_weighted(
      buffer.as_dataset(batch, num_steps=2), buffer, agent.train_step_counter)
  learner = tf_learner.Learner(
      str(tmp_path), agent.train_step_counter, agent,
      experience_dataset_fn=lambda: weighted,
      after_train_strategy_step_fn=tf_agents_buffer.PriorityUpdate(buffer),
      use_kwargs_in_agent_train=True, run_optimizer_variable_init=False)
  learner.run(iterations=1)
  feed = buffer.replay.feed()
  priorities = feed.raw_priorities()
  changed = np.flatnonzero(~np.isclose(priorities, 1.0) & (priorities > 0))
  assert 0 < len(changed) <= batch
  # The new priorities are |td_error| + eps of the rows drawn: recompute
  # them with the agent as it was (one step ago is gone; check the rule on
  # a fresh draw and update instead).
  experience, info = next(iter(buffer.as_dataset(batch, num_steps=2)))
  loss_info = agent._loss(experience, weights=None)  # pylint: disable=protected-access
  tf_agents_buffer.PriorityUpdate(buffer)((experience, info), loss_info)
  rows = info.key.numpy()[:, 0].astype(np.int64)
  expected = np.minimum(np.abs(loss_info.extra.td_error.numpy()) +
                        config.eps, config.priority_cap)
  last = {}
  for r, p in zip(rows, expected):
    last[r] = p
  np.testing.assert_allclose(feed.raw_priorities()[list(last)],
                             list(last.values()), rtol=1e-4)
  # Weights: (N P)^-beta / max over the batch, beta at step 1.
  element, info = next(iter(weighted))
  beta = 0.4 + 0.6 * 1 / 100
  raw = (size * info.probability.numpy()[:, 0]) ** -beta
  np.testing.assert_allclose(element['weights'].numpy(), raw / raw.max(),
                             rtol=1e-5)
  # Written back to the store and read back by a new buffer.
  assert buffer.write_priorities() == 4
  again = tf_agents_buffer.MemoryReplayBuffer.prioritized(
      client, 'dqn', batch_size=batch, config=config)
  np.testing.assert_allclose(again.replay.feed().raw_priorities(),
                             feed.raw_priorities(), rtol=1e-6)
  srv.stop()


def test_prioritized_draws_follow_priorities(cartpole):
  srv, client = _cartpole_table(cartpole, episodes=2, length=4)
  config = per.PerConfig(alpha=1.0, beta_steps=10)
  buffer = tf_agents_buffer.MemoryReplayBuffer.prioritized(
      client, 'dqn', batch_size=4000, config=config)
  feed = buffer.replay.feed()
  rows = buffer.memory.transition_rows()
  priorities = np.arange(1, len(rows) + 1, dtype=np.float32)
  feed.set_priorities(rows, priorities)
  _, info = next(iter(buffer.as_dataset(4000, num_steps=2)))
  drawn = info.key.numpy()[:, 0].astype(np.int64)
  counts = np.array([np.sum(drawn == r) for r in rows])
  expected = 4000 * priorities / priorities.sum()
  assert chi_square(counts, expected) < chi_square_bound(len(rows) - 1)
  np.testing.assert_allclose(
      info.probability.numpy()[:, 0],
      priorities[np.searchsorted(rows, drawn)] / priorities.sum(), rtol=1e-5)
  np.testing.assert_allclose(
      info.priority.numpy()[:, 0], priorities[np.searchsorted(rows, drawn)],
      rtol=1e-4)
  srv.stop()


def test_new_episodes_reach_a_polling_buffer(cartpole):
  srv, client = _cartpole_table(cartpole, episodes=0)
  buffer = tf_agents_buffer.MemoryReplayBuffer.uniform(
      client, 'dqn', capacity=1000, poll_every=1, wait_timeout_s=5)
  assert int(buffer.num_frames()) == 0
  dataset = buffer.as_dataset(8, num_steps=2)
  with pytest.raises(tf.errors.UnknownError, match='no transition in 5 s'):
    next(iter(dataset))
  observer = episode_observer.EpisodeObserver(client, 'dqn')
  for t in range(4):
    observer(trajectory_lib.Trajectory(
        step_type=np.int32(min(t, 1) if t < 3 else 2),
        observation=np.full(4, t, np.float32), action=np.int64(0),
        policy_info=(), next_step_type=np.int32(1 if t < 2 else
                                                (2 if t == 2 else 0)),
        reward=np.float32(t), discount=np.float32(1.0)))
  experience, info = next(iter(dataset))
  assert set(np.unique(info.table_size)) == {3}
  assert set(experience.observation.numpy()[:, 0, 0]) <= {0.0, 1.0, 2.0}
  srv.stop()
