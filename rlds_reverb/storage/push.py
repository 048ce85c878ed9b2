"""Trajectories -> Reverb tables: TF-Agents' observer path and a fast path.

`push_rlds_to_reverb` keeps TF-Agents' signature and feeds any observer.
`push_rlds_to_table` writes the very items that TF-Agents'
`ReverbAddTrajectoryObserver` (fixed-length windows) or
`ReverbAddEpisodeObserver` (whole episodes) would write, without a Python
call per trajectory field: episodes arrive converted as whole numpy arrays,
steps go to Reverb's C++ trajectory writer directly, and an episode item is
one append of the whole episode.

A push into a server of another process can outlive that server: each wait
for it has a deadline (`timeout_s`); a lost server raises
`ServerUnavailableError` naming what was confirmed and what was in flight.
`PushLedger` checkpoints the server every so many episodes, records in a
state file which episodes it durably holds, notices a server that lost
items, and lets a later push resume exactly where the table stands.
"""

import dataclasses
import datetime
import json
import math
import os
import re
import time
from typing import Any, Callable, Dict, List, Optional

from absl import logging
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from rlds_reverb.data import convert
from rlds_reverb.storage import network
from rlds_reverb.storage import tables
from rlds_reverb.data import validate as validate_lib
from rlds_reverb.storage import writers

_LAST = int(ts.StepType.LAST)


# One error for a server that does not answer, wherever it is raised.
ServerUnavailableError = network.ServerUnavailableError


class TableFullError(ValueError):
  """The push would make the table evict items, and that is not allowed."""


class ItemsLostError(RuntimeError):
  """The table holds fewer items than the push had confirmed into it."""


class ResumeError(ValueError):
  """A push cannot resume (no state, another push's state, or a table that
  holds none of the recorded sizes) or must not start over."""


@dataclasses.dataclass
class PushStats:
  """Running totals of a push; valid even when the push stops on an error.

  Positions count the episodes of the whole dataset (empty ones too), from
  `first_episode` (where a resumed push starts): episodes [first_episode,
  position) were handed to the writers, [first_episode, confirmed_position)
  were confirmed by the server at the last barrier, with `confirmed_items`.
  """
  episodes: int = 0
  steps: int = 0
  items: int = 0
  terminated: int = 0
  truncated: int = 0
  empty_episodes: int = 0  # Episodes without steps: nothing to write.
  seconds: float = 0.0
  first_episode: int = 0
  position: int = 0
  confirmed_position: int = 0
  confirmed_items: int = 0
  # Why the barrier 'stopped' failed (the push raised its own error, which
  # wins): the caller says it, since a --resume then needs a restore.
  stop_unrecorded: str = ''

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
                        priority: float, num_workers: int,
                        timeout_s: Optional[float], checkpoint_every: int,
                        first_episode: int) -> None:
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
  if timeout_s is not None and not timeout_s > 0:
    raise ValueError(f'timeout_s must be > 0 or None, got {timeout_s!r}.')
  for name, value in (('checkpoint_every', checkpoint_every),
                      ('first_episode', first_episode)):
    if not isinstance(value, (int, np.integer)) or value < 0:
      raise ValueError(f'{name} must be an integer >= 0, got {value!r}.')


def _invalid_episode_error(error: tf.errors.InvalidArgumentError,
                           items: int, table_name: str,
                           first_episode: int) -> Exception:
  """The conversion's error, cleaned to one line, plus what was written."""
  found = re.search(r'assertion failed: \[(.*?)\]', error.message)
  reason = found.group(1) if found else error.message.splitlines()[0]
  if first_episode:  # Count episodes in the whole dataset, not the rest.
    reason = re.sub(r'\(episode (\d+)',
                    lambda m: f'(episode {int(m[1]) + first_episode}', reason)
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
  stats.position = stats.first_episode + int(episode.next_episode_index)
  if step_type[-1] == _LAST:
    if episode.is_terminal[-1]:
      stats.terminated += 1
    else:
      stats.truncated += 1


def episode_range(start: int, stop: int) -> str:
  """'episodes 3-7', 'episode 3' or 'no episode' for [start, stop)."""
  if stop <= start:
    return 'no episode'
  if stop == start + 1:
    return f'episode {start}'
  return f'episodes {start}-{stop - 1}'


def table_info(client: reverb.Client, table: str,
               timeout_s: Optional[float] = None) -> Any:
  """`tables.get_table_info` with a deadline (Reverb's: whole seconds).

  Raises:
    tables.TableNotFoundError: The server has no `table`.
    ServerUnavailableError: No answer within `timeout_s`.
  """
  if timeout_s is None:
    return tables.get_table_info(client, table)
  try:
    infos = client.server_info(timeout=max(1, math.ceil(timeout_s)))
  except reverb.errors.DeadlineExceededError:
    raise ServerUnavailableError(
        f'Reverb server at {client.server_address} did not answer within '
        f'{max(1, math.ceil(timeout_s))}s (server down?)') from None
  except RuntimeError as e:  # gRPC's errors, through pybind.
    raise ServerUnavailableError(
        f'Reverb server at {client.server_address}: {e}') from None
  if table not in infos:
    return tables.get_table_info(client, table)  # Raises its error.
  return infos[table]


def _check_room(rlds_data: tf.data.Dataset, client: reverb.Client,
                table_name: str, sequence_length: Optional[int],
                timeout_s: Optional[float]) -> int:
  """The items the table takes before it evicts; refuses a dataset with more
  episodes than that (each makes at least one item, bar the very short)."""
  info = table_info(client, table_name, timeout_s)
  room = max(0, info.max_size - info.current_size)
  episodes = int(rlds_data.cardinality())
  if episodes > room:  # Negative: unknown, checked episode by episode.
    each = ('one item each' if sequence_length is None else
            'one item or more each')
    raise TableFullError(
        f'table {table_name!r} at {client.server_address} holds at most '
        f'{info.max_size} items and has {info.current_size}; this push would '
        f'evict: its {episodes} episodes make {each}, and {room} fit')
  return room


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
    validate: bool = True,
    allow_eviction: bool = True,
    timeout_s: Optional[float] = None,
    checkpoint_every: int = 0,
    on_barrier: Optional[Callable[[PushStats, str], None]] = None,
    first_episode: int = 0,
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
    validate: Check every episode's values before writing any of it
      (`validate.check_episode`: finite floats, discounts in [0, 1]).
    allow_eviction: If False, refuse (before writing, or before the first
      episode that would not fit) a push that would make the table evict:
      the table's max_size less its size at the start bounds the items.
      Assumes no one else writes to the table meanwhile.
    timeout_s: Deadline of every wait for the server (flushes, the end of
      a Reverb episode, table info); None waits forever.
    checkpoint_every: Every so many episodes (0: never), wait until the
      server confirmed everything written (a barrier) and call `on_barrier`.
    on_barrier: Called as `on_barrier(stats, reason)` with everything so far
      confirmed: reason 'every' (each `checkpoint_every` episodes), 'end'
      (all written and confirmed) or 'stopped' (the push stops on an error
      or Ctrl-C; what was handed to the writers was confirmed). See
      `PushLedger.on_barrier`.
    first_episode: Index in the whole dataset of `rlds_data`'s first
      episode (a resumed push passes `dataset.skip(k)` and k): errors and
      `stats` count episodes from it.

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
    validate.InvalidDataError: At the first episode with a non-finite value
      or a discount outside [0, 1] (with `validate`), before any of it is
      written: 'episode 3, step 17: observation[5] is nan; ...'.
    TableFullError: Without `allow_eviction`, when the data does not fit.
    ServerUnavailableError: The server did not confirm within `timeout_s`;
      says what was confirmed and what was in flight.
    Whatever `on_barrier` raises (e.g. `ItemsLostError`).
  """
  _validate_arguments(sequence_length, stride_length, priority, num_workers,
                      timeout_s, checkpoint_every, first_episode)
  if priority_fn is not None and sequence_length is not None:
    raise ValueError('priority_fn sets the priority of whole-episode items; '
                     'it needs sequence_length=None, got '
                     f'sequence_length={sequence_length}.')
  stats = stats if stats is not None else PushStats()
  stats.first_episode = stats.position = stats.confirmed_position = (
      first_episode)
  episodes = convert.convert_rlds_to_episodes(
      rlds_data, policy_info_fn, zero_terminal_discount=zero_terminal_discount)
  trajectory_spec = episodes.element_spec.trajectory
  per_step_spec = tf.nest.map_structure(
      lambda s: tf.TensorSpec(s.shape[1:], s.dtype), trajectory_spec)
  tables.check_signature(client, table_name, per_step_spec)
  room = (None if allow_eviction else
          _check_room(rlds_data, client, table_name, sequence_length,
                      timeout_s))

  if sequence_length is None:
    make_writer = lambda: writers.EpisodeWriter(
        client, table_name, priority, priority_fn, timeout_s=timeout_s)
  else:
    make_writer = lambda: writers.WindowWriter(
        client, table_name, sequence_length, stride_length, priority,
        timeout_s=timeout_s)
  # Writing runs on worker threads while this one reads and converts.
  writer = writers.ParallelWriter(make_writer, num_workers,
                                  join_timeout_s=timeout_s)
  start = time.perf_counter()
  planned_items = 0
  since_barrier = 0
  pending = None  # The episode being handed over, until counted.

  def barrier(reason: str) -> None:
    # The writer's position and items come from its threads, together: a
    # Ctrl-C between handing an episode over and counting it here must not
    # record its items without it (a resume would write it twice).
    written = writer.position
    if (written is not None and written > stats.position
        and pending is not None):
      _count_episode(stats, pending)
    stats.items = stats.confirmed_items = writer.items
    stats.confirmed_position = (written if written is not None else
                                stats.confirmed_position)
    stats.seconds = time.perf_counter() - start
    if on_barrier is not None:
      on_barrier(stats, reason)

  def lost(error: BaseException) -> ServerUnavailableError:
    stats.items = writer.items
    reason = (f'Reverb server at {client.server_address} did not confirm '
              f'items within {timeout_s:g}s (server down?)'
              if isinstance(error, writers.ServerTimeoutError) else
              str(error))
    in_flight = (
        f'{stats.items - stats.confirmed_items} items of '
        f'{episode_range(stats.confirmed_position, stats.position)} in flight'
        if stats.position > stats.confirmed_position else 'nothing in flight')
    return ServerUnavailableError(
        f'{reason}: {stats.confirmed_items} items of '
        f'{episode_range(first_episode, stats.confirmed_position)} '
        f'confirmed, {in_flight}')

  iterator = episodes.as_numpy_iterator()
  try:
    while True:
      try:
        episode = next(iterator)
      except StopIteration:
        break
      except tf.errors.InvalidArgumentError as e:
        writer.close()  # Count every item handed over before this episode.
        raise _invalid_episode_error(e, writer.items, table_name,
                                     first_episode) from None
      index = first_episode + int(episode.episode_index)
      if validate:
        try:
          validate_lib.check_episode(episode.trajectory, f'episode {index}')
        except validate_lib.InvalidDataError as e:
          writer.close()
          raise validate_lib.InvalidDataError(
              f'{e}; {writer.items} items were already written to table '
              f'{table_name!r}, none from this episode') from None
      step_type = episode.trajectory.step_type
      planned = writer.plan(step_type)
      if room is not None and planned_items + planned.items > room:
        raise TableFullError(
            f'table {table_name!r} at {client.server_address} holds at most '
            f'{room} more items; this push would evict: {planned_items} '
            f'items written so far '
            f'({episode_range(first_episode, stats.position)}), episode '
            f'{index} makes {planned.items} more')
      pending = episode
      writer.write(tf.nest.flatten(episode.trajectory), step_type, planned,
                   position=first_episode + int(episode.next_episode_index))
      planned_items += planned.items
      _count_episode(stats, episode)
      pending = None
      stats.items = writer.items
      stats.seconds = time.perf_counter() - start
      if progress is not None:
        progress(len(step_type))
      since_barrier += 1
      if checkpoint_every and since_barrier >= checkpoint_every:
        writer.flush()
        since_barrier = 0
        barrier('every')
    writer.close()
    barrier('end')
  except (writers.ServerTimeoutError, ServerUnavailableError) as e:
    writer.close(abort=True)
    raise lost(e) from None
  except BaseException as e:
    # Whatever stopped the push, what was handed to the writers reaches the
    # server (within the deadline) and `stats` counts it.
    try:
      writer.close()
    except writers.ServerTimeoutError as closing:
      writer.close(abort=True)
      if isinstance(e, KeyboardInterrupt):
        raise
      raise lost(closing) from None
    except KeyboardInterrupt:
      writer.close(abort=True)
      raise e  # pylint: disable=raise-missing-from
    try:
      barrier('stopped')
    except Exception as unrecorded:  # pylint: disable=broad-except
      stats.stop_unrecorded = str(unrecorded).splitlines()[0]
    raise
  finally:
    stats.items = writer.items
    stats.seconds = time.perf_counter() - start
  logging.info('Wrote %d steps as %d items to Reverb table %r.', stats.steps,
               writer.items, table_name)
  return stats.steps


# ------------------------------------------------------------- push ledger


@dataclasses.dataclass
class PushPoint:
  """A barrier of a push: the table held `table_size` items once episodes
  [0, episodes) were confirmed (`items` of them, over all runs of it)."""
  episodes: int
  items: int
  table_size: int
  checkpoint: Optional[str] = None  # The server checkpoint that holds it.
  time: str = ''
  reason: str = 'start'
  # A sharded push (`shards.py`): per shard its range [start, stop), the
  # position up to which it was confirmed and its items (all runs).
  shards: Optional[List[Dict[str, int]]] = None

  def held(self) -> str:
    """'episodes 0-9' or, sharded, 'episodes 0-4, 50-54'."""
    if self.shards is None:
      return episode_range(0, self.episodes)
    parts = [episode_range(s['start'], s['position'])
             for s in self.shards if s['position'] > s['start']]
    if not parts:
      return 'no episode'
    return 'episodes ' + ', '.join(
        p.split(' ', 1)[1] for p in parts) if len(parts) > 1 else parts[0]

  def describe(self) -> str:
    where = (f', checkpoint {self.checkpoint}' if self.checkpoint else
             ', not checkpointed')
    return f'{self.table_size} items ({self.held()}{where})'


@dataclasses.dataclass
class PushState:
  """What a state file records: which push, and its confirmed points."""
  fingerprint: Dict[str, Any]
  points: List[PushPoint]  # The first is the table before the push.
  complete: bool = False
  address: str = ''

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self), indent=1)

  @classmethod
  def from_json(cls, text: str) -> 'PushState':
    data = json.loads(text)
    return cls(fingerprint=data['fingerprint'],
               points=[PushPoint(**p) for p in data['points']],
               complete=bool(data.get('complete')),
               address=data.get('address', ''))

  def save(self, path: str) -> None:
    """Writes atomically: a crash leaves the old file or the new one."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f'{path}.tmp{os.getpid()}'
    with open(temporary, 'w') as f:
      f.write(self.to_json())
      f.flush()
      os.fsync(f.fileno())
    os.replace(temporary, path)

  @classmethod
  def load(cls, path: str) -> 'PushState':
    with open(path) as f:
      return cls.from_json(f.read())

  @property
  def last_checkpointed(self) -> PushPoint:
    """The latest point a server checkpoint holds (else the start)."""
    return next((p for p in reversed(self.points) if p.checkpoint),
                self.points[0])


def _now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(
      timespec='seconds')


class PushLedger:
  """What a push confirmed into a table: checked, checkpointed, recorded.

  At each barrier of `push_rlds_to_table` (pass `on_barrier=ledger.on_barrier`)
  the ledger compares the table's size with what the push expects (its size
  when this run started plus the items confirmed, capped at max_size): less
  means the server lost items (a restart from an older checkpoint, or none),
  and `ItemsLostError` says which episodes are no longer in the table. Then
  it asks the server to checkpoint (reasons 'every' and 'end') and records
  the point in the state file, so that a later push with `resume=True`
  skips exactly the episodes the table holds.

  The size checks assume this push is the table's only writer, and that
  sampling removes nothing (a table with max_times_sampled > 0 is not
  checked).
  """

  def __init__(self, client: reverb.Client, table: str, *,
               fingerprint: Dict[str, Any], state_path: Optional[str] = None,
               resume: bool = False, checkpoints: bool = True,
               timeout_s: Optional[float] = None,
               checkpoint_timeout_s: Optional[float] = None):
    """Reads the table and the state file; decides where the push starts.

    Args:
      client: Client of the server that holds `table`.
      table: The table the push writes.
      fingerprint: What identifies the push (dataset, split, table, item
        settings...): a resumed push must have the same.
      state_path: The state file; None records nothing (no resume).
      resume: Continue the push recorded in `state_path` (see
        `first_episode`); else start one, refusing to overwrite an
        unfinished one.
      checkpoints: Have the server checkpoint at barriers 'every' and 'end'
        (False: only check and record).
      timeout_s: Deadline of each table info call.
      checkpoint_timeout_s: Deadline of each checkpoint (default: 6 x
        `timeout_s`, at least 60 s; None with `timeout_s` None).

    Raises:
      ResumeError: `resume` without a state file, with another push's, or
        with a table whose size is none of the recorded points'; or, without
        `resume`, a state file of an unfinished push.
      ServerUnavailableError: The server did not answer within `timeout_s`.
    """
    self._client = client
    self._table = table
    self._path = state_path
    self._checkpoints = checkpoints
    self._timeout_s = timeout_s
    self._checkpoint_timeout_s = (
        checkpoint_timeout_s if checkpoint_timeout_s is not None else
        None if timeout_s is None else max(60.0, 6 * timeout_s))
    self.address = client.server_address
    info = table_info(client, table, timeout_s)
    self._max_size = info.max_size
    self._removes_on_sample = info.max_times_sampled > 0
    size = info.current_size
    exists = state_path is not None and os.path.exists(state_path)
    if resume:
      if not exists:
        raise ResumeError(f'no push state at {state_path} to resume from')
      self.state = PushState.load(state_path)
      self._check_fingerprint(fingerprint)
      self.start = self._resume_point(size)
    else:
      if exists:
        old = PushState.load(state_path)
        if not old.complete:
          raise ResumeError(
              f'{state_path} records an unfinished push into table '
              f'{old.fingerprint.get("table")!r} (confirmed: '
              f'{old.points[-1].describe()})')
      self.state = PushState(fingerprint, [PushPoint(0, 0, size, None,
                                                     _now())])
      self.start = self.state.points[0]
    self.state.address = self.address
    self.resumed = resume
    self._size_at_start = size

  @property
  def first_episode(self) -> int:
    """Where this run starts in the dataset: `dataset.skip(first_episode)`."""
    return self.start.episodes

  @property
  def complete(self) -> bool:
    """Whether the recorded push already wrote every episode."""
    return self.state.complete

  def _check_fingerprint(self, fingerprint: Dict[str, Any]) -> None:
    recorded = self.state.fingerprint
    differences = [f'{key}: recorded {recorded.get(key)!r}, now '
                   f'{fingerprint.get(key)!r}'
                   for key in sorted(set(recorded) | set(fingerprint))
                   if recorded.get(key) != fingerprint.get(key)]
    if differences:
      raise ResumeError(f'{self._path} records another push: '
                        f'{"; ".join(differences)}')

  def _resume_point(self, size: int) -> PushPoint:
    matching = [p for p in self.state.points if p.table_size == size]
    if matching:
      return matching[-1]
    recorded = '; '.join(p.describe() for p in self.state.points)
    held = self.state.last_checkpointed
    raise ResumeError(
        f'table {self._table!r} at {self.address} holds {size} items, which '
        f'matches no point that {self._path} recorded ({recorded}): restore '
        f'the server from its latest checkpoint (it holds {held.table_size} '
        'items), then resume')

  def expected_size(self, stats: PushStats) -> int:
    return min(self._max_size, self._size_at_start + stats.confirmed_items)

  def evicted(self, stats: PushStats, size: int) -> int:
    """Items that left the table while this push wrote (its only writer)."""
    if self._removes_on_sample:
      return 0
    return max(0, self._size_at_start + stats.confirmed_items - size)

  def size(self) -> int:
    return table_info(self._client, self._table, self._timeout_s).current_size

  def durable(self) -> str:
    """'episodes 0-99 are in checkpoint P (1000 items)', for error messages."""
    point = self.state.last_checkpointed
    if not point.checkpoint:
      return ('no episode of this push is in a server checkpoint yet (the '
              f'table held {point.table_size} items before it)')
    return (f'{point.held()} '
            f'{"are" if point.episodes > 1 else "is"} in checkpoint '
            f'{point.checkpoint} ({point.table_size} items)')

  def check(self, stats: PushStats) -> int:
    """Returns the table's size; raises if it lost confirmed items.

    Raises:
      ItemsLostError: The table holds fewer items than expected; says which
        episodes of this run may be missing and which a checkpoint holds.
      ServerUnavailableError: No answer within the deadline.
    """
    size = self.size()
    expected = self.expected_size(stats)
    if size >= expected or self._removes_on_sample:
      return size
    raise ItemsLostError(
        f'table {self._table!r} at {self.address} holds {size} items where '
        f'this push confirmed {expected}: the server lost '
        f'{expected - size} items (restarted?), so '
        f'{episode_range(stats.first_episode, stats.position)} are not all '
        f'in it; {self.durable()}')

  def on_barrier(self, stats: PushStats, reason: str,
                 shards: Optional[List[Dict[str, int]]] = None) -> None:
    """The `on_barrier` of `push_rlds_to_table`: check, checkpoint, record.

    A sharded push (`shards.py`) passes the shards' positions and, in
    `stats`, the episodes confirmed over all shards as `confirmed_position`
    and this run's items over all shards as `confirmed_items`.

    Raises:
      ItemsLostError, ServerUnavailableError: See `check`.
    """
    size = self.check(stats)
    point = PushPoint(stats.confirmed_position,
                      self.start.items + stats.confirmed_items, size, None,
                      _now(), reason, shards)
    # Recorded before the checkpoint exists: a server killed right after
    # writing it restores a size that the state file already names.
    self.state.points.append(point)
    self.state.complete = reason == 'end'
    self._save()
    if self._checkpoints and reason in ('every', 'end'):
      point.checkpoint = network.call_with_deadline(
          self._client.checkpoint, timeout_s=self._checkpoint_timeout_s,
          what='checkpointing its tables', address=self.address)
      self._save()

  def _save(self) -> None:
    if self._path is not None:
      self.state.save(self._path)

  @property
  def last_checkpoint(self) -> Optional[str]:
    return self.state.points[-1].checkpoint
