"""A learner fed by an actor it does not run (experiments/distributed.py).

One real Reverb server holds the episode and weights tables of a CartPole
run (what `pipelines.serve --env` starts); an `acting.remote.Actor` writes
episodes from a thread, as a `pipelines.act` process would, and
`online.train_online(num_actors=0)` learns from them and publishes its
weights. Checked: the learner's env-step clock is what the actor wrote, its
gradient steps follow the single-process schedule, and the actor acts with
weights the learner published.
"""

import dataclasses
import json
import os
import threading
import time

import pytest

from rlds_reverb.storage import tables
from rlds_reverb.acting import envs
from rlds_reverb.acting import remote
from rlds_reverb.experiments import distributed
from rlds_reverb.experiments import online
from rlds_reverb.experiments import run
from rlds_reverb.replay import variables
import preloaded_cli  # pylint: disable=g-bad-import-order

ENV = 'CartPole-v1'


@pytest.fixture
def server():
  spec = run.trajectory_spec(envs.env_specs(ENV))
  started = tables.start_server(remote.make_tables(spec))
  yield started
  started.stop()


def _config(root_dir, port, **overrides):
  values = dict(env=ENV, root_dir=str(root_dir), agent='dqn', env_steps=800,
                initial_collect_steps=300, batch_size=32, train_every=100,
                utd=0.5, eval_interval=800, eval_episodes=2,
                checkpoint_interval=800, replay_size=10_000, num_actors=0,
                reverb_address=f'localhost:{port}', publish_every=50,
                # An actor thread that dies fails the test, not hangs it.
                actor_wait_s=60)
  values.update(overrides)
  return online.OnlineConfig(**values)


def test_learner_trains_on_what_a_remote_actor_writes(server, tmp_path):
  client = server.localhost_client()
  record, stats = _run_with_actor(
      client, _config(tmp_path, server.port),
      remote.ActorConfig(env=ENV, seed=1, initial_random_steps=300,
                         policy_refresh_steps=100, max_unread_episodes=4,
                         epsilon=0.1))
  env_steps = record['env_steps']
  # The clock is what the actor wrote and the learner read: whole episodes,
  # so it ends at or just past the budget, never beyond what was written.
  assert 800 <= env_steps <= stats.env_steps
  # Single-process schedule: utd per env step from the first 300 on, in
  # whole phases of train_every * utd = 50 steps.
  expected = 0.5 * (env_steps - 300 + 100)
  assert expected - 50 <= record['train_step'] <= expected
  # The actor acted with weights the learner published after training.
  assert stats.policy_version is not None and stats.policy_version > 0
  published = variables.fetch(client)
  assert published.version % 50 == 0 and published.version > 0
  assert published.info['env_steps'] <= env_steps
  evals = [json.loads(line) for line in
           open(os.path.join(tmp_path, 'eval.jsonl'))]
  assert [e['env_steps'] for e in evals] == [env_steps]


def test_remote_learner_needs_its_server_tables(tmp_path):
  """A server without the weights table is refused before any training."""
  spec = run.trajectory_spec(envs.env_specs(ENV))
  only_episodes = tables.start_server(remote.make_tables(spec)[:1])
  try:
    with pytest.raises(tables.TableNotFoundError, match='variables'):
      online.train_online(_config(tmp_path / 'run', only_episodes.port),
                          show_progress=False)
  finally:
    only_episodes.stop()
  assert not os.path.exists(tmp_path / 'run' / 'config.json')


def test_learner_without_actors_stops_with_an_error(server, tmp_path):
  """No actor ever writes: the learner waits `actor_wait_s`, then says
  what is missing and where it stood, instead of waiting for ever."""
  started = time.monotonic()
  with pytest.raises(distributed.ActorsSilentError,
                     match=r'no new episode from the actors for \d+ s '
                           r'\(at env step 0, gradient step 0\)'):
    online.train_online(_config(tmp_path, server.port, actor_wait_s=2),
                        show_progress=False)
  # Bounded: the wait, start-up and one publication (a hang would be
  # for ever).
  assert time.monotonic() - started < 120
  # The first weights went out before the wait, as actors need them.
  assert variables.fetch(server.localhost_client()).version == 0


@pytest.mark.parametrize('overrides, message', [
    (dict(reverb_address=''), 'go together'),
    (dict(num_actors=2), 'num_actors must be 0'),
    (dict(replay='prioritized'), 'uniform replay'),
])
def test_remote_learner_settings_are_checked(tmp_path, overrides, message):
  with pytest.raises(ValueError, match=message):
    online.train_online(_config(tmp_path, 1, **overrides),
                        show_progress=False)


@pytest.mark.parametrize('args, message', [
    (['--num_actors', '0'], 'pass --reverb_address of their server'),
    (['--publish_every', '10'], '--publish_every is for --num_actors 0'),
    (['--actor_wait_s', '5'], '--actor_wait_s is for --num_actors 0'),
])
def test_train_flags_of_a_remote_learner(args, message):
  # Refused before any work: a fork of the preloaded interpreter.
  result = preloaded_cli.run(
      'train', '--agent', 'dqn', '--env', ENV, *args, env=os.environ,
      cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
      timeout_s=120)
  assert result.returncode == 2
  assert message in result.stderr.strip().splitlines()[-1]


def _run_with_actor(client, config, actor_config):
  """Trains `config` while an actor from `online.make_actor` writes."""
  actor = online.make_actor('dqn', actor_config, client)
  stop, results = threading.Event(), {}

  def act():
    try:
      results['stats'] = actor.run(should_stop=stop.is_set)
    except BaseException as e:  # pylint: disable=broad-except
      results['error'] = e

  thread = threading.Thread(target=act, daemon=True)
  thread.start()
  try:
    record = online.train_online(config, show_progress=False)
  finally:
    stop.set()
    thread.join(timeout=60)
    actor.close()
  assert 'error' not in results, results.get('error')
  return record, results['stats']


def test_learner_and_actors_from_one_builder_refresh_and_resume(tmp_path):
  """The server's tables, the actor and the learner all come from
  online.py; the actor fetches the weights the learner publishes; a rerun
  with a larger budget resumes the learner where its checkpoint stands."""
  served = tables.start_server(online.make_actor_tables(ENV))
  try:
    client = served.localhost_client()
    actor_config = remote.ActorConfig(
        env=ENV, seed=3, initial_random_steps=300, policy_refresh_steps=20,
        max_unread_episodes=4, epsilon=0.1)
    config = _config(tmp_path, served.port, publish_every=10)
    first, stats = _run_with_actor(client, config, actor_config)
    # Fresh weights: the actor saw the learner's newer versions, and the
    # learner published at every 10th gradient step, inside its phases too
    # (plus once at start).
    assert stats.policy_updates >= 2 and stats.policy_version > 0
    inserts = client.server_info()[variables.TABLE].rate_limiter_info
    assert inserts.insert_stats.completed == 1 + first['train_step'] // 10
    config = _config(tmp_path, served.port, publish_every=10, env_steps=1200,
                     eval_interval=400)
    second, _ = _run_with_actor(client, config, dataclasses.replace(
        actor_config, seed=4, initial_random_steps=0))
  finally:
    served.stop()
  assert second['env_steps'] >= 1200 > first['env_steps']
  assert second['train_step'] > first['train_step']
  with open(os.path.join(tmp_path, 'config.json')) as f:
    recorded = json.load(f)
  # The resume is on record: the budget changed, nothing else.
  changes = recorded['resumed_with_changes'][-1]['changes']
  assert set(changes) == {'env_steps', 'eval_interval'}, changes
