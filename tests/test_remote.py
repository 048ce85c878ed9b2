"""Tests of rlds_reverb/acting/remote.py: an actor against a real server.

InvertedPendulum-v5 (MuJoCo): episodes of a few steps under uniform or
constant actions, so each test runs many whole episodes in a second or two.
"""

import threading
import time
import warnings

import numpy as np
import pytest
import reverb

from rlds_reverb.storage import tables
from rlds_reverb.acting import envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.acting import remote
from rlds_reverb.acting import sender
from rlds_reverb.experiments import run
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import variables
from rlds_reverb.replay import variants

ENV = 'InvertedPendulum-v5'


@pytest.fixture(scope='module')
def pendulum():
  return envs.env_specs(ENV)


@pytest.fixture
def client(pendulum):
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')  # Listening on every interface.
    server = tables.start_server(
        remote.make_tables(run.trajectory_spec(pendulum), max_episodes=10_000)
        + [reverb.Table.queue('queue', 10)])
  yield server.localhost_client()
  server.stop()


def _constant(specs, value: float) -> numpy_policy.NumpyPolicy:
  """A deterministic policy whose action is `value` (scaled), always."""
  return numpy_policy.NumpyPolicy(
      'deterministic', [np.zeros((4, 1), np.float32)],
      [np.full(1, np.arctanh(value / 3.0), np.float32)],
      specs.action_low, specs.action_high)


def _actor(client, pendulum, **config) -> remote.Actor:
  # A generous deadline for a live server: under the suite's load a first
  # call can take seconds. Tests of dead servers and waits pass their own.
  config = {'initial_random_steps': 0, 'exploration_noise': 0.0,
            'timeout_s': 30.0, **config}
  return remote.Actor(remote.ActorConfig(ENV, **config), client,
                      data_spec=run.trajectory_spec(pendulum),
                      head='deterministic')


def test_writes_whole_episodes_the_learner_can_read(client, pendulum):
  actor = _actor(client, pendulum, initial_random_steps=200,
                 max_env_steps=200, max_unread_episodes=1000)
  episodes = []
  stats = actor.run(on_episode=lambda e, version: episodes.append(
      (e, version)))
  actor.close()
  assert stats.stopped == 'max_env_steps' and stats.env_steps == 200
  assert stats.episodes == stats.episodes_written == len(episodes) > 5
  assert stats.episodes_unconfirmed == 0 and stats.policy_version is None
  assert {version for _, version in episodes} == {None}  # Random actions.
  read = episode_table.EpisodeReader(client, 'online').read_all()
  assert len(read) == len(episodes)
  assert sender.unread_episodes(client, 'online') == 0
  # T + 1 RLDS steps per episode of T env steps, actions in bounds.
  assert (sum(len(e.data.reward) for e in read) ==
          sum(e.num_steps + 1 for e, _ in episodes))
  actions = np.concatenate([e.data.action for e in read])
  assert actions.shape[1:] == (1,) and np.all(np.abs(actions) <= 3.0)
  # The pendulum falls: terminal, so the step into it has discount 0.
  assert all(e.data.discount[-2] == 0.0 for e in read)


def test_a_learner_memory_counts_the_env_steps_it_read(client, pendulum):
  """What the learner side does: start, then poll what actors wrote since."""
  replay = variants.UniformReplay(variants.Settings(
      table='online', data_spec=run.trajectory_spec(pendulum), batch_size=4,
      capacity=10_000, max_episodes=10_000))
  taken = []
  for seed in (1, 2):
    actor = _actor(client, pendulum, initial_random_steps=60,
                   max_env_steps=60, max_unread_episodes=1000, seed=seed)
    actor.run(on_episode=lambda e, version: taken.append(e.num_steps))
    actor.close()
    if replay.memory is None:
      replay.start(client)
    else:
      assert replay.poll() > 0
    assert replay.transitions_read == sum(taken)
  assert int(replay.memory.num_transitions) == sum(taken)


def test_takes_newly_published_weights(client, pendulum):
  variables.publish(client, _constant(pendulum, 2.0), 1)
  episodes = []

  def on_episode(episode, version):
    episodes.append((version, episode.steps['action'][:-1]))
    if len(episodes) == 10:  # The learner moves on.
      variables.publish(client, _constant(pendulum, -2.0), 7)

  actor = _actor(client, pendulum, max_env_steps=300,
                 policy_refresh_steps=10, max_unread_episodes=1000)
  stats = actor.run(on_episode=on_episode)
  actor.close()
  assert stats.policy_version == 7 and stats.policy_updates == 2
  versions = [version for version, _ in episodes]
  assert versions[0] == 1 and versions[-1] == 7
  assert versions == sorted(versions)
  for version, actions in episodes:
    if version == 1:
      np.testing.assert_allclose(actions, 2.0, rtol=1e-5)
  # Whole episodes under version 7 act with it.
  np.testing.assert_allclose(episodes[-1][1], -2.0, rtol=1e-5)
  # 30 refreshes, 2 publications: only a new publication is sampled (a
  # look at the insert count does for the rest).
  info = tables.get_table_info(client, variables.TABLE)
  assert info.rate_limiter_info.sample_stats.completed == 2


def test_paced_actor_keeps_its_share_of_the_learners_schedule(client,
                                                              pendulum):
  """Two paced actors of InvertedPendulum (1000-step time limit): each
  may run one episode's length past half the env steps the learner's
  publication calls for, counted from where it joined on the steps of
  finished episodes (so it holds at the first episode end past that)."""
  variables.publish(client, _constant(pendulum, 1.0), 1,
                    info={'collect_target': 1000})
  actor = _actor(client, pendulum, actors=2, max_env_steps=5000,
                 policy_refresh_steps=10, max_unread_episodes=1000)
  stop, held, result, lengths = threading.Event(), [], {}, []

  def on_wait(kind, _):
    if kind == 'pace':
      held.append(actor.stats.env_steps)

  def held_from(steps: int) -> bool:
    """Held at the first episode end at or past `steps`."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
      if held and steps <= held[-1] < steps + max(lengths):
        return True
      time.sleep(0.05)
    return False

  def act():
    result['stats'] = actor.run(
        should_stop=stop.is_set, on_wait=on_wait,
        on_episode=lambda e, _: lengths.append(e.num_steps))

  thread = threading.Thread(target=act, daemon=True)
  thread.start()
  try:
    # Joined at 1000 / 2: one time limit (1000 steps) of lead, then held.
    assert pendulum.max_episode_steps == 1000
    assert held_from(1000), held[-3:]
    first_hold = held[-1]
    # The learner moves on: 400 more env steps called for, 200 per actor.
    variables.publish(client, _constant(pendulum, 1.0), 2,
                      info={'collect_target': 1400})
    assert held_from(1200), held[-3:]
  finally:
    stop.set()
    thread.join(timeout=60)
    actor.close()
  # Short episodes (the constant action tips the pole over in a few steps).
  assert max(lengths) < 100
  assert set(held) <= {first_hold, held[-1]} and held[-1] < 1200 + max(lengths)
  assert result['stats'].policy_version == 2


def _balancing(specs, gains) -> numpy_policy.NumpyPolicy:
  """A linear controller, 3 tanh(gains . observation): with these gains
  the pole stays up for hundreds of steps."""
  return numpy_policy.NumpyPolicy(
      'deterministic', [np.asarray(gains, np.float32).reshape(4, 1)],
      [np.zeros(1, np.float32)], specs.action_low, specs.action_high)


def test_paced_actor_never_strands_a_learner_behind_its_target(client,
                                                               pendulum):
  """A learner whose count is behind the target it publishes (a resumed
  one's can be, by up to a phase) and an actor of long episodes (about
  270 steps, against a lead of 1000): the actor holds only with every
  step it counts written, so the learner always reaches its target and
  both move on. (Counting the episode running at the hold, as the actor
  once did, stranded both within a few holds.)"""
  gap = 900  # Target minus the learner's count; under the 1000-step lead.
  variables.publish(client, _balancing(pendulum, [0, 5, 0, 1]), 1,
                    info={'collect_target': gap})
  actor = _actor(client, pendulum, actors=1, policy_refresh_steps=10,
                 max_unread_episodes=1000)
  replay = variants.UniformReplay(variants.Settings(
      table='online', data_spec=run.trajectory_spec(pendulum), batch_size=4,
      capacity=20_000, max_episodes=10_000))
  stop, result, lengths = threading.Event(), {}, []

  def act():
    result['stats'] = actor.run(
        should_stop=stop.is_set,
        on_episode=lambda e, _: lengths.append(e.num_steps))

  thread = threading.Thread(target=act, daemon=True)
  thread.start()
  target, version, published_at = gap, 1, [gap]
  try:
    deadline = time.monotonic() + 90
    while replay.transitions_read < 6000 and time.monotonic() < deadline:
      if replay.memory is None:
        replay.start(client)
      else:
        replay.poll()
      if replay.transitions_read >= target:  # A phase trains; publish.
        target, version = replay.transitions_read + gap, version + 1
        published_at.append(target)
        variables.publish(client, _balancing(pendulum, [0, 5, 0, 1]),
                          version, info={'collect_target': target})
      time.sleep(0.05)
  finally:
    stop.set()
    thread.join(timeout=60)
    actor.close()
  assert replay.transitions_read >= 6000, (replay.transitions_read,
                                           published_at[-3:])
  assert len(published_at) >= 5 and np.mean(lengths) > 150
  # Still paced: never more than the lead and an episode past the target.
  assert result['stats'].env_steps < target + 1000 + max(lengths)


def test_holds_back_while_the_learner_has_unread_episodes(client, pendulum):
  reader = episode_table.EpisodeReader(client, 'online')
  seen = []

  def on_wait(kind, value):
    """The learner: reads one episode each time the actor waits for it
    (a slow write on a loaded machine is a wait of another kind)."""
    if kind == 'write':
      return
    assert kind == 'unread'
    seen.append(value)
    assert sender.unread_episodes(client, 'online') <= 2
    reader.read_new(1)

  actor = _actor(client, pendulum, initial_random_steps=40,
                 max_env_steps=40, max_unread_episodes=2)
  stats = actor.run(on_wait=on_wait)
  actor.close()
  assert seen and max(seen) == 2
  assert stats.episodes_written == stats.episodes > 3
  assert stats.waiting_s > 0


def test_stop_counts_what_was_not_written(client, pendulum):
  """Nobody reads: the actor holds 2 episodes; a stop leaves the rest."""
  calls = []
  # The stop counts waits on the full table only: a slow write under the
  # suite's load is a wait of another kind and must not end the run early.
  actor = _actor(client, pendulum, initial_random_steps=10_000,
                 max_unread_episodes=2)
  stats = actor.run(should_stop=lambda: calls.count('unread') >= 3,
                    on_wait=lambda kind, value: calls.append(kind))
  actor.close()
  assert stats.stopped == 'stop requested'
  assert stats.episodes_written == 2
  assert stats.episodes_unconfirmed == stats.episodes - 2 >= 2


def test_waits_for_first_weights_a_bounded_time(client, pendulum):
  actor = _actor(client, pendulum, weights_timeout_s=0.5)
  start = time.monotonic()
  with pytest.raises(TimeoutError, match="no policy weights in table "
                     "'variables' at localhost:.* after"):
    actor.run()
  assert time.monotonic() - start < 5
  actor.close()


def test_refuses_weights_of_another_agent(client, pendulum):
  variables.publish(client, _constant(pendulum, 1.0), 3)
  actor = remote.Actor(remote.ActorConfig(ENV, initial_random_steps=0),
                       client, head='tanh_normal')
  with pytest.raises(ValueError, match="version 3 .* head 'deterministic', "
                     "not 'tanh_normal'"):
    actor.run()
  actor.close()


def test_refuses_tables_it_cannot_write(client, pendulum, specs):
  with pytest.raises(ValueError, match="'queue' samples fifo: it is not an "
                     'episode table'):
    remote.Actor(remote.ActorConfig(ENV, table='queue'), client)
  with pytest.raises(ValueError, match='signature spec should match'):
    remote.Actor(remote.ActorConfig(ENV), client,
                 data_spec=run.trajectory_spec(specs))  # HalfCheetah's.
  with pytest.raises(ValueError, match="'queue' keeps 10 items"):
    remote.Actor(remote.ActorConfig(ENV, variables_table='queue'), client)
  with pytest.raises(tables.TableNotFoundError, match="no table 'nope'"):
    remote.Actor(remote.ActorConfig(ENV, table='nope'), client)
  with pytest.raises(tables.TableNotFoundError, match="no table 'nope'"):
    sender.unread_episodes(client, 'nope')
  with pytest.raises(ValueError, match='max_unread_episodes must be >= 1'):
    remote.Actor(remote.ActorConfig(ENV, max_unread_episodes=0), client)


def test_a_stopped_server_ends_the_run_within_the_deadline(pendulum):
  with warnings.catch_warnings():
    warnings.simplefilter('ignore')
    server = tables.start_server(remote.make_tables(
        run.trajectory_spec(pendulum), max_episodes=100))
  client = reverb.Client(f'localhost:{server.port}')
  actor = _actor(client, pendulum, initial_random_steps=10_000,
                 max_unread_episodes=1000, timeout_s=1.0)
  stopped = []

  def on_episode(episode, version):
    del episode, version
    if not stopped and actor.stats.episodes >= 3:
      server.stop()
      stopped.append(time.monotonic())

  with pytest.raises(tables.ServerUnavailableError,
                     match=f'localhost:{server.port}'):
    actor.run(on_episode=on_episode)
  assert time.monotonic() - stopped[0] < 8
  actor.close()
