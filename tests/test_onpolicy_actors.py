"""PPO / A2C actor processes (acting/rollout_actor.py) and their learner
(experiments/onpolicy.py with num_actors 0).

One real Reverb server holds the rollout queue and the weights table (what
`pipelines.serve --env ENV --rollouts` starts); actors from
`onpolicy.make_actor` run on threads, as `pipelines.act --agent ppo`
processes would, and `train_onpolicy(num_actors=0)` learns from their
rollouts. Checked: every rollout is read once and counted on the learner's
clock, the actors act with the weights and statistics the learner
publishes, the learner's statistics cover what the actors saw, and a rerun
resumes.
"""

import dataclasses
import json
import os
import threading
import time

import numpy as np
import pytest

from rlds_reverb.acting import numpy_policy
from rlds_reverb.acting import rollout_actor
from rlds_reverb.agents.onpolicy import normalization
from rlds_reverb.experiments import distributed
from rlds_reverb.experiments import onpolicy
from rlds_reverb.replay import variables
from rlds_reverb.storage import tables
import preloaded_cli  # pylint: disable=g-bad-import-order

ENV = 'CartPole-v1'


def _config(root_dir, port, **overrides):
  values = dict(
      agent='ppo', env=ENV, root_dir=str(root_dir), env_steps=1024,
      eval_interval=1024, eval_episodes=2, checkpoint_interval=1024,
      num_actors=0, reverb_address=f'localhost:{port}',
      actor_wait_s=60,  # An actor thread that dies fails, not hangs.
      ppo_config=onpolicy.ppo.PpoConfig(
          algorithm='ppo', num_envs=2, rollout_steps=64, epochs=2,
          minibatches=2, hidden=(16, 16)))
  values.update(overrides)
  return onpolicy.OnPolicyConfig(**values)


def _train_with_actors(client, config, seeds):
  actors = [onpolicy.make_actor(
      config.agent, rollout_actor.RolloutActorConfig(
          env=ENV, seed=seed, weights_timeout_s=120.0), client)
            for seed in seeds]
  stop, results = threading.Event(), {}

  def act(actor):
    try:
      results[actor.config.seed] = actor.run(should_stop=stop.is_set)
    except BaseException as e:  # pylint: disable=broad-except
      results['error'] = e

  threads = [threading.Thread(target=act, args=(actor,), daemon=True)
             for actor in actors]
  for thread in threads:
    thread.start()
  try:
    record = onpolicy.train_onpolicy(config, show_progress=False)
  finally:
    stop.set()
    for thread in threads:
      thread.join(timeout=60)
    for actor in actors:
      actor.close()
  assert 'error' not in results, results.get('error')
  return record, [results[seed] for seed in seeds]


@pytest.fixture
def served():
  started = tables.start_server(onpolicy.make_actor_tables())
  yield started
  started.stop()


def test_two_actors_feed_one_learner_and_it_resumes(served, tmp_path):
  client = served.localhost_client()
  config = _config(tmp_path, served.port)
  record, stats = _train_with_actors(client, config, seeds=(1, 2))
  rollout_size = 2 * 64
  # The clock counts rollouts read, each once: 1024 env steps = 8 of them.
  assert record['env_steps'] == 1024
  written = sum(s.rollouts for s in stats)
  left = tables.get_table_info(client, onpolicy.ROLLOUT_TABLE).current_size
  assert written == 1024 // rollout_size + left
  # Both actors took part, and acted with weights the learner published
  # after updates (versions count updates).
  assert all(s.rollouts >= 1 for s in stats)
  assert max(s.policy_version for s in stats) >= 1
  published = variables.fetch(client)
  assert published.version == 1024 // rollout_size
  assert published.info['rollout_steps'] == 64
  # The learner's statistics hold every observation the actors sent: each
  # rollout's 128 plus each actor's 2 reset observations.
  obs_count = float(published.weights['statistics_obs_count'])
  assert obs_count == pytest.approx(
      1e-4 + 1024 + 2 * 2 + 0, abs=2 * rollout_size + 1)
  with open(os.path.join(tmp_path, 'config.json')) as f:
    assert json.load(f)['num_actors'] == 0
  # A rerun with a larger budget resumes where the checkpoint stands.
  second, _ = _train_with_actors(
      client, _config(tmp_path, served.port, env_steps=1536,
                      eval_interval=512), seeds=(3,))
  assert second['env_steps'] == 1536
  assert variables.fetch(client).version == 1536 // rollout_size


def test_learner_without_actors_stops_with_an_error(served, tmp_path):
  """No rollout ever comes: an error after `actor_wait_s`, not a wait
  for ever."""
  started = time.monotonic()
  with pytest.raises(distributed.ActorsSilentError,
                     match=r'no new rollout from the actors for \d+ s '
                           r'\(at env step 0, gradient step 0\)'):
    onpolicy.train_onpolicy(_config(tmp_path, served.port, actor_wait_s=2),
                            show_progress=False)
  assert time.monotonic() - started < 120  # Bounded, where a hang is not.
  # The first weights went out before the wait, as actors need them.
  assert variables.fetch(served.localhost_client()) is not None


def test_actor_statistics_merge_to_the_single_stream():
  """Moments sent by two actors and merged equal the statistics of all
  their observations in one stream."""
  rng = np.random.default_rng(0)
  learner = normalization.Normalization((3,), 1, gamma=0.9)
  one = normalization.Normalization((3,), 1, gamma=0.9)
  for scale in (1.0, 5.0):
    actor = normalization.Normalization((3,), 1, gamma=0.9)
    actor.set_state(learner.state())
    batch = rng.normal(2.0, scale, (50, 3))
    for row in batch:
      actor.observation(row[None], update=True)
      one.observation(row[None], update=True)
    learner.merge(actor.take_added())
  np.testing.assert_allclose(learner.observations.mean,
                             one.observations.mean, rtol=1e-9)
  np.testing.assert_allclose(learner.observations.var,
                             one.observations.var, rtol=1e-9)
  # take_added starts a new tally.
  assert float(actor.take_added()['obs_count']) == 0.0


def test_learner_of_actor_processes_needs_its_tables(tmp_path):
  started = tables.start_server([variables.make_table()])
  try:
    with pytest.raises(ValueError, match="no table 'rollouts'"):
      onpolicy.train_onpolicy(_config(tmp_path, started.port),
                              show_progress=False)
  finally:
    started.stop()
  assert not os.path.exists(os.path.join(tmp_path, 'config.json'))


@pytest.mark.parametrize('overrides, message', [
    (dict(reverb_address=''), 'give the reverb_address'),
    (dict(gail_dataset='x'), 'do not run GAIL yet'),
    (dict(num_actors=1), 'reverb_address is for num_actors 0'),
])
def test_learner_of_actor_processes_settings(tmp_path, overrides, message):
  with pytest.raises(ValueError, match=message):
    onpolicy.train_onpolicy(_config(tmp_path, 1, **overrides),
                            show_progress=False)


def test_actor_refuses_weights_of_another_env(served):
  client = served.localhost_client()
  actor = onpolicy.make_actor('ppo', rollout_actor.RolloutActorConfig(
      env='Pendulum-v1', weights_timeout_s=5.0), client)
  learner_norm = normalization.Normalization((4,), 1, gamma=0.99)
  cartpole = numpy_policy.NumpyPolicy(
      head='categorical', kernels=[np.zeros((4, 2), np.float32)],
      biases=[np.zeros(2, np.float32)], action_low=np.array(0),
      action_high=np.array(1))
  rollout_actor.publish(client, cartpole, learner_norm.state(), 0, {
      'num_envs': 1, 'rollout_steps': 8, 'gamma': 0.99,
      'observation_clip': 10.0, 'reward_clip': 10.0})
  try:
    with pytest.raises(ValueError, match="head 'categorical', not 'gaussian'"):
      actor.run(should_stop=lambda: False)
  finally:
    actor.close()


_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize('module, args, message', [
    ('train', ['--agent', 'ppo', '--num_actors', '0'],
     'pass --reverb_address of their server (pipelines.serve --env ENV '
     '--rollouts)'),
    ('train', ['--agent', 'ppo', '--reverb_address', 'localhost:1'],
     'or learn from actor processes: --num_actors 0'),
    ('act', ['--agent', 'ppo', '--reverb_address', 'localhost:1',
             '--run_dir', '/tmp/x', '--epsilon', '0.2'],
     '--epsilon: not a setting of --agent ppo actors'),
    ('act', ['--agent', 'sac', '--reverb_address', 'localhost:1',
             '--run_dir', '/tmp/x', '--max_unread_rollouts', '2'],
     '--max_unread_rollouts: not a setting of --agent sac actors'),
    ('serve', ['--env', ENV, '--rollouts', '--max_size', '5'],
     '--max_size does not apply to --rollouts'),
])
def test_command_lines_of_onpolicy_actor_processes(module, args, message):
  # Refused before any work: a fork of the preloaded interpreter.
  if module != 'serve':
    args = ['--env', ENV, *args]
  result = preloaded_cli.run(module, *args, env=os.environ, cwd=_REPO,
                             timeout_s=120)
  assert result.returncode == 2, result.stderr
  assert message in result.stderr.strip().splitlines()[-1]
