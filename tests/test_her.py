"""rlds_reverb.replay.her: goal relabelling at sample time on a real Reverb table.

The synthetic episodes carry their identity in their values: episode e's
achieved goal at step s is [e, s, 0.5], its observation [e, s] and its
desired goal [-1 - e, 0, 0]. A relabelled goal therefore says which episode
and step it was taken from, and a transition says where it sits.
"""

import threading

import numpy as np
import pytest
import rlds
import tensorflow as tf

from rlds_reverb.data import convert
from rlds_reverb.replay import her
from rlds_reverb.storage import push
from rlds_reverb.storage import tables
from rlds_reverb.acting import collect
from rlds_reverb.acting import envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import run

BATCH = 256


def goal_episode(episode_id: int, transitions: int, terminal: bool = False
                 ) -> dict:
  """RLDS steps of one episode with `transitions` transitions."""
  n = transitions + 1
  steps = np.arange(n, dtype=np.float32)
  ids = np.full(n, episode_id, np.float32)
  return {
      rlds.OBSERVATION: {
          'observation': np.stack([ids, steps], 1),
          'achieved_goal': np.stack([ids, steps, np.full(n, 0.5)], 1).astype(
              np.float32),
          'desired_goal': np.tile(
              np.array([[-1.0 - episode_id, 0.0, 0.0]], np.float32), (n, 1)),
      },
      rlds.ACTION: np.stack([ids, steps], 1),
      # The stored reward says which transition it is: -(step + 1).
      rlds.REWARD: np.where(steps < transitions, -(steps + 1), 0.0).astype(
          np.float32),
      rlds.DISCOUNT: np.ones(n, np.float32),
      rlds.IS_FIRST: steps == 0,
      rlds.IS_LAST: steps == transitions,
      rlds.IS_TERMINAL: (steps == transitions) & terminal,
  }


def as_rlds(episodes):
  data = None
  for steps in episodes:
    one = tf.data.Dataset.from_tensors(
        {rlds.STEPS: tf.data.Dataset.from_tensor_slices(steps)})
    data = one if data is None else data.concatenate(one)
  return data


def sparse_reward(achieved, desired):
  """FetchReach's rule: 0 within 0.05 of the goal, else -1."""
  return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(
      np.float32)


class Served:
  """A Reverb server with one HER episode table holding `episodes`."""

  def __init__(self, episodes, max_episodes=10_000, table_maker=None):
    rlds_data = as_rlds(episodes)
    self.data_spec = convert.create_trajectory_data_spec(rlds_data)
    make = table_maker or (lambda spec: her.make_table(
        'episodes', spec, max_episodes=max_episodes))
    self.server = tables.start_server([make(self.data_spec)])
    self.client = self.server.localhost_client()
    self.address = f'localhost:{self.server.port}'
    push.push_rlds_to_table(rlds_data, self.client, 'episodes',
                            sequence_length=None,
                            priority_fn=her.transition_priority)

  def batches(self, n, reward_fn=her.from_goal_function(sparse_reward),
              **kwargs):
    dataset = her.dataset(self.address, 'episodes', self.data_spec, BATCH,
                          reward_fn, with_info=True, **kwargs)
    out = list(dataset.take(n).as_numpy_iterator())
    return out

  def stop(self):
    self.server.stop()


LENGTHS = [1, 2, 3, 7, 20, 50]  # transitions; 1: a one-step episode


@pytest.fixture(scope='module')
def mixed():
  served = Served([goal_episode(e, LENGTHS[e % len(LENGTHS)])
                   for e in range(30)])
  yield served
  served.stop()


def _check_transitions(batch, info):
  obs = batch.observation  # [B, 2, 2 + 3]: [episode, step, goal]
  episode, step = obs[:, 0, 0].astype(int), obs[:, 0, 1].astype(int)
  transitions = np.array([LENGTHS[e % len(LENGTHS)] for e in episode])
  np.testing.assert_array_equal(obs[:, 1, 0], episode)  # same episode
  np.testing.assert_array_equal(obs[:, 1, 1], step + 1)  # next step
  assert np.all(step < transitions)  # never the final observation
  np.testing.assert_array_equal(obs[:, 0, 2:], obs[:, 1, 2:])  # one goal
  np.testing.assert_array_equal(obs[:, 0, 2:], info['goal'])
  np.testing.assert_array_equal(batch.action[:, 0, 1], step)
  return episode, step, transitions


@pytest.mark.parametrize('strategy', her.STRATEGIES)
def test_relabelled_goals_come_from_where_the_strategy_says(mixed, strategy):
  for batch, info in mixed.batches(6, config=her.HerConfig(strategy)):
    episode, step, transitions = _check_transitions(batch, info)
    goal = info['goal']
    relabelled = info['relabelled']
    # Originals: the episode's own desired goal, and its stored reward.
    np.testing.assert_array_equal(goal[~relabelled, 0],
                                  -1.0 - episode[~relabelled])
    np.testing.assert_array_equal(batch.reward[~relabelled, 0],
                                  -(step[~relabelled] + 1.0))
    # Relabelled: an achieved goal, [source episode, source step, 0.5].
    source, source_step = goal[relabelled, 0].astype(int), goal[
        relabelled, 1].astype(int)
    np.testing.assert_array_equal(goal[relabelled, 2], 0.5)
    t, n = step[relabelled], transitions[relabelled]
    if strategy == 'random':
      source_n = np.array([LENGTHS[e % len(LENGTHS)] for e in source])
      assert np.all((source_step >= 1) & (source_step <= source_n))
      continue
    np.testing.assert_array_equal(source, episode[relabelled])
    if strategy == 'future':
      assert np.all((source_step > t) & (source_step <= n))
    elif strategy == 'final':
      np.testing.assert_array_equal(source_step, n)
    else:  # episode
      assert np.all((source_step >= 1) & (source_step <= n))


def test_future_covers_every_later_step_and_random_other_episodes(mixed):
  # One draw (64 episodes, priority = transitions) holds none of the five
  # 3-transition episodes with P = (1 - 15/415)^64 ~ 0.095, and one such
  # episode (32 transitions) misses one of the three futures of its step 0
  # with P ~ 0.15; eight draws fail together with P < 1e-5.
  seen_future, other_episode = set(), 0
  for batch, info in mixed.batches(8 * 8):
    episode, step, _ = _check_transitions(batch, info)
    rel = info['relabelled']
    for e, t, s in zip(episode[rel], step[rel],
                       info['goal'][rel, 1].astype(int)):
      if e % len(LENGTHS) == 2:  # 3 transitions: future of step 0 is 1..3
        if t == 0:
          seen_future.add(int(s))
  assert seen_future == {1, 2, 3}
  for batch, info in mixed.batches(4, config=her.HerConfig('random')):
    rel = info['relabelled']
    other_episode += np.sum(info['goal'][rel, 0] !=
                            batch.observation[rel, 0, 0])
  assert other_episode > 0


@pytest.mark.parametrize('k', [4.0, 1.0, 0.0])
def test_share_of_original_goals_is_one_over_k_plus_one(mixed, k):
  relabelled = np.concatenate(
      [info['relabelled'] for _, info in mixed.batches(
          8, config=her.HerConfig(k=k, batches_per_draw=2))])
  p = k / (k + 1)
  n = len(relabelled)
  bound = 5 * np.sqrt(p * (1 - p) / n) + 1e-9
  assert abs(relabelled.mean() - p) <= bound, (relabelled.mean(), p)


def test_transitions_are_uniform_over_mixed_episode_lengths(mixed):
  """Episodes are drawn in proportion to their transitions, so every stored
  transition is equally likely, short episodes included."""
  counts = {}
  batches = mixed.batches(40, config=her.HerConfig(episodes_per_draw=64,
                                                   batches_per_draw=1))
  for batch, _ in batches:
    for e in batch.observation[:, 0, 0].astype(int):
      n = LENGTHS[e % len(LENGTHS)]
      counts[n] = counts.get(n, 0) + 1
  total = sum(counts.values())
  stored = {n: 5 * n for n in LENGTHS}  # 5 episodes of each length
  all_transitions = sum(stored.values())
  for n in LENGTHS:
    expected = total * stored[n] / all_transitions
    # Poisson-ish bound widened for the 64-episode draws (4 rows each).
    assert abs(counts.get(n, 0) - expected) < 6 * np.sqrt(4 * expected) + 4, (
        n, counts, expected)


def test_an_episode_without_transitions_is_stored_but_never_sampled():
  served = Served([goal_episode(0, 0), goal_episode(1, 2)])
  try:
    assert served.client.server_info()['episodes'].current_size == 2
    for batch, _ in served.batches(3):
      np.testing.assert_array_equal(batch.observation[:, 0, 0], 1.0)
  finally:
    served.stop()


class _PointGoalEnv:
  """Both reward interfaces, written out (no gymnasium needed)."""

  def compute_reward(self, achieved_goal, desired_goal, info):
    assert isinstance(info, dict)
    return -np.linalg.norm(achieved_goal - desired_goal, axis=-1)


class _MultitaskEnv:

  def compute_rewards(self, obs, action, next_obs):
    return (-np.linalg.norm(next_obs['achieved_goal'] - next_obs[
        'desired_goal'], axis=-1) - 0.1 * np.abs(action).sum(-1)
            - 0.01 * obs['observation'][:, 1])


def test_both_reward_interfaces_and_a_plain_function(mixed):
  cases = {
      'goal_env': (her.reward_fn_for(_PointGoalEnv()),
                   lambda obs, act, ag, g: -np.linalg.norm(ag - g, axis=-1)),
      'multitask': (her.reward_fn_for(_MultitaskEnv()),
                    lambda obs, act, ag, g: -np.linalg.norm(ag - g, axis=-1)
                    - 0.1 * np.abs(act).sum(-1) - 0.01 * obs[:, 1]),
      'plain': (her.reward_fn_for(sparse_reward),
                lambda obs, act, ag, g: sparse_reward(ag, g)),
  }
  for name, (reward_fn, expected_fn) in cases.items():
    for batch, info in mixed.batches(2, reward_fn=reward_fn):
      rel = info['relabelled']
      expected = expected_fn(batch.observation[:, 0, :2], batch.action[:, 0],
                             info['next_achieved_goal'], info['goal'])
      np.testing.assert_allclose(batch.reward[rel, 0], expected[rel],
                                 rtol=1e-6, err_msg=name)


def test_reward_fn_for_refuses_what_has_no_reward():
  with pytest.raises(ValueError, match='compute_reward'):
    her.reward_fn_for(42)


def test_a_reward_function_that_is_not_vectorised_fails_clearly(mixed):
  scalar = her.from_goal_function(lambda achieved, desired: -1.0)
  with pytest.raises(Exception, match='must be vectorised'):
    mixed.batches(1, reward_fn=scalar)


def test_success_is_terminal_where_the_env_says_so_and_timeouts_never():
  served = Served([goal_episode(e, 10, terminal=(e == 0)) for e in range(4)])
  try:
    # Without a terminal function the stored discounts stay: episodes 1-3
    # end by time limit, so all their discounts are 1.
    for batch, info in served.batches(3):
      timeouts = batch.observation[:, 0, 0] > 0
      np.testing.assert_array_equal(batch.discount[timeouts, 0], 1.0)
    # Success as termination: discount 0 exactly where the new reward says
    # the goal was reached.
    terminated_fn = lambda achieved, desired: sparse_reward(
        achieved, desired) == 0
    for batch, info in served.batches(3, terminated_fn=terminated_fn):
      rel = info['relabelled']
      success = batch.reward[rel, 0] == 0
      assert success.any() and (~success).any()
      np.testing.assert_array_equal(batch.discount[rel, 0],
                                    np.where(success, 0.0, 1.0))
  finally:
    served.stop()


def test_episodes_evicted_while_batches_are_drawn_stay_whole():
  served = Served([goal_episode(e, 10) for e in range(8)], max_episodes=8)
  stop = threading.Event()
  written = []

  def writer():
    e = 100
    while not stop.is_set():
      push.push_rlds_to_table(as_rlds([goal_episode(e, 5 + e % 7)]),
                              served.client, 'episodes',
                              sequence_length=None,
                              priority_fn=her.transition_priority)
      written.append(e)
      e += 1

  thread = threading.Thread(target=writer)
  thread.start()
  try:
    dataset = her.dataset(served.address, 'episodes', served.data_spec, BATCH,
                          her.from_goal_function(sparse_reward),
                          config=her.HerConfig(episodes_per_draw=8,
                                               batches_per_draw=1),
                          with_info=True)
    for drawn, (batch, info) in enumerate(dataset.as_numpy_iterator()):
      if len(written) > 12 or drawn > 2000:
        break
      obs = batch.observation
      episode, step = obs[:, 0, 0].astype(int), obs[:, 0, 1].astype(int)
      np.testing.assert_array_equal(obs[:, 1, 0], episode)
      np.testing.assert_array_equal(obs[:, 1, 1], step + 1)
      rel = info['relabelled']
      np.testing.assert_array_equal(info['goal'][rel, 0], episode[rel])
      assert np.all(info['goal'][rel, 1] > step[rel])
  finally:
    stop.set()
    thread.join()
  assert len(written) > 8  # the table turned over at least once
  assert served.client.server_info()['episodes'].current_size == 8
  served.stop()


def test_the_table_and_the_data_are_checked(mixed):
  served = Served([goal_episode(0, 3)], table_maker=lambda spec:
                  tables.make_table('episodes', spec, max_size=10,
                                    sequence_length=None))
  try:
    with pytest.raises(ValueError, match='prioritized, alpha 1'):
      her.dataset(served.address, 'episodes', served.data_spec, BATCH,
                  her.from_goal_function(sparse_reward))
  finally:
    served.stop()
  flat_spec = mixed.data_spec._replace(
      observation=tf.TensorSpec([5], tf.float32))
  with pytest.raises(ValueError, match='dict observations'):
    her.dataset(mixed.address, 'episodes', flat_spec, BATCH, sparse_reward)
  with pytest.raises(ValueError, match='strategy'):
    her.HerConfig('nearest')
  with pytest.raises(ValueError, match='k must'):
    her.HerConfig(k=-1)


def test_normalizer_matches_numpy_and_clips():
  rng = np.random.default_rng(0)
  obs = rng.normal(3.0, 2.0, (1000, 4))
  goals = rng.normal(-1.0, 0.5, (1000, 2))
  obs[0, 0] = 1e6  # clipped to 200 before the statistics
  normalizer = her.GoalNormalizer(4, 2)
  normalizer.update(obs[:500], goals[:500])
  normalizer.update(obs[500:], goals[500:])
  clipped = np.clip(obs, -200, 200)
  expected_obs = np.clip((clipped - clipped.mean(0)) / clipped.std(0), -5, 5)
  expected_goal = np.clip((goals - goals.mean(0)) / goals.std(0), -5, 5)
  out = normalizer(tf.constant(obs, tf.float32),
                   tf.constant(goals, tf.float32)).numpy()
  np.testing.assert_allclose(out[:, :4], expected_obs, atol=1e-4)
  np.testing.assert_allclose(out[:, 4:], expected_goal, atol=1e-4)
  assert out[0, 0] == 5.0
  np.testing.assert_allclose(normalizer.numpy_fn()(obs, goals), out,
                             atol=1e-5)


def test_fetchreach_rewards_are_the_envs_and_critic_loss_falls(tmp_path):
  """Random FetchReach episodes from the online collector; every reward of a
  relabelled batch is FetchReach's own compute_reward; TD3 trained on the
  HER batches fits its critic."""
  specs = envs.env_specs('FetchReach-v4')
  data_spec = run.trajectory_spec(specs)
  server = tables.start_server([her.make_table('online', data_spec,
                                               max_episodes=100)])
  env = envs.make_env('FetchReach-v4')
  collector = collect.Collector('FetchReach-v4', server.localhost_client(),
                                'online', sequence_length=None,
                                priority_fn=her.transition_priority)
  try:
    collector.collect(1000, collect.random_act(specs.action_low,
                                               specs.action_high))
    assert collector.stats.episodes == 20
    address = f'localhost:{server.port}'
    dataset = her.dataset(address, 'online', data_spec, BATCH,
                          her.reward_fn_for(env),
                          terminated_fn=her.terminated_fn_for(env),
                          with_info=True)
    step_spec = her.learner_spec(data_spec)
    for field, spec in zip(tf.nest.flatten(dataset.element_spec[0]),
                           tf.nest.flatten(step_spec)):
      assert field.shape.as_list() == [BATCH, 2] + spec.shape.as_list()
      assert field.dtype == spec.dtype
    assert step_spec.observation.shape == (13,)  # 10 + 3 goal
    for batch, info in dataset.take(3).as_numpy_iterator():
      expected = env.unwrapped.compute_reward(info['next_achieved_goal'],
                                              info['goal'], {})
      np.testing.assert_array_equal(batch.reward[:, 0], expected)
      assert 0 < (batch.reward[:, 0] == 0).mean() < 1
      np.testing.assert_array_equal(batch.discount[:, 0], 1.0)  # timeouts
    # The critic fits one relabelled batch (its targets move with it, so
    # the loss of a stream of fresh batches need not fall this early).
    agent = registry.make_agent('td3', specs.time_step_spec, specs.action_spec,
                              factory.AgentConfig(seed=0))
    learner = loop.Learner(agent, str(tmp_path))
    fixed = next(iter(her.dataset(address, 'online', data_spec, BATCH,
                                  her.reward_fn_for(env))))
    batches = iter(tf.data.Dataset.from_tensors(fixed).repeat())
    losses = []
    for _ in range(30):
      learner.train(batches, 10)
      losses.append(float(agent.train(fixed).extra.critic_loss))
    assert np.mean(losses[-3:]) < 0.75 * np.mean(losses[:3]), losses
  finally:
    collector.close()
    env.close()
    server.stop()


def test_a_saved_her_policy_takes_raw_observations(tmp_path):
  """policy.npz carries the normaliser: loaded, it acts on concat(obs, goal)
  exactly as the actor acted on the normalised view."""
  specs = envs.env_specs('FetchReach-v4')
  agent = registry.make_agent('td3', specs.time_step_spec, specs.action_spec,
                            factory.AgentConfig(seed=0))
  rng = np.random.default_rng(0)
  normalizer = her.GoalNormalizer(10, 3)
  normalizer.update(rng.normal(1.0, 0.3, (500, 10)),
                    rng.normal(0.5, 0.1, (500, 3)))
  obs = {'observation': rng.normal(1.0, 0.3, (64, 10)),
         'achieved_goal': rng.normal(0.5, 0.1, (64, 3)),
         'desired_goal': rng.normal(0.5, 0.1, (64, 3))}
  obs['observation'][0, 0] = 50.0  # beyond the +-5 clip once normalised
  actor = run.export_policy(agent, 'td3', specs)
  expected = actor.greedy(her.ObservationFlattener(normalizer)(obs))
  path = str(tmp_path / 'policy.npz')
  her.with_normalizer(run.export_policy(agent, 'td3', specs),
                      normalizer).save(path)
  loaded = numpy_policy.load(path)
  raw = np.concatenate([obs['observation'], obs['desired_goal']], -1)
  np.testing.assert_allclose(loaded.greedy(raw), expected, atol=1e-5)
  assert loaded.metadata['observation'] == 'concat(observation, desired_goal)'
