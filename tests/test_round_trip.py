"""generate -> load -> push -> sample: recorded MuJoCo data survives intact.

Each stage has its own tests; this one checks that they fit together: what
the table holds is exactly the recorded rollouts, converted as the contract
says, with the terminal-discount option and the TF-Agents reader on top.
"""

import numpy as np
import pytest
import reverb
import rlds
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

import rlds_reverb
from rlds_reverb.data import datasets
from rlds_reverb.data import recording

EPISODES, ENV_STEPS = 3, 15


@pytest.fixture(scope='module')
def recorded(tmp_path_factory):
  out = tmp_path_factory.mktemp('round_trip') / 'halfcheetah'
  recording.generate_dataset(
      'HalfCheetah-v5', 'random', EPISODES, str(out), seed=3,
      max_episode_steps=ENV_STEPS, show_progress=False)
  rlds_data = datasets.load(str(out))
  episodes = [
      {key: np.stack([step[key] for step in episode[rlds.STEPS]
                      .as_numpy_iterator()])
       for key in (rlds.OBSERVATION, rlds.ACTION, rlds.REWARD,
                   rlds.DISCOUNT, rlds.IS_LAST, rlds.IS_TERMINAL)}
      for episode in rlds_data]
  return rlds_data, episodes


@pytest.fixture(scope='module')
def server(recorded):
  rlds_data, _ = recorded
  signature = tensor_spec.add_outer_dim(
      rlds_reverb.create_trajectory_data_spec(rlds_data))
  server = reverb.Server([
      reverb.Table.queue('episodes', 100, signature=signature),
      reverb.Table.queue('pairs', 1000, signature=signature),
      reverb.Table('uniform', reverb.selectors.Uniform(),
                   reverb.selectors.Fifo(), 1000,
                   reverb.rate_limiters.MinSize(1), signature=signature),
  ])
  yield server
  server.stop()


def _drain(client, table):
  size = client.server_info()[table].current_size
  return [sample for sample in client.sample(
      table, num_samples=size, emit_timesteps=False, unpack_as_table_signature=True)]


def test_episode_items_hold_the_recorded_rollouts(recorded, server):
  rlds_data, episodes = recorded
  client = reverb.Client(f'localhost:{server.port}')
  steps = rlds_reverb.push_rlds_to_table(
      rlds_data, client, 'episodes', sequence_length=None)
  assert steps == EPISODES * (ENV_STEPS + 1)
  items = _drain(client, 'episodes')
  assert len(items) == EPISODES
  by_first_reward = {float(e[rlds.REWARD][0]): e for e in episodes}
  for item in items:
    traj = item.data
    recorded_episode = by_first_reward[float(traj.reward[0])]
    np.testing.assert_array_equal(traj.observation,
                                  recorded_episode[rlds.OBSERVATION])
    np.testing.assert_array_equal(traj.action, recorded_episode[rlds.ACTION])
    expected_types = [ts.StepType.FIRST] + [ts.StepType.MID] * (
        ENV_STEPS - 1) + [ts.StepType.LAST]
    np.testing.assert_array_equal(traj.step_type, expected_types)
    # Truncated by the time limit: no step is terminal, no discount is 0.
    assert not recorded_episode[rlds.IS_TERMINAL].any()
    np.testing.assert_array_equal(traj.discount, np.ones(ENV_STEPS + 1))


def test_pairs_readable_by_tf_agents_replay_buffer(recorded, server):
  rlds_data, episodes = recorded
  client = reverb.Client(f'localhost:{server.port}')
  rlds_reverb.push_rlds_to_table(rlds_data, client, 'pairs',
                                 sequence_length=2,
                                 zero_terminal_discount=True)
  assert client.server_info()['pairs'].current_size == EPISODES * ENV_STEPS
  first_pair = _drain(client, 'pairs')[0].data
  np.testing.assert_array_equal(first_pair.observation,
                                episodes[0][rlds.OBSERVATION][:2])

  rlds_reverb.push_rlds_to_table(rlds_data, client, 'uniform',
                                 sequence_length=2)
  replay = reverb_replay_buffer.ReverbReplayBuffer(
      rlds_reverb.create_trajectory_data_spec(rlds_data), 'uniform',
      sequence_length=2, local_server=server)
  batch, _ = next(iter(replay.as_dataset(sample_batch_size=8, num_steps=2)))
  assert batch.observation.shape == (8, 2, 17)
  assert batch.action.shape == (8, 2, 6)
  recorded_observations = np.concatenate(
      [e[rlds.OBSERVATION] for e in episodes])
  for observation in batch.observation.numpy().reshape(-1, 17):
    assert (recorded_observations == observation).all(axis=1).any()
