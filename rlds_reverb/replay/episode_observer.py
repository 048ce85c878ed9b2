"""A TF-Agents observer that writes whole episodes into an episode table.

TF-Agents' drivers and `tf_agents.train.Actor` hand each observer one
`Trajectory` per env step; `ReverbAddTrajectoryObserver` writes windows of
them item by item. `EpisodeObserver` keeps an episode's trajectories until
its boundary (the LAST trajectory) and writes them as one item, unread, with
the table's dtypes, exactly as `push_rlds_to_table(..., sequence_length=None,
priority=UNREAD)` writes the same trajectories: the item the in-memory feed
(`MemoryReplayBuffer`, the toolkit's learners) reads. A live env already
gives a transition into a terminal state discount 0 (the next time step's),
which is what the push's terminal fix writes.
"""

from __future__ import annotations

from typing import Any, List, Optional

import numpy as np
import reverb
import tensorflow as tf
import tree
from tf_agents.trajectories import time_step as ts

from rlds_reverb.replay import episode_table
from rlds_reverb.storage import tables
from rlds_reverb.storage import writers

_FIRST = int(ts.StepType.FIRST)
_LAST = int(ts.StepType.LAST)


class EpisodeObserver:
  """Observer of single (or batch-of-one) trajectories -> episode items.

  Use it as any TF-Agents observer: `py_driver.PyDriver(env, policy,
  observers=[observer])`, `actor.Actor(..., observers=[observer])`, or a TF
  driver over a `TFPyEnvironment` of one env. An episode cut by a reset
  (a FIRST step before its boundary) is written as ending at its last
  observation; call `close()` at the end (an unfinished episode is
  counted in `dropped_steps`, not written).
  """

  def __init__(self, client: reverb.Client, table: str, *,
               timeout_s: Optional[float] = tables.DEFAULT_TIMEOUT_S):
    episode_table.check_table_kind(client, table, episodes=True)
    signature = tables.get_table_signature(client, table)
    self._specs = tf.nest.flatten(signature)  # [T, ...] per field
    paths = [path for path, _ in tree.flatten_with_path(signature)]
    self._step_type_index = paths.index(('step_type',))
    self._next_step_type_index = paths.index(('next_step_type',))
    self._structure = signature
    self._table = table
    self._writer = writers.EpisodeWriter(
        client, table, priority=episode_table.UNREAD, timeout_s=timeout_s)
    self._steps: List[List[np.ndarray]] = []
    self.episodes = 0
    self.cut_episodes = 0  # written without their last transition
    self.dropped_steps = 0

  def _flatten(self, trajectory: Any) -> List[np.ndarray]:
    try:
      tf.nest.assert_same_structure(self._structure, trajectory,
                                    check_types=False)
    except (TypeError, ValueError) as e:
      raise ValueError(f'trajectory does not match the structure of table '
                       f'{self._table!r}: {e}') from e
    out = []
    for path_spec, value in zip(self._specs, tf.nest.flatten(trajectory)):
      value = np.asarray(value)
      shape = tuple(path_spec.shape[1:])
      if value.shape == (1,) + shape:  # A TF driver's batch of one env.
        value = value[0]
      if value.shape != shape:
        raise ValueError(
            f'trajectory field of shape {value.shape} where table '
            f'{self._table!r} stores {shape} (one env per observer: a '
            'batched environment needs one observer per env)')
      out.append(value.astype(path_spec.dtype.as_numpy_dtype, copy=False))
    return out

  def __call__(self, trajectory: Any) -> None:
    flat = self._flatten(trajectory)
    step_type = int(flat[self._step_type_index])
    if step_type == _FIRST and self._steps:
      # The env was reset mid-episode (a new `Actor` resets it on
      # creation): the episode so far ends there, cut.
      self._write_cut()
    self._steps.append(flat)
    if step_type == _LAST:
      self._write(self._steps)
      self._steps = []

  def _write(self, steps: List[List[np.ndarray]]) -> None:
    columns = [np.stack(column) for column in zip(*steps)]
    self._writer.write(columns, columns[self._step_type_index].astype(
        np.int32))
    self._writer.flush()
    self.episodes += 1

  def _write_cut(self) -> None:
    """Writes an episode that got no boundary as one cut at its last
    observation: that step becomes its LAST step (a truncation, so the
    transition into it keeps its discount), and the one transition that
    would have left it is lost (counted in `dropped_steps`)."""
    steps, self._steps = self._steps, []
    self.dropped_steps += 1
    if len(steps) < 2:
      return
    steps = [list(step) for step in steps]
    steps[-1][self._step_type_index] = np.asarray(_LAST, np.int32)
    steps[-1][self._next_step_type_index] = np.asarray(_FIRST, np.int32)
    steps[-2][self._next_step_type_index] = np.asarray(_LAST, np.int32)
    self.cut_episodes += 1
    self._write(steps)

  def reset(self, write_cached_steps: bool = False) -> None:
    """Ends the unfinished episode (TF-Agents' observers' reset): written
    as cut at its last observation with `write_cached_steps`, else dropped
    and counted in `dropped_steps`."""
    if write_cached_steps:
      if self._steps:
        self._write_cut()
      return
    self.dropped_steps += len(self._steps)
    self._steps = []

  def flush(self) -> None:
    self._writer.flush()

  def close(self) -> None:
    self.reset()
    self._writer.close()

