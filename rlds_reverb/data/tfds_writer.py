"""Writes recorded RLDS episodes to disk as a standard TFDS dataset.

The result is what `tfds.builder_from_directory` and `rlds_reverb.data.datasets.load`
read: `<data_dir>/<name>/<version>/` holding `dataset_info.json`,
`features.json` and `<name>-train.tfrecord-XXXXX-of-YYYYY` shards. The step
features follow the TFDS D4RL MuJoCo v2 configs (`d4rl_mujoco_halfcheetah/
v2-random` and friends), so recorded data and D4RL data are interchangeable
downstream. `output_dir` guards the directory around a write: it never
deletes foreign files and marks finished writes with an empty `.complete`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import shutil
import tempfile
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import tensorflow_datasets as tfds

from rlds_reverb.data import datasets

VERSION = '1.0.0'
SPLIT = 'train'
# Empty file in the output dir once a write has finished.
COMPLETE_MARKER = '.complete'


@dataclasses.dataclass(frozen=True)
class StepSpec:
  """Shapes and dtypes of one RLDS step, as stored on disk.

  Attributes:
    observation_shape: shape of `observation`; for a goal env's dict
      observation, the shape of each of its keys.
    action_shape: shape of `action`.
    observation_dtype: dtype of `observation` (float32 for float envs, as D4RL).
    action_dtype: dtype of `action`.
    qpos_shape: shape of `infos/qpos` (MuJoCo envs), or None to leave it out.
    qvel_shape: shape of `infos/qvel` (MuJoCo envs), or None to leave it out.
  """

  observation_shape: tuple[int, ...] | dict[str, tuple[int, ...]]
  action_shape: tuple[int, ...]
  observation_dtype: np.dtype = np.dtype(np.float32)
  action_dtype: np.dtype = np.dtype(np.float32)
  qpos_shape: tuple[int, ...] | None = None
  qvel_shape: tuple[int, ...] | None = None


def make_features(spec: StepSpec) -> tfds.features.FeaturesDict:
  """Returns the TFDS features of an RLDS dataset with steps like `spec`.

  Mirrors `tensorflow_datasets.d4rl.dataset_builder.get_features_dict` for the
  v2 configs without episode metadata: float32 reward and discount, bool
  flags, float64 `infos`.

  Args:
    spec: shapes and dtypes of a step.

  Returns:
    A FeaturesDict with a single `steps` Dataset feature.
  """
  infos: dict[str, Any] = {'action_log_probs': np.float64}
  if spec.qpos_shape is not None:
    infos['qpos'] = tfds.features.Tensor(shape=spec.qpos_shape, dtype=np.float64)
  if spec.qvel_shape is not None:
    infos['qvel'] = tfds.features.Tensor(shape=spec.qvel_shape, dtype=np.float64)
  if isinstance(spec.observation_shape, dict):
    observation = tfds.features.FeaturesDict({
        key: tfds.features.Tensor(shape=shape, dtype=spec.observation_dtype)
        for key, shape in spec.observation_shape.items()})
  else:
    # Image frames are zlib-compressed on disk (Atari's compress 10x).
    image = (spec.observation_dtype == np.uint8
             and len(spec.observation_shape) in (2, 3))
    observation = tfds.features.Tensor(
        shape=spec.observation_shape, dtype=spec.observation_dtype,
        encoding=(tfds.features.Encoding.ZLIB if image
                  else tfds.features.Encoding.NONE))
  steps = {
      'observation': observation,
      'action': tfds.features.Tensor(
          shape=spec.action_shape, dtype=spec.action_dtype),
      'reward': np.float32,
      'discount': np.float32,
      'is_first': np.bool_,
      'is_last': np.bool_,
      'is_terminal': np.bool_,
      'infos': infos,
  }
  return tfds.features.FeaturesDict({'steps': tfds.features.Dataset(steps)})


class _RecordedEpisodes(tfds.core.GeneratorBasedBuilder,
                        skip_registration=True):
  """A one-split TFDS builder whose examples come from an episode iterator.

  Defined here rather than per dataset because the name, features and data
  are only known at run time (the same approach as TFDS' `AdhocBuilder`).
  """

  VERSION = tfds.core.Version(VERSION)

  def __init__(self, *, name: str, features: tfds.features.FeaturesDict,
               description: str,
               episodes: Iterable[tuple[int, Mapping[str, Any]]],
               data_dir: str):
    self.name = name
    self._features = features
    self._description = description
    self._episodes = episodes
    super().__init__(data_dir=data_dir)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self._description,
        features=self._features,
        # Keep episodes in recording order (keys are episode indices).
        disable_shuffling=True,
    )

  # The caller reports progress and the result; TFDS' download banners would
  # only add noise (and talk about downloading).
  def _log_download_bytes(self) -> None:
    pass

  def _log_download_done(self) -> None:
    pass

  def _split_generators(self, dl_manager):
    del dl_manager  # Nothing to download.
    return {SPLIT: self._generate_examples()}

  def _generate_examples(self) -> Iterator[tuple[int, Mapping[str, Any]]]:
    yield from self._episodes


def write_episodes(episodes: Iterable[tuple[int, Mapping[str, Any]]],
                   data_dir: str, *, name: str, spec: StepSpec,
                   description: str = '') -> str:
  """Writes `(key, episode)` pairs as the `train` split of a TFDS dataset.

  Args:
    episodes: pairs of a unique int key (the episode's position in the
      dataset) and an episode `{'steps': {field: array over steps}}`.
    data_dir: TFDS data dir; the dataset lands in `<data_dir>/<name>/1.0.0`.
    name: dataset name (snake_case).
    spec: step shapes and dtypes; every episode must match it.
    description: free text stored in dataset_info.json.

  Returns:
    The directory holding `dataset_info.json` (for `builder_from_directory`).
  """
  with datasets.gcs_disabled():  # A local dataset has no info on GCS.
    builder = _RecordedEpisodes(
        name=name, features=make_features(spec), description=description,
        episodes=episodes, data_dir=data_dir)
  # TFDS' own progress bars would interleave with the caller's; silence them
  # for this write only.
  tqdm_utils = tfds.core.utils.tqdm_utils
  was_active = tqdm_utils._active  # pylint: disable=protected-access
  tfds.disable_progress_bar()
  try:
    # Nothing is downloaded: keep TFDS off GCS and its downloads/ dir out of
    # data_dir.
    with tempfile.TemporaryDirectory() as download_dir:
      builder.download_and_prepare(
          download_dir=download_dir,
          download_config=tfds.download.DownloadConfig(
              try_download_gcs=False,
              compute_stats=tfds.download.ComputeStatsMode.SKIP))
  finally:
    tqdm_utils.display_progress_bar(was_active)
  return str(builder.data_dir)


def _looks_generated(path: pathlib.Path) -> bool:
  """Whether `path` holds (possibly partial) output of `output_dir`."""
  if (path / COMPLETE_MARKER).exists():
    return True
  return any(p.name == 'dataset_info.json' or p.name.startswith('incomplete.')
             for pattern in ('*', '*/*', '*/*/*')
             for p in path.glob(pattern))


@contextlib.contextmanager
def output_dir(out_dir: str, overwrite: bool = False) -> Iterator[None]:
  """Gives the body an empty `out_dir`; marks it complete if the body succeeds.

  On success an empty `.complete` file is added (scripts skip regeneration
  when it exists). On any failure, including Ctrl-C, whatever the body wrote
  is removed, so no half-written dataset is ever mistaken for a good one.

  Args:
    out_dir: the directory; created if absent.
    overwrite: allow replacing a non-empty `out_dir`, but only if it holds
      earlier output of this function (never arbitrary files).

  Raises:
    FileExistsError: `out_dir` is a file, or is not empty and `overwrite` is
      False, or is not empty and does not hold generated data.
  """
  path = pathlib.Path(out_dir)
  if path.exists() and not path.is_dir():
    raise FileExistsError(f'out dir {out_dir} exists and is not a directory')
  created = not path.exists()
  if not created and any(path.iterdir()):
    if not overwrite:
      raise FileExistsError(
          f'out dir {out_dir} exists and is not empty (pass overwrite=True '
          'or --overwrite to replace it)')
    if not _looks_generated(path):
      raise FileExistsError(
          f'out dir {out_dir} is not empty and does not look like generated '
          'data; refusing to delete it')
    shutil.rmtree(path)
  path.mkdir(parents=True, exist_ok=True)
  try:
    yield
  except BaseException:
    shutil.rmtree(path, ignore_errors=True)
    if not created:
      path.mkdir(parents=True, exist_ok=True)
    raise
  (path / COMPLETE_MARKER).touch()
