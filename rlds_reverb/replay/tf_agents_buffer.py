"""A TF-Agents `ReplayBuffer` over a Reverb episode table and the in-memory feed.

TF-Agents jobs sample `ReverbReplayBuffer.as_dataset` item by item, at
Reverb's cost per item. `MemoryReplayBuffer` keeps Reverb as the store (an
episode table, filled by the push, by `EpisodeObserver` in a TF-Agents
driver or actor, or by the toolkit's actor processes) and draws batches
from a copy of the table in process memory, in graph, with the replay
variants the toolkit's own learners use (uniform with optional n-step
returns, prioritized, hindsight). Its `as_dataset` yields what
`ReverbReplayBuffer.as_dataset` yields for the same data and `num_steps`:
`(Trajectory [B, num_steps, ...], reverb.SampleInfo [B, num_steps])`, so
`tf_agents.train.Learner(..., experience_dataset_fn=lambda:
buffer.as_dataset(...))` trains from it unchanged.

New episodes in the table reach the memory every `poll_every` batches (and
while the memory is empty, the dataset waits for the first one, as a Reverb
table's rate limiter would). The `key` of a sample is the memory row where
its first step is stored: the key that `PriorityUpdate` takes.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

import numpy as np
import reverb
import tensorflow as tf
from tf_agents.replay_buffers import replay_buffer

from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from rlds_reverb.replay import her
from rlds_reverb.replay import per
from rlds_reverb.replay import variants
from rlds_reverb.storage import tables

# How often a draw from an empty memory looks at the table again.
_WAIT_SLICE_S = 0.1


def table_data_spec(client: reverb.Client, table: str) -> Any:
  """Per-step spec of an episode table (its signature without the time
  dimension), floats as float32: what the memory stores."""
  signature = tables.get_table_signature(client, table)
  if signature is None:
    raise ValueError(f'table {table!r} has no signature: make it with '
                     'replay.episode_table.make_table')
  return tf.nest.map_structure(
      lambda s: tf.TensorSpec(s.shape[1:], tf.float32 if s.dtype.is_floating
                              else s.dtype), signature)


class MemoryReplayBuffer(replay_buffer.ReplayBuffer):
  """TF-Agents replay buffer: Reverb episode table in, in-memory draws out.

  Make one with `uniform`, `prioritized` or `hindsight`, or from any
  `replay.variants` replay. Writing goes through Reverb (`add_batch` is not
  served: use `EpisodeObserver` or the push), so every writer, local or
  remote, fills the one store.
  """

  def __init__(self, replay: variants.UniformReplay, client: reverb.Client,
               *, poll_every: int = 100, wait_timeout_s: float = 600.0):
    """Reads what the table holds now into memory.

    Args:
      replay: the variant (its settings name the table and the capacity).
      client: a client of the server that holds the table.
      poll_every: batches between looks for new episodes (0: never; offline
        data).
      wait_timeout_s: how long a draw from an empty memory waits for a
        first episode before it fails.
    """
    self._replay, self._client = replay, client
    self._poll_every, self._wait_timeout_s = int(poll_every), wait_timeout_s
    self._lock = threading.Lock()
    replay.check(client)
    replay.start(client)
    memory = replay.memory
    spec = memory.transition_spec()
    if isinstance(replay, variants.HindsightReplay):
      spec = her.learner_spec(spec)
    super().__init__(spec, memory.capacity, stateful_dataset=True)
    self._windows: dict[int, tuple[tf.Variable, tf.Variable]] = {}
    self._polls = tf.Variable(0, dtype=tf.int64, trainable=False)

  # ------------------------------------------------------------ makers

  @classmethod
  def uniform(cls, client: reverb.Client, table: str, *,
              capacity: Optional[int] = None, n_step: int = 1,
              gamma: float = 0.99, **kwargs: Any) -> 'MemoryReplayBuffer':
    """Uniform draws; `n_step` > 1 sums n-step returns into 2-step items.
    `capacity`: rows (steps) the memory keeps, the oldest episodes evicted
    past it; None: what the table holds now (offline data)."""
    return cls(variants.UniformReplay(
        _settings(client, table, capacity, n_step, gamma, 1)), client,
               **kwargs)

  @classmethod
  def prioritized(cls, client: reverb.Client, table: str, *,
                  batch_size: int, config: per.PerConfig = per.PerConfig(),
                  capacity: Optional[int] = None, n_step: int = 1,
                  gamma: float = 0.99, **kwargs: Any) -> 'MemoryReplayBuffer':
    """Proportional PER on a sum tree in memory, drawing batches of
    `batch_size` (the sum tree's draw is stratified over the batch). The
    priorities are written back to the table's side table
    (`write_priorities`, at checkpoints) and read back when a buffer is
    made on the same table."""
    return cls(variants.PrioritizedReplay(
        _settings(client, table, capacity, n_step, gamma, batch_size),
        config), client, **kwargs)

  @classmethod
  def hindsight(cls, client: reverb.Client, table: str, reward_source: Any, *,
                batch_size: int, config: her.HerConfig = her.HerConfig(),
                capacity: Optional[int] = None, normalize: bool = False,
                **kwargs: Any) -> 'MemoryReplayBuffer':
    """Goal-conditioned episodes, goals relabelled when drawn; the agent
    sees concat(observation, goal) (`her.learner_spec`; `observation_fn`
    for its policies). `reward_source`: the goal env, or a function
    (achieved_goal, desired_goal) -> reward."""
    return cls(variants.HindsightReplay(
        _settings(client, table, capacity, 1, 0.99, batch_size), config,
        reward_source,
        normalize=normalize), client, **kwargs)

  # ------------------------------------------------------------ state

  @property
  def replay(self) -> variants.UniformReplay:
    return self._replay

  @property
  def memory(self):
    return self._replay.memory

  def poll(self) -> int:
    """Moves the episodes written since into memory; returns how many."""
    with self._lock:
      added = self._replay.poll()
      if added:
        self._refresh_windows()
      return added

  def observation_fn(self) -> Callable[[Any], np.ndarray]:
    """Env observation -> what the agent's policy takes (hindsight: the
    flattened, normalised observation and goal; else unchanged)."""
    view = self._replay.actor_view()
    return view if view is not None else (lambda observation: observation)

  def write_priorities(self) -> int:
    """Writes the priorities to the store's side table (prioritized);
    returns the episodes written (0 for other replays)."""
    if not isinstance(self._replay, variants.PrioritizedReplay):
      return 0
    self._replay.write_back(self._client)
    return len(self.memory.episode_rows())

  # ------------------------------------------------------------ drawing

  def _num_frames(self) -> tf.Tensor:
    return tf.cast(self.memory.num_transitions, tf.int64)

  def _add_batch(self, items):
    raise NotImplementedError(
        'MemoryReplayBuffer is filled through Reverb: add an '
        'EpisodeObserver(client, table) to the driver or actor, or push '
        'RLDS data into the table')

  def _get_next(self, sample_batch_size=None, num_steps=None,
                time_stacked=True):
    sample_batch_size = sample_batch_size or 1
    num_steps = self._check_num_steps(num_steps or 2)
    self._prepare(sample_batch_size, num_steps)
    return self._draw(sample_batch_size, num_steps)

  def _gather_all(self):
    raise NotImplementedError('MemoryReplayBuffer does not gather all; '
                              'use as_dataset(single_deterministic_pass=True)')

  def _clear(self):
    raise NotImplementedError('clear the Reverb table instead '
                              '(client.reset(table))')

  def _check_num_steps(self, num_steps: Optional[int]) -> int:
    if num_steps is None:
      raise ValueError(
          'num_steps=None (whole episodes) is not served by '
          'MemoryReplayBuffer: ask for windows of num_steps >= 1 steps')
    num_steps = int(num_steps)
    if num_steps < 1:
      raise ValueError(f'num_steps must be >= 1, got {num_steps}')
    plain = (type(self._replay) is variants.UniformReplay  # pylint: disable=unidiomatic-typecheck
             and self._replay.settings.n_step == 1)
    if num_steps != 2 and not plain:
      raise ValueError(
          f'{self._replay.kind} replay with n_step '
          f'{self._replay.settings.n_step} draws transitions: '
          f'num_steps must be 2, got {num_steps}')
    return num_steps

  def _window_index(self, num_steps: int) -> tuple[tf.Variable, tf.Variable]:
    """Rows where a window of `num_steps` steps of one episode starts."""
    if num_steps not in self._windows:
      self._windows[num_steps] = (
          tf.Variable(tf.zeros([self.memory.capacity], tf.int32),
                      trainable=False),
          tf.Variable(0, dtype=tf.int32, trainable=False))
      self._refresh_windows()
    return self._windows[num_steps]

  def _refresh_windows(self) -> None:
    for num_steps, (index, count) in self._windows.items():
      starts = [np.arange(start, start + length - num_steps + 1)
                for _, start, length in self.memory.episode_rows()
                if length >= num_steps]
      rows = (np.concatenate(starts).astype(np.int32) if starts
              else np.zeros(0, np.int32))
      index.scatter_update(tf.IndexedSlices(
          rows, tf.range(len(rows), dtype=tf.int32)))
      count.assign(len(rows))

  def _wait_for_data(self) -> np.int64:
    """Polls the table (every poll_every draws; until data, if none)."""
    deadline = time.monotonic() + self._wait_timeout_s
    while True:
      self.poll()
      if int(self.memory.num_transitions) > 0:
        return np.int64(0)
      if time.monotonic() > deadline:
        raise TimeoutError(
            f'table {self._replay.settings.table!r} gave no transition in '
            f'{self._wait_timeout_s:.0f} s: nothing has written an episode '
            'of two steps or more into it')
      time.sleep(_WAIT_SLICE_S)

  def _maybe_poll(self) -> tf.Tensor:
    every = self._poll_every
    if every <= 0:
      return tf.constant(0, tf.int64)
    count = self._polls.assign_add(1)

    def poll():
      return tf.py_function(self._wait_for_data, [], tf.int64)
    return tf.cond(tf.equal((count - 1) % every, 0), poll,
                   lambda: tf.constant(0, tf.int64))

  def _prepare(self, batch_size: int, num_steps: int) -> None:
    """Makes, eagerly, the variables a draw reads (never inside a trace)."""
    if isinstance(self._replay, (variants.PrioritizedReplay,
                                 variants.HindsightReplay)):
      self._feed(batch_size)
    elif num_steps != 2:
      self._window_index(num_steps)

  def _draw(self, batch_size: int, num_steps: int) -> tuple[Any, Any]:
    """One batch `(experience [B, num_steps, ...], SampleInfo [B,
    num_steps])`, drawn in graph."""
    replay = self._replay
    if isinstance(replay, variants.PrioritizedReplay):
      feed = self._feed(batch_size)
      experience, drawn = feed()
      rows, probability = drawn.rows, drawn.probability
      size = drawn.num_transitions
      priority = self._raw_priority(feed, probability)
    elif isinstance(replay, variants.HindsightReplay):
      experience, drawn = self._feed(batch_size).sample_with_info()
      rows, size = drawn['row'], self.memory.num_transitions
      probability = 1.0 / tf.cast(size, tf.float64) * tf.ones(
          [batch_size], tf.float64)
      priority = tf.ones([batch_size], tf.float64)
    elif num_steps == 2:
      rows = self.memory.sample_rows(batch_size)
      experience = self.memory.transitions(
          rows, n_step=replay.settings.n_step, gamma=replay.settings.gamma)
      size = self.memory.num_transitions
      probability = tf.fill([batch_size],
                            1.0 / tf.cast(size, tf.float64))
      priority = tf.ones([batch_size], tf.float64)
    else:
      index, size = self._window_index(num_steps)
      slot = tf.random.uniform([batch_size], 0, size, tf.int32)
      rows = tf.gather(index, slot)
      experience = self.memory.read(
          rows[:, None] + tf.range(num_steps, dtype=tf.int32)[None, :])
      probability = tf.fill([batch_size], 1.0 / tf.cast(size, tf.float64))
      priority = tf.ones([batch_size], tf.float64)

    def steps(x, dtype):
      return tf.tile(tf.cast(x, dtype)[:, None], [1, num_steps])
    info = reverb.SampleInfo(
        key=steps(rows, tf.uint64), probability=steps(probability, tf.float64),
        table_size=steps(tf.fill([batch_size], tf.cast(size, tf.int64)),
                         tf.int64),
        priority=steps(priority, tf.float64),
        times_sampled=tf.zeros([batch_size, num_steps], tf.int32))
    return experience, info

  def _feed(self, batch_size: int) -> Any:
    feed = self._replay.feed()
    if feed.batch_size != batch_size:
      raise ValueError(
          f'{self._replay.kind} replay draws batches of {feed.batch_size} '
          f'(the buffer\'s batch_size); got sample_batch_size={batch_size}')
    return feed

  def _raw_priority(self, feed: feeds.PrioritizedFeed,
                    probability: tf.Tensor) -> tf.Tensor:
    leaf = tf.cast(probability, tf.float64) * tf.cast(feed.tree.total(),
                                                      tf.float64)
    alpha = feed.config.alpha
    return leaf ** (1.0 / alpha) if alpha > 0 else tf.ones_like(leaf)

  def _as_dataset(self, sample_batch_size=None, num_steps=None,
                  sequence_preprocess_fn=None, num_parallel_calls=None):
    num_steps = self._check_num_steps(num_steps)
    del num_parallel_calls  # One draw is one batch, already vectorised.
    batch_size = sample_batch_size or 1
    if self._poll_every <= 0 and int(self.memory.num_transitions) == 0:
      raise ValueError(f'table {self._replay.settings.table!r} holds no '
                       'transition and the buffer does not poll it')
    self._prepare(batch_size, num_steps)

    def draw(_):
      with tf.control_dependencies([self._maybe_poll()]):
        experience, info = self._draw(batch_size, num_steps)
      if sequence_preprocess_fn is not None:
        experience = sequence_preprocess_fn(experience)
      return experience, info

    dataset = tf.data.Dataset.from_tensors(0).repeat().map(draw)
    # Each element is drawn when asked for: a prefetch that tf.data would
    # inject on its own draws ahead from a memory that has not yet read the
    # newest episodes, nor the newest priorities (add one explicitly to
    # overlap drawing with training).
    options = tf.data.Options()
    options.experimental_optimization.inject_prefetch = False
    dataset = dataset.with_options(options)
    if sample_batch_size is None:
      dataset = dataset.unbatch()
    return dataset

  def as_draws(self, sample_batch_size: int, num_steps: int = 2
               ) -> 'InGraphDraws':
    """What `as_dataset` yields, drawn inside the consumer's own graph.

    For `Learner(..., experience_dataset_fn=lambda: buffer.as_draws(B,
    2))`: the Learner's train function calls `next()` on it while it is
    traced, so each batch is drawn by ops of the train step itself, as the
    toolkit's own learners draw, with no tf.data pipeline between. Same
    element spec as `as_dataset(B, num_steps)`.
    """
    num_steps = self._check_num_steps(num_steps)
    self._prepare(sample_batch_size, num_steps)

    def draw():
      with tf.control_dependencies([self._maybe_poll()]):
        return self._draw(sample_batch_size, num_steps)
    return InGraphDraws(draw, self.as_dataset(
        sample_batch_size, num_steps=num_steps).element_spec)

  def _single_deterministic_pass_dataset(self, sample_batch_size=None,
                                         num_steps=None,
                                         sequence_preprocess_fn=None,
                                         num_parallel_calls=None):
    """Every window of `num_steps` steps once, in row order (uniform
    replay; the memory as it is now)."""
    num_steps = self._check_num_steps(num_steps)
    del num_parallel_calls
    if type(self._replay) is not variants.UniformReplay:  # pylint: disable=unidiomatic-typecheck
      raise ValueError('a deterministic pass is served by uniform replay')
    self.poll()
    if num_steps == 2:
      rows = self.memory.transition_rows()
    else:
      index, count = self._window_index(num_steps)
      rows = np.sort(index.numpy()[:int(count.numpy())])
    size = len(rows)
    settings = self._replay.settings

    def read(row):
      rows_1 = row[None]
      if num_steps == 2:
        experience = self.memory.transitions(rows_1, n_step=settings.n_step,
                                             gamma=settings.gamma)
      else:
        experience = self.memory.read(
            rows_1[:, None] + tf.range(num_steps, dtype=tf.int32)[None, :])
      experience = tf.nest.map_structure(lambda x: x[0], experience)
      if sequence_preprocess_fn is not None:
        experience = sequence_preprocess_fn(experience)
      ones = tf.ones([num_steps])
      info = reverb.SampleInfo(
          key=tf.cast(row, tf.uint64) * tf.cast(ones, tf.uint64),
          probability=tf.cast(ones, tf.float64) / size,
          table_size=tf.cast(ones, tf.int64) * size,
          priority=tf.cast(ones, tf.float64),
          times_sampled=tf.zeros([num_steps], tf.int32))
      return experience, info

    dataset = tf.data.Dataset.from_tensor_slices(rows).map(read)
    if sample_batch_size:
      dataset = dataset.batch(sample_batch_size, drop_remainder=True)
    return dataset


class InGraphDraws:
  """An iterable of batches drawn by graph ops where `next()` is called:
  a stand-in for a `tf.data.Dataset` in `Learner`'s
  `experience_dataset_fn` (it has `element_spec`, `map` and iteration,
  nothing else)."""

  def __init__(self, draw: Callable[[], Any], element_spec: Any):
    self._draw, self.element_spec = draw, element_spec

  def map(self, fn: Callable[..., Any]) -> 'InGraphDraws':
    """Applies `fn(*element)` to each batch, as `Dataset.map` does."""
    draw = self._draw
    mapped = lambda: fn(*draw())
    spec = tf.nest.map_structure(
        lambda s: s, tf.function(mapped).get_concrete_function()
        .structured_outputs)
    spec = tf.nest.map_structure(
        lambda t: tf.TensorSpec(t.shape, t.dtype), spec)
    return InGraphDraws(mapped, spec)

  def __iter__(self) -> 'InGraphDraws':
    return self

  def __next__(self) -> Any:
    return self._draw()


def _settings(client: reverb.Client, table: str, capacity: Optional[int],
              n_step: int, gamma: float, batch_size: int) -> variants.Settings:
  episode_table.check_episode_table(client, table)
  info = tables.get_table_info(client, table)
  return variants.Settings(
      table=table, data_spec=table_data_spec(client, table),
      batch_size=int(batch_size),
      capacity=int(capacity or 1), max_episodes=int(info.max_size),
      grow=capacity is None, n_step=n_step, gamma=gamma)


class PriorityUpdate:
  """The Learner's `after_train_strategy_step_fn` for a prioritized buffer:
  new priorities min(|td_error| + eps, cap) for the rows just drawn, from
  the agent's `LossInfo.extra.td_error`."""

  def __init__(self, buffer: MemoryReplayBuffer):
    if not isinstance(buffer.replay, variants.PrioritizedReplay):
      raise ValueError(f'{buffer.replay.kind} replay has no priorities')
    self._buffer = buffer

  def __call__(self, experience: Any, loss_info: Any) -> None:
    """`experience`: (the batch, its SampleInfo), as the Learner passes it
    (positionally, or by name with use_kwargs_in_agent_train)."""
    _, info = experience
    feed = self._buffer.replay.feed()
    config = feed.config
    priorities = per.priorities_from_td_errors(
        per.td_errors(loss_info), config.eps, config.priority_cap)
    feed.update(tf.cast(info.key[:, 0], tf.int32), priorities)


def importance_weighted(dataset: Any, buffer: MemoryReplayBuffer,
                        train_step: tf.Variable) -> Any:
  """Elements `(dict(experience=..., weights=w), info)` with PER weights
  (N * P(i))^-beta / max, beta annealed from `PerConfig.beta0` to 1 over
  `beta_steps` of `train_step`: for `Learner(...,
  use_kwargs_in_agent_train=True)`, which calls `agent.train(experience,
  weights=w)`. `dataset`: `as_dataset`'s or `as_draws`'."""
  config = buffer.replay.config
  if config.beta_steps is None:
    raise ValueError('PerConfig.beta_steps is unset: give the gradient '
                     'steps to anneal beta over')

  def weigh(experience, info):
    beta = per.beta(train_step, config.beta0, config.beta_steps)
    weights = per.importance_weights(info.probability[:, 0],
                                     info.table_size[:, 0], beta)
    return {'experience': experience, 'weights': weights}, info
  return dataset.map(weigh)
