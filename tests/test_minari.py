"""Tests for `datasets.load('minari:ID')` (rlds_reverb.data.minari_source).

The Minari datasets are written here, in a pytest tmp dir, by Minari's own
writer (`minari.create_dataset_from_buffers`) from real gymnasium rollouts
with random actions; nothing touches the network. (Minari's `DataCollector`
wrapper needs jax, which the project does not install: the buffers are
filled here instead, with what the collector would store.)
"""

import dataclasses
import os
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
import rlds
import tensorflow as tf

from rlds_reverb.data import convert
from rlds_reverb.data import datasets
from rlds_reverb.data import minari_source
from rlds_reverb.acting import envs
from rlds_reverb.experiments import offline_data

minari = pytest.importorskip('minari')
EpisodeBuffer = minari.data_collector.EpisodeBuffer

CHEETAH_ID = 'test/halfcheetah-random-v0'
HOPPER_ID = 'test/hopper-random-v0'
FETCH_ID = 'test/fetchreach-random-v0'
CHEETAH_STEPS = 7  # max_episode_steps: every episode is truncated.


def _record(env: gym.Env, seeds: list[int]) -> list[EpisodeBuffer]:
  """Random-action episodes, as Minari's DataCollector would buffer them."""
  buffers = []
  for number, seed in enumerate(seeds):
    observation, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    observations, actions, rewards, terminations, truncations = (
        [observation], [], [], [], [])
    while True:
      action = env.action_space.sample()
      observation, reward, terminated, truncated, _ = env.step(action)
      observations.append(observation)
      actions.append(action)
      rewards.append(reward)
      terminations.append(terminated)
      truncations.append(truncated)
      if terminated or truncated:
        break
    if isinstance(observations[0], dict):
      stacked = {key: np.stack([o[key] for o in observations])
                 for key in observations[0]}
    else:
      stacked = np.stack(observations)
    buffers.append(EpisodeBuffer(
        id=number, seed=seed, observations=stacked,
        actions=np.stack(actions), rewards=rewards, terminations=terminations,
        truncations=truncations, infos={}))
  return buffers


def _create(root: str, dataset_id: str, env_id: str, seeds: list[int],
            max_episode_steps: int) -> list:
  """Writes a Minari dataset under `root`; returns Minari's episodes of it."""
  env = gym.make(env_id, max_episode_steps=max_episode_steps)
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv(minari_source.ENV_VAR, root)
    with warnings.catch_warnings():  # Minari: no author, permalink, ...
      warnings.simplefilter('ignore', UserWarning)
      minari.create_dataset_from_buffers(
          dataset_id, _record(env, seeds), env=env, algorithm_name='random',
          description='rlds_reverb test data')
    return list(minari.load_dataset(dataset_id).iterate_episodes())


@pytest.fixture(scope='module')
def root(tmp_path_factory) -> str:
  return str(tmp_path_factory.mktemp('minari_datasets'))


@pytest.fixture(scope='module')
def cheetah(root) -> list:
  return _create(root, CHEETAH_ID, 'HalfCheetah-v5', [0, 1, 2], CHEETAH_STEPS)


@pytest.fixture(scope='module')
def hopper(root) -> list:
  # Seeds 1 and 2 fall over (terminate) within 20 steps, seed 0 does not.
  return _create(root, HOPPER_ID, 'Hopper-v5', [0, 1, 2], 20)


@pytest.fixture
def minari_root(root, monkeypatch) -> str:
  monkeypatch.setenv(minari_source.ENV_VAR, root)
  return root


def _episodes(ds: tf.data.Dataset) -> list[dict]:
  return [tf.nest.map_structure(
      lambda t: t.numpy(),
      episode[rlds.STEPS].batch(10_000).get_single_element())
          for episode in ds]


def test_episodes_equal_minari_arrays(cheetah, minari_root):
  del minari_root
  ds = datasets.load(f'minari:{CHEETAH_ID}', download=False)
  assert int(ds.cardinality()) == 3
  spec = ds.element_spec[rlds.STEPS].element_spec
  assert {k: (s.dtype, s.shape.as_list()) for k, s in spec.items()} == {
      rlds.OBSERVATION: (tf.float32, [17]), rlds.ACTION: (tf.float32, [6]),
      rlds.REWARD: (tf.float32, []), rlds.DISCOUNT: (tf.float32, []),
      rlds.IS_FIRST: (tf.bool, []), rlds.IS_LAST: (tf.bool, []),
      rlds.IS_TERMINAL: (tf.bool, [])}
  got = _episodes(ds)
  assert len(got) == len(cheetah) == 3
  for steps, episode in zip(got, cheetah):
    n = len(episode.rewards) + 1
    assert n == CHEETAH_STEPS + 1
    assert steps[rlds.OBSERVATION].shape == (n, 17)
    np.testing.assert_array_equal(steps[rlds.OBSERVATION],
                                  episode.observations.astype(np.float32))
    np.testing.assert_array_equal(steps[rlds.ACTION][:-1], episode.actions)
    np.testing.assert_array_equal(steps[rlds.ACTION][-1], np.zeros(6))
    np.testing.assert_array_equal(steps[rlds.REWARD][:-1],
                                  episode.rewards.astype(np.float32))
    assert steps[rlds.REWARD][-1] == 0
    np.testing.assert_array_equal(steps[rlds.DISCOUNT], np.ones(n))
    np.testing.assert_array_equal(steps[rlds.IS_FIRST], np.arange(n) == 0)
    np.testing.assert_array_equal(steps[rlds.IS_LAST], np.arange(n) == n - 1)
    # Truncated by the time limit: last, not terminal.
    assert episode.truncations[-1] and not episode.terminations[-1]
    assert not steps[rlds.IS_TERMINAL].any()


def test_is_terminal_follows_minari_terminations(hopper, minari_root):
  del minari_root
  got = _episodes(datasets.load(f'minari:{HOPPER_ID}', download=False))
  assert [bool(e.terminations[-1]) for e in hopper] == [False, True, True]
  for steps, episode in zip(got, hopper):
    n = len(episode.rewards) + 1
    assert len(steps[rlds.IS_TERMINAL]) == n
    np.testing.assert_array_equal(
        steps[rlds.IS_TERMINAL],
        (np.arange(n) == n - 1) & bool(episode.terminations[-1]))
    np.testing.assert_array_equal(steps[rlds.IS_LAST], np.arange(n) == n - 1)


def test_converts_to_trajectories(cheetah, hopper, minari_root, specs):
  del minari_root
  ds = datasets.load(f'minari:{CHEETAH_ID}', download=False)
  assert offline_data.check_and_cast(ds, specs) is ds  # Already float32.
  trajectories = list(convert.convert_rlds_to_trajectories(ds))
  assert len(trajectories) == sum(len(e.rewards) + 1 for e in cheetah)
  np.testing.assert_array_equal(
      trajectories[1].observation, cheetah[0].observations[1].astype(
          np.float32))
  np.testing.assert_array_equal(trajectories[1].action,
                                cheetah[0].actions[1])
  # Iterating again reads the episodes again.
  assert len(list(convert.convert_rlds_to_trajectories(ds))) == len(
      trajectories)
  # The terminal-discount fix sees Hopper's terminations.
  hopper_ds = datasets.load(f'minari:{HOPPER_ID}', download=False)
  converted = list(convert.convert_rlds_to_episodes(
      hopper_ds, zero_terminal_discount=True))
  assert len(converted) == 3
  for done, episode in zip(converted, hopper):
    discount = done.trajectory.discount.numpy()
    terminated = bool(episode.terminations[-1])
    assert discount[-2] == (0.0 if terminated else 1.0)


def test_dict_observations_stay_dicts(root, monkeypatch):
  envs.register_robotics_envs('FetchReach-v4')
  fetch = _create(root, FETCH_ID, 'FetchReach-v4', [0, 1], 4)
  monkeypatch.setenv(minari_source.ENV_VAR, root)
  ds = datasets.load(f'minari:{FETCH_ID}', download=False)
  observation = ds.element_spec[rlds.STEPS].element_spec[rlds.OBSERVATION]
  assert {k: (s.dtype, s.shape.as_list()) for k, s in observation.items()} == {
      'observation': (tf.float32, [10]), 'achieved_goal': (tf.float32, [3]),
      'desired_goal': (tf.float32, [3])}
  got = _episodes(ds)
  for steps, episode in zip(got, fetch):
    for key in observation:
      np.testing.assert_array_equal(
          steps[rlds.OBSERVATION][key],
          episode.observations[key].astype(np.float32))
  checked = offline_data.check_goal_data(ds, envs.env_specs('FetchReach-v4'))
  assert len(list(convert.convert_rlds_to_trajectories(checked))) == sum(
      len(e.rewards) + 1 for e in fetch)


def test_data_dir_is_used_and_the_variable_restored(cheetah, root, tmp_path,
                                                    monkeypatch):
  del cheetah
  elsewhere = str(tmp_path / 'other')
  monkeypatch.setenv(minari_source.ENV_VAR, elsewhere)
  ds = datasets.load(f'minari:{CHEETAH_ID}', data_dir=root, download=False)
  assert int(ds.cardinality()) == 3
  assert os.environ[minari_source.ENV_VAR] == elsewhere
  monkeypatch.delenv(minari_source.ENV_VAR)
  datasets.load(f'minari:{CHEETAH_ID}', data_dir=root, download=False)
  assert minari_source.ENV_VAR not in os.environ


def test_missing_dataset_without_download(tmp_path, monkeypatch):
  monkeypatch.setenv(minari_source.ENV_VAR, str(tmp_path))
  with pytest.raises(datasets.DatasetNotAvailableError,
                     match=(f"'test/absent-v0' is not in {tmp_path} .*"
                            'download=False; .*minari download')):
    datasets.load('minari:test/absent-v0', download=False)
  other = tmp_path / 'data_dir'
  with pytest.raises(datasets.DatasetNotAvailableError,
                     match=f'is not in {other} '):
    datasets.load('minari:test/absent-v0', data_dir=str(other),
                  download=False)


def test_failed_download_is_named(tmp_path, monkeypatch):
  monkeypatch.setenv(minari_source.ENV_VAR, str(tmp_path))

  def offline(dataset_id, *unused_args, **unused_kwargs):
    raise ConnectionError(f'no network for {dataset_id}')

  monkeypatch.setattr(minari.storage.hosting, 'download_dataset', offline)
  with pytest.raises(datasets.DatasetNotAvailableError,
                     match=(r"'test/absent-v0' is not in .* downloading it "
                            r'failed \(ConnectionError: no network for '
                            r'test/absent-v0\)')):
    datasets.load('minari:test/absent-v0')


@pytest.mark.parametrize('split', ['test', 'train[:1]', 'validation'])
def test_only_the_train_split(split, minari_root):
  del minari_root
  with pytest.raises(ValueError, match=f"no split '{split[:5]}"):
    datasets.load(f'minari:{CHEETAH_ID}', split=split, download=False)


@pytest.mark.parametrize('name', ['minari:halfcheetah', 'minari:',
                                  'minari:../x-v0', 'minari:/abs/x-v0'])
def test_malformed_id(name):
  with pytest.raises(datasets.DatasetNotFoundError,
                     match='is not a Minari dataset id'):
    datasets.load(name, download=False)


def test_minari_not_installed(monkeypatch):
  monkeypatch.setitem(sys.modules, 'minari', None)  # import minari fails
  with pytest.raises(datasets.DatasetNotAvailableError,
                     match=r'minari package, which is not installed .*'
                     r'pip install'):
    datasets.load(f'minari:{CHEETAH_ID}')


def test_unsupported_spaces():
  box = gym.spaces.Box(-1, 1, (2,))
  with pytest.raises(ValueError, match='Minari observation space Tuple'):
    minari_source.step_spec(gym.spaces.Tuple([box, box]), box)
  with pytest.raises(ValueError, match='Minari action space MultiBinary'):
    minari_source.step_spec(box, gym.spaces.MultiBinary(3))
  spec = minari_source.step_spec(gym.spaces.Discrete(4),
                                 gym.spaces.Discrete(2))
  assert spec[rlds.OBSERVATION] == tf.TensorSpec((), tf.int64)
  assert spec[rlds.ACTION] == tf.TensorSpec((), tf.int64)


def test_episode_with_a_missing_final_observation():
  spec = minari_source.step_spec(gym.spaces.Box(-1, 1, (2,)),
                                 gym.spaces.Box(-1, 1, (1,)))
  episode = minari.EpisodeData(
      id=4, observations=np.zeros((3, 2)), actions=np.zeros((3, 1)),
      rewards=np.zeros(3), terminations=np.zeros(3, bool),
      truncations=np.ones(3, bool), infos={})
  with pytest.raises(ValueError, match=r'Minari episode 4: 3 observations '
                     r'for 3 steps \(Minari stores T \+ 1\)'):
    minari_source.episode_steps(episode, spec)
  goal = minari_source.step_spec(
      gym.spaces.Dict({'observation': gym.spaces.Box(-1, 1, (2,))}),
      gym.spaces.Box(-1, 1, (1,)))
  with pytest.raises(ValueError, match=r"observation keys \['other'\], the "
                     r"space has \['observation'\]"):
    minari_source.episode_steps(
        dataclasses.replace(episode, observations={'other': np.zeros((4, 2))}),
        goal)


def test_unreadable_local_dataset(tmp_path, monkeypatch):
  data = tmp_path / 'test' / 'broken-v0' / 'data'
  data.mkdir(parents=True)
  (data / 'metadata.json').write_text('not json')
  monkeypatch.setenv(minari_source.ENV_VAR, str(tmp_path))
  with pytest.raises(datasets.DatasetNotAvailableError,
                     match=f"'test/broken-v0' in {tmp_path}/test/broken-v0 "
                     'cannot be read'):
    datasets.load('minari:test/broken-v0', download=False)
