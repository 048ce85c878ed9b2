"""Reverb tables -> batches of TF-Agents transitions, for learners.

`transition_dataset` yields what `ReverbReplayBuffer(data_spec, table,
sequence_length=2).as_dataset(sample_batch_size=B, num_steps=2)` yields first
(a `Trajectory` whose fields are [B, 2, ...]), i.e. what `agent.train` of
TF-Agents' SAC/TD3 takes, for a fraction of the CPU time (docs/training.md
has the figures). Learners read tables into memory by default
(`rlds_reverb.replay`); this streaming reader is for a remote table too big
for the learner's memory.

Where the time goes: Reverb's sampler unpacks every sampled item (one snappy
decompression and slice per column and chunk, then fresh tensors for the
data and the sample info), and tf.data hands each item over and copies it
into the batch: the floor of any `reverb.TrajectoryDataset` pipeline.
TF-Agents adds two per-element maps (broadcasting the sample info, its
sequence function) and a 32-way interleave per element. Here nothing else
runs per
element: the raw samples are batched first, then one vectorised map per batch
drops the sample info and casts floats. Extra readers (for machines with
free cores) run in parallel as whole-batch streams, so their interleave
costs one hand-over per batch.

A dead server: Reverb's dataset op then waits inside C++ (no error, no
deadline, deaf to Ctrl-C) and goes on by itself if the server comes back.
`ServerWatch` is the deadline: a thread that asks the server for the
table's size every few seconds and, when it does not answer, either waits
for it (a `server_link.ServerLink` with `reconnect_s`, saying so and what it
found on return) or ends the process: the thread blocked in C++ cannot be
interrupted, so `exit_process` prints one line and calls `os._exit(1)`.
"""

import numbers
import os
import sys
import threading
from typing import Any, Callable, List, Optional, Sequence

import reverb
import tensorflow as tf
import tree

from rlds_reverb.storage import server_link
from rlds_reverb.storage import tables

# Batches kept ready after the last map: the learner's next step never waits
# on a hand-over, and memory stays small (a batch of 256 halfcheetah
# transitions is about 60 KB).
_PREFETCH_BATCHES = 2


def _check_positive_int(arg: str, value: Any) -> None:
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < 1):
    raise ValueError(f'{arg} must be a positive integer, got {value!r}.')


def _check_spec(data_spec: Any) -> List[Any]:
  leaves = tree.flatten(data_spec)
  if not leaves:
    raise ValueError(
        f'data_spec must hold at least one spec, got {data_spec!r}.')
  for leaf in leaves:
    if not (hasattr(leaf, 'dtype') and hasattr(leaf, 'shape')):
      raise ValueError(
          'data_spec must be a nest of tf.TensorSpec (or ArraySpec), e.g. '
          f'create_trajectory_data_spec(rlds_data); found {leaf!r}.')
  return leaves


def _as_float_dtype(dtypes_to: Any) -> Optional[tf.DType]:
  if dtypes_to is None:
    return None
  try:
    dtype = tf.as_dtype(dtypes_to)
  except TypeError:
    dtype = None
  if dtype is None or not dtype.is_floating:
    raise ValueError(
        f'dtypes_to must be a floating dtype (e.g. tf.float32) or None, got '
        f'{dtypes_to!r}.')
  return dtype


def transition_dataset(
    server_address: str,
    table: str,
    data_spec: Any,
    batch_size: int,
    *,
    sequence_length: int = 2,
    num_parallel_readers: int = 1,
    max_in_flight: Optional[int] = None,
    dtypes_to: Optional[tf.DType] = tf.float32,
    rate_limiter_timeout_ms: int = -1,
    validate: bool = True,
    with_info: bool = False,
) -> tf.data.Dataset:
  """Endless batches of items sampled from a Reverb table of trajectories.

  The items must be windows of `sequence_length` trajectories, as
  `push_rlds_to_table(..., sequence_length=2)` or TF-Agents'
  `ReverbAddTrajectoryObserver` write them; each batch is drawn by the
  table's sampler (uniform, prioritized...), so the batch statistics are
  those of `ReverbReplayBuffer.as_dataset`.

  Args:
    server_address: 'host:port' of the Reverb server. A server in this same
      process is read directly, without gRPC.
    table: Table to sample from.
    data_spec: Spec of one trajectory (no time dimension), e.g.
      `create_trajectory_data_spec(rlds_data)`; the table's signature is
      `add_outer_dim(data_spec)`.
    batch_size: Items per batch (the leading dimension of every field).
    sequence_length: Trajectories per item (the second dimension).
    num_parallel_readers: Reverb samplers working in parallel, each making
      whole batches. One already keeps two threads busy (Reverb's sampler
      and the batching); more pay off only where cores are free
      (bench/sample.py measures it).
    max_in_flight: Items a sampler asks a remote server for at a time; None
      is 2 * batch_size, Reverb's rule of thumb. Larger is faster over gRPC
      but draws more items from one snapshot of the table.
    dtypes_to: Floating fields (float64 observation, reward...) are cast to
      this dtype; float32 is what TF-Agents' agents train on. Integer and
      bool fields are left as stored. None: no cast.
    rate_limiter_timeout_ms: How long a sampler waits on the table's rate
      limiter (e.g. for `min_size_to_sample` items) before the dataset ends;
      -1 waits for ever.
    validate: Check here, with one call to the server, that the table exists
      and stores `data_spec`; otherwise a bad table fails on the first batch.
    with_info: Yield `(trajectory, reverb.SampleInfo)` pairs, the info
      fields [batch_size]: the keys, probabilities and table sizes that
      prioritized replay needs (`rlds_reverb.replay.per`).

  Returns:
    A `tf.data.Dataset` of `data_spec`-shaped nests (a `Trajectory`) whose
    fields are [batch_size, sequence_length, ...], with static shapes.

  Raises:
    ValueError: If an argument is out of range (the message names it).
    ConnectionError: With `validate`, if no server answers at the address.
    TableNotFoundError (a ValueError): With `validate`, if the server has no
      such table.
    ValueError: With `validate`, if the table's signature does not match
      `data_spec`.
  """
  if not isinstance(server_address, str) or not server_address:
    raise ValueError('server_address must be a non-empty "host:port", got '
                     f'{server_address!r}.')
  if not isinstance(table, str) or not table:
    raise ValueError(f'table must be a non-empty string, got {table!r}.')
  _check_spec(data_spec)
  _check_positive_int('batch_size', batch_size)
  _check_positive_int('sequence_length', sequence_length)
  _check_positive_int('num_parallel_readers', num_parallel_readers)
  if max_in_flight is None:
    max_in_flight = 2 * batch_size
  _check_positive_int('max_in_flight', max_in_flight)
  if (isinstance(rate_limiter_timeout_ms, bool)
      or not isinstance(rate_limiter_timeout_ms, numbers.Integral)
      or rate_limiter_timeout_ms < -1):
    raise ValueError('rate_limiter_timeout_ms must be an integer >= -1, got '
                     f'{rate_limiter_timeout_ms!r}.')
  float_dtype = _as_float_dtype(dtypes_to)
  if validate:
    tables.check_signature(tables.connect(server_address), table, data_spec)

  batch_size, sequence_length = int(batch_size), int(sequence_length)
  dtypes = tree.map_structure(lambda s: tf.as_dtype(s.dtype), data_spec)
  # Static item shapes: Reverb checks each item against them, and the
  # batches come out as fully defined as ReverbReplayBuffer's.
  shapes = tree.map_structure(
      lambda s: tf.TensorShape([sequence_length]).concatenate(s.shape),
      data_spec)

  def unpack(sample: reverb.ReplaySample) -> Any:
    """Casts floats, once per batch; keeps the sample info if asked to."""
    data = sample.data
    if float_dtype is not None:
      data = tf.nest.map_structure(
          lambda x: tf.cast(x, float_dtype)
          if x.dtype.is_floating and x.dtype != float_dtype else x, data)
    return (data, sample.info) if with_info else data

  def reader(_=None) -> tf.data.Dataset:
    samples = reverb.TrajectoryDataset(
        server_address, table, dtypes, shapes,
        max_in_flight_samples_per_worker=int(max_in_flight),
        # One sampler thread per reader: Reverb's hand-over queue holds as
        # many samples as there are workers, and extra threads per reader
        # cost more CPU than they gain on few cores; parallelism comes from
        # `num_parallel_readers`.
        num_workers_per_iterator=1,
        rate_limiter_timeout_ms=int(rate_limiter_timeout_ms))
    # Batch the raw samples first: the per-element work stays inside Reverb
    # and the batch copy, everything else runs once per batch.
    return samples.batch(batch_size, drop_remainder=True).map(unpack)

  if num_parallel_readers == 1:
    dataset = reader()
  else:
    # Whole batches are interleaved, so a batch comes from one sampler (all
    # draw from the same table) and the interleave costs one hand-over per
    # batch instead of one per transition.
    dataset = tf.data.Dataset.range(num_parallel_readers).interleave(
        reader, cycle_length=num_parallel_readers,
        num_parallel_calls=num_parallel_readers, deterministic=False)
  options = tf.data.Options()
  options.deterministic = False  # Sampling is random anyway.
  options.autotune.enabled = True
  return dataset.prefetch(_PREFETCH_BATCHES).with_options(options)


def mixed_dataset(datasets: Sequence[tf.data.Dataset],
                  batch_sizes: Sequence[int]) -> tf.data.Dataset:
  """One batch from each dataset per step, concatenated along the batch axis.

  For symmetric sampling (RLPD: half of each batch offline, half online),
  e.g. `mixed_dataset([transition_dataset(addr, 'offline', spec, 128),
  transition_dataset(addr, 'online', spec, 128)], [128, 128])` yields
  batches of 256 whose first 128 items come from 'offline' and last 128 from
  'online', exactly, in every batch.

  Args:
    datasets: Datasets of batches with the same nest structure, dtypes and
      per-item shapes; dataset i yields batches of `batch_sizes[i]` items.
    batch_sizes: Leading dimension of each dataset's batches, checked against
      the static shapes (and at run time where a dataset's is unknown).

  Returns:
    A dataset of batches of `sum(batch_sizes)` items; it ends when the
    first of `datasets` ends.

  Raises:
    ValueError: If `datasets` is empty, the two lengths differ, a batch size
      is not a positive integer, or the datasets' elements differ in
      structure, dtype, per-item shape or batch size.
  """
  datasets, batch_sizes = list(datasets), list(batch_sizes)
  if not datasets:
    raise ValueError('datasets must hold at least one tf.data.Dataset, got '
                     'none.')
  if len(datasets) != len(batch_sizes):
    raise ValueError(
        f'datasets and batch_sizes must have the same length, got '
        f'{len(datasets)} datasets and {len(batch_sizes)} batch_sizes.')
  for i, size in enumerate(batch_sizes):
    _check_positive_int(f'batch_sizes[{i}]', size)
  for i, dataset in enumerate(datasets):
    if not isinstance(dataset, tf.data.Dataset):
      raise ValueError(
          f'datasets[{i}] must be a tf.data.Dataset, got {type(dataset)!r}.')

  first = datasets[0].element_spec
  needs_check = []
  for i, (dataset, size) in enumerate(zip(datasets, batch_sizes)):
    spec = dataset.element_spec
    try:
      tf.nest.assert_same_structure(first, spec)
    except (TypeError, ValueError) as e:
      raise ValueError(
          f'datasets[{i}] yields a different structure than datasets[0]: '
          f'{e}') from None
    unknown = False
    for (path, a), b in zip(tree.flatten_with_path(first), tree.flatten(spec)):
      where = '/'.join(map(str, path)) or '<root>'
      if a.dtype != b.dtype:
        raise ValueError(f'datasets[{i}] field {where} is {b.dtype.name}, '
                         f'datasets[0]\'s is {a.dtype.name}.')
      if b.shape.rank is None or b.shape.rank < 1:
        raise ValueError(f'datasets[{i}] field {where} has no batch '
                         f'dimension (shape {b.shape}).')
      if not a.shape[1:].is_compatible_with(b.shape[1:]):
        raise ValueError(
            f'datasets[{i}] field {where} has items of shape {b.shape[1:]}, '
            f'datasets[0]\'s are {a.shape[1:]}.')
      if b.shape[0] is None:
        unknown = True
      elif b.shape[0] != size:
        raise ValueError(
            f'datasets[{i}] yields batches of {b.shape[0]} (field {where}), '
            f'but batch_sizes[{i}] is {size}.')
    needs_check.append(unknown)

  def with_batch_size(dataset: tf.data.Dataset, size: int) -> tf.data.Dataset:
    """Fails at run time on a batch of another size (a short last batch)."""
    return dataset.map(lambda batch: tf.nest.map_structure(
        lambda x: tf.ensure_shape(x, [size] + x.shape[1:].as_list()), batch))

  datasets = [with_batch_size(d, s) if check else d
              for d, s, check in zip(datasets, batch_sizes, needs_check)]
  if len(datasets) == 1:
    return datasets[0]
  return tf.data.Dataset.zip(tuple(datasets)).map(
      lambda *batches: tf.nest.map_structure(
          lambda *parts: tf.concat(parts, axis=0), *batches)).prefetch(
              _PREFETCH_BATCHES)


def exit_process(error: BaseException) -> None:
  """Prints `error: <message>` on stderr and ends the process (exit 1).

  `os._exit`: the main thread may be blocked inside Reverb's C++ sampler,
  where no exception or signal reaches it; nothing else would end it.
  """
  message = ' '.join(str(error).split()) or type(error).__name__
  try:
    sys.stdout.flush()
    print(f'error: {message}', file=sys.stderr, flush=True)
  except (OSError, ValueError):
    pass
  os._exit(1)  # pylint: disable=protected-access


class ServerWatch:
  """Watches the server a streaming dataset samples, from a thread.

  Every `interval_s` it asks for the table's size through `link` (with the
  link's deadline). A lost server is waited for if the link reconnects
  (`ServerLink.wait` reports what it found on return); otherwise, or if the
  server does not come back in time (or comes back with the table empty),
  `on_lost(error)` is called from the watch's thread, by default
  `exit_process`. Use as a context manager around the training loop.
  """

  def __init__(self, link: server_link.ServerLink, client: reverb.Client, *,
               interval_s: float = 2.0,
               on_lost: Callable[[BaseException], None] = exit_process):
    if not interval_s > 0:
      raise ValueError(f'interval_s must be > 0, got {interval_s!r}.')
    self._link, self._client = link, client
    self._interval_s, self._on_lost = interval_s, on_lost
    self._stop = threading.Event()
    self._thread = threading.Thread(
        target=self._run, name=f'watch {link.address}', daemon=True)

  def __enter__(self) -> 'ServerWatch':
    self._thread.start()
    return self

  def __exit__(self, *_) -> None:
    self.stop()

  def stop(self) -> None:
    self._stop.set()

  def _run(self) -> None:
    what = f'sampling table {self._link.table!r}'
    while not self._stop.wait(self._interval_s):
      try:
        # Not own_deadline: the error names `what`, not the probe.
        self._link.call(lambda: self._link.table_size(self._client), what)
      except tables.ServerUnavailableError as e:
        if not self._stop.is_set():
          self._on_lost(e)
        return
