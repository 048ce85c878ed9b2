"""Offline data for the learners: check, cast, push, statistics.

A dataset is checked against the env (flat or goal data) and cast to
float32, then `push_rlds_to_table` writes it (terminal-discount fix on) into
a table big enough for all of it: whole episodes for the in-memory feed
(`push_episodes`, read back by `rlds_reverb.replay`), 2-step items for the
streaming feed (`push_to_new_table`, read with `sampling.transition_dataset`).
Nothing is dropped: a push that would not fit fails instead of evicting.
Nothing unusable is trained on: the pushes and `load_memory` refuse NaN/inf
values and discounts outside [0, 1] (`rlds_reverb.data.validate`), naming the
episode, step and field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import reverb
import rlds
import tensorflow as tf
from tf_agents.trajectories import trajectory
import tree

from rlds_reverb.data import convert
from rlds_reverb.storage import push
from rlds_reverb.replay import sampling
from rlds_reverb.storage import tables
from rlds_reverb.data import validate as validate_lib
from rlds_reverb.acting import envs
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import memory as memory_lib

# Step fields that become agent inputs, and the dtype agents compute in.
CAST_FIELDS = (rlds.OBSERVATION, rlds.ACTION, rlds.REWARD, rlds.DISCOUNT)
AGENT_DTYPE = tf.float32
# Table size when the dataset's size is unknown up front: Reverb allocates
# per item, not per slot, so a large bound costs nothing.
UNBOUNDED_TABLE_SIZE = 100_000_000


@dataclasses.dataclass(frozen=True)
class TableData:
  """Where the transitions live and how to read them."""
  address: str
  table: str
  data_spec: trajectory.Trajectory  # per step, float32 after casting
  table_size: int
  pushed: push.PushStats | None  # None when an existing table was read


def without_terminations(rlds_data: tf.data.Dataset) -> tf.data.Dataset:
  """Every ending a truncation and every discount 1.0: the data as a loader
  that loses terminations reads it (a measurement's control arm)."""

  def steps(step: dict[str, Any]) -> dict[str, Any]:
    out = dict(step)
    out[rlds.DISCOUNT] = tf.ones_like(step[rlds.DISCOUNT])
    out[rlds.IS_TERMINAL] = tf.zeros_like(step[rlds.IS_TERMINAL])
    return out
  return rlds_data.map(lambda episode: {
      **episode, rlds.STEPS: episode[rlds.STEPS].map(steps)})


def check_and_cast(rlds_data: tf.data.Dataset, specs: envs.EnvSpecs
                   ) -> tf.data.Dataset:
  """Casts observation/action/reward/discount to the agents' dtypes
  (float32; uint8 frames and discrete int64 actions stay), checked against
  the env.

  D4RL v2 configs store float32 steps with float64 `infos`; v1 replay configs
  are float64 throughout; agents compute in float32. Extra fields (infos)
  are left as they are: the conversion does not use them.

  Raises:
    ValueError: a field is not numeric (cannot be cast), or its shape is not
      what the env observes / acts; the message names field, dtype, shape.
  """
  convert.create_trajectory_data_spec(rlds_data)  # Validates the RLDS spec.
  step_spec = rlds_data.element_spec[rlds.STEPS].element_spec
  check_fields({f: step_spec[f] for f in CAST_FIELDS}, specs,
               'dataset step field')
  observation = step_spec[rlds.OBSERVATION]
  if specs.image and observation.dtype != tf.uint8:
    raise ValueError(f'dataset step field {rlds.OBSERVATION!r} has dtype '
                     f'{observation.dtype.name}; env {specs.env_id} gives '
                     'uint8 frames, and the data must hold them so')
  # Image frames stay uint8 (the memory keeps them once, the networks
  # scale them); discrete actions are indices, int64 as the action spec.
  dtypes = {f: (tf.int64 if f == rlds.ACTION and specs.discrete
                else AGENT_DTYPE) for f in CAST_FIELDS
            if not (specs.image and f == rlds.OBSERVATION)}
  if all(step_spec[f].dtype == dtype for f, dtype in dtypes.items()):
    return rlds_data

  def cast_steps(steps):
    return {k: (tf.cast(v, dtypes[k]) if k in dtypes else v)
            for k, v in steps.items()}

  def cast_episode(episode):
    episode = dict(episode)
    episode[rlds.STEPS] = episode[rlds.STEPS].map(cast_steps)
    return episode

  return rlds_data.map(cast_episode)


def check_fields(fields: dict[str, Any], specs: envs.EnvSpecs,
                 what: str) -> None:
  """Checks that each field can be cast to float32 and has the env's shape.

  Raises:
    ValueError: naming the field, its dtype or shape, and what is needed.
  """
  expected = {rlds.OBSERVATION: specs.observation_shape,
              rlds.ACTION: tuple(specs.action_spec.shape),
              rlds.REWARD: (), rlds.DISCOUNT: ()}
  for field, spec in fields.items():
    if not isinstance(spec, tf.TensorSpec):
      raise ValueError(f'{what} {field!r} is a nest '
                       f'({type(spec).__name__}); the agents need one tensor')
    if not (spec.dtype.is_floating or spec.dtype.is_integer or
            spec.dtype.is_bool):
      raise ValueError(f'{what} {field!r} has dtype {spec.dtype.name}, which '
                       f'cannot be cast to {AGENT_DTYPE.name}')
    if tuple(spec.shape.as_list()) != expected[field]:
      raise ValueError(
          f'{what} {field!r} has shape {spec.shape.as_list()} but env '
          f'{specs.env_id} needs {list(expected[field])}')


def push_to_new_table(rlds_data: tf.data.Dataset, client: reverb.Client,
                      address: str, table: str, *,
                      progress=None) -> TableData:
  """Pushes all of `rlds_data` (2-step items, terminal fix on) into `table`.

  Raises:
    push.TableFullError: the table is too small for the data (refused
      before the first episode that would not fit).
    RuntimeError: the table evicted items anyway (another writer).
    validate.InvalidDataError: NaN/inf or a discount outside [0, 1].
  """
  stats, size = _push_all(rlds_data, client, table, 'items', progress,
                          sequence_length=2)
  return TableData(address, table, convert.create_trajectory_data_spec(
      rlds_data), size, stats)


def existing_table(client: reverb.Client, address: str, table: str,
                   specs: envs.EnvSpecs) -> TableData:
  """Describes a table someone else filled (e.g. `pipelines.push --serve`).

  Raises:
    tables.TableNotFoundError: no such table.
    ValueError: the table has no signature, is empty, or holds fields the
      env's agent cannot use (see `check_fields`).
  """
  info = tables.get_table_info(client, table)
  if info.signature is None:
    raise ValueError(f'table {table!r} at {address} has no signature; '
                     'make it with pipelines.serve or pipelines.push')
  if info.current_size == 0:
    raise ValueError(f'table {table!r} at {address} is empty; push a '
                     'dataset into it first (pipelines.push)')
  fields = getattr(info.signature, '_asdict', lambda: {})()
  if set(fields) != set(trajectory.Trajectory._fields):
    raise ValueError(f'table {table!r} at {address} does not hold TF-Agents '
                     f'trajectories (signature {info.signature})')
  # The server sends back a look-alike namedtuple; agents want the class.
  data_spec = trajectory.Trajectory(**tf.nest.map_structure(
      lambda s: tf.TensorSpec(s.shape[1:], s.dtype), fields))
  check_fields({f: getattr(data_spec, f) for f in CAST_FIELDS}, specs,
               f'table {table!r} field')
  return TableData(address, table, data_spec, info.current_size, None)


def sample_batches(data: TableData, batch_size: int, *,
                   with_info: bool = False) -> tf.data.Dataset:
  """Batches of [batch_size, 2] trajectories from the table, float32.

  With `with_info`, (batch, SampleInfo) pairs, for prioritized replay.
  """
  return sampling.transition_dataset(data.address, data.table, data.data_spec,
                                     batch_size, dtypes_to=AGENT_DTYPE,
                                     with_info=with_info)


def observation_stats(data: TableData, num_samples: int = 100_000,
                      batch_size: int = 1000) -> tuple[np.ndarray, np.ndarray]:
  """Mean and std of observations, from uniform samples of the table.

  TD3+BC normalises states with the dataset's statistics; a uniform sample
  of 100k transitions estimates them to well under 1% of a std.
  """
  batches = max(1, num_samples // batch_size)
  observations = [
      batch.observation[:, 0].numpy() for batch in
      sample_batches(data, batch_size).take(batches)]
  flat = np.concatenate(observations).reshape(
      -1, int(np.prod(data.data_spec.observation.shape)))
  return flat.mean(0).astype(np.float32), (flat.std(0) + 1e-3).astype(
      np.float32)


def normalizer(mean: np.ndarray | None, std: np.ndarray | None):
  """Batch map that normalises both observations of each transition."""
  if mean is None:
    return lambda batch: batch
  mean_t, std_t = tf.constant(mean), tf.constant(std)
  return lambda batch: batch._replace(
      observation=(batch.observation - mean_t) / std_t)



def check_goal_data(rlds_data: tf.data.Dataset, specs: envs.EnvSpecs
                    ) -> tf.data.Dataset:
  """Checks a goal dataset against the env and casts its floats to float32.

  Raises:
    ValueError: flat observations, a missing goal key, or a shape that is not
      the env's (named: field, key, shape, what the env needs).
  """
  convert.create_trajectory_data_spec(rlds_data)  # validates the RLDS spec
  step_spec = rlds_data.element_spec[rlds.STEPS].element_spec
  observation = step_spec[rlds.OBSERVATION]
  if not isinstance(observation, dict):
    raise ValueError(
        f'dataset step field observation is flat ({observation.shape}); HER '
        f'needs goal-conditioned data with dict observations '
        f'({", ".join(envs.GOAL_KEYS)}), e.g. pipelines.generate --env '
        f'{specs.env_id}')
  obs_size, goal_size = specs.goal_sizes
  expected = {'observation': [obs_size], 'achieved_goal': [goal_size],
              'desired_goal': [goal_size]}
  for key, shape in expected.items():
    if key not in observation:
      raise ValueError(f'dataset observation has no {key!r}; it has '
                       f'{", ".join(sorted(observation))}')
    if observation[key].shape.as_list() != shape:
      raise ValueError(
          f'dataset observation[{key!r}] has shape '
          f'{observation[key].shape.as_list()} but env {specs.env_id} '
          f'needs {shape}')
  action = step_spec[rlds.ACTION]
  if action.shape.as_list() != specs.action_spec.shape.as_list():
    raise ValueError(f'dataset step field action has shape '
                     f'{action.shape.as_list()} but env {specs.env_id} needs '
                     f'{specs.action_spec.shape.as_list()}')

  def cast_steps(steps):
    out = {k: steps[k] for k in (rlds.IS_FIRST, rlds.IS_LAST,
                                 rlds.IS_TERMINAL)}
    out[rlds.OBSERVATION] = {k: tf.cast(steps[rlds.OBSERVATION][k],
                                        tf.float32) for k in expected}
    for k in (rlds.ACTION, rlds.REWARD, rlds.DISCOUNT):
      out[k] = tf.cast(steps[k], tf.float32)
    return out

  return rlds_data.map(lambda episode: {
      **episode, rlds.STEPS: episode[rlds.STEPS].map(cast_steps)})


# ------------------------------------------------- the in-memory feed's path

def push_episodes(rlds_data: tf.data.Dataset, client: reverb.Client,
                  table: str, *, progress=None) -> push.PushStats:
  """Pushes all of `rlds_data` as whole-episode items (terminal fix on) into
  an episode table, unread, for `load_memory`.

  Raises:
    push.TableFullError: the table is too small for the data (refused
      before the first episode that would not fit).
    RuntimeError: the table evicted episodes anyway (another writer).
    validate.InvalidDataError: NaN/inf or a discount outside [0, 1].
  """
  stats, _ = _push_all(rlds_data, client, table, 'episodes', progress,
                       sequence_length=None, priority=episode_table.UNREAD)
  return stats


def _push_all(rlds_data: tf.data.Dataset, client: reverb.Client, table: str,
              what: str, progress, **push_kwargs: Any
              ) -> tuple[push.PushStats, int]:
  """The push (terminal fix on), then a check that nothing was evicted;
  returns its stats and the table's size after it."""
  stats = push.PushStats()
  size_before = tables.get_table_info(client, table).current_size
  push.push_rlds_to_table(rlds_data, client, table,
                          zero_terminal_discount=True, stats=stats,
                          progress=progress, num_workers=2,
                          allow_eviction=False, **push_kwargs)
  size = tables.get_table_info(client, table).current_size
  if size != size_before + stats.items:
    raise RuntimeError(
        f'table {table!r} holds {size} {what} after {stats.items} were '
        f'written into {size_before}: it evicted data (raise its max_size)')
  return stats, size


def load_memory(client: reverb.Client, table: str, data_spec: Any, *,
                progress=None, validate: bool = True, **memory_kwargs: Any
                ) -> memory_lib.TransitionMemory:
  """Reads every episode of an episode table once into a new memory.

  Floating fields are stored as float32 (what the agents train on). With
  `validate`, each episode is checked as a push checks it (a table that
  someone filled without the check may hold NaN/inf).

  Raises:
    validate.InvalidDataError: An episode with a non-finite value or a
      discount outside [0, 1], named by its read order and key.
  """
  reader = episode_table.EpisodeReader(client, table)
  episodes, keys = [], []
  for episode in reader.iter_all():
    if validate:
      validate_lib.check_episode(
          episode.data, f'table {table!r} episode {len(episodes)} (item key '
          f'{episode.key})')
    episodes.append(tree.map_structure(
        lambda x: x.astype(np.float32) if x.dtype.kind == 'f' else x,
        episode.data))
    keys.append(episode.key)
    if progress is not None:
      progress(len(tree.flatten(episode.data)[0]))
  spec = tree.map_structure(
      lambda s: tf.TensorSpec(s.shape, AGENT_DTYPE if s.dtype.is_floating
                              else s.dtype), data_spec)
  return memory_lib.from_episodes(spec, episodes, keys, **memory_kwargs)


def memory_observation_stats(memory: memory_lib.TransitionMemory
                             ) -> tuple[np.ndarray, np.ndarray]:
  """Mean and std of the observation of every stored transition, exactly."""
  rows = memory._index[:int(memory.num_transitions)]  # pylint: disable=protected-access
  flat = memory.read(rows).observation.numpy()
  flat = flat.reshape(len(flat), -1).astype(np.float64)
  return flat.mean(0).astype(np.float32), (flat.std(0) + 1e-3).astype(
      np.float32)


def episode_returns(memory: Any) -> np.ndarray:
  """Undiscounted return of each live episode in the memory."""
  returns = []
  for _, start, length in memory.episode_rows():
    if length < 2:
      continue
    rewards = memory.read_fields(np.arange(start, start + length - 1),
                                 ('reward',))['reward']
    returns.append(float(np.sum(rewards.numpy(), dtype=np.float64)))
  return np.asarray(returns)


def reward_scale(returns: np.ndarray) -> float:
  """1000 / (max - min episode return): IQL's locomotion reward scaling
  (and CORL's normalize_reward), which makes the scale of Q the same on
  every dataset.

  Raises:
    ValueError: fewer than two episodes, or all returns equal.
  """
  if len(returns) < 2 or np.ptp(returns) <= 0:
    raise ValueError('reward scaling needs episodes of different returns; '
                     f'the data has {len(returns)} episode(s) with returns '
                     f'from {np.min(returns, initial=0):.1f} to '
                     f'{np.max(returns, initial=0):.1f}')
  return float(1000.0 / np.ptp(returns))
