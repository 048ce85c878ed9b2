"""D4RL's flat arrays and TFDS's `d4rl_mujoco_*` encoding of them.

D4RL stores one row per env step (`observations`, `actions`, `rewards`,
`terminals`, `timeouts`, from v2 also `next_observations`, and per-step
`infos/...`); an episode ends at a row whose terminal or timeout flag is
set. TFDS's `d4rl_mujoco_*` builders cut the rows there and write RLDS
episodes this way, which `episodes_from_arrays` reproduces:

  rows b..e-1 of the episode      o_t, a_t, r_t, discount 1.0; discount 0.0
                                  on the last row when it terminated
  one extra step, when the episode terminated or next observations exist:
                                  the last row's next observation (zeros
                                  without next_observations), zero action
                                  and reward, discount 0.0, is_last,
                                  is_terminal = whether it terminated
  no extra step otherwise         the last row is is_last: its action and
                                  reward are dropped (RLDS gives a last
                                  step's action no meaning), so the episode
                                  loses its last transition

The toolkit's own recordings hold T + 1 steps (the final observation is the
last step) and meet the same layout with `tfds_encoding`. Read with the
contract's terminal discounts, every encoding gives the same transitions
where the information exists; `ArraysSummary` counts what it lost where it
does not. Only a terminal row ends the bootstrap: D4RL's `timeouts` (which
in medium-replay mark the end of each training iteration's rows, not only
the time limit) are truncations.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Iterable, Mapping

import numpy as np
import rlds
import tensorflow as tf

REQUIRED = ('observations', 'actions', 'rewards', 'terminals', 'timeouts')
NEXT_OBSERVATIONS = 'next_observations'
INFOS = 'infos/'
SUFFIXES = ('.hdf5', '.h5', '.npz')


@dataclasses.dataclass(frozen=True)
class ArraysSummary:
  """What the rows became."""
  rows: int
  episodes: int
  terminated: int
  timed_out: int
  """Episodes ended by a timeout row (not terminated)."""
  unfinished: int
  """1 when the last rows carry no done flag (the data stops mid-episode)."""
  lost_transitions: int
  """Episodes that ended without a terminal and without a next
  observation: each loses its last row's transition."""

  def loss_message(self, where: str) -> str | None:
    if not self.lost_transitions:
      return None
    return (f'{where}: {self.lost_transitions} of {self.episodes} episodes '
            'end in a timeout (or the end of the data) without a next '
            'observation; their last transitions ('
            f'{self.lost_transitions} of {self.rows} rows) are lost, as '
            "TFDS's d4rl_mujoco encoding loses them")


def check_arrays(arrays: Mapping[str, np.ndarray], where: str) -> int:
  """Returns the number of rows; ValueError naming the field otherwise."""
  missing = [k for k in REQUIRED if k not in arrays]
  if missing:
    raise ValueError(f'{where}: D4RL arrays lack {", ".join(missing)} '
                     f'(need {", ".join(REQUIRED)}; '
                     f'{NEXT_OBSERVATIONS} optional)')
  for key in REQUIRED:
    if np.ndim(arrays[key]) == 0:
      raise ValueError(f'{where}: {key} is a scalar, not one value per row')
  rows = len(arrays['observations'])
  for key, values in arrays.items():
    if key in REQUIRED or key == NEXT_OBSERVATIONS or key.startswith(INFOS):
      if len(values) != rows:
        raise ValueError(f'{where}: {key} has {len(values)} rows, '
                         f'observations {rows}')
  for key in ('rewards', 'terminals', 'timeouts'):
    shape = np.shape(arrays[key])
    if len(shape) > 2 or (len(shape) == 2 and shape[1] != 1):
      raise ValueError(f'{where}: {key} must hold one value per row, got '
                       f'shape {shape}')
  if (NEXT_OBSERVATIONS in arrays and np.shape(arrays[NEXT_OBSERVATIONS])
      != np.shape(arrays['observations'])):
    raise ValueError(
        f'{where}: {NEXT_OBSERVATIONS} has shape '
        f'{np.shape(arrays[NEXT_OBSERVATIONS])}, observations '
        f'{np.shape(arrays["observations"])}')
  return rows


def _flags(values: np.ndarray) -> np.ndarray:
  return np.asarray(values).reshape(-1).astype(bool)


def episodes_from_arrays(arrays: Mapping[str, np.ndarray],
                         where: str = 'D4RL arrays'
                         ) -> tuple[list[dict[str, Any]], ArraysSummary]:
  """D4RL rows -> RLDS episodes (numpy steps) as TFDS's builders make them,
  but for the extra step's observation, which is the episode's own next
  observation (TFDS's is the file's last: `drop_unknown_final_observations`).
  Observations, actions and rewards become float32, what the agents train
  on (TFDS keeps float64 for its replay configs); `infos/...` keep their
  dtype; episode `metadata/...` is not carried.

  Raises:
    ValueError: a missing field or fields of different lengths, naming them.
  """
  rows = check_arrays(arrays, where)
  terminals, timeouts = _flags(arrays['terminals']), _flags(arrays['timeouts'])
  observations = np.asarray(arrays['observations'], np.float32)
  actions = np.asarray(arrays['actions'], np.float32)
  rewards = np.asarray(arrays['rewards'], np.float32).reshape(-1)
  next_observations = (np.asarray(arrays[NEXT_OBSERVATIONS], np.float32)
                       if NEXT_OBSERVATIONS in arrays else None)
  infos = {k[len(INFOS):]: np.asarray(v) for k, v in arrays.items()
           if k.startswith(INFOS)}
  ends = list(np.flatnonzero(terminals | timeouts) + 1)
  unfinished = int(rows > 0 and (not ends or ends[-1] != rows))
  if unfinished:
    ends.append(rows)
  episodes, terminated, lost = [], 0, 0
  for begin, end in zip([0] + ends[:-1], ends):
    n = end - begin
    ends_in_terminal = bool(terminals[end - 1])
    terminated += ends_in_terminal
    steps = {
        rlds.OBSERVATION: observations[begin:end],
        rlds.ACTION: actions[begin:end],
        rlds.REWARD: rewards[begin:end],
        rlds.DISCOUNT: np.ones(n, np.float32),
        rlds.IS_FIRST: np.arange(n) == 0,
        rlds.IS_LAST: np.zeros(n, bool),
        rlds.IS_TERMINAL: np.zeros(n, bool),
    }
    if infos:
      steps['infos'] = {k: v[begin:end] for k, v in infos.items()}
    if ends_in_terminal:
      steps[rlds.DISCOUNT][-1] = 0.0
    if ends_in_terminal or next_observations is not None:
      final = (next_observations[end - 1] if next_observations is not None
               else np.zeros_like(observations[0]))
      extra = {rlds.OBSERVATION: final, rlds.ACTION: np.zeros_like(actions[0]),
               rlds.REWARD: np.float32(0), rlds.DISCOUNT: np.float32(0),
               rlds.IS_FIRST: False, rlds.IS_LAST: True,
               rlds.IS_TERMINAL: ends_in_terminal}
      for key, value in extra.items():
        steps[key] = np.concatenate([steps[key], np.asarray(value)[None]])
      for key, value in steps.get('infos', {}).items():
        steps['infos'][key] = np.concatenate([value,
                                              np.zeros_like(value[:1])])
    else:
      steps[rlds.IS_LAST][-1] = True
      lost += 1
    episodes.append(steps)
  return episodes, ArraysSummary(
      rows=rows, episodes=len(episodes), terminated=terminated,
      timed_out=len(episodes) - terminated - unfinished,
      unfinished=unfinished, lost_transitions=lost)


def to_arrays(episodes: Iterable[Mapping[str, Any]], *,
              next_observations: bool = True) -> dict[str, np.ndarray]:
  """RLDS episodes whose last step holds the final observation (the
  toolkit's recordings, TFDS's encoding with next observations) -> D4RL
  rows, one per transition; `infos/<key>` rows from the steps' `infos`."""
  parts: dict[str, list[np.ndarray]] = {}
  for steps in episodes:
    n = len(steps[rlds.REWARD]) - 1  # Transitions; the last step is o_T.
    if n < 1:
      continue
    terminal = bool(steps[rlds.IS_TERMINAL][-1])
    done = np.arange(n) == n - 1
    columns = {
        'observations': steps[rlds.OBSERVATION][:-1],
        'actions': steps[rlds.ACTION][:-1],
        'rewards': steps[rlds.REWARD][:-1],
        'terminals': done & terminal,
        'timeouts': done & (not terminal),
    }
    if next_observations:
      columns[NEXT_OBSERVATIONS] = steps[rlds.OBSERVATION][1:]
    for key, value in steps.get('infos', {}).items():
      columns[INFOS + key] = value[:-1]
    for key, value in columns.items():
      parts.setdefault(key, []).append(np.asarray(value))
  return {key: np.concatenate(value) for key, value in parts.items()}


def tfds_encoding(steps: Mapping[str, Any]) -> dict[str, Any]:
  """A toolkit recording's steps (T + 1, final observation last) in TFDS's
  `d4rl_mujoco_*` encoding: discount 0.0 on the last step and, when the
  episode terminated, on the last real step. Unlike TFDS, which zeroes
  them, the last step keeps its `infos` (the final state's qpos, qvel)."""
  out = dict(steps)
  discount = np.array(steps[rlds.DISCOUNT], np.float32)
  discount[-1] = 0.0
  if bool(steps[rlds.IS_TERMINAL][-1]) and len(discount) > 1:
    discount[-2] = 0.0
  out[rlds.DISCOUNT] = discount
  return out


# TFDS's d4rl builders (tensorflow-datasets 4.9.4, d4rl_* version 1.2.0)
# give every episode's extra step `next_observations[-1]`: the next
# observation of the file's last row, not of the episode's.
TFDS_BUILDER_PREFIX = 'd4rl_'
TFDS_FINAL_OBSERVATION_NOTE = (
    "TFDS's d4rl builders put the file's last next observation, not the "
    "episode's, into each episode's extra final step. Where an episode "
    'ends without terminating and has that step (discount 0.0; files with '
    'next_observations), the step is dropped and the episode loses its '
    'last transition (the last episode of the file too, whose observation '
    'was right); terminated episodes keep theirs (discount 0, so that '
    'observation enters no target). keep_tfds_final_observations=True keeps '
    'them all')


def drop_unknown_final_observations(rlds_data: tf.data.Dataset
                                    ) -> tf.data.Dataset:
  """Episodes of TFDS's d4rl builders with the wrong final observations
  left out: a non-terminal extra step (discount 0.0, which no real row of
  theirs has) is dropped and the step before it becomes the last one."""

  def fix(steps: dict[str, Any]) -> dict[str, Any]:
    n = tf.shape(steps[rlds.IS_LAST])[0]
    unknown = ((n >= 2) & steps[rlds.IS_LAST][-1]
               & ~steps[rlds.IS_TERMINAL][-1]
               & tf.equal(steps[rlds.DISCOUNT][-1], 0.0))
    keep = tf.where(unknown, n - 1, n)
    kept = tf.nest.map_structure(lambda x: x[:keep], steps)
    kept[rlds.IS_LAST] = tf.where(unknown, tf.range(keep) == keep - 1,
                                  kept[rlds.IS_LAST])
    return kept

  def episode(element: dict[str, Any]) -> dict[str, Any]:
    out = dict(element)
    out[rlds.STEPS] = element[rlds.STEPS].batch(2**31 - 1).map(fix).unbatch()
    return out
  return rlds_data.map(episode)


def read_arrays(path: str) -> dict[str, np.ndarray]:
  """An .hdf5 file in D4RL's layout (h5py; nested groups become
  'infos/qpos' keys) or an .npz of the same keys."""
  if path.endswith('.npz'):
    with np.load(path) as data:
      return {key: data[key] for key in data.files}
  import h5py  # pylint: disable=g-import-not-at-top  # TensorFlow brings it.
  arrays = {}
  with h5py.File(path, 'r') as f:

    def visit(name: str, item: Any) -> None:
      if isinstance(item, h5py.Dataset) and item.shape:  # Not scalars.
        arrays[name] = item[:]
    f.visititems(visit)
  return arrays


def write_hdf5(path: str, arrays: Mapping[str, np.ndarray]) -> None:
  """Writes rows as D4RL's files hold them ('infos/qpos' -> group infos)."""
  import h5py  # pylint: disable=g-import-not-at-top
  with h5py.File(path, 'w') as f:
    for key, value in arrays.items():
      f.create_dataset(key, data=value)


def load(path: str) -> tf.data.Dataset:
  """A D4RL .hdf5 or .npz file as RLDS episodes (TFDS's encoding); what it
  loses is said on stderr."""
  arrays = read_arrays(path)
  episodes, summary = episodes_from_arrays(arrays, where=path)
  message = summary.loss_message(path)
  if message:
    print(message, file=sys.stderr)
  metadata = sorted(k for k in arrays if k.startswith('metadata/'))
  if metadata:
    print(f'{path}: episode metadata not carried: {", ".join(metadata)}',
          file=sys.stderr)
  if not episodes:
    raise ValueError(f'{path}: no rows')
  signature = tf.nest.map_structure(
      lambda v: tf.TensorSpec((None,) + v.shape[1:], tf.as_dtype(v.dtype)),
      episodes[0])
  return (tf.data.Dataset.from_generator(lambda: iter(episodes),
                                         output_signature=signature)
          .apply(tf.data.experimental.assert_cardinality(len(episodes)))
          .map(lambda steps: {
              rlds.STEPS: tf.data.Dataset.from_tensor_slices(steps)}))


def is_arrays_file(path: str) -> bool:
  return os.path.isfile(path) and path.endswith(SUFFIXES)
