"""Offline training from a Reverb table, and offline-to-online fine-tuning.

`train_offline` pushes a dataset into a table (or reads an existing one),
trains BC, TD3+BC or CQL-SAC from uniform samples of all of it, evaluates
in the real environment every `eval_interval` gradient steps (average
return and D4RL normalised score) and, with `online_finetune_steps`, goes
on online: a second table takes fresh episodes and every batch is half
offline, half online (symmetric sampling, as RLPD does).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from typing import Any

import numpy as np
import tensorflow as tf
import tqdm

from rlds_reverb import convert
from rlds_reverb import datasets
from rlds_reverb import her
from rlds_reverb import per
from rlds_reverb import sampling
from rlds_reverb import tables
from rlds_reverb.acting import collect
from rlds_reverb.acting import envs
from rlds_reverb.acting import evaluation
from rlds_reverb.acting import numpy_policy
from rlds_reverb.learners import agents
from rlds_reverb.learners import export
from rlds_reverb.learners import her_offline
from rlds_reverb.learners import loop
from rlds_reverb.learners import offline_data
from rlds_reverb.learners import online
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from rlds_reverb.replay import follow
from rlds_reverb.replay import memory as memory_lib

OFFLINE_TABLE = 'rlds'
FEEDS = ('memory', 'stream')
NORMALIZATION_FILE = 'observation_stats.npz'


@dataclasses.dataclass
class OfflineConfig:
  """An offline run; each field is the `pipelines.train` flag of that name."""
  agent: str
  dataset: str
  root_dir: str
  env: str = 'HalfCheetah-v5'
  split: str = 'train'
  data_dir: str | None = None
  download: bool = True
  max_episodes: int = 0
  reverb_address: str = ''
  table: str = OFFLINE_TABLE
  train_steps: int = 300_000
  batch_size: int = 256
  eval_interval: int = 10_000
  eval_episodes: int = 10
  checkpoint_interval: int = 10_000
  normalize_observations: bool | None = None  # None: on for td3_bc only
  online_finetune_steps: int = 0
  train_every: int = 1000
  exploration_noise: float = 0.1
  replay: str = 'uniform'  # or 'prioritized' (the offline table)
  # 'memory': the table holds whole episodes, read once into the learner's
  # memory and sampled in-graph; 'stream': 2-step items sampled from Reverb
  # for every batch (a remote table too big for the learner's memory).
  feed: str = 'memory'
  n_step: int = 1  # memory feed: n-step returns (1: one-step TD)
  # None: per.PerConfig defaults, beta annealed over all train_steps.
  per_config: per.PerConfig | None = None
  # Goal-conditioned data: hindsight relabelling (`her_offline`).
  her_config: her.HerConfig | None = None
  her_normalize: bool = True
  seed: int = 0
  agent_config: agents.AgentConfig = dataclasses.field(
      default_factory=agents.AgentConfig)

  @property
  def prioritized(self) -> bool:
    return self.replay == 'prioritized'

  @property
  def per_settings(self) -> per.PerConfig:
    return self.per_config or per.PerConfig(beta_steps=self.train_steps)

  @property
  def normalizes(self) -> bool:
    if self.normalize_observations is None:
      return self.agent == 'td3_bc'
    return self.normalize_observations


def _check(config: OfflineConfig) -> None:
  if config.agent not in agents.OFFLINE_AGENTS:
    raise ValueError(f'agent {config.agent!r} is not an offline agent; one '
                     f'of: {", ".join(agents.OFFLINE_AGENTS)}')
  for name in ('train_steps', 'batch_size', 'eval_interval', 'eval_episodes',
               'checkpoint_interval', 'train_every'):
    if getattr(config, name) < 1:
      raise ValueError(f'{name} must be >= 1, got {getattr(config, name)}')
  if config.online_finetune_steps < 0:
    raise ValueError('online_finetune_steps must be >= 0, got '
                     f'{config.online_finetune_steps}')
  if config.online_finetune_steps and config.agent == 'bc':
    raise ValueError('bc has no critic to fine-tune online; use td3_bc or '
                     'cql_sac with --online_finetune_steps')
  if config.online_finetune_steps and config.batch_size < 2:
    raise ValueError('symmetric sampling needs batch_size >= 2')
  if config.feed not in FEEDS:
    raise ValueError(f'feed must be one of {", ".join(FEEDS)}, got '
                     f'{config.feed!r}')
  if config.n_step < 1 or (config.n_step > 1 and config.feed != 'memory'):
    raise ValueError(f'n_step must be >= 1 and needs the memory feed, got '
                     f'n_step={config.n_step} with feed {config.feed!r}')
  if config.replay not in per.REPLAYS:
    raise ValueError(f'replay must be one of {", ".join(per.REPLAYS)}, got '
                     f'{config.replay!r}')
  if config.prioritized and config.agent == 'bc':
    raise ValueError('bc has no TD error to prioritize by; use td3_bc or '
                     'cql_sac with prioritized replay')
  if config.prioritized and config.online_finetune_steps:
    raise ValueError('prioritized replay covers the offline phase only; '
                     'fine-tuning samples both tables uniformly: drop '
                     'prioritized replay or online_finetune_steps')


class _Tables:
  """The offline table (ours or external) and, for fine-tuning, ours online."""

  def __init__(self, config: OfflineConfig, specs: envs.EnvSpecs,
               data_spec: Any):
    self.server = None
    table_list = []
    if not config.reverb_address and config.feed == 'memory':
      table_list.append(episode_table.make_table(
          config.table, data_spec,
          max_episodes=offline_data.UNBOUNDED_TABLE_SIZE))
      if config.prioritized:
        table_list.append(feeds.make_priority_table(config.table))
    elif not config.reverb_address:
      table_list.append(tables.make_table(
          config.table, data_spec,
          max_size=offline_data.UNBOUNDED_TABLE_SIZE,
          sampler='prioritized' if config.prioritized else 'uniform',
          alpha=config.per_settings.alpha, min_size_to_sample=1))
    if config.online_finetune_steps and config.feed == 'memory':
      table_list.append(episode_table.make_table(
          online.ONLINE_TABLE, online.trajectory_spec(specs),
          max_episodes=max(config.online_finetune_steps, 1)))
    elif config.online_finetune_steps:
      table_list.append(tables.make_table(
          online.ONLINE_TABLE, online.trajectory_spec(specs),
          max_size=max(config.online_finetune_steps, 1),
          min_size_to_sample=config.batch_size // 2))
    if table_list:
      # Checkpointed with the run, so a resumed run neither pushes again
      # nor loses its online data.
      self.server = tables.start_server(
          table_list, checkpoint_dir=os.path.join(config.root_dir,
                                                  online.REVERB_CHECKPOINTS))
    self.local_address = (f'localhost:{self.server.port}' if self.server
                          else None)
    self.offline_address = config.reverb_address or self.local_address
    self.offline_client = (
        tables.connect(config.reverb_address) if config.reverb_address
        else self.server.localhost_client())
    if (config.prioritized and config.reverb_address
        and config.feed == 'stream'):
      per.check_prioritized(self.offline_client, config.table)

  def checkpoint(self) -> None:
    if self.server is not None:
      tables.checkpoint(self.server.localhost_client())

  def stop(self) -> None:
    if self.server is not None:
      self.server.stop()
      self.server = None


def load_offline_data(config: OfflineConfig, specs: envs.EnvSpecs,
                      rlds_data: tf.data.Dataset | None, data_spec: Any,
                      reverb_tables: _Tables, show_progress: bool
                      ) -> offline_data.TableData:
  """Reads the existing table, or pushes the dataset into ours."""
  client, address = reverb_tables.offline_client, reverb_tables.offline_address
  if rlds_data is None:
    return offline_data.existing_table(client, address, config.table, specs)
  size = tables.get_table_info(client, config.table).current_size
  if size:  # Restored from the run's Reverb checkpoint.
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
  reverb_tables.checkpoint()
  return data


def load_memory(config: OfflineConfig, data: offline_data.TableData,
                client: Any, show_progress: bool
                ) -> memory_lib.TransitionMemory:
  """The whole table, read once into the learner's memory."""
  with tqdm.tqdm(desc=f'load {config.table}', unit='step',
                 disable=not show_progress) as bar:
    return offline_data.load_memory(client, config.table, data.data_spec,
                                    progress=bar.update)


def _offline_feed(config: OfflineConfig, data: offline_data.TableData,
                  memory: memory_lib.TransitionMemory | None, normalize,
                  max_priority: per.MaxPriority) -> Any:
  """The learner's batches: an in-graph feed, or a streaming reader."""
  gamma = config.agent_config.gamma
  if memory is not None and config.prioritized:
    return feeds.PrioritizedFeed(memory, config.batch_size,
                                 config.per_settings, n_step=config.n_step,
                                 gamma=gamma, transform=normalize,
                                 max_priority=max_priority)
  if memory is not None:
    return feeds.UniformFeed(memory, config.batch_size, n_step=config.n_step,
                             gamma=gamma, transform=normalize)
  if config.prioritized:
    return iter(offline_data.sample_batches(
        data, config.batch_size, with_info=True).map(
            lambda batch, info: (normalize(batch), info)))
  return iter(offline_data.sample_batches(data, config.batch_size).map(
      normalize))


def load_dataset(config: OfflineConfig) -> tf.data.Dataset:
  rlds_data = datasets.load(config.dataset, split=config.split,
                            data_dir=config.data_dir, download=config.download)
  if config.max_episodes:
    rlds_data = rlds_data.take(config.max_episodes)
  return rlds_data


def _observation_stats(config: OfflineConfig, data: offline_data.TableData,
                       memory: memory_lib.TransitionMemory | None
                       ) -> tuple[np.ndarray | None, np.ndarray | None]:
  if not config.normalizes:
    return None, None
  path = os.path.join(config.root_dir, NORMALIZATION_FILE)
  if os.path.exists(path):  # Resumed: the networks were trained on these.
    with np.load(path) as saved:
      return saved['mean'], saved['std']
  mean, std = (offline_data.memory_observation_stats(memory) if memory
               is not None else offline_data.observation_stats(data))
  os.makedirs(config.root_dir, exist_ok=True)
  np.savez(path, mean=mean, std=std)
  return mean, std


def _priority_store(config: OfflineConfig, reverb_tables: _Tables,
                    feed: feeds.PrioritizedFeed):
  """Restores the priorities the store kept; returns the write-back.

  The store keeps them in the side table `feeds.make_priority_table` made
  next to the episode table; a remote table without one keeps none (said
  once, on stderr).
  """
  client = reverb_tables.offline_client
  if feeds.priority_table_name(config.table) not in client.server_info():
    print(f'table {config.table!r} has no side table '
          f'{feeds.priority_table_name(config.table)!r}: priorities live in '
          'this process only', file=sys.stderr)
    return None
  feeds.restore_priorities(client, config.table, feed)

  def write_back():
    feeds.write_priorities(client, config.table, feed)
    reverb_tables.checkpoint()
  return write_back


def train_offline(config: OfflineConfig, *, show_progress: bool = True
                  ) -> dict:
  """Runs the offline phase (and fine-tuning); returns the final summary."""
  if config.her_config is not None:
    return her_offline.train_her_offline(
        config, None if config.reverb_address else load_dataset(config),
        show_progress=show_progress)
  _check(config)
  tf.random.set_seed(config.seed)
  specs = envs.env_specs(config.env)
  os.makedirs(config.root_dir, exist_ok=True)
  rlds_data, data_spec = None, None
  if not config.reverb_address:
    rlds_data = offline_data.check_and_cast(load_dataset(config), specs)
    data_spec = convert.create_trajectory_data_spec(rlds_data)
  reverb_tables = _Tables(config, specs, data_spec)
  try:
    data = load_offline_data(config, specs, rlds_data, data_spec,
                             reverb_tables, show_progress)
    memory = None
    if config.feed == 'memory':
      t0 = time.perf_counter()
      memory = load_memory(config, data, reverb_tables.offline_client,
                           show_progress)
      load_seconds = time.perf_counter() - t0
    mean, std = _observation_stats(config, data, memory)
    normalize = offline_data.normalizer(mean, std)
    agent = agents.make_agent(config.agent, specs.time_step_spec,
                              specs.action_spec, config.agent_config)
    max_priority = per.MaxPriority()
    source = _offline_feed(config, data, memory, normalize, max_priority)
    train_step_fn = None
    if config.prioritized and memory is not None:
      train_step_fn = source.train_step(agent)
    elif config.prioritized:
      train_step_fn = per.PrioritizedTrainStep(
          agent, per.PriorityUpdater(data.address, data.table),
          config.per_settings, max_priority)
    learner = loop.Learner(agent, config.root_dir,
                           train_step_fn=train_step_fn,
                           max_priority=max_priority.variable)
    learner.restore()
    store_priorities = None
    if isinstance(source, feeds.PrioritizedFeed):
      store_priorities = _priority_store(config, reverb_tables, source)
    policy = online.export_policy(agent, config.agent, specs,
                                  dataset=config.dataset, seed=config.seed)
    policy.obs_mean, policy.obs_std = mean, std
    summary = {'agent': config.agent, 'dataset': config.dataset,
               'env': config.env, 'seed': config.seed,
               'replay': config.replay, 'feed': config.feed,
               'table_size': data.table_size,
               'batch_size': config.batch_size}
    if memory is not None:
      summary.update(transitions=int(memory.num_transitions),
                     load_seconds=round(load_seconds, 2),
                     memory_bytes=memory.bytes)

    # Both phases are drawn against gradient steps, so the run's curve goes
    # on where the offline phase stopped; each record also holds env_steps.
    def evaluate(phase: str) -> dict:
      export.update_weights(policy, agents.actor_network(agent))
      result = evaluation.evaluate(policy.greedy, config.env,
                                   config.eval_episodes,
                                   seed=10_000 + config.seed)
      return learner.log_eval({**result.to_dict(), 'phase': phase},
                              x='train_step',
                              title=f'{config.agent} on {config.dataset}, '
                              f'seed {config.seed}')

    record = None
    phases = loop.TrainPhases(learner, source,
                              config.train_steps,
                              (config.eval_interval,
                               config.checkpoint_interval))
    with tqdm.tqdm(total=config.train_steps, initial=min(
        learner.train_step, config.train_steps), unit='grad step',
                   desc=f'{config.agent} offline',
                   disable=not show_progress) as bar:
      for after, loss, todo in phases:
        bar.update(todo)
        bar.set_postfix(loss=f'{loss:.3g}')
        if after % config.eval_interval == 0 or after == config.train_steps:
          record = evaluate('offline')
          bar.write(f'eval at {after} gradient steps: return '
                    f'{record["average_return"]:.1f}, normalised '
                    f'{_fmt(record["normalized_score"])}')
        if (after % config.checkpoint_interval == 0 or
            after == config.train_steps):
          learner.save()
          if store_priorities is not None:
            store_priorities()
    if record is None:  # Resumed after the offline phase had finished.
      record = evaluate('offline')
    summary.update(
        offline_return=record['average_return'],
        offline_normalized_score=record['normalized_score'],
        train_steps=learner.train_step,
        grad_steps_per_s=phases.steps_per_second,
        sampled_transitions_per_s=(
            round(phases.steps_per_second * config.batch_size)
            if phases.steps_per_second else None))
    policy.save(os.path.join(config.root_dir, 'policy_offline.npz'))
    if config.online_finetune_steps:
      summary.update(finetune(config, specs, learner, policy, data, memory,
                              normalize, reverb_tables, evaluate,
                              show_progress))
    return summary
  finally:
    reverb_tables.stop()


def finetune(config: OfflineConfig, specs: envs.EnvSpecs,
             learner: loop.Learner, policy: numpy_policy.NumpyPolicy,
             data: offline_data.TableData,
             memory: memory_lib.TransitionMemory | None, normalize,
             reverb_tables: _Tables, evaluate, show_progress: bool) -> dict:
  """Offline-to-online: half of every batch from each table."""
  half = config.batch_size // 2
  client = reverb_tables.server.localhost_client()
  follower = None
  if memory is not None:
    online_memory = memory_lib.TransitionMemory(
        online.trajectory_spec(specs),
        config.online_finetune_steps + (specs.max_episode_steps or 1000))
    follower = follow.TableFollower(client, online.ONLINE_TABLE,
                                    online_memory)
    follower.catch_up()  # A resumed run gets back what it had collected.
    batches = feeds.MixedFeed(
        feeds.UniformFeed(memory, config.batch_size - half,
                          transform=normalize),
        feeds.UniformFeed(online_memory, half, transform=normalize))
  else:
    batches = sampling.mixed_dataset(
        [offline_data.sample_batches(data, config.batch_size - half),
         sampling.transition_dataset(
             reverb_tables.local_address, online.ONLINE_TABLE,
             online.trajectory_spec(specs), half)],
        [config.batch_size - half, half]).map(normalize)
  collector = collect.Collector(
      config.env, client, online.ONLINE_TABLE,
      seed=config.seed * 1_000_003 + int(learner.env_steps.numpy()),
      **(online.EPISODE_ITEMS if follower is not None else {}))
  act = collect.policy_act(policy, config.exploration_noise)
  iterator = None
  try:
    with tqdm.tqdm(total=config.online_finetune_steps,
                   initial=int(learner.env_steps.numpy()), unit='env step',
                   desc=f'{config.agent} fine-tune',
                   disable=not show_progress) as bar:
      while int(learner.env_steps.numpy()) < config.online_finetune_steps:
        before = int(learner.env_steps.numpy())
        collector.collect(config.train_every, act)
        learner.env_steps.assign_add(config.train_every)
        ready = True
        if follower is not None:
          follower.poll()
          # No finished episode yet: nothing online to mix in.
          ready = int(follower.memory.num_transitions) > 0
          iterator = batches
        elif iterator is None:
          iterator = iter(batches)
        if ready:
          learner.train(iterator, config.train_every)
          export.update_weights(policy, agents.actor_network(
              learner.agent))
        after = int(learner.env_steps.numpy())
        bar.update(after - before)
        if online.crossed(before, after, config.eval_interval):
          record = evaluate('online')
          bar.write(f'eval at {after} env steps: return '
                    f'{record["average_return"]:.1f}')
        if online.crossed(before, after, config.checkpoint_interval):
          learner.save()
          reverb_tables.checkpoint()
    record = evaluate('online')
    learner.save()
    reverb_tables.checkpoint()
  finally:
    collector.close()
  policy.save(os.path.join(config.root_dir, 'policy_finetuned.npz'))
  return {'finetune_env_steps': int(learner.env_steps.numpy()),
          'finetuned_return': record['average_return'],
          'finetuned_normalized_score': record['normalized_score']}


def _fmt(value: float | None) -> str:
  return 'n/a' if value is None else f'{value:.1f}'


def summary_line(summary: dict) -> str:
  return json.dumps(summary)
