"""Tests for rlds_reverb.datasets.load: local directories and TFDS names.

Never touches the network: TFDS names are either unprepared with
download=False or served by tfds.testing.mock_data.
"""

import pathlib
import shutil

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from rlds_reverb import datasets
from rlds_reverb import recording

D4RL = 'd4rl_mujoco_halfcheetah/v2-medium'


@pytest.fixture(scope='module')
def generated(tmp_path_factory) -> recording.GenerateSummary:
  return recording.generate_dataset(
      'HalfCheetah-v5', 'random', 2, str(tmp_path_factory.mktemp('gen')),
      seed=0, max_episode_steps=4, show_progress=False)


def _num_steps(ds: tf.data.Dataset) -> list[int]:
  return [int(ep['steps'].reduce(0, lambda n, _: n + 1)) for ep in ds]


@pytest.mark.parametrize('level', ['out_dir', 'name_dir', 'version_dir'])
def test_load_local_dir_at_any_level(generated, level):
  version_dir = pathlib.Path(generated.dataset_dir)
  path = {'out_dir': generated.out_dir, 'name_dir': version_dir.parent,
          'version_dir': version_dir}[level]
  ds = datasets.load(str(path))
  steps = ds.element_spec['steps'].element_spec
  assert steps['observation'].shape == (17,)
  assert steps['action'].dtype == tf.float32
  assert _num_steps(ds) == [5, 5]


def test_load_split_slices(generated):
  assert _num_steps(datasets.load(generated.out_dir, split='train[:1]')) == [5]


def test_load_unknown_split(generated):
  with pytest.raises(ValueError, match="no split 'test'.*splits: train"):
    datasets.load(generated.out_dir, split='test')


def test_load_missing_path(tmp_path):
  missing = str(tmp_path / 'nope')
  with pytest.raises(datasets.DatasetNotFoundError, match='does not exist'):
    datasets.load(missing)


def test_load_dir_without_dataset(tmp_path):
  (tmp_path / 'a' / 'b').mkdir(parents=True)
  with pytest.raises(datasets.DatasetNotFoundError,
                     match='no TFDS dataset.*found in'):
    datasets.load(str(tmp_path))


def test_load_dir_with_two_datasets_is_ambiguous(generated, tmp_path):
  for name in ('first', 'second'):
    shutil.copytree(generated.dataset_dir, tmp_path / name / '1.0.0')
  with pytest.raises(ValueError, match='holds 2 TFDS datasets') as e:
    datasets.load(str(tmp_path))
  assert str(tmp_path / 'first' / '1.0.0') in str(e.value)


def test_load_unknown_tfds_name():
  with pytest.raises(datasets.DatasetNotFoundError,
                     match="'no_such_dataset_xyz' is not a known TFDS dataset"):
    datasets.load('no_such_dataset_xyz', download=False)


def test_load_unknown_tfds_config():
  with pytest.raises(datasets.DatasetNotFoundError,
                     match='not a known TFDS dataset.*v9-nope'):
    datasets.load('d4rl_mujoco_halfcheetah/v9-nope', download=False)


def test_known_name_not_prepared(tmp_path):
  with pytest.raises(datasets.DatasetNotAvailableError) as e:
    datasets.load(D4RL, data_dir=str(tmp_path), download=False)
  message = str(e.value)
  assert '\n' not in message
  for part in (D4RL, str(tmp_path), 'tfds build', 'pipelines.generate',
               '--env HalfCheetah-v5'):
    assert part in message
  assert not any(tmp_path.iterdir())  # Nothing was downloaded or written.


def test_known_name_not_prepared_names_default_data_dir(tmp_path, monkeypatch):
  monkeypatch.setenv('TFDS_DATA_DIR', str(tmp_path / 'default'))
  with pytest.raises(datasets.DatasetNotAvailableError,
                     match=f'not prepared in {tmp_path / "default"} '):
    datasets.load(D4RL, download=False)


def test_load_real_d4rl_builder_under_mock_data():
  with tfds.testing.mock_data(num_examples=2):
    ds = datasets.load(D4RL)
    steps_spec = ds.element_spec['steps'].element_spec
    assert steps_spec['observation'] == tf.TensorSpec((17,), tf.float32)
    assert steps_spec['action'] == tf.TensorSpec((6,), tf.float32)
    assert steps_spec['infos']['qpos'].shape == (9,)
    episodes = list(ds)
    assert len(episodes) == 2
    first = next(iter(episodes[0]['steps']))
    assert first['observation'].shape == (17,)
