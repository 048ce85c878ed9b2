"""Online training: actors fill an episode table, the learner its memory.

Each phase takes `train_every` env steps of collection (numpy actor, whole
episodes written to Reverb), moves the finished episodes into the learner's
memory, then takes `train_every * utd` gradient steps on batches drawn
in-graph (SpinningUp's `update_every` scheme). The replay variant
(`rlds_reverb.replay.variants`: uniform, prioritized, hindsight) owns the
table, the feed, the train step and what the checkpoint keeps; the run loop
(`run`) owns evaluation, checkpoints and exported policies. Everything needed
to resume is checkpointed together: the agent and the variant's state
(Learner) and the Reverb table (Reverb's own checkpointer).

DQN (discrete actions) explores epsilon-greedy, epsilon falling linearly from
1 to `epsilon_final` over the first `exploration_fraction` of the run.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Callable

import numpy as np

from rlds_reverb import settings
from rlds_reverb.replay import per
from rlds_reverb.storage import tables
from rlds_reverb.acting import collect
from rlds_reverb.acting import envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.acting import remote
from rlds_reverb.agents import registry
from rlds_reverb.experiments import configs
from rlds_reverb.experiments import distributed
from rlds_reverb.agents import dqn
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import resume
from rlds_reverb.experiments import run
from rlds_reverb.experiments import runner
from rlds_reverb.replay import variants

ONLINE_TABLE = configs.ONLINE_TABLE
FEEDS = ('memory',)
# Rows the memory keeps beyond replay_size: room for the longest episode.
_SLACK_EPISODES = 1


OnlineConfig = configs.OnlineConfig


def _check(config: OnlineConfig) -> None:
  if config.initial_collect_steps < 0 or config.utd <= 0:
    raise ValueError('initial_collect_steps must be >= 0 and utd > 0')
  registry.get(config.agent).check_mode(
      registry.ONLINE, her=config.her_config is not None)
  if config.replay not in per.REPLAYS:
    raise ValueError(f'replay must be one of {", ".join(per.REPLAYS)}, got '
                     f'{config.replay!r}')
  if not 0 <= config.random_action_probability <= 1:
    raise ValueError('random_action_probability must be in [0, 1], got '
                     f'{config.random_action_probability}')
  if not 0 <= config.epsilon_final <= 1 or not (
      0 <= config.exploration_fraction <= 1):
    raise ValueError('epsilon_final and exploration_fraction must be in '
                     '[0, 1]')
  if config.feed not in FEEDS:
    raise ValueError(f'online training reads its episodes into memory '
                     f'(feed memory); got feed {config.feed!r}')
  if config.n_step < 1 or (config.n_step > 1 and
                           config.her_config is not None):
    raise ValueError(f'n_step must be >= 1, and > 1 does not go with her; '
                     f'got n_step={config.n_step}')
  if config.num_actors not in (0, 1):
    raise ValueError(f'num_actors must be 0 (actors are other processes) or '
                     f'1 (this process acts), got {config.num_actors}')
  if (config.num_actors == 0) != bool(config.reverb_address):
    raise ValueError('num_actors 0 (actors in other processes) and '
                     'reverb_address (their server) go together; got '
                     f'num_actors={config.num_actors}, '
                     f'reverb_address={config.reverb_address!r}')
  if config.num_actors == 0 and (config.her_config is not None or
                                 config.replay != 'uniform'):
    raise ValueError('a learner fed by actor processes takes uniform replay '
                     'without HER (the remote server holds no priority or '
                     'HER tables); got '
                     f'replay={config.replay!r}, her={config.her_config}')
  if config.publish_every < 1:
    raise ValueError(f'publish_every must be >= 1, got '
                     f'{config.publish_every}')
  if config.her_config is not None and config.replay != 'uniform':
    raise ValueError('HER samples its own episode table; replay must be '
                     f'uniform with her, got {config.replay!r}')
  settings.check_bounds(config)


def check_her_fits_env(config: OnlineConfig, specs: envs.EnvSpecs) -> None:
  """HER needs a goal env, and a goal env needs HER's episode table."""
  if config.her_config is not None and not specs.goal_conditioned:
    raise ValueError(f'HER needs a goal env (dict observation with '
                     f'{", ".join(envs.GOAL_KEYS)}); {specs.env_id} has a '
                     'flat observation')
  if config.her_config is None and specs.goal_conditioned:
    raise ValueError(f'env {specs.env_id} is a goal env (dict observations): '
                     'train it with her (--her future)')


def check_agent_fits_env(kind: str, specs: envs.EnvSpecs) -> None:
  """Raises ValueError when a discrete agent meets continuous actions or back."""
  actions = registry.get(kind).actions
  if specs.discrete and actions == registry.CONTINUOUS:
    raise ValueError(f'env {specs.env_id} has discrete actions; agent {kind} '
                     f'needs continuous ones: use '
                     f'{", ".join(registry.names(registry.ONLINE, discrete=True))}')
  if not specs.discrete and actions == registry.DISCRETE:
    raise ValueError(f'agent {kind} needs discrete actions; env '
                     f'{specs.env_id} has continuous ones: use '
                     f'{" or ".join(registry.names(registry.ONLINE, discrete=False))}')


def explore_act(policy: numpy_policy.NumpyPolicy, config: OnlineConfig,
                specs: envs.EnvSpecs, env_steps: int,
                flatten: Callable[[Any], np.ndarray] | None = None
                ) -> collect.ActFn:
  """How the actor picks actions after `env_steps` steps.

  `flatten` turns a goal env's observation dicts into the agent's vectors.
  """
  act = _explore_act(policy, config, specs, env_steps)
  if flatten is None:
    return act
  return lambda obs, rng: act(flatten(obs), rng)


def _explore_act(policy: numpy_policy.NumpyPolicy, config: OnlineConfig,
                 specs: envs.EnvSpecs, env_steps: int) -> collect.ActFn:
  if env_steps < config.initial_collect_steps:
    return collect.random_act(specs.action_low, specs.action_high)
  if specs.discrete:
    decay_steps = int(config.exploration_fraction * config.env_steps)
    return collect.epsilon_greedy_act(
        policy, dqn.epsilon(env_steps, decay_steps, config.epsilon_final))
  return collect.with_random_actions(
      collect.policy_act(policy, config.exploration_noise),
      config.random_action_probability, specs.action_low, specs.action_high)


def make_replay(config: OnlineConfig, specs: envs.EnvSpecs,
                reward_env: Any = None) -> Any:
  """The run's replay variant over the online episode table."""
  settings = variants.Settings(
      table=config.table, data_spec=run.trajectory_spec(specs),
      batch_size=config.batch_size,
      capacity=config.replay_size + _SLACK_EPISODES * (
          specs.max_episode_steps or 1000),
      # The memory evicts (by steps) and deletes what it evicts from the
      # table; the table's own bound only has to stay out of its way.
      max_episodes=config.replay_size, n_step=config.n_step,
      gamma=config.agent_config.gamma, frame_stack=specs.frame_stack)
  if config.her_config is not None:
    return variants.HindsightReplay(settings, config.her_config, reward_env,
                                    normalize=config.her_normalize)
  if config.replay == 'prioritized':
    return variants.PrioritizedReplay(settings, config.per_settings)
  return variants.UniformReplay(settings)


def make_actor_tables(env: str, *, table: str = ONLINE_TABLE,
                      max_episodes: int = 1_000_000) -> list[Any]:
  """The tables of a distributed run's server (pipelines.serve --env): the
  episode table the actors write and the weights table the learner
  (`OnlineBuilder` with num_actors 0) publishes into."""
  return remote.make_tables(run.trajectory_spec(envs.env_specs(env)),
                            table=table, max_episodes=max_episodes)


def make_actor(agent: str, config: remote.ActorConfig,
               client: Any) -> remote.Actor:
  """An actor process's actor (pipelines.act) for the learner that
  `OnlineBuilder` makes with num_actors 0: the same agent's numpy head,
  the same trajectory spec, the tables of `make_actor_tables`."""
  specs = envs.env_specs(config.env)
  check_agent_fits_env(agent, specs)
  return remote.Actor(config, client, data_spec=run.trajectory_spec(specs),
                      head=registry.get(agent).head)


def train_online(config: OnlineConfig, *, show_progress: bool = True,
                 on_eval: Callable[[dict], None] | None = None) -> dict:
  """Trains `config.agent` online in `config.env`; resumes from root_dir.

  A root_dir with a run in it is resumed if its recorded config allows
  (`resume.check_resumable`); config.json is written once training starts,
  and a run that fails before that leaves nothing behind in root_dir.

  Returns:
    The last evaluation record (average return, normalised score, steps).

  Raises:
    resume.ResumeMismatchError: root_dir holds a run of other settings.
    ValueError: a bad config, or an agent or HER setting that does not fit
      the env.
    run.TrainingError: training failed (an op error, a non-finite loss).
  """
  return runner.run_experiment(OnlineBuilder(
      config, on_eval=on_eval, show_progress=show_progress))


class OnlineBuilder:
  """Online off-policy runs: one process acting and learning, or the
  learner of actor processes (num_actors 0, tables on their server)."""

  def __init__(self, config: OnlineConfig, *,
               on_eval: Callable[[dict], None] | None = None,
               show_progress: bool = True):
    self.config, self._on_eval = config, on_eval
    self._show_progress = show_progress
    self._reward_env, self._collector = None, None

  @property
  def remote_actors(self) -> bool:
    return self.config.num_actors == 0

  def check(self, specs: envs.EnvSpecs) -> OnlineConfig:
    config = self.config
    _check(config)
    check_agent_fits_env(config.agent, specs)
    check_her_fits_env(config, specs)
    # Recorded resolved, so a resume compares the settings actually used.
    self.config = config = dataclasses.replace(
        config, agent_config=registry.resolve(config.agent,
                                              config.agent_config))
    self._specs = specs
    return config

  def prepare(self) -> None:
    if self._specs.goal_conditioned:
      self._reward_env = envs.make_env(self.config.env)
    self._replay = make_replay(self.config, self._specs, self._reward_env)

  def servers(self) -> list:
    if self.remote_actors:
      return []  # The actors' server (pipelines.serve --env) holds them.
    return [(self._replay.tables(), run.REVERB_CHECKPOINTS)]

  def make_learner(self, servers) -> loop.Learner:
    config, specs = self.config, self._specs
    if self.remote_actors:
      self._client = tables.connect(config.reverb_address)
      distributed.check_remote_tables(self._client, config.table,
                                      run.trajectory_spec(specs))
    else:
      self._client = servers[0].localhost_client()
    self._agent = registry.make_agent(config.agent, specs.time_step_spec,
                                      specs.action_spec, config.agent_config)
    learner = loop.Learner(self._agent, config.root_dir,
                           **self._replay.checkpoint_state())
    how = (f'HER {config.her_config.strategy} k={config.her_config.k:g}'
           if config.her_config else f'{config.replay} replay')
    self._title = (f'{config.agent} online, {how}, {config.env}, seed '
                   f'{config.seed}')
    self._metric = ('success_rate' if specs.goal_conditioned
                    else 'average_return')
    learner.set_curve(x='env_steps', title=self._title, y=self._metric)
    return learner

  def train(self, learner: loop.Learner, resumed: bool,
            run_dir: resume.RunDirectory) -> dict:
    show_progress = self._show_progress
    config, specs, replay = self.config, self._specs, self._replay
    client, remote_actors = self._client, self.remote_actors
    replay.start(client)  # A resumed run gets back what it had collected.
    if not remote_actors:
      run.check_episodes_restored(
          config.root_dir, run.REVERB_CHECKPOINTS,
          int(learner.env_steps.numpy()), specs.max_episode_steps,
          replay.ready, 'training')
    if remote_actors and not resumed:
      # Episodes the actors wrote before the learner came up.
      learner.env_steps.assign(replay.transitions_read)
    train_step = replay.train_step(self._agent)
    if train_step is not None:
      learner.set_train_step(train_step)
    start = int(learner.env_steps.numpy())
    # A resumed run reseeds from its step count: it does not replay the
    # episodes it already collected.
    if not remote_actors:
      self._collector = collect.Collector(
          config.env, client, config.table,
          seed=config.seed * 1_000_003 + start,
          frame_stack=specs.frame_stack, **replay.writer_kwargs())
    this_run = run.Run(
        learner, config.agent, specs, config.root_dir, clients=(client,),
        write_back=lambda: replay.write_back(client),
        view=replay.actor_view(), refresh_view=replay.refresh_actor_view,
        normalizer=getattr(replay, 'normalizer', None), seed=config.seed)
    run_dir.start()
    with run.progress(config.env_steps, start, 'env step',
                      f'{config.agent} {config.env}', show_progress) as bar:
      if resumed:
        bar.write(f'resumed at {start} env steps, {learner.train_step} '
                  'gradient steps', file=sys.stderr)

      def evaluate(_):
        this_run.evaluate(config.eval_episodes, config.seed, x='env_steps',
                          title=self._title, metric=self._metric, bar=bar,
                          on_eval=self._on_eval)

      def snapshot(env_steps):
        # Snapshots are behaviour policies for recording: npz only.
        record = this_run.last_record
        this_run.export(os.path.join(
            run.POLICY_SNAPSHOTS, f'step_{env_steps:08d}.npz'),
                        saved_model=False, env_steps=env_steps, train_step=learner.train_step,
                        eval=(record if record.get('env_steps') == env_steps
                              else None))

      if remote_actors:
        phase = distributed.RemotePhase(
            this_run, replay, client, utd=config.utd,
            train_every=config.train_every,
            learn_from=config.initial_collect_steps,
            publish_every=config.publish_every,
            actor_wait_s=config.actor_wait_s, bar=bar)
        # Actors past their random steps wait for weights: publish the
        # first ones before waiting for their episodes.
        phase.publish()
      else:
        phase = run.OnlinePhase(
            this_run, self._collector, replay.poll, lambda: replay.ready,
            replay.feed,
            act=lambda steps: explore_act(this_run.policy, config, specs,
                                          steps, replay.actor_view()),
            train_every=config.train_every,
            gradient_steps=int(config.train_every * config.utd),
            learn_from=config.initial_collect_steps, bar=bar)
      run.run_phases(
          lambda: int(learner.env_steps.numpy()), config.env_steps, phase,
          [run.Every(config.eval_interval, evaluate, at_end=False),
           run.Every(config.snapshot_interval, snapshot, at_end=False),
           run.Every(config.checkpoint_interval, this_run.checkpoint)], bar,
          what='online training', unit='env step')
    this_run.export('policy.npz', env_steps=config.env_steps)
    return this_run.final_record()

  def close(self) -> None:
    if self._collector is not None:
      self._collector.close()
      self._collector = None
    if self._reward_env is not None:
      self._reward_env.close()
      self._reward_env = None
