"""Loads RLDS datasets: TFDS names or local TFDS-format directories.

One entry point, `load`, so pipelines accept either `d4rl_mujoco_halfcheetah/
v2-medium` or a directory written by `python -m pipelines.generate` behind a
single `--dataset` flag; `minari:ID` reads a Minari dataset
(`rlds_reverb.data.minari_source`). Failures raise one-line errors that say what
was asked for and how to get the data, because the usual cause is an offline
machine, not a bug.

Two guards sit on the load path. A dataset directory is data, never code:
TFDS imports whatever module a `features.json` names as a feature class, so
`load` refuses any class outside TFDS's own before TFDS reads the directory.
And a damaged shard is named up front: `load` walks each tfrecord shard's
framing and (up to a size budget) checks every record's checksum, where
TensorFlow would later fail mid-training with no file name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import re
import struct
import sys
import threading
from typing import Any, Iterator

import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import downloader as tfds_downloader
from tensorflow_datasets.core.utils import gcs_utils

from rlds_reverb.data import d4rl_format

_INFO_FILE = 'dataset_info.json'
# <dir>/<name>/<config>/<version>/dataset_info.json is 3 levels below <dir>.
_MAX_SEARCH_DEPTH = 4
_DOWNLOAD_RETRIES = 3
_GENERATE_HINT = ('python -m pipelines.generate --env HalfCheetah-v5 '
                  '--policy random --episodes N --out DIR')
# The only feature classes a dataset's metadata may name: TFDS's own. Any
# other dotted name makes TFDS import that module, i.e. run its code.
_TFDS_FEATURE_CLASS = re.compile(
    r'tensorflow_datasets\.core\.features(\.[A-Za-z_][A-Za-z0-9_]*)+')
_CLASS_KEYS = ('pythonClassName', 'python_class_name')  # Proto JSON.
_LEGACY_CLASS_KEY = 'type'  # features.json of TFDS < 4.6: {type, content}.
_METADATA_FILES = ('features.json', _INFO_FILE)
# verify='auto' checks every record's checksum while the shards to read hold
# at most this many bytes (about 0.2 s for a 1M-step, 172 MiB dataset here;
# docs/datasets.md), else only their framing (milliseconds at any size).
_FULL_CHECK_MAX_BYTES = 512 << 20
_VERIFY_MODES = ('auto', 'full', 'framing', 'none')
_GUARD_LOCK = threading.RLock()


class DatasetNotFoundError(ValueError):
  """The name is not a TFDS dataset, or the path holds no TFDS dataset."""


class DatasetNotAvailableError(RuntimeError):
  """A known TFDS dataset is neither prepared locally nor downloadable."""


class UnsafeDatasetError(DatasetNotFoundError):
  """The dataset's metadata names code outside TFDS: refused, never run."""


class CorruptDatasetError(DatasetNotAvailableError):
  """A shard file of the dataset is missing, truncated or damaged."""


@dataclasses.dataclass(frozen=True)
class ShardCheck:
  """What `check_shards` verified.

  Attributes:
    files: the shard files the split reads.
    records: records found in them (one per episode for RLDS data).
    num_bytes: their total size.
    checked: 'full' (framing and every record's checksum), 'framing'
      (record boundaries, length checksums and counts) or 'none' (not local
      tfrecord files, nothing checked).
  """
  files: tuple[str, ...]
  records: int
  num_bytes: int
  checked: str


@contextlib.contextmanager
def gcs_disabled() -> Iterator[None]:
  """Keeps TFDS off gs://tfds-data (dataset info look-ups, GCS downloads).

  TFDS probes GCS whenever it builds a builder for unprepared data, which on
  an offline machine costs DNS timeouts and on any machine is a network
  access the caller did not ask for.
  """
  previous = gcs_utils._is_gcs_disabled  # pylint: disable=protected-access
  gcs_utils._is_gcs_disabled = True  # pylint: disable=protected-access
  try:
    yield
  finally:
    gcs_utils._is_gcs_disabled = previous  # pylint: disable=protected-access


def _class_names(node: Any, keys: tuple[str, ...]) -> Iterator[str]:
  """Yields every string under one of `keys` anywhere in a JSON value."""
  if isinstance(node, dict):
    for key, value in node.items():
      if key in keys and isinstance(value, str):
        yield value
      else:
        yield from _class_names(value, keys)
  elif isinstance(node, list):
    for value in node:
      yield from _class_names(value, keys)


def _unsafe_message(where: str, class_name: str) -> str:
  return (f'{where} names feature type {class_name!r}, which is not a TFDS '
          'feature class (tensorflow_datasets.core.features.*); refusing to '
          'load it, because TFDS would import and run that module')


def check_metadata(dataset_dir: str) -> None:
  """Refuses a dataset directory whose metadata names non-TFDS code.

  TFDS rebuilds a directory's features from the class names in its
  `features.json` (and `dataset_info.json`), importing each name's module:
  a dataset could ship a module and have it run at load. Only TFDS's own
  feature classes are accepted; nothing is imported here.

  Args:
    dataset_dir: a TFDS version dir (holding `dataset_info.json`).

  Raises:
    UnsafeDatasetError: a feature type outside
      `tensorflow_datasets.core.features.*`; the message names the file.
    DatasetNotFoundError: a metadata file that is not valid JSON.
  """
  for file_name in _METADATA_FILES:
    path = pathlib.Path(dataset_dir) / file_name
    if not path.is_file():
      continue
    try:
      content = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
      raise DatasetNotFoundError(
          f'{path} is not a readable JSON file: {e}') from None
    keys = _CLASS_KEYS + ((_LEGACY_CLASS_KEY,)
                          if file_name == 'features.json' else ())
    for class_name in _class_names(content, keys):
      if not _TFDS_FEATURE_CLASS.fullmatch(class_name):
        raise UnsafeDatasetError(_unsafe_message(str(path), class_name))


@contextlib.contextmanager
def _tfds_feature_classes_only(what: str) -> Iterator[None]:
  """Makes TFDS refuse, not import, a non-TFDS feature class while active.

  The backstop behind `check_metadata`: it also covers TFDS names that TFDS
  resolves to a directory in a data dir (`builder_from_files`).
  """
  connector = tfds.features.FeatureConnector
  original = connector.__dict__['cls_from_name']

  def guarded(cls, python_class_name: str):
    if not _TFDS_FEATURE_CLASS.fullmatch(str(python_class_name)):
      raise UnsafeDatasetError(_unsafe_message(what, str(python_class_name)))
    return original.__func__(cls, python_class_name)

  with _GUARD_LOCK:
    connector.cls_from_name = classmethod(guarded)
    try:
      yield
    finally:
      connector.cls_from_name = original


def _looks_like_path(name_or_path: str) -> bool:
  return (os.path.isabs(name_or_path) or
          name_or_path.startswith(('.', '~')) or
          os.path.exists(os.path.expanduser(name_or_path)))


def _subdirs(path: pathlib.Path) -> list[pathlib.Path]:
  try:
    return sorted(c for c in path.iterdir()
                  if c.is_dir() and not c.name.startswith('incomplete.'))
  except OSError:  # Unreadable: nothing to find there.
    return []


def find_dataset_dir(path: str) -> str:
  """Returns the TFDS version dir (holding dataset_info.json) at or under path.

  Args:
    path: the version dir itself, or a parent of exactly one version dir
      (searched up to 4 levels down; TFDS' `incomplete.*` dirs are skipped).

  Returns:
    The directory to pass to `tfds.builder_from_directory`.

  Raises:
    DatasetNotFoundError: `path` does not exist or holds no TFDS dataset.
    ValueError: `path` holds more than one TFDS dataset.
  """
  root = pathlib.Path(path).expanduser()
  if not root.is_dir():
    raise DatasetNotFoundError(f'dataset path {path} does not exist or is not '
                               'a directory')
  found, level = [], [root]
  for _ in range(_MAX_SEARCH_DEPTH + 1):
    found += [d for d in level if (d / _INFO_FILE).is_file()]
    level = [c for d in level if not (d / _INFO_FILE).is_file()
             for c in _subdirs(d)]
  if not found:
    raise DatasetNotFoundError(
        f'no TFDS dataset ({_INFO_FILE}) found in {path} or up to '
        f'{_MAX_SEARCH_DEPTH} levels below it')
  if len(found) > 1:
    raise ValueError(
        f'dataset path {path} holds {len(found)} TFDS datasets, pass one of: '
        + ', '.join(str(d) for d in found))
  return str(found[0])


@contextlib.contextmanager
def _few_download_retries() -> Iterator[None]:
  """Makes an offline download fail in seconds instead of minutes.

  TFDS retries each failed HTTP request 10 times with exponential backoff
  (about 3.5 minutes in all) before it gives up, which is what an offline
  machine sees after `load(name)`. A few retries still ride out a transient
  error.
  """
  previous = tfds_downloader.MAX_RETRIES
  tfds_downloader.MAX_RETRIES = _DOWNLOAD_RETRIES
  try:
    yield
  finally:
    tfds_downloader.MAX_RETRIES = previous


def _not_available(name: str, builder: tfds.core.DatasetBuilder,
                   data_dir: str | None, why: str) -> DatasetNotAvailableError:
  searched = data_dir or tfds.core.utils.file_utils.get_default_data_dir()
  return DatasetNotAvailableError(
      f'TFDS dataset {name!r} is not prepared in {searched} (looked for '
      f'{builder.data_dir}) and {why}; either (a) on a machine with network '
      f'access run `tfds build {name} --data_dir DATA_DIR` (or '
      f'tfds.load({name!r}, data_dir=DATA_DIR, download=True)) and copy '
      f'DATA_DIR to {searched}, or (b) generate local data with '
      f'`{_GENERATE_HINT}` and pass DIR instead')


def make_builder(name_or_path: str, data_dir: str | None = None,
                 download: bool = True) -> tfds.core.DatasetBuilder:
  """Returns a prepared TFDS builder for a local directory or a TFDS name.

  Args:
    name_or_path: a TFDS-format directory (see `find_dataset_dir`), or a
      TFDS name with optional config and version, e.g.
      `d4rl_mujoco_halfcheetah/v2-medium:1.2.0`.
    data_dir: TFDS data dir for names; None means TFDS' default.
    download: for names, download and prepare the data if it is missing.

  Returns:
    A builder whose `as_dataset` reads the data.

  Raises:
    DatasetNotFoundError: no such directory / dataset in it, or no such
      TFDS dataset (or config).
    UnsafeDatasetError: the dataset's metadata names a feature class outside
      TFDS (see `check_metadata`); nothing of it was imported.
    DatasetNotAvailableError: the name is known but the data is not prepared
      and `download` is False or the download failed.
  """
  if _looks_like_path(name_or_path):
    dataset_dir = find_dataset_dir(name_or_path)
    check_metadata(dataset_dir)
    with _tfds_feature_classes_only(dataset_dir):
      return tfds.builder_from_directory(dataset_dir)
  try:
    # Without download, stay offline: no GCS look-up of the dataset info.
    with (gcs_disabled() if not download else contextlib.nullcontext(),
          _tfds_feature_classes_only(f'dataset {name_or_path!r}')):
      builder = tfds.builder(name_or_path, data_dir=data_dir)
  except UnsafeDatasetError:
    raise
  except tfds.core.registered.DatasetNotFoundError:
    raise DatasetNotFoundError(
        f'{name_or_path!r} is not a known TFDS dataset and no such directory '
        'exists') from None
  except ValueError as e:  # E.g. unknown config or version.
    raise DatasetNotFoundError(
        f'{name_or_path!r} is not a known TFDS dataset: {e}') from None
  if builder.is_prepared():
    return builder
  if not download:
    raise _not_available(name_or_path, builder, data_dir,
                         'download=False')
  try:
    with _few_download_retries():
      builder.download_and_prepare()
  except Exception as e:  # pylint: disable=broad-except
    # Offline failures surface as many exception types (DNS, HTTP, GCS).
    reason = ' '.join(f'{type(e).__name__}: {e}'.split())[:200]
    raise _not_available(name_or_path, builder, data_dir,
                         f'downloading it failed ({reason})') from e
  return builder


def _crc32c_table() -> list[int]:
  table = []
  for byte in range(256):
    crc = byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    table.append(crc)
  return table


_CRC32C_TABLE = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
  """TFRecord's checksum: CRC-32C, rotated and offset (short inputs only)."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc = _CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
  crc ^= 0xFFFFFFFF
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _walk_tfrecord(path: str, expected: int | None) -> int:
  """Returns the number of records, checking framing without reading data.

  A tfrecord is a run of `length (uint64), masked crc of length (uint32),
  data, masked crc of data (uint32)`; this seeks from header to header.
  """
  size = os.path.getsize(path)
  records, offset = 0, 0
  with open(path, 'rb') as f:
    while offset < size:
      header = f.read(12)
      if len(header) < 12:
        raise CorruptDatasetError(
            f'shard {path} is corrupt: truncated (record {records} header at '
            f'byte {offset}, file ends at {size})')
      length, crc = struct.unpack('<QI', header)
      if _masked_crc32c(header[:8]) != crc:
        raise CorruptDatasetError(
            f'shard {path} is corrupt: bad length checksum of record '
            f'{records} at byte {offset}')
      offset += 12 + length + 4
      if offset > size:
        raise CorruptDatasetError(
            f'shard {path} is corrupt: truncated (record {records} ends at '
            f'byte {offset}, file ends at {size})')
      f.seek(offset)
      records += 1
  if expected is not None and records != expected:
    raise CorruptDatasetError(
        f'shard {path} is corrupt: holds {records} records, '
        f'{_INFO_FILE} says {expected}')
  return records


def _check_record_data(files: list[str]) -> None:
  """Reads every record once, checking its data checksum (TF, in C++)."""

  def count(paths) -> int:
    return int(tf.data.TFRecordDataset(paths).reduce(
        tf.constant(0, tf.int64), lambda n, _: n + 1))

  try:
    count(files)  # One pass; only a failure is worth a pass per file.
    return
  except tf.errors.DataLossError:
    pass
  for path in files:
    try:
      count([path])
    except tf.errors.DataLossError as e:
      where = re.search(r'corrupted record at (\d+)', e.message)
      at = f' (the record at byte {where.group(1)})' if where else ''
      raise CorruptDatasetError(
          f'shard {path} is corrupt: a record fails its data '
          f'checksum{at}') from None
  raise CorruptDatasetError(  # Failed together but not one by one.
      f'shards {", ".join(files)} failed a data checksum on one pass and '
      'passed one by one; check the disk')


def _check_verify(verify: str) -> None:
  if verify not in _VERIFY_MODES:
    raise ValueError(f'verify={verify!r}; expected one of '
                     f'{", ".join(_VERIFY_MODES)}')


def _check_builder_shards(builder: tfds.core.DatasetBuilder, split: str,
                          verify: str) -> ShardCheck:
  """`check_shards` on a builder; see there."""
  _check_verify(verify)
  file_format = str(getattr(builder.info, 'file_format', '') or 'tfrecord')
  try:
    instructions = builder.info.splits[split].file_instructions
  except (KeyError, ValueError, TypeError):  # No split info: nothing to check.
    instructions = []
  expected: dict[str, int | None] = {}
  for instruction in instructions:
    shard_length = getattr(instruction, 'examples_in_shard', None)
    expected[os.fspath(instruction.filename)] = shard_length or None
  files = list(expected)
  local = all('://' not in f for f in files)
  if verify == 'none' or not files or not local or 'tfrecord' not in (
      file_format.lower()):
    return ShardCheck(tuple(files), 0, 0, 'none')
  for path in files:
    if not os.path.isfile(path):
      raise CorruptDatasetError(
          f'shard {path} is missing ({_INFO_FILE} lists it for split '
          f'{split!r})')
  num_bytes = sum(os.path.getsize(path) for path in files)
  records = sum(_walk_tfrecord(path, expected[path]) for path in files)
  full = verify == 'full' or (verify == 'auto' and
                              num_bytes <= _FULL_CHECK_MAX_BYTES)
  if full:
    _check_record_data(files)
  return ShardCheck(tuple(files), records, num_bytes,
                    'full' if full else 'framing')


def check_shards(name_or_path: str, split: str = 'train', *,
                 data_dir: str | None = None,
                 verify: str = 'full') -> ShardCheck:
  """Checks the shard files a split reads; a damaged one is named.

  Call it after TensorFlow reported a `DataLossError` on a dataset that
  `load` only checked for framing (large datasets), to learn which file.

  Args:
    name_or_path: as for `load` (a prepared dataset; nothing is downloaded).
    split: TFDS split spec; the files it reads are checked whole.
    data_dir: TFDS data dir for names.
    verify: 'full' (framing, record counts against dataset_info.json and
      every record's data checksum), 'framing' (all but the data checksums:
      milliseconds), 'auto' ('full' up to 512 MiB of shards, else
      'framing') or 'none'.

  Returns:
    What was checked. Files that are not local tfrecords are not checked
    (`checked='none'`).

  Raises:
    CorruptDatasetError: a shard is missing, truncated, holds another number
      of records than dataset_info.json says, or fails a checksum; the
      one-line message names the file.
    ValueError: an unknown `verify`.
    DatasetNotFoundError, UnsafeDatasetError, DatasetNotAvailableError: see
      `make_builder`.
  """
  _check_verify(verify)
  builder = make_builder(name_or_path, data_dir=data_dir, download=False)
  return _check_builder_shards(builder, split, verify)


def load(name_or_path: str, split: str = 'train', data_dir: str | None = None,
         download: bool = True, *, verify: str = 'auto',
         keep_tfds_final_observations: bool = False) -> tf.data.Dataset:
  """Returns an RLDS dataset (episodes with a nested `steps` dataset).

  Args:
    name_or_path: TFDS name (`d4rl_mujoco_halfcheetah/v2-medium`), local
      TFDS-format directory (e.g. the `--out` of `pipelines.generate`), or
      `minari:` and a Minari dataset id (`minari:mujoco/halfcheetah/
      medium-v0`; see `rlds_reverb.data.minari_source.load`), or a D4RL
      .hdf5 / .npz file of flat rows (`rlds_reverb.data.d4rl_format`).
    split: TFDS split spec, e.g. `train` or `train[:10]`; only `train` for
      Minari datasets.
    data_dir: TFDS data dir for names (Minari's data root for `minari:`
      names); None means TFDS' (Minari's) default.
    download: for names, download and prepare the data if it is missing.
    verify: how the shard files are checked before the dataset is returned;
      see `check_shards`. The default 'auto' checks every record's checksum
      up to 512 MiB of shards and only their framing above. Minari datasets
      and D4RL files have no tfrecord shards: nothing is checked.
    keep_tfds_final_observations: for TFDS's `d4rl_*` datasets, keep the
      extra final steps of episodes that end without terminating, whose
      observation TFDS's builders take from the file's last row
      (`d4rl_format.drop_unknown_final_observations`; docs/datasets.md).

  Returns:
    A tf.data.Dataset of episodes.

  Raises:
    DatasetNotFoundError: see `make_builder`.
    UnsafeDatasetError: see `make_builder`.
    DatasetNotAvailableError: see `make_builder`.
    CorruptDatasetError: see `check_shards`.
    ValueError: `split` names a split the dataset does not have, or an
      unknown `verify`.
  """
  _check_verify(verify)
  if name_or_path.startswith('minari:'):
    # Lazy: TFDS users never import minari (or h5py through it).
    from rlds_reverb.data import minari_source  # pylint: disable=g-import-not-at-top
    return minari_source.load(name_or_path, split=split, data_dir=data_dir,
                              download=download)
  if d4rl_format.is_arrays_file(name_or_path):
    if split != 'train':
      raise ValueError(f'{name_or_path}: D4RL arrays have one split, '
                       f"'train'; got {split!r}")
    return d4rl_format.load(name_or_path)
  builder = make_builder(name_or_path, data_dir=data_dir, download=download)
  known = set(builder.info.splits.keys())
  for part in split.split('+'):
    base = part.split('[')[0].strip()
    if known and base not in known:
      raise ValueError(f'dataset {name_or_path!r} has no split {base!r} '
                       f'(splits: {", ".join(sorted(known))})')
  _check_builder_shards(builder, split, verify)
  with _tfds_feature_classes_only(name_or_path):
    rlds_data = builder.as_dataset(split=split)
  if (builder.name.startswith(d4rl_format.TFDS_BUILDER_PREFIX)
      and not keep_tfds_final_observations):
    print(f'{name_or_path}: {d4rl_format.TFDS_FINAL_OBSERVATION_NOTE} '
          '(docs/datasets.md)', file=sys.stderr)
    rlds_data = d4rl_format.drop_unknown_final_observations(rlds_data)
  return rlds_data
