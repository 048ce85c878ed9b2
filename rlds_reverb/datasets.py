"""Loads RLDS datasets: TFDS names or local TFDS-format directories.

One entry point, `load`, so pipelines accept either `d4rl_mujoco_halfcheetah/
v2-medium` or a directory written by `python -m pipelines.generate` behind a
single `--dataset` flag. Failures raise one-line errors that say what was
asked for and how to get the data, because the usual cause is an offline
machine, not a bug.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from typing import Iterator

import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import downloader as tfds_downloader
from tensorflow_datasets.core.utils import gcs_utils

_INFO_FILE = 'dataset_info.json'
# <dir>/<name>/<config>/<version>/dataset_info.json is 3 levels below <dir>.
_MAX_SEARCH_DEPTH = 4
_DOWNLOAD_RETRIES = 3
_GENERATE_HINT = ('python -m pipelines.generate --env HalfCheetah-v5 '
                  '--policy random --episodes N --out DIR')


class DatasetNotFoundError(ValueError):
  """The name is not a TFDS dataset, or the path holds no TFDS dataset."""


class DatasetNotAvailableError(RuntimeError):
  """A known TFDS dataset is neither prepared locally nor downloadable."""


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
    DatasetNotAvailableError: the name is known but the data is not prepared
      and `download` is False or the download failed.
  """
  if _looks_like_path(name_or_path):
    return tfds.builder_from_directory(find_dataset_dir(name_or_path))
  try:
    # Without download, stay offline: no GCS look-up of the dataset info.
    with gcs_disabled() if not download else contextlib.nullcontext():
      builder = tfds.builder(name_or_path, data_dir=data_dir)
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


def load(name_or_path: str, split: str = 'train', data_dir: str | None = None,
         download: bool = True) -> tf.data.Dataset:
  """Returns an RLDS dataset (episodes with a nested `steps` dataset).

  Args:
    name_or_path: TFDS name (`d4rl_mujoco_halfcheetah/v2-medium`) or local
      TFDS-format directory (e.g. the `--out` of `pipelines.generate`).
    split: TFDS split spec, e.g. `train` or `train[:10]`.
    data_dir: TFDS data dir for names; None means TFDS' default.
    download: for names, download and prepare the data if it is missing.

  Returns:
    A tf.data.Dataset of episodes.

  Raises:
    DatasetNotFoundError: see `make_builder`.
    DatasetNotAvailableError: see `make_builder`.
    ValueError: `split` names a split the dataset does not have.
  """
  builder = make_builder(name_or_path, data_dir=data_dir, download=download)
  known = set(builder.info.splits.keys())
  for part in split.split('+'):
    base = part.split('[')[0].strip()
    if known and base not in known:
      raise ValueError(f'dataset {name_or_path!r} has no split {base!r} '
                       f'(splits: {", ".join(sorted(known))})')
  return builder.as_dataset(split=split)
