"""Offline training from a Reverb table, and offline-to-online fine-tuning.

`train_offline` pushes a dataset into an episode table (or reads an existing
table), reads it once into the learner's memory and trains any agent whose
registry record trains offline (on goal data with `her_config`, one that
does so with hindsight relabelling) from batches drawn in-graph; it evaluates in the real
environment every `eval_interval` gradient steps (average return and D4RL
normalised score, or success rate). With `online_finetune_steps` it goes on
online: a second episode table takes fresh episodes and every batch is half
offline, half online (symmetric sampling, as RLPD does). `feed='stream'`
samples 2-step items from Reverb for every batch instead (a remote table too
big for the learner's memory). The run loop is `run`'s, shared with online
training.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf
import tqdm

from rlds_reverb import settings
from rlds_reverb.data import convert
from rlds_reverb.data import datasets
from rlds_reverb.replay import per
from rlds_reverb.replay import sampling
from rlds_reverb.storage import server_link
from rlds_reverb.storage import tables
from rlds_reverb.acting import collect
from rlds_reverb.acting import envs
from rlds_reverb.agents import registry
from rlds_reverb.experiments import configs
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import offline_data
from rlds_reverb.experiments import resume
from rlds_reverb.experiments import run
from rlds_reverb.experiments import runner
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from rlds_reverb.replay import variants

OFFLINE_TABLE = configs.OFFLINE_TABLE
FINETUNE_TABLE = 'online'
FEEDS = configs.FEEDS
NORMALIZATION_FILE = 'observation_stats.npz'
# Deadline of writing PER priorities back to a remote table (one item).
_WRITE_BACK_TIMEOUT_S = 60.0


OfflineConfig = configs.OfflineConfig


def _check(config: OfflineConfig, specs: envs.EnvSpecs) -> None:
  her_run = config.her_config is not None
  agent = registry.get(config.agent)
  agent.check_mode(registry.OFFLINE, her=her_run)
  if agent.actions != registry.BOTH and specs.discrete != (
      agent.actions == registry.DISCRETE):
    fitting = registry.names(registry.OFFLINE, discrete=specs.discrete)
    raise ValueError(f'agent {config.agent} needs {agent.actions} actions; '
                     f'env {config.env} has '
                     f'{"discrete" if specs.discrete else "continuous"} ones: '
                     f'use {", ".join(fitting)}')
  if not config.reconnect_timeout_s >= 0 or (config.reconnect_timeout_s and
                                            not config.reverb_address):
    raise ValueError('reconnect_timeout_s must be >= 0, and > 0 only with '
                     'a remote table (reverb_address); got '
                     f'{config.reconnect_timeout_s}')
  if config.online_finetune_steps < 0:
    raise ValueError('online_finetune_steps must be >= 0, got '
                     f'{config.online_finetune_steps}')
  if config.online_finetune_steps and not agent.trains(registry.FINETUNE):
    raise ValueError(f'{config.agent} has no critic to fine-tune online; use '
                     f'one of {", ".join(registry.names(registry.FINETUNE))} '
                     'with --online_finetune_steps')
  if config.online_finetune_steps and config.batch_size < 2:
    raise ValueError('symmetric sampling needs batch_size >= 2')
  if config.online_finetune_steps and config.feed != 'memory':
    raise ValueError('fine-tuning mixes two in-memory feeds: drop --feed '
                     'stream or online_finetune_steps')
  if config.feed not in FEEDS:
    raise ValueError(f'feed must be one of {", ".join(FEEDS)}, got '
                     f'{config.feed!r}')
  if agent.one_step and config.n_step != 1:
    raise ValueError(f'{config.agent} takes one-step transitions (it reads '
                     'the next action or the return-to-go of each); drop '
                     f'n_step={config.n_step}')
  if agent.returns_to_go and (config.feed != 'memory' or
                              config.prioritized):
    raise ValueError(f'{config.agent} reads each transition\'s return-to-go '
                     'from the '
                     'memory feed with uniform sampling: drop --feed stream '
                     'and prioritized replay')
  if config.scales_rewards and (config.feed != 'memory' or her_run or
                                not agent.ensemble_critics):
    raise ValueError('reward scaling (normalize_rewards) reads the episode '
                     'returns from the memory feed and is offered for '
                     f'{", ".join(registry.names_with_ensemble_critics())} '
                     'without HER')
  if config.n_step < 1 or (config.n_step > 1 and (
      config.feed != 'memory' or her_run)):
    raise ValueError(f'n_step must be >= 1, and > 1 needs the memory feed '
                     f'without her; got n_step={config.n_step} with feed '
                     f'{config.feed!r}')
  if config.replay not in per.REPLAYS:
    raise ValueError(f'replay must be one of {", ".join(per.REPLAYS)}, got '
                     f'{config.replay!r}')
  if config.prioritized and not agent.td_errors:
    with_td_errors = [name for name in registry.names(registry.OFFLINE)
                      if registry.get(name).td_errors]
    raise ValueError(f'{config.agent} has no TD error to prioritize by; use '
                     f'one of {", ".join(with_td_errors)} with prioritized '
                     'replay')
  if config.prioritized and config.online_finetune_steps:
    raise ValueError('prioritized replay covers the offline phase only; '
                     'fine-tuning samples both tables uniformly: drop '
                     'prioritized replay or online_finetune_steps')
  if her_run:
    if not specs.goal_conditioned:
      raise ValueError(f'HER needs a goal env (dict observations with '
                       f'{", ".join(envs.GOAL_KEYS)}); {config.env} has a '
                       'flat observation')
    for unsupported, why in (
        (config.reverb_address, 'reverb_address (HER pushes the dataset '
         'into its own episode table)'),
        (config.online_finetune_steps, 'online_finetune_steps'),
        (config.prioritized, 'prioritized replay'),
        (config.feed != 'memory', 'feed stream')):
      if unsupported:
        raise ValueError(f'offline HER does not take {why}')
  settings.check_bounds(config)


def load_dataset(config: OfflineConfig) -> tf.data.Dataset:
  rlds_data = datasets.load(config.dataset, split=config.split,
                            data_dir=config.data_dir, download=config.download)
  if config.max_episodes:
    rlds_data = rlds_data.take(config.max_episodes)
  if config.bootstrap_through_terminals:
    rlds_data = offline_data.without_terminations(rlds_data)
  return rlds_data


def _replay(config: OfflineConfig, specs: envs.EnvSpecs, data_spec: Any,
            reward_env: Any) -> Any:
  """The offline data's replay variant."""
  settings = variants.Settings(
      table=config.table, data_spec=data_spec, batch_size=config.batch_size,
      capacity=1, max_episodes=offline_data.UNBOUNDED_TABLE_SIZE, grow=True,
      n_step=config.n_step, gamma=config.agent_config.gamma,
      frame_stack=specs.frame_stack)
  if config.feed == 'stream':
    return variants.StreamReplay(
        settings, config.per_settings if config.prioritized else None)
  if config.her_config is not None:
    return variants.HindsightReplay(settings, config.her_config, reward_env,
                                    normalize=config.her_normalize)
  if config.prioritized:
    return variants.PrioritizedReplay(settings, config.per_settings)
  if registry.get(config.agent).returns_to_go:
    return variants.ReturnToGoReplay(settings)
  return variants.UniformReplay(settings)


def _finetune_replay(config: OfflineConfig,
                     specs: envs.EnvSpecs) -> variants.UniformReplay:
  variant = (variants.ReturnToGoReplay
             if registry.get(config.agent).returns_to_go
             else variants.UniformReplay)
  return variant(variants.Settings(
      table=FINETUNE_TABLE, data_spec=run.trajectory_spec(specs),
      batch_size=config.batch_size // 2,
      capacity=config.online_finetune_steps + (specs.max_episode_steps or
                                               1000),
      max_episodes=max(config.online_finetune_steps, 1),
      n_step=config.n_step, gamma=config.agent_config.gamma))


def _observation_stats(config: OfflineConfig, memory: Any,
                       data: offline_data.TableData | None
                       ) -> tuple[np.ndarray | None, np.ndarray | None]:
  if not config.normalizes:
    return None, None
  path = os.path.join(config.root_dir, NORMALIZATION_FILE)
  if os.path.exists(path):  # Resumed: the networks were trained on these.
    with np.load(path) as saved:
      return saved['mean'], saved['std']
  mean, std = (offline_data.memory_observation_stats(memory)
               if memory is not None else offline_data.observation_stats(data))
  os.makedirs(config.root_dir, exist_ok=True)
  np.savez(path, mean=mean, std=std)
  return mean, std


def _checked_data(config: OfflineConfig, specs: envs.EnvSpecs
                  ) -> tuple[tf.data.Dataset | None, Any]:
  """The dataset, checked against the env and cast, and its spec."""
  if config.reverb_address:
    return None, None
  rlds_data = load_dataset(config)
  if config.her_config is not None:
    rlds_data = offline_data.check_goal_data(rlds_data, specs)
  else:
    rlds_data = offline_data.check_and_cast(rlds_data, specs)
  return rlds_data, convert.create_trajectory_data_spec(rlds_data)


def train_offline(config: OfflineConfig, *, show_progress: bool = True,
                  on_server_lost: Callable[[BaseException], None] =
                  sampling.exit_process) -> dict:
  """Runs the offline phase (and fine-tuning); returns the final summary.

  A root_dir with a run in it is resumed if its recorded config allows
  (`resume.check_resumable`); config.json is written once training starts,
  and a run that fails before that leaves nothing behind in root_dir.

  A remote table (reverb_address): every call on the server has a
  deadline; with reconnect_timeout_s a lost server is waited for (see
  `server_link`). The streaming feed blocks inside Reverb's C++ sampler when
  its server dies, so a `sampling.ServerWatch` thread watches the server and
  calls `on_server_lost(error)` when it is gone for good; the default,
  `sampling.exit_process`, prints the error and ends the process (exit 1).

  Raises:
    resume.ResumeMismatchError: root_dir holds a run of other settings.
    ValueError, RuntimeError, OSError: bad config, data or table.
    tables.ServerUnavailableError: the remote server stopped answering
      (a ConnectionError; `server_link.ServerLostError` when it did not come
      back within reconnect_timeout_s).
    run.TrainingError: training failed (an op error, a non-finite loss).
  """
  return runner.run_experiment(
      OfflineBuilder(config, on_server_lost=on_server_lost,
                     show_progress=show_progress))


class OfflineBuilder:
  """Offline runs from a dataset or a remote table, and their fine-tuning."""

  def __init__(self, config: OfflineConfig, *,
               on_server_lost: Callable[[BaseException], None] =
               sampling.exit_process, show_progress: bool = True):
    self.config, self._on_server_lost = config, on_server_lost
    self._show_progress = show_progress
    self._reward_env, self._watch, self._link = None, None, None
    self._client = None

  def check(self, specs: envs.EnvSpecs) -> OfflineConfig:
    config = self.config
    _check(config, specs)
    # The method's own settings, read once here and passed to the agent.
    self._method_config = registry.default_method_config(config.agent)
    self.config = config = dataclasses.replace(
        config, agent_config=registry.resolve(
            config.agent, dataclasses.replace(
                config.agent_config,
                train_steps=(config.agent_config.train_steps
                             or config.train_steps))),
        method_settings=registry.method_settings(self._method_config))
    self._specs = specs
    return config

  def prepare(self) -> None:
    config, specs = self.config, self._specs
    self._rlds_data, data_spec = _checked_data(config, specs)
    if config.her_config is not None:
      self._reward_env = envs.make_env(config.env)
    if config.reverb_address:
      self._client, self._link, external = _connect(config, specs)
      data_spec = external.data_spec
    self._data_spec = data_spec
    self._replay = _replay(config, specs, data_spec, self._reward_env)
    self._finetune_replay = (_finetune_replay(config, specs)
                             if config.online_finetune_steps else None)
    if self._link is not None and self._replay.samples_from_reverb:
      # Sampling blocks inside Reverb's C++ when the server dies.
      self._watch = sampling.ServerWatch(self._link, self._client,
                                         on_lost=self._on_server_lost)
      self._watch.__enter__()

  def servers(self) -> list:
    found = []
    if not self.config.reverb_address:
      # Checkpointed with the run: a resumed run does not push again (and
      # pushes again if this copy of the dataset is gone).
      found.append((self._replay.tables(), run.REVERB_CHECKPOINTS))
    if self._finetune_replay is not None:
      # The online episodes in a server of their own: their checkpoint is
      # what a resumed fine-tuning run cannot get back any other way.
      found.append((self._finetune_replay.tables(),
                    run.ONLINE_REVERB_CHECKPOINTS))
    return found

  def make_learner(self, servers) -> loop.Learner:
    config, link = self.config, self._link
    servers = list(servers)
    local = None if config.reverb_address else servers.pop(0)
    self._local_client = local.localhost_client() if local else None
    self._online_client = (servers.pop(0).localhost_client()
                           if self._finetune_replay is not None else None)
    client, address = self._client, config.reverb_address
    if local is not None:
      client = self._client = self._local_client
      address = f'localhost:{local.port}'
    fill = lambda: _fill_table(config, self._rlds_data, self._data_spec,
                               client, address, self._show_progress)
    self._data = (link.call(fill, f'reading table {config.table!r}',
                            own_deadline=True) if link else fill())
    # Before anything is written: a table that cannot serve this replay.
    self._replay.check(client)
    self._agent = registry.make_agent(config.agent,
                                      self._specs.time_step_spec,
                                      self._specs.action_spec,
                                      config.agent_config,
                                      method_config=self._method_config)
    learner = loop.Learner(self._agent, config.root_dir,
                           **self._replay.checkpoint_state())
    goal = config.her_config is not None
    how = (f'HER {config.her_config.strategy} k={config.her_config.k:g}, '
           if goal else '')
    self._title = f'{config.agent} on {config.dataset}, {how}seed {config.seed}'
    self._metric = 'success_rate' if goal else 'average_return'
    learner.set_curve(x='train_step', title=self._title, y=self._metric)
    return learner

  def train(self, learner: loop.Learner, resumed: bool,
            run_dir: resume.RunDirectory) -> dict:
    del resumed  # The step counters say where each phase stands.
    show_progress = self._show_progress
    config, specs, replay, agent = (self.config, self._specs, self._replay,
                                    self._agent)
    client, link, data = self._client, self._link, self._data
    title, metric = self._title, self._metric
    goal = config.her_config is not None
    t0 = time.perf_counter()
    with tqdm.tqdm(desc=f'load {config.table}', unit='step',
                   disable=not show_progress or replay.samples_from_reverb
                   ) as bar:
      replay.start(client, progress=bar.update)
    load_seconds = time.perf_counter() - t0
    mean, std = _observation_stats(config, replay.memory, data)
    if config.scales_rewards:  # On top of a reward_scale_factor given.
      returns = offline_data.episode_returns(replay.memory)
      agent.reward_scale.assign(config.agent_config.reward_scale_factor *
                                offline_data.reward_scale(returns))
    for variant in (replay, self._finetune_replay):
      if isinstance(variant, variants.ReturnToGoReplay):
        # Returns-to-go in the units of the agent's (scaled) rewards.
        variant.reward_scale = float(agent.reward_scale.numpy())
    normalize = offline_data.normalizer(mean, std)
    source = replay.feed(transform=normalize)
    train_step = replay.train_step(agent)
    if train_step is not None:
      learner.set_train_step(train_step)
    write_back = lambda: replay.write_back(client)
    if replay.writes_back and link is not None:
      write_back = lambda: _write_back(replay, client, link)
    this_run = run.Run(
        learner, config.agent, specs, config.root_dir,
        clients=[c for c in (self._local_client, self._online_client)
                 if c is not None],
        write_back=write_back,
        view=replay.actor_view(), refresh_view=replay.refresh_actor_view,
        normalizer=getattr(replay, 'normalizer', None),
        dataset=config.dataset, seed=config.seed)
    this_run.policy.obs_mean, this_run.policy.obs_std = mean, std
    summary = {'agent': config.agent, 'dataset': config.dataset,
               'env': config.env, 'seed': config.seed,
               'replay': config.replay, 'feed': config.feed,
               'table_size': data.table_size,
               'batch_size': config.batch_size}
    if replay.memory is not None:
      summary.update(transitions=int(replay.memory.num_transitions),
                     load_seconds=round(load_seconds, 2),
                     memory_bytes=replay.memory.bytes)
    if goal:
      summary.update(her=config.her_config.strategy, k=config.her_config.k)

    def evaluate(phase: str, bar) -> dict:
      # Both phases are drawn against gradient steps, so the run's curve
      # goes on where the offline phase stopped; records hold env_steps too.
      return this_run.evaluate(config.eval_episodes, config.seed,
                               x='train_step', title=title, metric=metric,
                               bar=bar, phase=phase)

    run_dir.start()
    with run.progress(config.train_steps, learner.train_step, 'grad step',
                      f'{config.agent} offline', show_progress) as bar:
      phase = run.OfflinePhase(learner, source, config.train_steps,
                               (config.eval_interval,
                                config.checkpoint_interval), bar)
      run.run_phases(lambda: learner.train_step, config.train_steps, phase,
                     [run.Every(config.eval_interval,
                                lambda _: evaluate('offline', bar)),
                      run.Every(config.checkpoint_interval,
                                this_run.checkpoint)], bar,
                     what='offline training', unit='gradient step')
    finetuning = int(learner.env_steps.numpy()) > 0  # Resumed in it.
    # A run resumed at its end has its last evaluation in the log already.
    record = this_run.last_record or _last_record(
        learner, 'offline',
        **({} if finetuning else {'train_step': learner.train_step}))
    if record is None:
      record = (evaluate('offline', None) if not finetuning else
                {'average_return': None})
    summary.update(
        offline_return=record['average_return'],
        offline_normalized_score=record.get('normalized_score'),
        train_steps=learner.train_step,
        grad_steps_per_s=phase.steps_per_second,
        sampled_transitions_per_s=(
            round(phase.steps_per_second * config.batch_size)
            if phase.steps_per_second else None))
    if goal:
      summary.update(success_rate=record.get('success_rate'),
                     average_return=record.get('average_return'))
    if not finetuning:  # Else the learner holds fine-tuned weights.
      this_run.export('policy_offline.npz', train_step=learner.train_step)
    if self._finetune_replay is not None:
      summary.update(_finetune(config, specs, this_run, replay,
                               self._finetune_replay, normalize,
                               self._online_client, evaluate, show_progress))
    return summary

  def close(self) -> None:
    if self._watch is not None:
      self._watch.stop()
      self._watch = None
    if self._reward_env is not None:
      self._reward_env.close()
      self._reward_env = None


def _write_back(replay: Any, client: Any,
                link: server_link.ServerLink) -> None:
  """The replay's write-back to a remote table, within deadlines: a ping
  with the link's, then the write with a longer one."""
  what = f'writing priorities back to table {link.table!r}'
  link.call(lambda: link.table_size(client), what, own_deadline=True)
  link.call(lambda: replay.write_back(client), what,
            timeout_s=_WRITE_BACK_TIMEOUT_S)


def _connect(config: OfflineConfig, specs: envs.EnvSpecs
             ) -> tuple[Any, server_link.ServerLink, offline_data.TableData]:
  """The remote table: a client with its link (deadlines; waiting for a
  lost server with reconnect_timeout_s), and what the table holds."""
  address, table = config.reverb_address, config.table
  link = server_link.ServerLink(address, table,
                                reconnect_s=config.reconnect_timeout_s)
  try:
    client = tables.connect(address)
  except ConnectionError as e:
    link.wait('connecting', e)  # Raises unless reconnecting.
    client = tables.connect(address)
  server_link.attach(client, link)
  external = link.call(
      lambda: offline_data.existing_table(client, address, table, specs),
      f'reading table {table!r}', own_deadline=True)
  link.note_size(external.table_size)
  return client, link, external


def _last_record(learner: loop.Learner, phase: str,
                 **position: int) -> dict | None:
  """The phase's last logged evaluation (at `position`'s step counters, if
  given), so a run whose interval, or an earlier session of it, already
  evaluated there does not evaluate and log twice."""
  records = [r for r in learner.eval_records() if r.get('phase') == phase
             and all(r.get(key) == value for key, value in position.items())]
  return records[-1] if records else None


def _fill_table(config: OfflineConfig, rlds_data: tf.data.Dataset | None,
                data_spec: Any, client: Any, address: str,
                show_progress: bool) -> offline_data.TableData:
  """Pushes the dataset into our empty table (whole episodes for the memory
  feed, 2-step items to stream); an existing or restored table is used as
  it is."""
  size = tables.get_table_info(client, config.table).current_size
  if rlds_data is None or size:  # Theirs, or restored from our checkpoint.
    if config.feed == 'memory':
      episode_table.check_episode_table(client, config.table)
    elif episode_table.is_episode_table(client, config.table):
      raise ValueError(
          f'table {config.table!r} holds whole episodes for the in-memory '
          'feed; the streaming feed samples 2-step items: drop --feed stream')
    return offline_data.TableData(address, config.table, data_spec, size,
                                  None)
  with tqdm.tqdm(desc=f'push {config.dataset}', unit='step',
                 disable=not show_progress) as bar:
    if config.feed == 'memory':
      stats = offline_data.push_episodes(rlds_data, client, config.table,
                                         progress=bar.update)
      data = offline_data.TableData(address, config.table, data_spec,
                                    stats.items, stats)
    else:
      data = offline_data.push_to_new_table(rlds_data, client, address,
                                            config.table, progress=bar.update)
  tables.checkpoint(client)
  return data


def _finetune(config: OfflineConfig, specs: envs.EnvSpecs, this_run: run.Run,
              offline_replay: Any, online_replay: variants.UniformReplay,
              normalize, client: Any, evaluate, show_progress: bool) -> dict:
  """Offline-to-online: half of every batch from each table."""
  learner = this_run.learner
  online_replay.start(client)  # A resumed run gets back what it collected.
  run.check_episodes_restored(
      config.root_dir, run.ONLINE_REVERB_CHECKPOINTS,
      int(learner.env_steps.numpy()), specs.max_episode_steps,
      online_replay.ready, 'fine-tuning')
  half = config.batch_size // 2
  mixed = None

  def source():
    nonlocal mixed
    if mixed is None:
      if isinstance(offline_replay, variants.ReturnToGoReplay):
        offline_part = feeds.ReturnToGoFeed(
            offline_replay.memory, config.batch_size - half,
            gamma=config.agent_config.gamma,
            reward_scale=offline_replay.reward_scale, transform=normalize)
      else:
        offline_part = feeds.UniformFeed(
            offline_replay.memory, config.batch_size - half,
            n_step=config.n_step, gamma=config.agent_config.gamma,
            transform=normalize)
      mixed = feeds.MixedFeed(offline_part,
                              online_replay.feed(transform=normalize))
    return mixed

  collector = collect.Collector(
      config.env, client, FINETUNE_TABLE,
      seed=config.seed * 1_000_003 + int(learner.env_steps.numpy()),
      **online_replay.writer_kwargs())
  try:
    with run.progress(config.online_finetune_steps,
                      int(learner.env_steps.numpy()), 'env step',
                      f'{config.agent} fine-tune', show_progress) as bar:
      phase = run.OnlinePhase(
          this_run, collector, online_replay.poll,
          lambda: online_replay.ready, source,
          act=lambda _: collect.policy_act(this_run.policy,
                                           config.exploration_noise),
          train_every=config.train_every,
          gradient_steps=config.train_every, bar=bar)
      run.run_phases(
          lambda: int(learner.env_steps.numpy()),
          config.online_finetune_steps, phase,
          [run.Every(config.eval_interval,
                     lambda _: evaluate('online', bar), at_end=False),
           run.Every(config.checkpoint_interval, this_run.checkpoint)], bar,
          what='fine-tuning', unit='env step')
    record = (_last_record(learner, 'online',
                           env_steps=int(learner.env_steps.numpy()))
              or evaluate('online', None))
  finally:
    collector.close()
  this_run.export('policy_finetuned.npz')
  return {'finetune_env_steps': int(learner.env_steps.numpy()),
          'finetuned_return': record['average_return'],
          'finetuned_normalized_score': record['normalized_score']}
