"""PPO / A2C actor processes: rollouts of the learner's newest policy.

An on-policy actor steps N env copies T steps at a time (`vector_rollouts`)
with the newest weights the learner published (`replay.variables`) and
writes each rollout into the learner's queue table (`replay.rollout_queue`),
which hands it to the learner once. What the single-process run keeps in
one place is split so that nothing is stated twice:

- The learner's settings reach the actor with its weights (the published
  `info`: copies, rollout length, gamma, the clips), so an actor process
  takes no agent settings of its own.
- Observation and return statistics (`agents.onpolicy.normalization`): the
  actor starts each rollout from the learner's published statistics,
  updates them step by step as one process would, and sends the moments of
  what it added with the rollout; the learner merges them, so its
  statistics (checkpointed and exported) cover what every actor saw.

Balance: an actor collects only while fewer than `max_unread_rollouts`
rollouts wait in the queue, and takes the newest weights just before it
collects, so a rollout is at most a few updates older than the learner.
Nothing here imports a learner.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, ClassVar, Mapping, Optional, Protocol

import numpy as np
import reverb

from rlds_reverb import settings
from rlds_reverb.acting import numpy_policy
from rlds_reverb.acting import remote
from rlds_reverb.acting import sender
from rlds_reverb.acting import vector_rollouts
from rlds_reverb.replay import rollout_queue
from rlds_reverb.replay import variables
from rlds_reverb.storage import tables

ROLLOUT_TABLE = 'rollouts'
# Published weights: the policy's fields, and the statistics under this
# prefix.
STATISTICS_PREFIX = 'statistics_'
# What a remote rollout carries besides `vector_rollouts.FIELDS`.
EXTRA_FIELDS = ('actor', 'rollout', 'policy_version', 'episode_returns',
                'episode_lengths')
ADDED_PREFIX = 'added_'


class Statistics(Protocol):
  """The observation and reward normalisation an actor applies
  (`normalization.Normalization`)."""

  def observation(self, observations: np.ndarray, *,
                  update: bool = False) -> np.ndarray: ...

  def reward(self, rewards: np.ndarray, ended: np.ndarray) -> np.ndarray: ...

  def set_state(self, state: Mapping[str, Any]) -> None: ...

  def take_added(self) -> dict[str, np.ndarray]: ...


# (published info) -> the actor's statistics for the learner's settings.
MakeStatistics = Callable[[Mapping[str, Any]], Statistics]


@dataclasses.dataclass
class RolloutActorConfig(remote.ActorProcessConfig):
  """One PPO / A2C actor process (the shared fields are
  `remote.ActorProcessConfig`'s)."""
  KIND: ClassVar[str] = 'ppo and a2c'
  table: str = ROLLOUT_TABLE
  """The rollout queue the actor writes into (a queue: each rollout read
  once, pipelines.serve --env ENV --rollouts)."""
  max_unread_rollouts: int = settings.setting(1, lower=1)
  """Balance with the learner: collect a rollout only while fewer than N
  rollouts wait in the queue (all actors together), so each is at most
  about N + actors - 1 updates older than the learner's policy."""


@dataclasses.dataclass
class RolloutActorStats(remote.ActingStats):
  """What an on-policy actor did."""
  rollouts: int = 0
  """Rollouts the server confirmed."""


def publish(client: reverb.Client, policy: numpy_policy.NumpyPolicy,
            statistics: Mapping[str, np.ndarray], version: int,
            info: Mapping[str, Any], *, table: str = variables.TABLE,
            timeout_s: float = tables.DEFAULT_TIMEOUT_S) -> None:
  """The learner's side: its policy, its statistics (`state()`) and the
  rollout settings in `info` (num_envs, rollout_steps, gamma,
  observation_clip, reward_clip) as version `version`."""
  weights = {f.name: getattr(policy, f.name)
             for f in dataclasses.fields(policy)}
  weights.update({STATISTICS_PREFIX + key: value
                  for key, value in statistics.items()})
  variables.publish(client, weights, version, table=table, info=info,
                    timeout_s=timeout_s)


def added_statistics(rollout: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """The statistics' tally an actor sent with `rollout` (keys of
  `Normalization.state()`)."""
  return {key[len(ADDED_PREFIX):]: value for key, value in rollout.items()
          if key.startswith(ADDED_PREFIX)}


class RolloutActor:
  """Make it, `run` it (until `max_env_steps` or `should_stop()`), `close`
  it."""

  def __init__(self, config: RolloutActorConfig, client: reverb.Client, *,
               make_statistics: MakeStatistics, head: Optional[str] = None,
               observation_size: Optional[int] = None):
    """Checks the tables.

    Args:
      config: the actor's settings.
      client: client of the server with both tables.
      make_statistics: the normalisation for the learner's published info.
      head: the `NumpyPolicy` head the learner's agent exports (weights of
        another are refused); None: any.
      observation_size: what the env's observations flatten to (weights of
        another are refused); None: not checked.

    Raises:
      ValueError: a bad setting; a rollout table that is not a queue.
      TableNotFoundError: the server has no weights table.
      ServerUnavailableError: the server does not answer in time.
    """
    config.check()
    self.config, self._client = config, client
    self._address = client.server_address
    self._make_statistics = make_statistics
    self._head, self._observation_size = head, observation_size
    rollout_queue.check_queue(client, config.table, timeout_s=config.timeout_s)
    variables.check_table(client, config.variables_table,
                          timeout_s=config.timeout_s)
    self._rng = np.random.default_rng(config.seed)
    self.policy: Optional[numpy_policy.NumpyPolicy] = None
    self._statistics: Optional[Statistics] = None
    self._collector: Optional[vector_rollouts.VectorRollouts] = None
    self._settings: dict[str, Any] = {}
    self.stats = RolloutActorStats()

  def _refresh(self) -> bool:
    """Takes the newest published weights and statistics; whether any
    were published.

    Raises:
      ValueError: weights of another head or size, or other rollout
        settings than the first ones.
    """
    published = variables.fetch(self._client,
                                table=self.config.variables_table,
                                timeout_s=self.config.timeout_s)
    if published is None:
      return False
    if published.version == self.stats.policy_version:
      return True
    fields = {f.name for f in dataclasses.fields(numpy_policy.NumpyPolicy)}
    policy = numpy_policy.NumpyPolicy(**{
        key: value for key, value in published.weights.items()
        if key in fields})
    problems = []
    if self._head is not None and policy.head != self._head:
      problems.append(f'head {policy.head!r}, not {self._head!r}')
    if (self._observation_size is not None and
        policy.observation_size != self._observation_size):
      problems.append(f'observation size {policy.observation_size}, not '
                      f'{self._observation_size}')
    rollout_settings = {key: published.info.get(key) for key in (
        'num_envs', 'rollout_steps', 'gamma', 'observation_clip',
        'reward_clip')}
    if self._settings and rollout_settings != self._settings:
      problems.append(f'rollout settings {rollout_settings}, not '
                      f'{self._settings} as before')
    if problems:
      raise ValueError(
          f'weights version {published.version} in table '
          f'{self.config.variables_table!r} at {self._address} do not fit '
          f'this actor ({self.config.env}): {"; ".join(problems)}; is the '
          'learner training another env or agent?')
    if self._collector is None:
      self._settings = rollout_settings
      self._statistics = self._make_statistics(published.info)
      self._statistics.set_state(self._statistics_of(published.weights))
      self._collector = vector_rollouts.VectorRollouts(
          self.config.env, num_envs=int(rollout_settings['num_envs']),
          rollout_steps=int(rollout_settings['rollout_steps']),
          seed=self.config.seed * 1000,
          observe=self._statistics.observation,
          scale_reward=self._statistics.reward)
    else:
      self._statistics.set_state(self._statistics_of(published.weights))
    self.policy = policy
    self.stats.policy_version = published.version
    self.stats.policy_updates += 1
    return True

  @staticmethod
  def _statistics_of(weights: Mapping[str, Any]) -> dict[str, np.ndarray]:
    return {key[len(STATISTICS_PREFIX):]: np.asarray(value)
            for key, value in weights.items()
            if key.startswith(STATISTICS_PREFIX)}

  def _wait(self, ready: Callable[[], bool], give_up_s: Optional[float],
            kind: str, should_stop: Callable[[], bool],
            on_wait: Optional[sender.OnWait]) -> bool:
    """Polls `ready` until it holds; False if stopped first."""
    start = time.monotonic()
    try:
      while not ready():
        waited = time.monotonic() - start
        if give_up_s is not None and waited > give_up_s:
          raise TimeoutError(
              f'no policy weights in table {self.config.variables_table!r} '
              f'at {self._address} after {waited:.0f}s: is the learner '
              'running (pipelines.train --agent ppo --reverb_address ... '
              '--num_actors 0)?')
        if on_wait is not None:
          on_wait(kind, waited)
        if not sender.sleep(sender.SLICE_S, should_stop):
          return False
      return True
    finally:
      self.stats.waiting_s += time.monotonic() - start

  def _unread(self) -> int:
    return tables.get_table_info(self._client, self.config.table,
                                 timeout_s=self.config.timeout_s).current_size

  def run(self, *, should_stop: Callable[[], bool] = lambda: False,
          on_rollout: Optional[Callable[[list[float], list[int]],
                                        None]] = None,
          on_wait: Optional[sender.OnWait] = None) -> RolloutActorStats:
    """Collects and writes rollouts until `max_env_steps` (0: until
    `should_stop()`).

    Raises:
      ServerUnavailableError: the server stopped answering.
      TimeoutError: no weights were published in `weights_timeout_s`.
      ValueError: published weights that do not fit the env or agent.
    """
    config, stats = self.config, self.stats
    start = time.monotonic()
    stats.stopped = ''
    try:
      while not (config.max_env_steps and
                 stats.env_steps >= config.max_env_steps):
        if (should_stop() or
            not self._wait(lambda: self._unread() < config.max_unread_rollouts,
                           None, 'unread', should_stop, on_wait) or
            not self._wait(self._refresh, config.weights_timeout_s,
                           'weights', should_stop, on_wait)):
          break
        policy = self.policy
        rollout, returns, lengths = self._collector.collect(
            lambda obs, starts: policy.sample(obs, self._rng))
        rollout.update({
            'actor': np.int64(config.seed),
            'rollout': np.int64(stats.rollouts),
            'policy_version': np.int64(stats.policy_version),
            'episode_returns': np.asarray(returns, np.float64),
            'episode_lengths': np.asarray(lengths, np.int64)})
        rollout.update({ADDED_PREFIX + key: value for key, value in
                        self._statistics.take_added().items()})
        rollout_queue.write(self._client, config.table, rollout,
                            timeout_s=config.timeout_s, address=self._address)
        stats.rollouts += 1
        stats.env_steps += self._collector.num_envs * (
            self._collector.rollout_steps)
        stats.episodes += len(returns)
        stats.returns.extend(returns)
        if on_rollout is not None:
          on_rollout(returns, lengths)
      else:
        stats.stopped = 'max_env_steps'
      if not stats.stopped:
        stats.stopped = 'stop requested'
    finally:
      stats.seconds = time.monotonic() - start
    return stats

  def close(self) -> None:
    if self._collector is not None:
      self._collector.close()
      self._collector = None
