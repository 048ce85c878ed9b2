"""Tests of the learners (rlds_reverb.learners): real TF-Agents agents, real
Reverb tables, real MuJoCo evaluation, on tiny data.
"""

import gymnasium as gym
import numpy as np
import pytest
import rlds
import tensorflow as tf
from tf_agents.policies import greedy_policy
from tf_agents.trajectories import time_step as ts

from rlds_reverb import recording
from rlds_reverb import tables
from rlds_reverb.acting import envs
from rlds_reverb.acting import evaluation
from rlds_reverb.acting import numpy_policy
from rlds_reverb.learners import agents
from rlds_reverb.learners import export
from rlds_reverb.learners import loop
from rlds_reverb.learners import offline_data

ENV_ID = 'HalfCheetah-v5'
EPISODES, LIMIT = 3, 30


@pytest.fixture(scope='module')
def specs():
  return envs.env_specs(ENV_ID)


@pytest.fixture(scope='module')
def dataset_dir(tmp_path_factory):
  out = tmp_path_factory.mktemp('data') / 'hc'
  recording.generate_dataset(ENV_ID, 'random', EPISODES, str(out), seed=3,
                             max_episode_steps=LIMIT, show_progress=False)
  return str(out)


def _rlds(steps_per_episode, dtype=np.float64, obs_size=17, act_size=6,
          observation=None):
  """In-memory RLDS episodes with the given dtype (float64: D4RL v1 style)."""
  episodes = []
  for n in steps_per_episode:
    rng = np.random.default_rng(n)
    steps = {
        'observation': (observation[:n] if observation is not None else
                        rng.normal(size=(n, obs_size)).astype(dtype)),
        'action': rng.uniform(-1, 1, (n, act_size)).astype(dtype),
        'reward': rng.normal(size=n).astype(dtype),
        'discount': np.ones(n, dtype),
        'is_first': np.arange(n) == 0, 'is_last': np.arange(n) == n - 1,
        'is_terminal': np.zeros(n, bool)}
    episodes.append(tf.data.Dataset.from_tensors(
        {rlds.STEPS: tf.data.Dataset.from_tensor_slices(steps)}))
  out = episodes[0]
  for e in episodes[1:]:
    out = out.concatenate(e)
  return out


@pytest.mark.parametrize(
    'kind', [k for k in agents.AGENTS if k not in agents.DISCRETE_AGENTS])
def test_numpy_policy_is_the_tf_agents_greedy_policy(kind, specs, tmp_path):
  agent = agents.make_agent(kind, specs.time_step_spec, specs.action_spec)
  policy = export.from_network(agents.actor_network(agent),
                               agents.HEAD[kind], specs.action_spec)
  obs = np.random.default_rng(0).normal(size=(8, 17)).astype(np.float32)
  step = ts.restart(tf.constant(obs), batch_size=8)
  expected = greedy_policy.GreedyPolicy(agent.policy).action(step).action
  np.testing.assert_allclose(policy.greedy(obs), expected.numpy(), atol=1e-5)
  policy.save(str(tmp_path / 'p.npz'))
  loaded = numpy_policy.load(str(tmp_path / 'p.npz'))
  np.testing.assert_array_equal(loaded.greedy(obs), policy.greedy(obs))


def test_sampled_actions_have_the_tf_agents_log_prob(specs):
  agent = agents.make_agent('sac', specs.time_step_spec, specs.action_spec)
  policy = export.from_network(agents.actor_network(agent),
                               'tanh_normal', specs.action_spec)
  obs = np.random.default_rng(1).normal(size=(16, 17)).astype(np.float32)
  actions, log_probs = policy.sample(obs, np.random.default_rng(2))
  distribution = agent.collect_policy.distribution(
      ts.restart(tf.constant(obs), batch_size=16)).action
  np.testing.assert_allclose(log_probs, distribution.log_prob(actions),
                             rtol=1e-4, atol=1e-4)
  assert np.all(np.abs(actions) <= 1.0)


def test_policy_file_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match='no policy file'):
    numpy_policy.load(str(tmp_path / 'missing.npz'))
  np.savez(tmp_path / 'other.npz', x=np.zeros(2))
  with pytest.raises(ValueError, match='not a policy file'):
    numpy_policy.load(str(tmp_path / 'other.npz'))


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


def test_float64_data_is_cast_to_float32_and_sampled(specs):
  rlds_data = offline_data.check_and_cast(_rlds([5, 7]), specs)
  step_spec = rlds_data.element_spec[rlds.STEPS].element_spec
  for field in ('observation', 'action', 'reward', 'discount'):
    assert step_spec[field].dtype == tf.float32, field
  first = next(iter(rlds_data))[rlds.STEPS]
  original = next(iter(_rlds([5])))[rlds.STEPS]
  np.testing.assert_allclose(
      next(iter(first))['observation'],
      next(iter(original))['observation'].numpy().astype(np.float32))


@pytest.mark.parametrize('change, message', [
    (dict(obs_size=11), "'observation' has shape \\[11\\] but env "
     'HalfCheetah-v5 needs \\[17\\]'),
    (dict(act_size=3), "'action' has shape \\[3\\]"),
])
def test_data_that_does_not_fit_the_env_is_refused(specs, change, message):
  with pytest.raises(ValueError, match=message):
    offline_data.check_and_cast(_rlds([4], **change), specs)


def test_a_field_that_cannot_be_cast_is_named(specs):
  steps = _rlds([4]).map(lambda e: {rlds.STEPS: e[rlds.STEPS].map(
      lambda s: {**s, 'reward': tf.strings.as_string(s['reward'])})})
  with pytest.raises(ValueError, match="'reward' has dtype string, which "
                     'cannot be cast to float32'):
    offline_data.check_and_cast(steps, specs)


def test_the_table_holds_the_whole_dataset(specs, dataset_dir):
  from rlds_reverb import datasets  # pylint: disable=g-import-not-at-top
  rlds_data = offline_data.check_and_cast(datasets.load(dataset_dir), specs)
  spec = offline_data.convert.create_trajectory_data_spec(rlds_data)
  server = tables.start_server([tables.make_table(
      'rlds', spec, max_size=offline_data.UNBOUNDED_TABLE_SIZE)])
  try:
    address = f'localhost:{server.port}'
    data = offline_data.push_to_new_table(
        rlds_data, server.localhost_client(), address, 'rlds')
    # One 2-step item per env transition: every transition is there.
    assert data.table_size == EPISODES * LIMIT
    assert data.pushed.steps == EPISODES * (LIMIT + 1)
    batch = next(iter(offline_data.sample_batches(data, 64)))
    assert batch.observation.shape == (64, 2, 17)
    assert batch.observation.dtype == tf.float32
    mean, std = offline_data.observation_stats(data, num_samples=2000,
                                               batch_size=500)
    stored = np.concatenate([
        e[rlds.STEPS].batch(1000).get_single_element()['observation'][:-1]
        for e in rlds_data])
    np.testing.assert_allclose(mean, stored.mean(0), atol=0.15 * stored.std(
        0).max())
    assert np.all(std > 0)
  finally:
    server.stop()


def test_a_full_table_fails_instead_of_evicting(specs, dataset_dir):
  from rlds_reverb import datasets  # pylint: disable=g-import-not-at-top
  rlds_data = offline_data.check_and_cast(datasets.load(dataset_dir), specs)
  spec = offline_data.convert.create_trajectory_data_spec(rlds_data)
  server = tables.start_server([tables.make_table('rlds', spec, max_size=10)])
  try:
    with pytest.raises(RuntimeError, match='evicted data'):
      offline_data.push_to_new_table(rlds_data, server.localhost_client(),
                                     f'localhost:{server.port}', 'rlds')
  finally:
    server.stop()


def _fixed_batch(batch_size=64, seed=0):
  """A [B, 2] Trajectory batch of random HalfCheetah-shaped transitions."""
  from tf_agents.trajectories import trajectory  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  obs = rng.normal(size=(batch_size, 2, 17)).astype(np.float32)
  return trajectory.Trajectory(
      step_type=tf.constant([[0, 1]] * batch_size, tf.int32),
      observation=tf.constant(obs),
      action=tf.constant(rng.uniform(-0.9, 0.9, (batch_size, 2, 6)),
                         tf.float32),
      policy_info=(),
      next_step_type=tf.constant([[1, 1]] * batch_size, tf.int32),
      reward=tf.constant(rng.normal(size=(batch_size, 2)), tf.float32),
      discount=tf.ones((batch_size, 2), tf.float32))


@pytest.mark.parametrize('kind, loss_field', [
    ('bc', None), ('td3_bc', 'critic_loss'), ('cql_sac', 'critic_loss')])
def test_loss_falls_on_a_fixed_batch(kind, loss_field, specs):
  tf.random.set_seed(0)
  agent = agents.make_agent(kind, specs.time_step_spec, specs.action_spec,
                            agents.AgentConfig(cql_bc_steps=0))
  batch = _fixed_batch()
  train = tf.function(agent.train)

  def loss():
    info = train(batch)
    return float(info.loss if loss_field is None else
                 getattr(info.extra, loss_field))

  first = np.mean([loss() for _ in range(3)])
  for _ in range(150):
    loss()
  last = np.mean([loss() for _ in range(3)])
  assert last < 0.5 * first, (first, last)


def test_td3_bc_actor_imitates_when_the_q_term_is_off(specs):
  agent = agents.make_agent('td3_bc', specs.time_step_spec, specs.action_spec,
                            agents.AgentConfig(td3_bc_alpha=0.0))
  batch = _fixed_batch(32)
  train = tf.function(agent.train)
  actor = agents.actor_network(agent)
  error = lambda: float(tf.reduce_mean(tf.square(
      actor(batch.observation[:, 0])[0] - batch.action[:, 0])))
  before = error()
  for _ in range(300):
    train(batch)
  assert error() < 0.2 * before


def _optimized_variables(agent):
  """optimizer attribute -> the variables it trains."""
  # pylint: disable=protected-access
  actor = agents.actor_network(agent).trainable_variables
  found = {'_optimizer': actor} if hasattr(agent, '_optimizer') else {
      '_actor_optimizer': actor,
      '_critic_optimizer': (agent._critic_network_1.trainable_variables +
                            agent._critic_network_2.trainable_variables)}
  if hasattr(agent, '_alpha_optimizer'):
    found['_alpha_optimizer'] = [agent._log_alpha]
  return {name: (getattr(agent, name), variables)
          for name, variables in found.items()}


def _state(agent):
  """Agent variables by position; Adam slots and step count per variable."""
  state = {f'agent/{i}': v.numpy() for i, v in enumerate(agent.variables)}
  for name, (optimizer, variables) in _optimized_variables(agent).items():
    state[f'{name}/iterations'] = optimizer.iterations.numpy()
    for i, variable in enumerate(variables):
      for slot in ('m', 'v'):
        state[f'{name}/{slot}/{i}'] = optimizer.get_slot(variable,
                                                         slot).numpy()
  return state


@pytest.mark.parametrize('kind', ['bc', 'td3_bc', 'cql_sac'])
def test_checkpoint_restores_weights_and_optimizer_state(kind, specs,
                                                        tmp_path):
  make = lambda: agents.make_agent(kind, specs.time_step_spec,
                                   specs.action_spec)
  batch = _fixed_batch(32)
  agent = make()
  learner = loop.Learner(agent, str(tmp_path))
  iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
  learner.train(iterator, 7)
  learner.env_steps.assign(123)
  learner.save()
  saved = _state(agent)
  assert sum('/m/' in k for k in saved) > 4

  fresh = make()
  restored = loop.Learner(fresh, str(tmp_path))
  assert restored.restore()
  # Slots appear on first use; restoring fills them as they are made.
  for optimizer, variables in _optimized_variables(fresh).values():
    optimizer._create_all_weights(variables)  # pylint: disable=protected-access
  assert restored.train_step == 7
  assert int(restored.env_steps.numpy()) == 123
  got = _state(fresh)
  assert got.keys() == saved.keys()
  for name, value in saved.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)
  if kind == 'bc':  # Deterministic: the next step is identical too.
    learner.train(iterator, 1)
    restored.train(iter(tf.data.Dataset.from_tensors(batch).repeat()), 1)
    for name, value in _state(agent).items():
      np.testing.assert_allclose(_state(fresh)[name], value, rtol=1e-6,
                                 err_msg=name)


def test_cql_behaviour_cloning_warm_up_follows_the_config(specs):
  # A short budget needs a shorter warm-up than the D4RL config's 10k.
  agent = agents.make_agent('cql_sac', specs.time_step_spec,
                            specs.action_spec,
                            agents.AgentConfig(cql_bc_steps=7))
  assert agent._num_bc_steps == 7  # pylint: disable=protected-access
  default = agents.make_agent('cql_sac', specs.time_step_spec,
                              specs.action_spec)
  assert default._num_bc_steps == 10_000  # pylint: disable=protected-access


def test_unknown_agent_is_refused(specs):
  with pytest.raises(ValueError, match="unknown agent 'ppo'"):
    agents.make_agent('ppo', specs.time_step_spec, specs.action_spec)


def test_env_errors():
  with pytest.raises(ValueError, match="cannot make env 'NoSuchEnv-v0'"):
    envs.env_specs('NoSuchEnv-v0')
  with pytest.raises(ValueError, match='observation space must be a Box'):
    envs.env_specs('FrozenLake-v1')
  cartpole = envs.env_specs('CartPole-v1')  # Discrete actions: int64 0..1.
  assert cartpole.discrete and cartpole.action_spec.dtype == tf.int64
  assert (cartpole.action_spec.minimum, cartpole.action_spec.maximum) == (0, 1)


def test_offline_training_reads_an_existing_float64_table(tmp_path):
  """--reverb_address: a table someone else filled, cast when sampled."""
  from rlds_reverb import convert  # pylint: disable=g-import-not-at-top
  from rlds_reverb import push  # pylint: disable=g-import-not-at-top
  from rlds_reverb.learners import offline  # pylint: disable=g-import-not-at-top
  # D4RL v1 replay style: float64 steps (TF-Agents' spec keeps discount
  # float32, so that one stays).
  rlds_data = _rlds([40, 30]).map(lambda e: {rlds.STEPS: e[rlds.STEPS].map(
      lambda s: {**s, 'discount': tf.cast(s['discount'], tf.float32)})})
  spec = convert.create_trajectory_data_spec(rlds_data)
  assert spec.observation.dtype == tf.float64
  server = tables.start_server([tables.make_table('d4rl', spec,
                                                  max_size=1000)])
  try:
    push.push_rlds_to_table(rlds_data, server.localhost_client(), 'd4rl')
    address = f'localhost:{server.port}'
    summary = offline.train_offline(offline.OfflineConfig(
        agent='bc', dataset=address, reverb_address=address, table='d4rl',
        root_dir=str(tmp_path / 'run'), train_steps=40, batch_size=16,
        eval_interval=40, checkpoint_interval=40, eval_episodes=1,
        feed='stream'),
                                    show_progress=False)
    assert summary['table_size'] == 39 + 29
    assert summary['train_steps'] == 40
    assert np.isfinite(summary['offline_normalized_score'])
    # The run did not push: the table is as it was.
    assert tables.get_table_info(server.localhost_client(),
                                 'd4rl').current_size == 68
  finally:
    server.stop()
