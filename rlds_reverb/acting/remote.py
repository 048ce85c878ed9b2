"""Actor processes: act with the learner's newest weights, write episodes.

An actor steps gymnasium env copies with the rollout loop every acting path
shares (`rollout`), writes each finished episode into the learner's episode
table exactly as the online learner's own collector does (whole episodes,
unread, terminal discounts fixed: `collect`), and every
`policy_refresh_steps` env steps takes the newest weights the learner
published (`replay.variables`). Nothing here imports a learner.

    learner --publish--> [variables]  --fetch every N steps-->  actor
    learner <--reads---- [episodes]   <--whole episodes-------  actor

Balance (docs/distributed.md, `sender`): an actor writes an episode only
while fewer than `max_unread_episodes` episodes of the table are unread,
i.e. not yet taken by the learner, which takes new episodes only once it
has trained on the ones it has (its update-to-data ratio): Reverb's
SampleToInsertRatio rule (inserts - samples <= error buffer), counted in
episodes.

Every server call has a deadline: a dead server ends `Actor.run` with a
`tables.ServerUnavailableError` within seconds.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, ClassVar, Optional

import gymnasium as gym
import numpy as np
import reverb

from rlds_reverb import settings
from rlds_reverb.replay import her
from rlds_reverb.storage import tables
from rlds_reverb.acting import collect
from rlds_reverb.acting import envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.acting import rollout
from rlds_reverb.acting import sender
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import variables

# The online learner's episode table (experiments.online.ONLINE_TABLE).
EPISODE_TABLE = 'online'
# Pacing: how often a paced actor looks for the learner's progress, and the
# lead it keeps in an env without a time limit.
_PACE_POLL_S = 0.02
_EPISODE_STEPS_IF_UNLIMITED = 1000
OnWait = sender.OnWait
# on_episode(episode, policy version or None for uniform actions)
OnEpisode = Callable[[rollout.Episode, Optional[int]], None]


def make_tables(data_spec: Any, *, table: str = EPISODE_TABLE,
                max_episodes: int = 1_000_000,
                variables_table: str = variables.TABLE) -> list[reverb.Table]:
  """The tables a server holds for one learner and its actors: the episode
  table actors write (`data_spec` per step) and the weights table."""
  return [episode_table.make_table(table, data_spec,
                                   max_episodes=max_episodes),
          variables.make_table(variables_table)]


@dataclasses.dataclass
class ActorProcessConfig:
  """What every actor process is told, whichever kind of agent it serves;
  each field is the `pipelines.act` flag of its name."""
  env: str = 'HalfCheetah-v5'
  """gymnasium env id; the learner's. The actor's table's signature must be
  this env's trajectory spec."""
  variables_table: str = variables.TABLE
  """Table the learner publishes its policy weights into (max_size 1: the
  newest only)."""
  seed: int = settings.setting(0, lower=0)
  """Seed of the envs and the exploration; give each actor its own. Also
  names the log directory."""
  max_env_steps: int = settings.setting(0, lower=0)
  """Stop after N env steps, once every finished episode or rollout is
  written; 0: run until SIGTERM / Ctrl-C."""
  timeout_s: float = settings.setting(10.0, lower=0.1)
  """Deadline of each call on the server; a server that does not answer
  ends the actor with an error within about twice this (a write still
  running after this long makes the actor ask the server whether it is
  alive). A stop gives the write in flight this long."""
  weights_timeout_s: float = settings.setting(600.0, lower=0.1)
  """How long to wait for the learner's first weights (after any random
  steps) before giving up with an error."""

  def check(self) -> None:
    """Raises ValueError for a setting out of range (the fields' bounds)."""
    settings.check_bounds(self)


@dataclasses.dataclass
class ActorConfig(ActorProcessConfig):
  """One off-policy actor process (the shared fields are
  `ActorProcessConfig`'s)."""
  KIND: ClassVar[str] = 'off-policy agents'
  table: str = EPISODE_TABLE
  """Episode table the actor writes into (an episode table: whole episodes,
  read once by the learner's memory)."""
  num_envs: int = settings.setting(1, lower=1)
  """Env copies this actor steps side by side (one policy call per step for
  all of them)."""
  policy_refresh_steps: int = settings.setting(10, lower=1)
  """Env steps between looks for newer weights: a look asks the weights
  table's insert count, and only a new publication is fetched."""
  initial_random_steps: int = settings.setting(10_000, lower=0)
  """Uniform random actions for this actor's first N env steps (the
  learner's initial_collect_steps divided by the number of actors
  reproduces a single-process run). Then the actor needs published
  weights."""
  max_unread_episodes: int = settings.setting(2, lower=1)
  """Balance with the learner: write an episode only while fewer than N
  episodes in the table are unread by the learner (all actors together);
  otherwise hold still. The learner reads new episodes only once it has
  trained on those it has, so this bounds how far actors run ahead of its
  training."""
  actors: int = settings.setting(1, lower=0)
  """Actor processes that feed the learner, this one included. Each keeps
  its env steps within its share (1/actors) of those the learner's
  gradient steps call for, plus one episode per env copy, so actors
  collect as the learner trains, with weights a few updates old, instead
  of running ahead (Acme's rate limiter, step by step). 0: no pacing, only
  max_unread_episodes."""
  exploration_noise: float = settings.setting(0.1, lower=0)
  """td3-style (deterministic) policies: std of the Gaussian action noise,
  in action units."""
  epsilon: float = settings.setting(0.05, lower=0, upper=1)
  """dqn: probability of a uniform action."""


@dataclasses.dataclass
class ActingStats:
  """What an actor process did, whatever it writes; `to_dict` is its
  summary line (the fields of a subclass go in as they are)."""
  env_steps: int = 0
  episodes: int = 0
  """Finished episodes."""
  policy_version: Optional[int] = None
  """Version of the weights acted with last; None: uniform actions only."""
  policy_updates: int = 0
  """Times newer weights were taken."""
  waiting_s: float = 0.0
  """Seconds held back: unread episodes or rollouts, first weights, slow
  writes."""
  seconds: float = 0.0
  returns: list[float] = dataclasses.field(default_factory=list)
  stopped: str = ''
  """'max_env_steps', or what stopped the actor early."""

  def to_dict(self) -> dict[str, Any]:
    last = self.returns[-10:]
    shared = {f.name for f in dataclasses.fields(ActingStats)}
    return {
        'env_steps': self.env_steps, 'episodes': self.episodes,
        **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
           if f.name not in shared},
        'average_return_last_10': (round(float(np.mean(last)), 3) if last
                                   else None),
        'policy_version': self.policy_version,
        'policy_updates': self.policy_updates,
        'env_steps_per_s': (round(self.env_steps / self.seconds, 1)
                            if self.seconds else None),
        'waiting_s': round(self.waiting_s, 1),
        'seconds': round(self.seconds, 1), 'stopped': self.stopped}


@dataclasses.dataclass
class ActorStats(ActingStats):
  """What an off-policy actor did."""
  episodes_written: int = 0
  """Episodes the server confirmed."""
  episodes_unconfirmed: int = 0
  """Finished episodes not confirmed at the end (a stop while a write was
  in flight or held back by the balance)."""


class Actor:
  """An actor process's work: envs, the newest weights, episode writes.

  Make it, `run` it (until `max_env_steps` or `should_stop()`), `close` it.
  """

  def __init__(self, config: ActorConfig, client: reverb.Client, *,
               data_spec: Any = None, head: Optional[str] = None):
    """Checks the tables and makes the envs.

    Args:
      config: the actor's settings.
      client: client of the server with both tables.
      data_spec: per-step trajectory spec the episode table must store
        (checked here rather than at the first write); None: not checked.
      head: the `NumpyPolicy` head the learner's agent exports; published
        weights of another kind are refused. None: any.

    Raises:
      ValueError: a bad setting; an episode table of another kind or spec;
        a weights table that keeps more than one item; an unknown env.
      TableNotFoundError: a table the server does not have.
      ServerUnavailableError: the server does not answer in time.
    """
    config.check()
    self.config, self._client = config, client
    self._address = client.server_address
    self._head = head
    self.specs = envs.env_specs(config.env)
    self._check_tables(data_spec)
    self._view = (her.ObservationFlattener() if self.specs.goal_conditioned
                  else None)
    self._random = collect.random_act(self.specs.action_low,
                                      self.specs.action_high)
    self._envs = gym.vector.SyncVectorEnv(
        [lambda: envs.make_env(config.env)] * config.num_envs,
        autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
    # Image envs: acts on frame stacks (the learner's default), writes frames.
    self._rollout = rollout.Rollout(self._envs,
                                    rollout.layout_of(self._envs),
                                    seed=config.seed * 1000,
                                    frame_stack=self.specs.frame_stack)
    self._rng = np.random.default_rng(config.seed)
    self.policy: Optional[numpy_policy.NumpyPolicy] = None
    self._sender = sender.EpisodeSender(
        client, config.table, max_unread_episodes=config.max_unread_episodes,
        timeout_s=config.timeout_s)
    self._weights_waiting_s = 0.0
    self._publications_seen: Optional[int] = None
    # Pacing: the env steps the learner's last publication calls for, and
    # (own env steps, that target) when the first one came.
    self._collect_target: Optional[int] = None
    self._paced_from: Optional[tuple[int, int]] = None
    # Env steps of the episodes that ended (handed to the sender): what
    # pacing counts, as only they can reach the learner.
    self._finished_steps = 0
    self._lead_steps = config.num_envs * (self.specs.max_episode_steps or
                                          _EPISODE_STEPS_IF_UNLIMITED)
    self.stats = ActorStats()

  def _call(self, fn: Callable[[], Any], what: str) -> Any:
    return tables.call_with_deadline(
        fn, timeout_s=self.config.timeout_s, what=what,
        address=self._address)

  def _check_tables(self, data_spec: Any) -> None:
    table = self.config.table
    self._call(lambda: episode_table.check_table_kind(
        self._client, table, episodes=True), f'reading table {table!r}')
    if data_spec is not None:
      self._call(lambda: tables.check_signature(self._client, table,
                                                data_spec),
                 f'reading table {table!r}')
    variables.check_table(self._client, self.config.variables_table,
                          timeout_s=self.config.timeout_s)

  # -- weights
  def refresh(self) -> bool:
    """Takes the newest published weights; returns whether they are new.

    Raises:
      ValueError: weights of another head or shape than this actor needs.
      ServerUnavailableError: no answer in time.
    """
    # A fetch samples the whole weights item; when nothing was published
    # since the last one, a look at the table's insert count is enough.
    count = variables.publications(self._client,
                                   table=self.config.variables_table,
                                   timeout_s=self.config.timeout_s)
    if count == self._publications_seen:
      return False
    published = variables.fetch(self._client,
                                table=self.config.variables_table,
                                timeout_s=self.config.timeout_s)
    self._publications_seen = count
    if published is None or published.version == self.stats.policy_version:
      return False
    policy = numpy_policy.NumpyPolicy(**published.weights)
    self._check_policy(policy, published.version)
    self.policy = policy
    self.stats.policy_version = published.version
    self.stats.policy_updates += 1
    self._collect_target = published.info.get('collect_target')
    return True

  def _ahead(self) -> bool:
    """Whether this actor has taken its share of the env steps the
    learner's last publication calls for, plus one episode per copy.

    Counted from where the actor was when it first saw a target, so an
    actor started (or restarted) late joins at the learner's position, and
    on the steps of finished episodes only: a held actor has handed the
    learner every step it counts, so the learner can always reach the
    target it published and publish the next. (Counting the running
    episode too, an actor held mid-episode could leave a learner whose
    count is behind its target, as a resumed one's can be, short of a
    phase, with both waiting.)
    """
    target, actors = self._collect_target, self.config.actors
    if not actors or target is None:
      return False
    if self._paced_from is None:
      self._paced_from = (self._finished_steps, target)
    own_at_start, target_at_start = self._paced_from
    position = target_at_start / actors + (self._finished_steps -
                                           own_at_start)
    return position >= target / actors + self._lead_steps

  def _keep_pace(self, should_stop: Callable[[], bool],
                 on_wait: Optional[OnWait]) -> bool:
    """Waits while ahead of the learner, sending the finished episodes
    still waiting meanwhile (the learner needs them to move on); False if
    stopped first."""
    start = time.monotonic()
    try:
      while self._ahead():
        self._sender.send_waiting()
        if on_wait is not None:
          on_wait('pace', time.monotonic() - start)
        if not sender.sleep(_PACE_POLL_S, should_stop):
          return False
        self.refresh()
      return True
    finally:
      self._weights_waiting_s += time.monotonic() - start

  def _check_policy(self, policy: numpy_policy.NumpyPolicy,
                    version: int) -> None:
    specs = self.specs
    observation_size = (sum(specs.goal_sizes) if specs.goal_conditioned
                        else int(np.prod(specs.observation_shape)))
    action_shape = tuple(np.shape(specs.action_low))
    problems = []
    if self._head is not None and policy.head != self._head:
      problems.append(f'head {policy.head!r}, not {self._head!r}')
    if policy.observation_size != observation_size:
      problems.append(f'observation size {policy.observation_size}, not '
                      f'{observation_size}')
    if tuple(np.shape(policy.action_low)) != action_shape:
      problems.append(f'action shape {tuple(np.shape(policy.action_low))}, '
                      f'not {action_shape}')
    if problems:
      raise ValueError(
          f'weights version {version} in table '
          f'{self.config.variables_table!r} at {self._address} do not fit '
          f'this actor ({specs.env_id}): {"; ".join(problems)}; is the '
          'learner training another env or agent?')

  def _wait_for_weights(self, should_stop: Callable[[], bool],
                        on_wait: Optional[OnWait]) -> bool:
    """Waits for a first publish; False if stopped first."""
    start = time.monotonic()
    try:
      while not self.refresh():
        waited = time.monotonic() - start
        if waited > self.config.weights_timeout_s:
          raise TimeoutError(
              f'no policy weights in table {self.config.variables_table!r} '
              f'at {self._address} after {waited:.0f}s: is the learner '
              'running (pipelines.train --reverb_address ... --num_actors '
              '0)? Until it publishes, actors act at random for '
              '--initial_random_steps only')
        if on_wait is not None:
          on_wait('weights', waited)
        if not sender.sleep(1.0, should_stop):
          return False
      return True
    finally:
      self._weights_waiting_s += time.monotonic() - start

  def _act(self) -> collect.ActFn:
    policy = self.policy
    if policy is None:
      return self._random
    if policy.head == 'q_argmax':
      act = collect.epsilon_greedy_act(policy, self.config.epsilon)
    else:
      act = collect.policy_act(policy, self.config.exploration_noise)
    if self._view is None:
      return act
    return lambda obs, rng: act(self._view(obs), rng)

  # -- the loop
  def run(self, *, should_stop: Callable[[], bool] = lambda: False,
          on_episode: Optional[OnEpisode] = None,
          on_wait: Optional[OnWait] = None,
          on_steps: Optional[Callable[[int], None]] = None) -> ActorStats:
    """Acts until `max_env_steps` (0: until `should_stop()`).

    Uniform actions for the first `initial_random_steps`, then the newest
    weights (waiting for a first publish up to `weights_timeout_s`),
    fetched again every `policy_refresh_steps`. At `max_env_steps` every
    finished episode is written (as the table makes room); a stop gives
    the writes `timeout_s` and counts what is left as unconfirmed.
    Episodes still running at the end are dropped (only whole episodes are
    valid RLDS).

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
        if should_stop():
          break
        if (self.policy is None and
            stats.env_steps >= config.initial_random_steps and
            not self._wait_for_weights(should_stop, on_wait)):
          break
        if (self.policy is not None and
            not self._keep_pace(should_stop, on_wait)):
          break
        finished: list[rollout.Episode] = []
        before = stats.env_steps
        act = self._act()
        taken = self._rollout.step(lambda obs: act(obs, self._rng),
                                   finished.append)
        stats.env_steps += taken
        if on_steps is not None:
          on_steps(taken)
        version = stats.policy_version if self.policy is not None else None
        for episode in finished:
          self._finished_steps += episode.num_steps
          stats.episodes += 1
          stats.returns.append(episode.episode_return)
          if on_episode is not None:
            on_episode(episode, version)
        self._sender.add([episode.steps for episode in finished])
        # Ahead of the learner: hold still until the table takes some.
        if not self._sender.pace(should_stop, on_wait):
          break
        if (self.policy is not None and stats.env_steps // config.
            policy_refresh_steps > before // config.policy_refresh_steps):
          self.refresh()
      else:
        stats.stopped = 'max_env_steps'
        self._sender.flush(should_stop, on_wait)
      if not stats.stopped:
        stats.stopped = 'stop requested'
      stats.episodes_unconfirmed = self._sender.finish()
    finally:
      stats.seconds = time.monotonic() - start
      stats.episodes_written = self._sender.written
      stats.waiting_s = self._sender.waiting_s + self._weights_waiting_s
    return stats

  def close(self) -> None:
    self._envs.close()

