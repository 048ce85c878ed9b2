"""Tests for rlds_reverb.data.datasets.load: local directories and TFDS names.

Never touches the network: TFDS names are either unprepared with
download=False or served by tfds.testing.mock_data.
"""

import json
import pathlib
import shutil
import struct
import sys

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from rlds_reverb.data import datasets
from rlds_reverb.data import recording

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


# A dataset directory is data, never code (issue 13, defect 11).

_PLANTED = '''import pathlib
pathlib.Path({marker!r}).write_text('planted module ran')
'''


def _plant(generated, tmp_path, where: str) -> tuple[pathlib.Path, str, str]:
  """Copies the dataset, plants a module in it and names it as a feature.

  Returns the version dir, the planted class name and the marker file the
  module writes when imported. `where` picks the metadata that names it:
  `features_json` (proto JSON), `legacy_type` (TFDS < 4.6 `{type, content}`)
  or `dataset_info` (features inside dataset_info.json).
  """
  out = tmp_path / 'data'
  version_dir = out / 'halfcheetah_v5_random' / '1.0.0'
  shutil.copytree(generated.dataset_dir, version_dir)
  module = f'planted_{where}_{tmp_path.name}'.replace('-', '_')
  marker = tmp_path / 'PLANTED_MODULE_RAN'
  (version_dir / f'{module}.py').write_text(_PLANTED.format(marker=str(marker)))
  class_name = f'{module}.Evil'
  features_path = version_dir / 'features.json'
  features = json.loads(features_path.read_text())
  if where == 'features_json':
    features['pythonClassName'] = class_name
  elif where == 'legacy_type':
    features = {'type': class_name, 'content': {}}
  else:
    info_path = version_dir / 'dataset_info.json'
    info = json.loads(info_path.read_text())
    info['features'] = {**features, 'pythonClassName': class_name}
    info_path.write_text(json.dumps(info))
    features_path.unlink()
  if where != 'dataset_info':
    features_path.write_text(json.dumps(features))
  return version_dir, class_name, str(marker)


def test_planted_module_would_run_under_plain_tfds(generated, tmp_path,
                                                   monkeypatch):
  # The attack is real: TFDS imports (runs) the module features.json names.
  version_dir, _, marker = _plant(generated, tmp_path, 'features_json')
  monkeypatch.syspath_prepend(str(version_dir))
  with pytest.raises(ValueError, match='Unrecognized FeatureConnector'):
    tfds.builder_from_directory(str(version_dir))
  assert pathlib.Path(marker).exists()


@pytest.mark.parametrize('where', ['features_json', 'legacy_type',
                                   'dataset_info'])
def test_load_refuses_planted_module_and_does_not_run_it(generated, tmp_path,
                                                         monkeypatch, where):
  version_dir, class_name, marker = _plant(generated, tmp_path, where)
  monkeypatch.syspath_prepend(str(version_dir))  # Importable, were it asked.
  with pytest.raises(datasets.UnsafeDatasetError) as e:
    datasets.load(str(tmp_path / 'data'))
  message = str(e.value)
  assert '\n' not in message
  file_name = 'dataset_info.json' if where == 'dataset_info' else 'features.json'
  assert str(version_dir / file_name) in message
  assert repr(class_name) in message and 'not a TFDS feature class' in message
  assert isinstance(e.value, datasets.DatasetNotFoundError)  # CLIs: one line.
  assert not pathlib.Path(marker).exists()
  assert class_name.split('.')[0] not in sys.modules


def test_tfds_name_resolving_to_planted_dir_is_refused(generated, tmp_path,
                                                       monkeypatch):
  # A name TFDS does not know is looked up as files in data_dir
  # (builder_from_files): the guard inside TFDS' class lookup refuses it.
  version_dir, class_name, marker = _plant(generated, tmp_path,
                                           'features_json')
  monkeypatch.syspath_prepend(str(version_dir))
  with pytest.raises(datasets.UnsafeDatasetError,
                     match=f"'halfcheetah_v5_random' names feature type "
                     f"'{class_name}'"):
    datasets.load('halfcheetah_v5_random', data_dir=str(tmp_path / 'data'),
                  download=False)
  assert not pathlib.Path(marker).exists()
  # The guard is lifted afterwards: TFDS' own lookup is back.
  assert (tfds.features.FeatureConnector.cls_from_name('tensorflow_datasets.'
          'core.features.tensor_feature.Tensor') is tfds.features.Tensor)


def test_check_metadata_accepts_tfds_features(generated):
  datasets.check_metadata(generated.dataset_dir)  # Raises nothing.


def test_check_metadata_unreadable_json(generated, tmp_path):
  version_dir = tmp_path / '1.0.0'
  shutil.copytree(generated.dataset_dir, version_dir)
  (version_dir / 'features.json').write_text('{not json')
  with pytest.raises(datasets.DatasetNotFoundError,
                     match='features.json is not a readable JSON file'):
    datasets.load(str(version_dir))


# A damaged shard is named (issue 13, defect 10).


def _copy_dataset(generated, tmp_path) -> tuple[pathlib.Path, pathlib.Path]:
  version_dir = tmp_path / 'ds' / '1.0.0'
  shutil.copytree(generated.dataset_dir, version_dir)
  shards = sorted(version_dir.glob('*.tfrecord-*'))
  assert len(shards) == 1
  return version_dir, shards[0]


def _first_record_length(shard: pathlib.Path) -> int:
  return struct.unpack('<Q', shard.read_bytes()[:8])[0]


def _truncate(shard):
  shard.write_bytes(shard.read_bytes()[:-10])


def _flip_data_byte(shard):
  data = bytearray(shard.read_bytes())
  data[12 + _first_record_length(shard) // 2] ^= 0xFF  # Inside record 0.
  shard.write_bytes(bytes(data))


def _flip_length_byte(shard):
  data = bytearray(shard.read_bytes())
  data[1] ^= 0x01
  shard.write_bytes(bytes(data))


def _drop_last_record(shard):
  data = shard.read_bytes()
  first = 12 + _first_record_length(shard) + 4
  shard.write_bytes(data[:first])  # Framing intact, one record of two.


@pytest.mark.parametrize('damage, why', [
    (_truncate, 'corrupt: truncated'),
    (_flip_data_byte, 'corrupt: a record fails its data checksum'),
    (_flip_length_byte, 'corrupt: bad length checksum of record 0'),
    (_drop_last_record, 'corrupt: holds 1 records, dataset_info.json says 2'),
    (lambda shard: shard.unlink(), 'is missing'),
])
def test_damaged_shard_is_named(generated, tmp_path, damage, why):
  version_dir, shard = _copy_dataset(generated, tmp_path)
  damage(shard)
  with pytest.raises(datasets.CorruptDatasetError) as e:
    datasets.load(str(version_dir))
  message = str(e.value)
  assert '\n' not in message
  assert message.startswith(f'shard {shard} ')
  assert why in message
  assert isinstance(e.value, datasets.DatasetNotAvailableError)


def test_framing_check_misses_data_damage_that_check_shards_names(
    generated, tmp_path):
  version_dir, shard = _copy_dataset(generated, tmp_path)
  _flip_data_byte(shard)
  ds = datasets.load(str(version_dir), verify='framing')
  with pytest.raises(tf.errors.DataLossError) as e:  # TF's text, no file.
    list(ds)
  assert str(shard) not in str(e.value)
  with pytest.raises(datasets.CorruptDatasetError,
                     match=f'shard {shard} is corrupt'):
    datasets.check_shards(str(version_dir))
  assert datasets.check_shards(str(version_dir), verify='framing') == (
      datasets.ShardCheck((str(shard),), 2, shard.stat().st_size, 'framing'))


def test_check_shards_of_intact_dataset(generated):
  check = datasets.check_shards(generated.out_dir, split='train[:1]')
  assert check.checked == 'full' and check.records == 2
  assert len(check.files) == 1
  assert datasets.check_shards(generated.out_dir, verify='none').checked == (
      'none')


def test_verify_none_skips_the_check(generated, tmp_path):
  version_dir, shard = _copy_dataset(generated, tmp_path)
  _truncate(shard)
  datasets.load(str(version_dir), verify='none')  # The caller's choice.


def test_unknown_verify_mode(generated):
  with pytest.raises(ValueError, match="verify='fast'; expected one of auto"):
    datasets.load(generated.out_dir, verify='fast')
  with pytest.raises(ValueError, match="verify='fast'"):
    datasets.check_shards(generated.out_dir, verify='fast')
