"""rlds_reverb.experiments.offline_data: checking and casting offline data, the
table that holds a whole dataset, its batches and observation statistics.
"""

import numpy as np
import pytest
import rlds
import tensorflow as tf

from rlds_reverb.storage import push
from rlds_reverb.data import recording
from rlds_reverb.storage import tables
from rlds_reverb.data import validate
from rlds_reverb.experiments import offline_data
from rlds_reverb.replay import episode_table
from conftest import _rlds  # pylint: disable=g-bad-import-order
import rlds_fixtures as fx  # pylint: disable=g-bad-import-order

ENV_ID = 'HalfCheetah-v5'
EPISODES, LIMIT = 3, 30


@pytest.fixture(scope='module')
def dataset_dir(tmp_path_factory):
  out = tmp_path_factory.mktemp('data') / 'hc'
  recording.generate_dataset(ENV_ID, 'random', EPISODES, str(out), seed=3,
                             max_episode_steps=LIMIT, show_progress=False)
  return str(out)


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
  from rlds_reverb.data import datasets  # pylint: disable=g-import-not-at-top
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
  from rlds_reverb.data import datasets  # pylint: disable=g-import-not-at-top
  rlds_data = offline_data.check_and_cast(datasets.load(dataset_dir), specs)
  spec = offline_data.convert.create_trajectory_data_spec(rlds_data)
  server = tables.start_server([tables.make_table('rlds', spec, max_size=10)])
  try:
    # Refused before the first episode that would not fit: nothing written.
    with pytest.raises(push.TableFullError, match='this push would evict'):
      offline_data.push_to_new_table(rlds_data, server.localhost_client(),
                                     f'localhost:{server.port}', 'rlds')
    assert tables.get_table_info(server.localhost_client(),
                                 'rlds').current_size == 0
  finally:
    server.stop()


def _with_value(field, episode, step, value):
  episodes = [fx.complete_episode(4, seed=i) for i in range(3)]
  episodes[episode][field] = episodes[episode][field].copy()
  episodes[episode][field][step] = value
  return fx.make_rlds(episodes)


@pytest.mark.parametrize('field, value, message', [
    ('observation', np.nan, r'^episode 2, step 1: observation\[0\] is nan;'),
    ('discount', 7.0, r'^episode 2, step 1: discount is 7.0, not in \[0, 1\];'),
])
def test_the_memory_feed_refuses_nonfinite_data(field, value, message):
  """What pipelines.train --dataset pushes and then reads into memory."""
  rlds_data = _with_value(field, 2, 1, value)
  spec = offline_data.convert.create_trajectory_data_spec(rlds_data)
  server = tables.start_server([
      episode_table.make_table('episodes', spec, max_episodes=100)])
  client = server.localhost_client()
  try:
    with pytest.raises(validate.InvalidDataError, match=message):
      offline_data.push_episodes(rlds_data, client, 'episodes')
    assert tables.get_table_info(client, 'episodes').current_size == 2
    # A table filled without the check is refused when it is read.
    client.reset('episodes')
    push.push_rlds_to_table(rlds_data, client, 'episodes',
                            sequence_length=None,
                            priority=episode_table.UNREAD, validate=False)
    with pytest.raises(validate.InvalidDataError,
                       match=r"^table 'episodes' episode \d \(item key \d+\), "
                       r'step 1: ' + field):
      offline_data.load_memory(client, 'episodes', spec)
  finally:
    server.stop()
