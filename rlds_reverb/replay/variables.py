"""Policy weights in a Reverb table: the learner publishes, actors fetch.

TF-Agents' `ReverbVariableContainer` keeps a nest of `tf.Variable`s in a
table of `max_size` 1 (the newest push replaces the last) whose signature is
the nest's. Our actors act with numpy policies (`acting.numpy_policy`) and
never build a TF graph, and the server (`pipelines.serve`) is started before
anyone knows the actor network's layer sizes. So this is the numpy-side
equivalent, with one difference: the table has no signature, and each item
describes itself.

    item = [header, array_0, array_1, ...]
    header = uint8 bytes of JSON {"format": 1, "version": v, "info": {...},
             "values": {field: JSON value},
             "arrays": [[field, index in a list or null, shape], ...]}

`publish` takes a flat mapping or a dataclass (a `NumpyPolicy`): numpy
arrays and lists of arrays (kernels, biases) travel as columns, everything
else (head, metadata, obs_clip) in the header; `fetch` gives the mapping
back, so `NumpyPolicy(**fetched.weights)` is the policy. `version` is the
learner's gradient step of the weights; `info` anything else JSON-able
(its env steps).

Every call has a deadline (`tables.call_with_deadline`): a dead server is a
`tables.ServerUnavailableError` that names the address and the call within
`timeout_s` (plus a second for a publish), never a hang (Reverb's own sample
and flush calls wait forever).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, NamedTuple, Optional

import numpy as np
import reverb

from rlds_reverb.storage import tables

TABLE = 'variables'
FORMAT = 1


def make_table(name: str = TABLE) -> reverb.Table:
  """The table that holds the newest published weights (at most one item).

  As `ReverbVariableContainer` wants it (max_size 1, sampling waits for the
  first item), with a LIFO sampler so a reader always gets the newest item,
  and no signature (items describe themselves, see the module docstring).

  Raises:
    ValueError: `name` is empty.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f'name must be a non-empty string, got {name!r}.')
  return reverb.Table(
      name=name, sampler=reverb.selectors.Lifo(),
      remover=reverb.selectors.Fifo(), max_size=1,
      rate_limiter=reverb.rate_limiters.MinSize(1))


def check_table(client: reverb.Client, table: str = TABLE, *,
                timeout_s: float = tables.DEFAULT_TIMEOUT_S) -> None:
  """Checks that `table` exists and keeps one item (made by `make_table`).

  Raises:
    TableNotFoundError: the server has no such table (the message lists its
      tables).
    ValueError: its max_size is not 1 (it would hand out old weights).
    ServerUnavailableError: no answer within `timeout_s`.
  """
  info = tables.get_table_info(client, table, timeout_s=timeout_s)
  if info.max_size != 1:
    raise ValueError(
        f'table {table!r} keeps {info.max_size} items; a weights table keeps '
        'only the newest (max_size 1: replay.variables.make_table)')


def _encode(weights: Mapping[str, Any], version: int,
            info: Mapping[str, Any]) -> list[np.ndarray]:
  values, arrays, columns = {}, [], []
  for field, value in weights.items():
    if isinstance(value, np.ndarray):
      arrays.append([field, None, list(value.shape)])
      columns.append(value)
    elif (isinstance(value, (list, tuple)) and value and
          all(isinstance(v, np.ndarray) for v in value)):
      for i, array in enumerate(value):
        arrays.append([field, i, list(array.shape)])
        columns.append(array)
    else:
      values[field] = value
  header = {'format': FORMAT, 'version': version, 'info': dict(info),
            'values': values, 'arrays': arrays}
  try:
    text = json.dumps(header, sort_keys=True)
  except TypeError as e:
    raise ValueError(f'weights and info must be numpy arrays, lists of '
                     f'them, or JSON values: {e}') from None
  return [np.frombuffer(text.encode(), np.uint8)] + [
      np.ascontiguousarray(c) for c in columns]


class Published(NamedTuple):
  """What `fetch` returns."""
  weights: dict[str, Any]
  """The published mapping: arrays, lists of arrays, JSON values."""
  version: int
  """The learner's gradient step of the weights."""
  info: dict[str, Any]
  """What the learner published with them (e.g. its env steps)."""


def _decode(columns: list[Any]) -> Published:
  try:
    header = json.loads(np.asarray(columns[0], np.uint8).tobytes())
    if header.get('format') != FORMAT:
      raise ValueError(f'format {header.get("format")!r}, not {FORMAT}')
    weights = dict(header['values'])
    for (field, index, shape), column in zip(header['arrays'], columns[1:]):
      # Reverb hands a 0-d column back as [1].
      array = np.asarray(column).reshape(shape)
      if index is None:
        weights[field] = array
      else:
        weights.setdefault(field, []).append(array)
    return Published(weights, int(header['version']), header['info'])
  except (ValueError, KeyError, TypeError) as e:
    raise ValueError(f'not an item of replay.variables.publish: {e}') from None


def publish(client: reverb.Client, weights: Any, version: int, *,
            table: str = TABLE, info: Optional[Mapping[str, Any]] = None,
            timeout_s: float = tables.DEFAULT_TIMEOUT_S) -> None:
  """Publishes `weights` as version `version`; returns once the server has it.

  Args:
    client: Client of the server that holds `table`.
    weights: A flat mapping, or a dataclass such as a `NumpyPolicy`: numpy
      arrays, lists of arrays, and JSON values.
    version: The learner's gradient step (non-negative).
    table: The weights table (`make_table`).
    info: JSON-able facts to publish with them (e.g. {'env_steps': ...}).
    timeout_s: Deadline of the write.

  Raises:
    ValueError: a negative version, a value that is neither an array, a
      list of arrays nor JSON, or no table `table` on the server.
    ServerUnavailableError: the server did not confirm within `timeout_s`.
  """
  if (isinstance(version, bool) or
      not isinstance(version, (int, np.integer)) or version < 0):
    raise ValueError(f'version must be a non-negative integer, got '
                     f'{version!r}.')
  if dataclasses.is_dataclass(weights):
    weights = {f.name: getattr(weights, f.name)
               for f in dataclasses.fields(weights)}
  columns = _encode(weights, int(version), info or {})
  timeout_ms = max(1, math.ceil(timeout_s * 1000))

  def write():
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
      writer.append(columns)
      writer.create_item(table, 1.0, [column[-1] for column in writer.history])
      writer.flush(timeout_ms=timeout_ms)

  tables.call_with_deadline(write, timeout_s=timeout_s + 1.0,
                            what=f'publishing weights version {version} to '
                            f'table {table!r}', address=client.server_address)


def publications(client: reverb.Client, *, table: str = TABLE,
                 timeout_s: float = tables.DEFAULT_TIMEOUT_S) -> int:
  """How many times weights were published into `table` (Reverb's insert
  count, kept by a server checkpoint): a reader that saw this count last
  time has the newest weights already and need not sample them again.

  Raises:
    TableNotFoundError: the server has no table `table`.
    ServerUnavailableError: no answer within `timeout_s`.
  """
  info = tables.get_table_info(client, table, timeout_s=timeout_s)
  return int(info.rate_limiter_info.insert_stats.completed)


def fetch(client: reverb.Client, *, table: str = TABLE,
          timeout_s: float = tables.DEFAULT_TIMEOUT_S) -> Optional[Published]:
  """The newest published weights, or None if none were published yet.

  Raises:
    TableNotFoundError: the server has no table `table`.
    ValueError: the item was not written by `publish`.
    ServerUnavailableError: no answer within `timeout_s` (each of the two
      calls: the table's size, then the sample).
  """
  info = tables.get_table_info(client, table, timeout_s=timeout_s)
  if info.current_size == 0:  # Sampling would wait for the first publish.
    return None
  sample = tables.call_with_deadline(
      lambda: next(client.sample(table, 1, emit_timesteps=False)),
      timeout_s=timeout_s, what=f'fetching weights from table {table!r}',
      address=client.server_address)
  return _decode(list(sample.data))
