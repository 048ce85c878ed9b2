"""Replay variants: what each kind of replay owns, behind one interface.

A variant owns its Reverb table(s) and how writers fill them, the learner's
in-memory feed, the train-step wrapper that goes with it, the extra state
that goes into the learner's checkpoint, what it writes back to the store
at a checkpoint, and the actor's view of observations. The learners' run
loop is written once against this interface, for offline data (everything
read at `start`) and online data (new episodes at each `poll`) alike.

  uniform      transitions uniform over the memory, optional n-step returns
  prioritized  a sum tree in TF ops; priorities kept in the store
  hindsight    goals relabelled at sample time; observation/goal normaliser
  return_to_go uniform, with each transition's Monte-Carlo return (Cal-QL)
  stream       2-step items sampled from Reverb for every batch (uniform or
               Reverb's own prioritized sampler): a table too big for the
               learner's memory
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable, Optional

import numpy as np
import reverb
import tensorflow as tf
import tree

from rlds_reverb.replay import her
from rlds_reverb.replay import per
from rlds_reverb.storage import tables
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from rlds_reverb.replay import follow
from rlds_reverb.replay import hindsight
from rlds_reverb.replay import memory as memory_lib
from rlds_reverb.replay import sampling

# Restoring priorities reads one item of a table's size: more than a ping.
_PRIORITY_TIMEOUT_S = 60.0

# How actors write for the in-memory feed: whole episodes, unread.
WRITER_KWARGS = {'sequence_length': None,
                 'priority': lambda: episode_table.UNREAD}


@dataclasses.dataclass
class Settings:
  """Where the data lives and how the learner draws it."""
  table: str
  """Reverb episode table that holds the data (the store of record)."""
  data_spec: Any
  """Per-step trajectory spec of what the table stores (float32 floats)."""
  batch_size: int
  """Transitions per batch."""
  capacity: int
  """Rows (RLDS steps) the memory keeps; at least what the table holds at
  start (offline data: all of it)."""
  max_episodes: int
  """Episodes the store table keeps before evicting the oldest."""
  grow: bool = False
  """Offline data: the memory grows to hold everything the table holds at
  start; online, it keeps `capacity` rows and evicts the oldest episodes."""
  n_step: int = 1
  """n-step returns (uniform and prioritized)."""
  gamma: float = 0.99
  """Discount of the n-step returns (the agent's)."""
  frame_stack: int = 1
  """Image observations are read as stacks of this many frames (stored
  once per step; see `memory.TransitionMemory`)."""


class UniformReplay:
  """An episode table, a memory of its transitions, a uniform feed."""

  kind = 'uniform'
  # Its batches come from a memory in this process (not drawn from Reverb
  # per batch), and the store keeps what `write_back` writes.
  samples_from_reverb = False
  writes_back = True

  def __init__(self, settings: Settings):
    # Agents compute in float32: floats are stored so (D4RL v1 is float64).
    settings = dataclasses.replace(settings, data_spec=tree.map_structure(
        lambda s: tf.TensorSpec(s.shape, tf.float32 if s.dtype.is_floating
                                else s.dtype), settings.data_spec))
    self.settings = settings
    self.memory: Optional[memory_lib.TransitionMemory] = None
    self._feed = None
    self._follower: Optional[follow.TableFollower] = None
    # Transitions moved into the memory since made (`start` and `poll`):
    # a learner fed by remote actors counts its env steps with it.
    self.transitions_read = 0

  # -- the store
  def tables(self) -> list[reverb.Table]:
    return [episode_table.make_table(
        self.settings.table, self.settings.data_spec,
        max_episodes=self.settings.max_episodes)]

  def writer_kwargs(self) -> dict:
    """Keyword arguments of `acting.collect.Collector` for this table."""
    return dict(WRITER_KWARGS)

  def check(self, client: reverb.Client) -> None:
    """Raises ValueError when the table cannot serve this replay; called
    before the learner writes anything."""
    del client

  def checkpoint_state(self) -> dict[str, Any]:
    """Trackables that go into the learner's checkpoint."""
    return {}

  def write_back(self, client: reverb.Client) -> None:
    """Writes what the store should keep (at every checkpoint)."""
    del client

  # -- the memory
  def _make_memory(self, steps: int) -> memory_lib.TransitionMemory:
    return memory_lib.TransitionMemory(
        self.settings.data_spec, self._capacity(steps),
        frame_stack=self.settings.frame_stack)

  def _capacity(self, steps: int) -> int:
    if self.settings.grow:
      return max(self.settings.capacity, steps, 1)
    return self.settings.capacity

  def start(self, client: reverb.Client, *,
            progress: Optional[Callable[[int], None]] = None) -> int:
    """Reads everything the table holds into a new memory; returns the
    number of episodes. Called once, after the learner's restore."""
    reader = episode_table.EpisodeReader(client, self.settings.table)
    episodes = []
    for episode in reader.iter_all():
      episodes.append(episode)
      if progress is not None:
        progress(len(tree.flatten(episode.data)[0]))
    steps = sum(len(tree.flatten(e.data)[0]) for e in episodes)
    self.memory = self._make_memory(steps)
    self._follower = follow.TableFollower(
        client, self.settings.table, self.memory, on_added=self._on_added,
        on_episodes=self._on_episodes, reader=reader,
        delete_evicted=not self.settings.grow)
    self._follower.store(episodes, restored=True)
    self._after_start(client)
    self.refresh_actor_view()  # A restored normaliser, a first one.
    return len(episodes)

  def _after_start(self, client: reverb.Client) -> None:
    del client

  def poll(self) -> int:
    """Moves episodes written since into the memory; returns how many."""
    return self._follower.poll()

  @property
  def ready(self) -> bool:
    return self.memory is not None and int(self.memory.num_transitions) > 0

  def _on_added(self, added: memory_lib.Added) -> None:
    self.transitions_read += int(added.transitions)
    if self._feed is not None:
      self._feed.on_added(added)

  def _on_episodes(self, episodes: list[Any], restored: bool) -> None:
    del episodes, restored

  # -- the learner
  def feed(self, transform: Optional[Callable[[Any], Any]] = None,
           batch_size: Optional[int] = None) -> Any:
    """The in-graph feed (made once; `transform` maps each batch)."""
    if self._feed is None:
      self._feed = self._make_feed(transform,
                                   batch_size or self.settings.batch_size)
    return self._feed

  def _make_feed(self, transform, batch_size):
    return feeds.UniformFeed(self.memory, batch_size,
                             n_step=self.settings.n_step,
                             gamma=self.settings.gamma, transform=transform)

  def train_step(self, agent: Any) -> Optional[Callable[[Any], tf.Tensor]]:
    """The train step that goes with the feed (None: `agent.train`)."""
    del agent
    return None

  # -- the actor
  def actor_view(self) -> Optional[Callable[[Any], np.ndarray]]:
    """Env observation -> what the policy takes (None: as it is)."""
    return None

  def refresh_actor_view(self) -> None:
    pass


class ReturnToGoReplay(UniformReplay):
  """Uniform, each transition with its Monte-Carlo return-to-go (Cal-QL)."""

  kind = 'return_to_go'

  def __init__(self, settings: Settings, reward_scale: float = 1.0):
    if settings.n_step != 1:
      raise ValueError('returns-to-go go with one-step transitions; got '
                       f'n_step={settings.n_step}')
    super().__init__(settings)
    self.reward_scale = reward_scale

  def _make_feed(self, transform, batch_size):
    return feeds.ReturnToGoFeed(self.memory, batch_size,
                                gamma=self.settings.gamma,
                                reward_scale=self.reward_scale,
                                transform=transform)

  def train_step(self, agent: Any) -> Callable[[Any], tf.Tensor]:
    if self._feed is None:
      raise RuntimeError('make the feed (feed(transform=...)) before its '
                         'train step: a feed made here would not normalise')
    return self._feed.train_step(agent)


class PrioritizedReplay(UniformReplay):
  """Proportional PER on the memory; the store keeps the priorities in a
  side table, written back at every checkpoint, read back at start."""

  kind = 'prioritized'

  def __init__(self, settings: Settings, config: per.PerConfig):
    super().__init__(settings)
    self.config = config
    self.max_priority = per.MaxPriority()

  def tables(self) -> list[reverb.Table]:
    return super().tables() + [feeds.make_priority_table(self.settings.table)]

  def checkpoint_state(self) -> dict[str, Any]:
    return {'max_priority': self.max_priority.variable}

  def _make_feed(self, transform, batch_size):
    return feeds.PrioritizedFeed(
        self.memory, batch_size, self.config, n_step=self.settings.n_step,
        gamma=self.settings.gamma, transform=transform,
        max_priority=self.max_priority)

  def _has_priority_table(self, client: reverb.Client) -> bool:
    name = feeds.priority_table_name(self.settings.table)
    return name in tables.call_with_deadline(
        client.server_info, timeout_s=tables.DEFAULT_TIMEOUT_S,
        what=f'looking for the priority table {name!r}',
        address=client.server_address)

  def _after_start(self, client: reverb.Client) -> None:
    self._client = client
    self.feed()  # The sum tree starts with what start() read.
    if self._has_priority_table(client):
      tables.call_with_deadline(
          lambda: feeds.restore_priorities(client, self.settings.table,
                                           self._feed),
          timeout_s=_PRIORITY_TIMEOUT_S,
          what=f'restoring the priorities of table {self.settings.table!r}',
          address=client.server_address)
    else:
      print(f'table {self.settings.table!r} has no side table '
            f'{feeds.priority_table_name(self.settings.table)!r} (pipelines.'
            'serve --feed_table --sampler prioritized makes one): the '
            'priorities live in this process only', file=sys.stderr)

  def feed(self, transform=None, batch_size=None):
    if self._feed is not None and transform is not None:
      self._feed._transform = transform  # pylint: disable=protected-access
    return super().feed(transform, batch_size)

  def train_step(self, agent: Any) -> Callable[[Any], tf.Tensor]:
    return self.feed().train_step(agent)

  def write_back(self, client: reverb.Client) -> None:
    if self._has_priority_table(client):
      feeds.write_priorities(client, self.settings.table, self.feed())


class HindsightReplay(UniformReplay):
  """Goal-conditioned episodes; goals relabelled when sampled. The learner
  and the actor see concat(observation, goal), normalised by running
  statistics that the learner's checkpoint keeps."""

  kind = 'hindsight'

  def __init__(self, settings: Settings, config: her.HerConfig,
               reward_source: Any, *, normalize: bool = True):
    """`reward_source`: the goal env (either reward interface) or a
    function (achieved_goal, desired_goal) -> reward."""
    super().__init__(settings)
    her.check_goal_spec(settings.data_spec)
    self.config = config
    self._reward_fn = her.reward_fn_for(reward_source)
    self._terminated_fn = her.terminated_fn_for(reward_source)
    observation = settings.data_spec.observation
    self.normalizer = (her.GoalNormalizer(
        int(observation[her.OBSERVATION].shape[0]),
        int(observation[her.DESIRED_GOAL].shape[0])) if normalize else None)
    self._flatten = her.ObservationFlattener(self.normalizer)

  def checkpoint_state(self) -> dict[str, Any]:
    return {} if self.normalizer is None else {'normalizer': self.normalizer}

  def _make_memory(self, steps: int) -> memory_lib.TransitionMemory:
    return memory_lib.TransitionMemory(
        self.settings.data_spec, self._capacity(steps),
        with_episode_bounds=True)

  def _on_episodes(self, episodes: list[Any], restored: bool) -> None:
    # A restored normaliser already counts the episodes read at start.
    if self.normalizer is None or (restored and
                                   float(self.normalizer.count.numpy())):
      return
    her.update_normalizer(self.normalizer, episodes)
    self._flatten.refresh()

  def _make_feed(self, transform, batch_size):
    del transform  # The feed normalises with the normaliser itself.
    return hindsight.HindsightFeed(
        self.memory, batch_size, self._reward_fn, config=self.config,
        terminated_fn=self._terminated_fn, normalizer=self.normalizer)

  def actor_view(self) -> Callable[[Any], np.ndarray]:
    return self._flatten

  def refresh_actor_view(self) -> None:
    self._flatten.refresh()


class StreamReplay:
  """2-step items sampled from a Reverb table for every batch, uniformly or
  by Reverb's prioritized sampler (priorities updated in the train graph):
  for a table too big for the learner's memory. Nothing is read at start
  and nothing written back: the table keeps the priorities itself."""

  kind = 'stream'
  samples_from_reverb = True
  writes_back = False
  memory = None
  normalizer = None

  def __init__(self, settings: Settings,
               per_config: Optional[per.PerConfig] = None):
    """`settings.max_episodes` is the table's size in items here;
    `per_config`: prioritized (Reverb's sampler, alpha from it)."""
    self.settings, self.config = settings, per_config
    self.max_priority = per.MaxPriority()
    self._address: Optional[str] = None
    self._feed = None

  @property
  def prioritized(self) -> bool:
    return self.config is not None

  def tables(self) -> list[reverb.Table]:
    return [tables.make_table(
        self.settings.table, self.settings.data_spec,
        max_size=self.settings.max_episodes,
        sampler='prioritized' if self.prioritized else 'uniform',
        alpha=self.config.alpha if self.prioritized else per.DEFAULT_ALPHA,
        min_size_to_sample=1)]

  def writer_kwargs(self) -> dict:
    return {'sequence_length': 2}

  def checkpoint_state(self) -> dict[str, Any]:
    return {'max_priority': self.max_priority.variable}

  def write_back(self, client: reverb.Client) -> None:
    del client

  def check(self, client: reverb.Client) -> None:
    """Prioritized replay needs a table that samples by priority."""
    if self.prioritized:
      per.check_prioritized(client, self.settings.table)

  def start(self, client: reverb.Client, *,
            progress: Optional[Callable[[int], None]] = None) -> int:
    """Nothing to read: batches are drawn from the table as trained."""
    del progress
    self._address = client.server_address
    return 0

  def poll(self) -> int:
    return 0

  @property
  def ready(self) -> bool:
    return self._address is not None

  def _batches(self, with_info: bool) -> tf.data.Dataset:
    return sampling.transition_dataset(
        self._address, self.settings.table, self.settings.data_spec,
        self.settings.batch_size, dtypes_to=tf.float32, with_info=with_info)

  def feed(self, transform: Optional[Callable[[Any], Any]] = None,
           batch_size: Optional[int] = None) -> Any:
    """An iterator of batches (with their SampleInfo when prioritized)."""
    del batch_size
    if self._feed is None:
      transform = transform or (lambda batch: batch)
      if self.prioritized:
        batches = self._batches(True).map(
            lambda batch, info: (transform(batch), info))
      else:
        batches = self._batches(False).map(transform)
      self._feed = iter(batches)
    return self._feed

  def train_step(self, agent: Any) -> Optional[Callable[[Any], tf.Tensor]]:
    if not self.prioritized:
      return None
    return per.PrioritizedTrainStep.for_reverb(
        agent, per.PriorityUpdater(self._address, self.settings.table),
        self.config, self.max_priority)

  def actor_view(self) -> None:
    return None

  def refresh_actor_view(self) -> None:
    pass
