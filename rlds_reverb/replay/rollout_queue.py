"""On-policy rollouts through Reverb: a queue that hands each one out once.

An on-policy learner must train on each rollout exactly once, and only on
rollouts of its current policy. A Reverb queue table (FIFO sampler and
remover, every item sampled once and then deleted, inserts blocked while it
is full) is that contract: actors insert one item per rollout, the learner
takes them in the order they were written, and a full queue holds the
actors back instead of letting them run ahead on stale weights.

One item is one whole rollout: a flat dict of arrays ([T, N, ...] steps of
N env copies, plus per-rollout fields such as its number), written as a
single Reverb step, so a rollout costs Reverb's per-item overhead once.
Every call on the server has a deadline (`tables.call_with_deadline`).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import reverb
import tree

from rlds_reverb.storage import network
from rlds_reverb.storage import tables

DEFAULT_TIMEOUT_S = 30.0


def make_table(name: str, *, max_rollouts: int = 2) -> reverb.Table:
  """A queue of whole rollouts; writers wait while `max_rollouts` are
  unread."""
  if not isinstance(name, str) or not name:
    raise ValueError(f'name must be a non-empty string, got {name!r}.')
  if (isinstance(max_rollouts, bool) or not isinstance(max_rollouts, int)
      or max_rollouts < 1):
    raise ValueError(f'max_rollouts must be a positive integer, got '
                     f'{max_rollouts!r}.')
  return reverb.Table.queue(name, max_size=max_rollouts)


def check_queue(client: reverb.Client, table: str, *,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
  """Raises ValueError unless `table` is a queue (each item read once)."""
  info = network.server_info(client, timeout_s,
                             f'checking rollout table {table!r}')
  if table not in info:
    raise ValueError(f'the server has no table {table!r}; it has '
                     f'{", ".join(sorted(info)) or "none"}')
  table_info = info[table]
  if (table_info.max_times_sampled != 1 or
      not table_info.sampler_options.HasField('fifo') or
      not table_info.remover_options.HasField('fifo')):
    raise ValueError(f'table {table!r} is not a queue (FIFO, each item '
                     'sampled once): on-policy rollouts need '
                     'rollout_queue.make_table')


def write(client: reverb.Client, table: str, rollout: Mapping[str, Any], *,
          timeout_s: float | None = DEFAULT_TIMEOUT_S,
          address: str = 'the server') -> None:
  """Inserts one rollout (a flat dict of arrays) and waits until the server
  has it; a full queue is waited for up to `timeout_s` too.

  Raises:
    ValueError: `rollout` is not a non-empty flat dict of arrays.
    ServerUnavailableError: the server did not take it within `timeout_s`.
  """
  if not isinstance(rollout, Mapping) or not rollout:
    raise ValueError('a rollout is a non-empty dict of arrays')
  data = {key: np.asarray(value) for key, value in rollout.items()}
  nested = [key for key, value in data.items() if value.dtype == object]
  if nested:
    raise ValueError(f'rollout fields must be arrays, got objects in '
                     f'{", ".join(nested)}')

  def insert() -> None:
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
      writer.append(data)
      writer.create_item(table, 1.0, tree.map_structure(
          lambda column: column[-1], writer.history))
      writer.flush()

  tables.call_with_deadline(insert, timeout_s=timeout_s,
                            what=f'writing a rollout to table {table!r}',
                            address=address)


def read(client: reverb.Client, table: str, fields: Any, *,
         timeout_s: float | None = DEFAULT_TIMEOUT_S,
         address: str = 'the server') -> dict[str, np.ndarray]:
  """Takes the oldest unread rollout, waiting up to `timeout_s` for one.

  `fields` lists the rollout's keys (any order). The queue deletes what it
  hands out, so no rollout is read twice; a read that times out is an error
  for the learner to stop on (Reverb cannot cancel the call, which may still
  take the next rollout).

  Raises:
    ValueError: the item does not have `fields`.
    ServerUnavailableError: no rollout within `timeout_s`, or no server.
  """
  keys = sorted(fields)
  sample = tables.call_with_deadline(
      lambda: next(client.sample(table, 1, emit_timesteps=False)),
      timeout_s=timeout_s, what=f'reading a rollout from table {table!r}',
      address=address)
  columns = sample.data
  if len(columns) != len(keys):
    raise ValueError(f'a rollout in table {table!r} has {len(columns)} '
                     f'fields; expected {len(keys)}: {", ".join(keys)}')
  return dict(zip(keys, columns))
