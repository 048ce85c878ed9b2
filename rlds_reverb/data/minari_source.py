"""Minari datasets (Farama's maintained successor of D4RL) as RLDS episodes.

`datasets.load('minari:ID')` lands here. A Minari episode of T env steps
holds T + 1 observations and T actions, rewards, terminations and
truncations; it becomes T + 1 RLDS steps laid out as this project's
recordings (`rlds_reverb.data.recording`) and the TFDS `d4rl_mujoco_halfcheetah`
v2 configs lay them out:

  step t (0 <= t < T): o_t, a_t, r_t, discount 1.0
  step T (is_last):    o_T (final observation), zero action and reward,
                       is_terminal = Minari's terminations[-1]

Discount is 1.0 on every step; consumers derive terminal discounts from
`is_terminal` (docs/datasets.md). Float observations and actions are
float32, a dict observation (goal datasets) a dict of them. Minari's per-step
`infos` are not carried: the conversion does not use them.

`datasets.load` imports this module, and it imports minari, only for a
`minari:` name. The project pins minari (setup.py); a missing install is a
one-line `DatasetNotAvailableError` saying how to install it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Iterator

import numpy as np
import rlds
import tensorflow as tf

from rlds_reverb.data import datasets

PREFIX = 'minari:'
SPLIT = 'train'  # Minari datasets have no splits: all episodes are 'train'.
ENV_VAR = 'MINARI_DATASETS_PATH'
INSTALL_HINT = ("pip install -c constraints.txt 'minari[hdf5]==0.5.3' (or "
                '`make install`)')
_EXAMPLE_ID = 'mujoco/halfcheetah/medium-v0'
# Minari reads its data root from the environment: one load at a time.
_ENV_LOCK = threading.Lock()


def is_minari_name(name_or_path: str) -> bool:
  return name_or_path.startswith(PREFIX)


def default_root() -> str:
  """Minari's data root: $MINARI_DATASETS_PATH, else ~/.minari/datasets."""
  root = os.environ.get(ENV_VAR)  # Minari's own rule: set means used.
  return root if root is not None else os.path.join(
      os.path.expanduser('~'), '.minari', 'datasets')


def _import_minari() -> Any:
  try:
    import minari  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise datasets.DatasetNotAvailableError(
        f'Minari datasets need the minari package, which is not installed '
        f'({e}); install it with {INSTALL_HINT}') from None
  return minari


@contextlib.contextmanager
def _datasets_path(root: str | None) -> Iterator[None]:
  """Points Minari at `root` (None: leave as is), restoring the variable."""
  if root is None:
    yield
    return
  with _ENV_LOCK:
    previous = os.environ.get(ENV_VAR)
    os.environ[ENV_VAR] = root
    try:
      yield
    finally:
      if previous is None:
        del os.environ[ENV_VAR]
      else:
        os.environ[ENV_VAR] = previous


def _reason(error: BaseException) -> str:
  return ' '.join(f'{type(error).__name__}: {error}'.split())[:300]


def step_spec(observation_space: Any, action_space: Any) -> dict[str, Any]:
  """The RLDS step spec (no leading dimension) of a Minari dataset's spaces.

  Raises:
    ValueError: a space other than Box / Discrete (or, for observations, a
      one-level Dict of them).
  """
  import gymnasium as gym  # pylint: disable=g-import-not-at-top

  def field(space, what):
    if isinstance(space, gym.spaces.Box):
      dtype = (np.float32 if np.issubdtype(space.dtype, np.floating)
               else space.dtype)
      return tf.TensorSpec(tuple(space.shape), tf.as_dtype(dtype))
    if isinstance(space, gym.spaces.Discrete):
      return tf.TensorSpec((), tf.int64)
    raise ValueError(f'Minari {what} space {space} is not supported: '
                     'observations must be a Box, a Discrete or a Dict of '
                     'them, actions a Box or a Discrete')

  if isinstance(observation_space, gym.spaces.Dict):
    observation = {key: field(space, f'observation[{key!r}]')
                   for key, space in observation_space.spaces.items()}
  else:
    observation = field(observation_space, 'observation')
  return {
      rlds.OBSERVATION: observation,
      rlds.ACTION: field(action_space, 'action'),
      rlds.REWARD: tf.TensorSpec((), tf.float32),
      rlds.DISCOUNT: tf.TensorSpec((), tf.float32),
      rlds.IS_FIRST: tf.TensorSpec((), tf.bool),
      rlds.IS_LAST: tf.TensorSpec((), tf.bool),
      rlds.IS_TERMINAL: tf.TensorSpec((), tf.bool),
  }


def episode_steps(episode: Any, spec: dict[str, Any]) -> dict[str, Any]:
  """One Minari `EpisodeData` -> its T + 1 RLDS steps, as numpy arrays.

  Raises:
    ValueError: observations that are not T + 1 (or keys that are not the
      spec's), naming the episode.
  """
  num_steps = len(episode.rewards)
  n = num_steps + 1
  obs_spec = spec[rlds.OBSERVATION]

  def observations(values, field_spec, what):
    values = np.asarray(values, dtype=field_spec.dtype.as_numpy_dtype)
    if len(values) != n:
      raise ValueError(
          f'Minari episode {episode.id}: {len(values)} {what} for '
          f'{num_steps} steps (Minari stores T + 1)')
    return values

  if isinstance(obs_spec, dict):
    got = episode.observations
    if not isinstance(got, dict) or set(got) != set(obs_spec):
      keys = sorted(got) if isinstance(got, dict) else type(got).__name__
      raise ValueError(f'Minari episode {episode.id}: observation keys '
                       f'{keys}, the space has {sorted(obs_spec)}')
    observation = {key: observations(got[key], field_spec,
                                     f'observations[{key!r}]')
                   for key, field_spec in obs_spec.items()}
  else:
    observation = observations(episode.observations, obs_spec,
                               'observations')
  action_spec = spec[rlds.ACTION]
  action_dtype = action_spec.dtype.as_numpy_dtype
  action_shape = tuple(action_spec.shape.as_list())
  actions = np.asarray(episode.actions, dtype=action_dtype).reshape(
      (num_steps,) + action_shape)
  index = np.arange(n)
  terminated = bool(num_steps and np.asarray(episode.terminations)[-1])
  return {
      rlds.OBSERVATION: observation,
      rlds.ACTION: np.concatenate(
          [actions, np.zeros((1,) + action_shape, action_dtype)]),
      rlds.REWARD: np.append(np.asarray(episode.rewards, np.float32),
                             np.float32(0)),
      rlds.DISCOUNT: np.ones(n, np.float32),
      rlds.IS_FIRST: index == 0,
      rlds.IS_LAST: index == n - 1,
      rlds.IS_TERMINAL: (index == n - 1) & terminated,
  }


def _open(minari: Any, dataset_id: str, root: str | None,
          download: bool) -> Any:
  """`minari.load_dataset`, with one-line errors naming what was searched."""
  searched = root or default_root()
  dataset_dir = os.path.join(searched, dataset_id)
  local = os.path.isdir(os.path.join(dataset_dir, 'data'))
  hint = (f'on a machine with network access run `MINARI_DATASETS_PATH='
          f'DIR minari download {dataset_id}` (needs pip install '
          f"'minari[hf]') and copy DIR to {searched}")
  if not local and not download:
    raise datasets.DatasetNotAvailableError(
        f'Minari dataset {dataset_id!r} is not in {searched} (looked for '
        f'{dataset_dir}/data) and download=False; {hint}')
  try:
    with _datasets_path(root):
      return minari.load_dataset(dataset_id, download=not local)
  except Exception as e:  # pylint: disable=broad-except
    # Offline or missing-extra failures surface as many exception types.
    if local:
      raise datasets.DatasetNotAvailableError(
          f'Minari dataset {dataset_id!r} in {dataset_dir} cannot be read '
          f'({_reason(e)})') from e
    raise datasets.DatasetNotAvailableError(
        f'Minari dataset {dataset_id!r} is not in {searched} (looked for '
        f'{dataset_dir}/data) and downloading it failed ({_reason(e)}); '
        f'{hint}') from e


def load(name: str, split: str = SPLIT, data_dir: str | None = None,
         download: bool = True) -> tf.data.Dataset:
  """Returns a Minari dataset as RLDS episodes, each `{'steps': Dataset}`.

  Args:
    name: `minari:` followed by a Minari dataset id, e.g.
      `minari:mujoco/halfcheetah/medium-v0`.
    split: 'train' (Minari datasets have no other split).
    data_dir: Minari's data root for this call (it is set as
      $MINARI_DATASETS_PATH while Minari looks the dataset up, then
      restored); None: $MINARI_DATASETS_PATH, else ~/.minari/datasets.
    download: download the dataset with Minari if it is not in the root.

  Returns:
    A tf.data.Dataset of episodes with a known cardinality; its `steps`
    fields are observation, action, reward, discount, is_first, is_last and
    is_terminal (see the module docstring).

  Raises:
    ValueError: `split` is not 'train', or the dataset's spaces are not
      supported (see `step_spec`).
    DatasetNotFoundError: `name` is not a well-formed Minari id.
    DatasetNotAvailableError: minari is not installed, or the dataset is
      neither in the root nor downloadable (download=False, or the
      download failed), or it cannot be read.
  """
  dataset_id = name[len(PREFIX):] if is_minari_name(name) else name
  if split != SPLIT:
    raise ValueError(f'Minari dataset {dataset_id!r} has no split {split!r} '
                     f'(Minari datasets have one split: {SPLIT!r})')
  minari = _import_minari()
  try:
    minari.dataset.minari_dataset.parse_dataset_id(dataset_id)
  except (ValueError, TypeError):  # TypeError: no -vN version.
    raise datasets.DatasetNotFoundError(
        f'{dataset_id!r} is not a Minari dataset id: ids look like '
        f'NAMESPACE/NAME-vN, e.g. {PREFIX}{_EXAMPLE_ID}') from None
  root = os.path.abspath(os.path.expanduser(data_dir)) if data_dir else None
  source = _open(minari, dataset_id, root, download)
  spec = step_spec(source.observation_space, source.action_space)
  signature = tf.nest.map_structure(
      lambda s: tf.TensorSpec([None] + s.shape.as_list(), s.dtype), spec)

  def episodes() -> Iterator[dict[str, Any]]:
    for episode in source.iterate_episodes():
      yield episode_steps(episode, spec)

  return (tf.data.Dataset.from_generator(episodes, output_signature=signature)
          .apply(tf.data.experimental.assert_cardinality(len(source)))
          .map(lambda steps: {
              rlds.STEPS: tf.data.Dataset.from_tensor_slices(steps)}))
