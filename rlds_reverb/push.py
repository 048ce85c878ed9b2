"""Trajectories -> Reverb tables: TF-Agents' observer path and a fast path.

`push_rlds_to_reverb` keeps TF-Agents' signature and feeds any observer.
`push_rlds_to_table` writes the very items that TF-Agents'
`ReverbAddTrajectoryObserver` (fixed-length windows) or
`ReverbAddEpisodeObserver` (whole episodes) would write, without a Python
call per trajectory field: episodes arrive converted as whole numpy arrays,
steps go to Reverb's C++ trajectory writer directly, and an episode item is
one append of the whole episode.
"""

import dataclasses
import re
import time
from typing import Any, Callable, Optional

from absl import logging
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from rlds_reverb import convert
from rlds_reverb import tables
from rlds_reverb import writers

_LAST = int(ts.StepType.LAST)


@dataclasses.dataclass
class PushStats:
  """Running totals of a push; valid even when the push stops on an error."""
  episodes: int = 0
  steps: int = 0
  items: int = 0
  terminated: int = 0
  truncated: int = 0
  empty_episodes: int = 0  # Episodes without steps: nothing to write.
  seconds: float = 0.0

  @property
  def steps_per_second(self) -> float:
    return self.steps / self.seconds if self.seconds > 0 else 0.0


def push_rlds_to_reverb(
    rlds_data: tf.data.Dataset,
    reverb_observer: Any,
    policy_info_fn: convert.PolicyInfoFn = None,
) -> int:
  """Pushes RLDS data through a TF-Agents Reverb observer.

  Drop-in for `tf_agents.replay_buffers.rlds_to_reverb.push_rlds_to_reverb`.
  The observer is still called once per trajectory (it owns the item
  logic), but the conversion feeding it is done per episode.

  Args:
    rlds_data: An RLDS dataset of episodes.
    reverb_observer: A `ReverbAddTrajectoryObserver` or
      `ReverbAddEpisodeObserver` (anything with `get_table_signature()` that is
      called with single trajectories).
    policy_info_fn: Optional per-step `(cur_step, next_step) -> policy_info`.

  Returns:
    The number of trajectories pushed.

  Raises:
    ValueError: If no RLDS steps exist in rlds_data.
    ValueError: If step spec for rlds_data is not valid.
    ValueError: If the observer's table signature does not match the data
      spec of `rlds_data`.
    InvalidArgumentError: For invalid episodes (see
      `convert_rlds_to_trajectories`); nothing of that episode is pushed.
  """
  table_signature_spec = reverb_observer.get_table_signature()
  if table_signature_spec != tensor_spec.add_outer_dim(
      convert.create_trajectory_data_spec(rlds_data)):
    raise ValueError(tables.SIGNATURE_MISMATCH)

  steps = 0
  for episode in convert.convert_rlds_to_episodes(
      rlds_data, policy_info_fn).as_numpy_iterator():
    traj = episode.trajectory
    for t in range(len(traj.step_type)):
      reverb_observer(tf.nest.map_structure(lambda x, t=t: x[t], traj))
    steps += len(traj.step_type)
  logging.info('Successfully wrote %d steps to Reverb.', steps)
  return steps


def _validate_arguments(sequence_length: Optional[int], stride_length: int,
                        priority: float, num_workers: int) -> None:
  if sequence_length is not None and (
      not isinstance(sequence_length, (int, np.integer))
      or sequence_length < 1):
    raise ValueError(
        f'sequence_length must be a positive integer or None (whole '
        f'episodes), got {sequence_length!r}.')
  if not isinstance(stride_length, (int, np.integer)) or stride_length < 1:
    raise ValueError(
        f'stride_length must be a positive integer, got {stride_length!r}.')
  if not isinstance(num_workers, (int, np.integer)) or num_workers < 1:
    raise ValueError(
        f'num_workers must be a positive integer, got {num_workers!r}.')
  if not np.isfinite(priority) or priority < 0:
    raise ValueError(
        f'priority must be a finite number >= 0, got {priority!r}.')


def _invalid_episode_error(error: tf.errors.InvalidArgumentError,
                           items: int, table_name: str) -> Exception:
  """The conversion's error, cleaned to one line, plus what was written."""
  found = re.search(r'assertion failed: \[(.*?)\]', error.message)
  reason = found.group(1) if found else error.message.splitlines()[0]
  return tf.errors.InvalidArgumentError(
      error.node_def, error.op,
      f'{reason}; {items} items were already written to table '
      f'{table_name!r}, none from this episode.')


def _count_episode(stats: PushStats, episode: convert.EpisodeTrajectories
                   ) -> None:
  step_type = episode.trajectory.step_type
  if stats.episodes == 0:
    stats.empty_episodes += int(episode.episode_index)
  stats.empty_episodes += int(
      episode.next_episode_index - episode.episode_index - 1)
  stats.episodes += 1
  stats.steps += len(step_type)
  if step_type[-1] == _LAST:
    if episode.is_terminal[-1]:
      stats.terminated += 1
    else:
      stats.truncated += 1


def push_rlds_to_table(
    rlds_data: tf.data.Dataset,
    client: reverb.Client,
    table_name: str,
    *,
    sequence_length: Optional[int] = 2,
    stride_length: int = 1,
    priority: float = 1.0,
    policy_info_fn: convert.PolicyInfoFn = None,
    zero_terminal_discount: bool = False,
    stats: Optional[PushStats] = None,
    progress: Optional[Callable[[int], None]] = None,
    num_workers: int = 1,
    priority_fn: Optional[Callable[[int], float]] = None,
) -> int:
  """Pushes RLDS data into a Reverb table, fast.

  Writes the same items as `ReverbAddTrajectoryObserver(client, table_name,
  sequence_length, stride_length, priority)` fed by `push_rlds_to_reverb`
  (or, with `sequence_length=None`, as `ReverbAddEpisodeObserver`: one item
  per episode), readable by TF-Agents' `ReverbReplayBuffer`.

  Args:
    rlds_data: An RLDS dataset of episodes.
    client: Client of the Reverb server that holds `table_name`.
    table_name: Table to write to; its signature must be the trajectory spec
      of the data with an outer time dimension.
    sequence_length: Trajectories per item, or None for whole episodes.
    stride_length: Steps between the starts of consecutive items.
    priority: Priority of every item.
    policy_info_fn: Optional per-step `(cur_step, next_step) -> policy_info`.
    zero_terminal_discount: Zero the discount of the step whose next step is
      last and terminal (see `convert_rlds_to_episodes`).
    stats: Optional `PushStats` updated in place as episodes are written.
    progress: Optional callback, called with the step count of each episode
      once it is handed to a writer (for a progress bar).
    num_workers: Writer threads; they overlap with the reading and with each
      other, since Reverb's C++ writer releases the GIL. With one, items come
      in exactly TF-Agents' order; with more, each segment's items still come
      in order, but segments of different episodes may interleave.
    priority_fn: With `sequence_length=None` only: the priority of each
      episode item from its number of trajectories, replacing `priority`
      (`her.transition_priority` makes a prioritized table sample episodes
      in proportion to their transitions).

  Returns:
    The number of trajectories (RLDS steps) pushed, as `push_rlds_to_reverb`.

  Raises:
    ValueError: If an argument is out of range, the table does not exist, or
      its signature does not match the data (TF-Agents' message, then the
      differences).
    ValueError: If no RLDS steps exist in rlds_data or the step spec is not
      valid.
    InvalidArgumentError: At the first invalid episode, before any of it is
      written; the message names episode and step and how many items were
      already written.
  """
  _validate_arguments(sequence_length, stride_length, priority, num_workers)
  if priority_fn is not None and sequence_length is not None:
    raise ValueError('priority_fn sets the priority of whole-episode items; '
                     'it needs sequence_length=None, got '
                     f'sequence_length={sequence_length}.')
  stats = stats if stats is not None else PushStats()
  episodes = convert.convert_rlds_to_episodes(
      rlds_data, policy_info_fn, zero_terminal_discount=zero_terminal_discount)
  trajectory_spec = episodes.element_spec.trajectory
  per_step_spec = tf.nest.map_structure(
      lambda s: tf.TensorSpec(s.shape[1:], s.dtype), trajectory_spec)
  tables.check_signature(client, table_name, per_step_spec)

  if sequence_length is None:
    make_writer = lambda: writers.EpisodeWriter(client, table_name, priority,
                                                priority_fn)
  else:
    make_writer = lambda: writers.WindowWriter(
        client, table_name, sequence_length, stride_length, priority)
  # Writing runs on worker threads while this one reads and converts.
  writer = writers.ParallelWriter(make_writer, num_workers)
  start = time.perf_counter()
  iterator = episodes.as_numpy_iterator()
  try:
    while True:
      try:
        episode = next(iterator)
      except StopIteration:
        break
      except tf.errors.InvalidArgumentError as e:
        writer.close()
        raise _invalid_episode_error(e, writer.items, table_name) from None
      writer.write(tf.nest.flatten(episode.trajectory),
                   episode.trajectory.step_type)
      _count_episode(stats, episode)
      stats.items = writer.items
      stats.seconds = time.perf_counter() - start
      if progress is not None:
        progress(len(episode.trajectory.step_type))
  finally:
    # Whatever stopped the push, what was written reaches the server and
    # `stats` counts it.
    writer.close()
    stats.items = writer.items
    stats.seconds = time.perf_counter() - start
  logging.info('Wrote %d steps as %d items to Reverb table %r.', stats.steps,
               writer.items, table_name)
  return stats.steps
