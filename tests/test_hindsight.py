"""rlds_reverb.replay.hindsight: goal relabelling on a real TransitionMemory.

As in test_her.py, the synthetic episodes carry their identity in their
values: episode e's achieved goal at step s is [e, s, 0.5], its observation
[e, s] and its desired goal [-1 - e, 0, 0]. A goal therefore says which
episode and step (hence which memory row) it was taken from.

Statistical bounds: shares within 5 sigma; chi-square statistics below
dof + 6 * sqrt(2 * dof), which a correct sampler exceeds with probability
well below 1e-4 at the dofs used here (scipy is not installed).
"""

import numpy as np
import pytest
import rlds
import tensorflow as tf
import tree

import rlds_reverb
from rlds_reverb.replay import her
from rlds_reverb.replay import hindsight
from rlds_reverb.replay import memory as memory_lib
import rlds_fixtures as fx  # pylint: disable=g-bad-import-order
from conftest import chi_square_bound  # pylint: disable=g-bad-import-order
from conftest import converted_episodes  # pylint: disable=g-bad-import-order

BATCH = 1024
LENGTHS = [0, 2, 10, 50]  # transitions per episode; 0: a one-step episode


def sparse_reward(achieved, desired):
  """FetchReach's rule: 0 within 0.05 of the goal, else -1."""
  return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(
      np.float32)


def goal_episode(episode_id: int, transitions: int, terminal: bool = False
                 ) -> dict:
  """RLDS steps of one episode; stored rewards are `sparse_reward`'s."""
  n = transitions + 1
  steps = np.arange(n, dtype=np.float32)
  ids = np.full(n, episode_id, np.float32)
  achieved = np.stack([ids, steps, np.full(n, 0.5, np.float32)], 1)
  desired = np.tile(np.array([[-1.0 - episode_id, 0.0, 0.0]], np.float32),
                    (n, 1))
  reward = np.zeros(n, np.float32)
  reward[:-1] = sparse_reward(achieved[1:], desired[1:])
  return {
      rlds.OBSERVATION: {'observation': np.stack([ids, steps], 1),
                         'achieved_goal': achieved, 'desired_goal': desired},
      rlds.ACTION: np.stack([ids, steps], 1),
      rlds.REWARD: reward,
      rlds.DISCOUNT: np.ones(n, np.float32),
      rlds.IS_FIRST: steps == 0,
      rlds.IS_LAST: steps == transitions,
      rlds.IS_TERMINAL: (steps == transitions) & terminal,
  }


def memory_of(episodes, **kwargs) -> memory_lib.TransitionMemory:
  """A memory holding `episodes`, keyed by their index."""
  spec, converted = converted_episodes(fx.make_rlds(episodes))
  kwargs.setdefault('with_episode_bounds', True)
  memory = memory_lib.TransitionMemory(
      spec, sum(len(e[rlds.REWARD]) for e in episodes), **kwargs)
  memory.add(converted, keys=range(len(converted)))
  return memory


def first_rows(memory) -> dict:
  return {key: first for key, first, _ in memory.episode_rows()}


def draws(feed, calls: int):
  """`calls` batches and infos of `feed.sample_with_info`, concatenated."""
  sample = tf.function(feed.sample_with_info)
  out = [tree.map_structure(lambda x: x.numpy(), sample())
         for _ in range(calls)]
  return tree.map_structure(lambda *x: np.concatenate(x), *out)


def feed_of(memory, batch_size=BATCH, reward_fn=None, **kwargs):
  return hindsight.HindsightFeed(
      memory, batch_size, reward_fn or her.from_goal_function(sparse_reward),
      **kwargs)


@pytest.fixture(scope='module')
def mixed():
  episodes = [goal_episode(e, LENGTHS[e % len(LENGTHS)]) for e in range(12)]
  return memory_of(episodes)


def decode(memory, batch, info):
  """(episode, step, transitions) of each row, checked against the rows."""
  obs = batch.observation  # [B, 2, 2 + 3]: [episode, step, goal]
  episode, step = obs[:, 0, 0].astype(int), obs[:, 0, 1].astype(int)
  transitions = np.array([LENGTHS[e % len(LENGTHS)] for e in episode])
  first = first_rows(memory)
  np.testing.assert_array_equal(
      info['row'], [first[e] + s for e, s in zip(episode, step)])
  np.testing.assert_array_equal(obs[:, 1, 0], episode)  # same episode
  np.testing.assert_array_equal(obs[:, 1, 1], step + 1)  # next step
  assert np.all(step < transitions)  # never from an episode's last step
  np.testing.assert_array_equal(obs[:, 0, 2:], info['goal'])  # one goal
  np.testing.assert_array_equal(obs[:, 1, 2:], info['goal'])
  np.testing.assert_array_equal(batch.action[:, 0, 1], step)
  return episode, step, transitions


@pytest.mark.parametrize('strategy', her.STRATEGIES)
def test_goal_rows_lie_where_the_strategy_says(mixed, strategy):
  batch, info = draws(feed_of(mixed, config=her.HerConfig(strategy)), 4)
  episode, step, transitions = decode(mixed, batch, info)
  first = first_rows(mixed)
  row, goal_row, rel = info['row'], info['goal_row'], info['relabelled']
  start = np.array([first[e] for e in episode])
  last = start + transitions
  if strategy == 'future':
    assert np.all((row < goal_row) & (goal_row <= last))
  elif strategy == 'final':
    np.testing.assert_array_equal(goal_row, last)
  elif strategy == 'episode':
    assert np.all((start + 1 <= goal_row) & (goal_row <= last))
  else:  # the row after a stored transition: step 1..T of some episode
    after = {first[e] + s for e in first
             for s in range(1, LENGTHS[e % len(LENGTHS)] + 1)}
    assert set(goal_row.tolist()) <= after
  # Originals keep the episode's own goal; relabelled goals are the
  # achieved goal stored at goal_row.
  goal = info['goal']
  np.testing.assert_array_equal(goal[~rel, 0], -1.0 - episode[~rel])
  np.testing.assert_array_equal(goal[rel, 2], 0.5)
  np.testing.assert_array_equal(
      goal_row[rel], [first[int(e)] + int(s) for e, s in goal[rel, :2]])
  if strategy == 'random':
    assert np.mean(goal[rel, 0] != episode[rel]) > 0.5


@pytest.mark.parametrize('k', [4.0, 1.0, 0.0])
def test_share_of_relabelled_goals_is_k_over_k_plus_one(mixed, k):
  _, info = draws(feed_of(mixed, config=her.HerConfig(k=k)), 10)
  relabelled = info['relabelled']
  p, n = k / (k + 1), len(relabelled)
  bound = 5 * np.sqrt(p * (1 - p) / n)  # 0 for k = 0: never relabelled
  assert abs(relabelled.mean() - p) <= bound, (relabelled.mean(), p, bound)


def test_transitions_are_uniform_over_all_stored_transitions(mixed):
  """Each of the 186 transitions of episodes of 2, 10 and 50 transitions is
  equally likely; the one-step episodes (no transition) never come up."""
  batch, info = draws(feed_of(mixed), 64)
  episode, step, _ = decode(mixed, batch, info)
  cells = [(e, s) for e in range(12) for s in range(LENGTHS[e % 4])]
  counts = {c: 0 for c in cells}
  for c in zip(episode.tolist(), step.tolist()):
    counts[c] += 1  # a KeyError would be a transition that does not exist
  observed = np.array([counts[c] for c in cells], float)
  expected = len(episode) / len(cells)
  statistic = np.sum((observed - expected) ** 2 / expected)
  assert statistic < chi_square_bound(len(cells) - 1), statistic


def test_future_goals_are_uniform_over_the_later_steps():
  """For each t of an 8-transition episode, the goal's step is uniform over
  t+1..8 (one chi-square over all t, dof = sum of (8 - t - 1))."""
  memory = memory_of([goal_episode(0, 8)])
  batch, info = draws(feed_of(memory, batch_size=4096), 10)
  rel = info['relabelled']
  step = batch.observation[rel, 0, 1].astype(int)
  goal_step = info['goal'][rel, 1].astype(int)
  statistic, dof = 0.0, 0
  for t in range(8):
    later = goal_step[step == t]
    observed = np.array([np.sum(later == s) for s in range(t + 1, 9)], float)
    assert observed.sum() == len(later)  # nothing outside t+1..8
    expected = len(later) / len(observed)
    statistic += np.sum((observed - expected) ** 2 / expected)
    dof += len(observed) - 1
  assert statistic < chi_square_bound(dof), (statistic, dof)


def test_rewards_are_the_reward_function_of_next_achieved_and_goal(mixed):
  for strategy in her.STRATEGIES:
    batch, info = draws(feed_of(mixed, config=her.HerConfig(strategy)), 2)
    episode, step, _ = decode(mixed, batch, info)
    next_achieved = np.stack([episode, step + 1, np.full(len(step), 0.5)],
                             1).astype(np.float32)
    np.testing.assert_array_equal(info['next_achieved_goal'], next_achieved)
    np.testing.assert_array_equal(
        batch.reward[:, 0], sparse_reward(next_achieved, info['goal']))
    if strategy != 'random':  # rarely reached from another episode
      assert set(np.unique(batch.reward[:, 0])) == {0.0, -1.0}, strategy


def test_success_is_terminal_only_for_relabelled_rows():
  """Terminal episodes store discount 0 on their last transition: the rows
  that keep their goal keep it; relabelled rows get 1 - success."""
  memory = memory_of([goal_episode(e, 2, terminal=e % 2 == 0)
                      for e in range(6)])
  terminated_fn = lambda achieved, desired: sparse_reward(
      achieved, desired) == 0
  for kwargs in ({}, {'terminated_fn': terminated_fn}):
    batch, info = draws(feed_of(memory, config=her.HerConfig(k=1.0),
                                **kwargs), 2)
    episode = batch.observation[:, 0, 0].astype(int)
    step = batch.observation[:, 0, 1].astype(int)
    stored = np.where((episode % 2 == 0) & (step == 1), 0.0, 1.0)
    rel = info['relabelled']
    np.testing.assert_array_equal(batch.discount[~rel, 0], stored[~rel])
    assert np.any(stored[~rel] == 0)
    if not kwargs:
      np.testing.assert_array_equal(batch.discount[rel, 0], stored[rel])
      continue
    success = batch.reward[rel, 0] == 0
    assert success.any() and (~success).any()
    np.testing.assert_array_equal(batch.discount[rel, 0],
                                  np.where(success, 0.0, 1.0))


def test_a_reward_function_that_is_not_vectorised_fails_clearly(mixed):
  scalar = her.from_goal_function(lambda achieved, desired: -1.0)
  with pytest.raises(Exception, match='must be vectorised'):
    draws(feed_of(mixed, reward_fn=scalar), 1)


def test_memory_observations_and_batch_size_are_checked(mixed):
  goal_data = [goal_episode(0, 3)]
  with pytest.raises(ValueError, match='with_episode_bounds'):
    feed_of(memory_of(goal_data, with_episode_bounds=False))
  flat = memory_of([fx.episode(4)])
  with pytest.raises(ValueError, match='dict observations'):
    feed_of(flat)
  for bad in (0, -3, 2.5, True):
    with pytest.raises(ValueError, match='batch_size'):
      feed_of(mixed, batch_size=bad)


def test_batches_have_the_learner_spec_and_the_normalizer_applies(mixed):
  step_spec = her.learner_spec(mixed.data_spec)
  batch = tf.function(feed_of(mixed, batch_size=64))()
  for field, spec in zip(tf.nest.flatten(batch), tf.nest.flatten(step_spec)):
    assert field.shape.as_list() == [64, 2] + spec.shape.as_list()
    assert field.dtype == spec.dtype
  normalizer = her.GoalNormalizer(2, 3)
  normalizer.update(np.random.default_rng(0).normal(size=(50, 2)) * 9,
                    np.random.default_rng(1).normal(size=(50, 3)) * 9)
  batch, info = draws(feed_of(mixed, normalizer=normalizer), 1)
  rows = np.stack([info['row'], info['row'] + 1], 1)
  obs = mixed.read(tf.constant(rows)).observation['observation'].numpy()
  goal = np.broadcast_to(info['goal'][:, None], obs.shape[:2] + (3,))
  np.testing.assert_allclose(batch.observation,
                             normalizer.numpy_fn()(obs, goal), atol=1e-5)


def test_fetchreach_rewards_are_the_envs_compute_reward():
  gym = pytest.importorskip('gymnasium')
  robotics = pytest.importorskip('gymnasium_robotics')
  gym.register_envs(robotics)
  env = gym.make('FetchReach-v4')
  rng = np.random.default_rng(0)
  episodes = []
  for seed in range(4):
    observation, _ = env.reset(seed=seed)
    steps = [observation]
    actions, rewards = [], []
    for _ in range(50):
      action = rng.uniform(-1, 1, 4).astype(np.float32)
      observation, reward, _, _, _ = env.step(action)
      steps.append(observation)
      actions.append(action)
      rewards.append(reward)
    n = len(steps)
    episodes.append({
        rlds.OBSERVATION: {key: np.stack([o[key] for o in steps]).astype(
            np.float32) for key in her.GOAL_KEYS},
        rlds.ACTION: np.stack(actions + [np.zeros(4, np.float32)]),
        rlds.REWARD: np.array(rewards + [0.0], np.float32),
        rlds.DISCOUNT: np.ones(n, np.float32),
        rlds.IS_FIRST: np.arange(n) == 0,
        rlds.IS_LAST: np.arange(n) == n - 1,
        rlds.IS_TERMINAL: np.zeros(n, bool),
    })
  memory = memory_of(episodes)
  feed = feed_of(memory, batch_size=512, reward_fn=her.reward_fn_for(env),
                 terminated_fn=her.terminated_fn_for(env))
  batch, info = draws(feed, 2)
  expected = env.unwrapped.compute_reward(info['next_achieved_goal'],
                                          info['goal'], {})
  np.testing.assert_array_equal(batch.reward[:, 0], expected)
  assert 0 < (batch.reward[:, 0] == 0).mean() < 1
  np.testing.assert_array_equal(batch.discount[:, 0], 1.0)  # never terminal
  assert batch.observation.shape == (1024, 2, 13)
  env.close()
