"""On-policy training (PPO, A2C): rollouts through a Reverb queue, once each.

Each phase is one rollout: the numpy actor steps N env copies T steps
(`acting.vector_rollouts`), the rollout goes into a Reverb queue table as
one item, the learner takes it back out (the queue hands every rollout out
exactly once, in order, and deletes it), computes values, GAE advantages
and returns (`gae`), and updates (`ppo.Updater`). The run loop (`run`) owns
evaluation, checkpoints, the PNG curve and the exported policy, as for the
off-policy agents; the checkpoint holds the networks, the optimiser, the
env-step clock and the normalisation statistics.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from rlds_reverb import settings
from rlds_reverb.data import datasets
from rlds_reverb.acting import envs
from rlds_reverb.acting import rollout_actor
from rlds_reverb.acting import vector_rollouts
from rlds_reverb.agents import actor_critic
from rlds_reverb.agents.onpolicy import gae
from rlds_reverb.agents.onpolicy import gail
from rlds_reverb.agents import registry
from rlds_reverb.experiments import loop
from rlds_reverb.agents.onpolicy import normalization
from rlds_reverb.agents.onpolicy import ppo
from rlds_reverb.experiments import resume
from rlds_reverb.experiments import configs
from rlds_reverb.experiments import distributed
from rlds_reverb.experiments import run
from rlds_reverb.experiments import runner
from rlds_reverb.replay import rollout_queue
from rlds_reverb.replay import variables
from rlds_reverb.storage import tables

ROLLOUT_TABLE = rollout_actor.ROLLOUT_TABLE
# How long the learner of actor processes sleeps between polls of an empty
# queue.
_POLL_S = 0.05


OnPolicyConfig = configs.OnPolicyConfig


def check(config: OnPolicyConfig) -> None:
  registry.get(config.agent).check_mode(registry.ONPOLICY)
  settings.check_bounds(config)
  if config.ppo_config is not None:
    ppo.check(config.ppo_config)
    if config.ppo_config.algorithm != config.agent:
      raise ValueError(f'ppo_config.algorithm {config.ppo_config.algorithm!r}'
                       f' is not the agent {config.agent!r}')


def agent_settings(config: OnPolicyConfig, specs: envs.EnvSpecs
                   ) -> ppo.PpoConfig:
  """The run's agent settings: the given ones, or the env kind's defaults."""
  if config.ppo_config is not None:
    return config.ppo_config
  return ppo.defaults_for(config.agent, specs.discrete, image=specs.image)


def check_env(specs: envs.EnvSpecs,
              agent_config: ppo.PpoConfig | None = None) -> None:
  """Raises ValueError for an env the on-policy agents cannot act in (with
  these settings)."""
  if specs.goal_conditioned:
    raise ValueError(f'on-policy agents take flat observations; '
                     f'{specs.env_id} has goal dicts')
  if specs.image:
    if agent_config is not None and agent_config.recurrent:
      raise ValueError(f'{specs.env_id} has image observations: the '
                       'recurrent policy takes vectors (the CNN policy is '
                       'feed-forward)')
    if agent_config is not None and agent_config.observation_clip > 0:
      raise ValueError(f'{specs.env_id} has image observations, which the '
                       'network scales: observation normalisation is for '
                       'vectors (pass --observation_clip 0)')
    return
  if len(specs.observation_shape) != 1:
    raise ValueError(f'on-policy agents take flat observations or image '
                     f'frames; {specs.env_id} has shape '
                     f'{specs.observation_shape}')


def make_model(specs: envs.EnvSpecs, agent_config: ppo.PpoConfig) -> Any:
  """An `ActorCritic`, a `RecurrentActorCritic` with `recurrent`, or a
  `CnnActorCritic` on an image env's frame stacks."""
  check_env(specs, agent_config)
  actions = (
      {'num_actions': int(specs.action_high) - int(specs.action_low) + 1}
      if specs.discrete else
      {'action_size': int(np.prod(specs.action_spec.shape))})
  if specs.image:
    return actor_critic.CnnActorCritic(
        specs.time_step_spec.observation.shape, **actions)
  if agent_config.recurrent:
    return actor_critic.RecurrentActorCritic(
        specs.observation_shape[0], hidden=agent_config.hidden,
        state_size=agent_config.recurrent_size,
        initial_log_std=agent_config.initial_log_std, **actions)
  return actor_critic.ActorCritic(
      specs.observation_shape[0], hidden=agent_config.hidden,
      activation=agent_config.activation,
      orthogonal_init=agent_config.orthogonal_init,
      initial_log_std=agent_config.initial_log_std, **actions)


def _recurrent_values(model: actor_critic.RecurrentActorCritic,
                      rollout: dict) -> tuple[np.ndarray, ...]:
  """V(o_t) [T, N] along each copy's unrolled state, V(o_T) [N] after the
  last step (a fresh state where that step ended an episode), and V(real
  final observation) [T, N] stepped from the state of its episode."""
  observation = rollout['observation']
  t_steps, n = observation.shape[:2]
  states = model.unroll(np.swapaxes(observation, 0, 1),
                        np.swapaxes(rollout['episode_start'], 0, 1),
                        rollout['initial_state'])  # [N, T, H]
  flat_states = tf.reshape(states, [n * t_steps, -1])
  values = model.value_of(flat_states).numpy().reshape(n, t_steps).T
  ended = rollout['terminated'][-1] | rollout['truncated'][-1]
  last = states[:, -1] * (1.0 - ended[:, None].astype(np.float32))
  next_values = model.value_of(
      model.step(rollout['next_observation'], last)).numpy()
  final_values = None
  if rollout['truncated'].any():
    finals = np.swapaxes(rollout['final_observation'], 0, 1).reshape(
        n * t_steps, -1)
    final_values = model.value_of(model.step(
        finals, flat_states)).numpy().reshape(n, t_steps).T
  return values, next_values, final_values


def learner_batch(model: Any, rollout: dict, agent_config: ppo.PpoConfig,
                  *, action_low: Any = 0) -> dict[str, np.ndarray]:
  """Values, GAE advantages and returns of a rollout, in the layout
  `ppo.Updater` trains on: flattened over (T, N), or [N, T] sequences for a
  recurrent model. Discrete actions become indices of the model's logits
  (minus `action_low`)."""
  observation = rollout['observation']
  t_steps, n = observation.shape[:2]
  flat = observation.reshape((t_steps * n,) + observation.shape[2:])
  if model.recurrent:
    values, next_values, final_values = _recurrent_values(model, rollout)
  else:
    values = model.value(flat).numpy().reshape(t_steps, n)
    next_values = model.value(rollout['next_observation']).numpy()
    final_values = None
    if rollout['truncated'].any():
      final_values = model.value(rollout['final_observation'].reshape(
          flat.shape)).numpy().reshape(t_steps, n)
  advantages, returns = gae.advantages(
      rollout['reward'], values, next_values, rollout['terminated'],
      rollout['truncated'], gamma=agent_config.gamma,
      lam=agent_config.gae_lambda, final_values=final_values,
      proper_time_limits=agent_config.proper_time_limits)
  action = rollout['action']
  if model.discrete:
    action = (action - np.int64(np.min(action_low))).astype(np.int64)
  steps = {
      'observation': observation, 'action': action,
      'log_prob': rollout['log_prob'].astype(np.float32),
      'advantage': advantages, 'return': returns,
      'value': values.astype(np.float32),
  }
  if model.recurrent:  # [N, T, ...]: each copy's sequence whole.
    batch = {key: np.swapaxes(value, 0, 1) for key, value in steps.items()}
    batch['episode_start'] = np.swapaxes(rollout['episode_start'], 0, 1)
    batch['initial_state'] = rollout['initial_state']
    return batch
  return {key: value.reshape((t_steps * n,) + value.shape[2:])
          for key, value in steps.items()}


def load_demonstrations(config: OnPolicyConfig, specs: envs.EnvSpecs
                        ) -> tuple[np.ndarray, np.ndarray]:
  """The expert pairs of `config.gail_dataset`, checked against the env.

  Raises:
    ValueError: a discrete env, or pairs of other sizes than the env's.
  """
  if specs.discrete:
    raise ValueError(f'GAIL here takes continuous actions; {specs.env_id} '
                     'has discrete ones')
  observations, actions = gail.expert_pairs(
      datasets.load(config.gail_dataset),
      num_trajectories=config.gail_trajectories,
      subsample=config.gail_subsample, seed=config.seed)
  want = (specs.observation_shape[0], int(np.prod(specs.action_spec.shape)))
  got = (observations.shape[1], actions.shape[1])
  if got != want:
    raise ValueError(f'gail_dataset {config.gail_dataset}: observations and '
                     f'actions of sizes {got}, {specs.env_id} has {want}')
  return observations, actions


class GailRewards:
  """Replaces a rollout's rewards with the discriminator's (the seed's
  GAIL loop), training the discriminator on the rollout first.

  Expert observations are normalised with the policy's statistics of the
  moment, as the rollout's are; the policy's actions are given to the
  discriminator as the env took them (clipped to the bounds), since the
  expert's are within them too. From update `gail_warmup_updates` on (the
  seed's `j >= 10`) the observation statistics freeze: that update's
  rollout was the last to move them.
  """

  def __init__(self, expert_observations: np.ndarray,
               expert_actions: np.ndarray, norm: normalization.Normalization,
               config: OnPolicyConfig, agent_config: ppo.PpoConfig,
               specs: envs.EnvSpecs):
    self._expert_observations = expert_observations
    self._expert_actions = expert_actions
    self._norm, self._config, self._gamma = norm, config, agent_config.gamma
    self._low, self._high = specs.action_low, specs.action_high
    # Adam at 1e-3: torch's default, which the seed's discriminator uses.
    self.discriminator = gail.Discriminator(
        expert_observations.shape[1], expert_actions.shape[1],
        learning_rate=1e-3, seed=config.seed)
    self.reward_scale = gail.RewardNormalizer(agent_config.num_envs)
    self._reseed(0)
    # The checkpoint's mirror of the reward scale's statistics.
    self.variables = tf.Module()
    self.variables.discriminator = self.discriminator
    self.variables.ret_stats = tf.Variable(np.zeros(3), dtype=tf.float64)

  def _reseed(self, update_index: int) -> None:
    # A resumed run draws other minibatches than the updates it replaces.
    self._rng = np.random.default_rng(
        (self._config.seed + 7) * 1_000_003 + update_index)

  def save(self) -> None:
    stats = self.reward_scale.returns
    self.variables.ret_stats.assign([stats.mean, stats.var, stats.count])

  def load(self, update_index: int) -> None:
    """After a restore: `update_index` is the next update's."""
    mean, var, count = self.variables.ret_stats.numpy()
    stats = self.reward_scale.returns
    if count > 0:
      stats.mean, stats.var, stats.count = mean, var, count
    self._norm.update_observations = (
        update_index <= self._config.gail_warmup_updates)
    self._reseed(update_index)

  def __call__(self, rollout: dict, update_index: int
               ) -> tuple[np.ndarray, dict[str, float]]:
    config = self._config
    t_steps, n = rollout['reward'].shape
    policy_obs = rollout['observation'].reshape(t_steps * n, -1)
    policy_actions = np.clip(rollout['action'], self._low,
                             self._high).reshape(t_steps * n, -1)
    expert_obs = self._norm.observation(self._expert_observations)
    batch = min(config.gail_batch_size, len(expert_obs), len(policy_obs))
    steps = min(len(expert_obs) // batch, len(policy_obs) // batch)
    totals, count = {}, 0
    for _ in range(gail.warmup_epochs(
        update_index, warmup_updates=config.gail_warmup_updates,
        warmup_epochs=config.gail_warmup_epochs, epochs=config.gail_epochs)):
      expert_order = self._rng.permutation(len(expert_obs))
      policy_order = self._rng.permutation(len(policy_obs))
      for k in range(steps):
        e = expert_order[k * batch:(k + 1) * batch]
        p = policy_order[k * batch:(k + 1) * batch]
        parts = self.discriminator.train_step(
            expert_obs[e], self._expert_actions[e], policy_obs[p],
            policy_actions[p])
        totals = {key: totals.get(key, 0.0) + value
                  for key, value in parts.items()}
        count += 1
    raw = self.discriminator.reward(policy_obs, policy_actions).reshape(
        t_steps, n)
    ended = rollout['terminated'] | rollout['truncated']
    scaled = self.reward_scale(raw, ended, self._gamma)
    if update_index >= config.gail_warmup_updates:
      self._norm.update_observations = False
    expert_reward = float(np.mean(self.discriminator.reward(
        expert_obs, self._expert_actions)))
    means = {key: value / count for key, value in totals.items()}
    return scaled, {**means, 'policy_reward': float(raw.mean()),
                    'expert_reward': expert_reward}


class OnPolicyPhase:
  """One rollout: collect, pass through the queue, update, log."""

  def __init__(self, this_run: run.Run,
               collector: vector_rollouts.VectorRollouts | None,
               updater: ppo.Updater, client, table: str, *,
               agent_config: ppo.PpoConfig, total_env_steps: int, seed: int,
               rng: np.random.Generator, bar=None,
               imitation: GailRewards | None = None):
    self._run, self._collector, self._updater = this_run, collector, updater
    self._imitation = imitation
    self._client, self._table = client, table
    self._config, self._total = agent_config, total_env_steps
    self._seed, self._rng, self._bar = seed, rng, bar
    self.last_metrics: dict[str, float] = {}
    # A recurrent actor's state, carried across rollouts (reset where an
    # episode starts: the first step after a (re)start is one).
    self._state = np.zeros(
        (agent_config.num_envs, agent_config.recurrent_size), np.float32)
    # A CNN acts through its own graph (the numpy policy still evaluates
    # and exports); an MLP's numpy forward is the faster one.
    model = updater.model
    self._sample = (model.sampler(this_run.policy.action_low)
                    if isinstance(model, actor_critic.CnnActorCritic)
                    else None)

  def _act_recurrent(self, observations: np.ndarray, starts: np.ndarray):
    actions, log_probs, self._state = self._run.policy.sample(
        observations, self._state, starts, self._rng)
    return actions, log_probs

  def rollout(self, env_steps: int) -> tuple[dict, list[float], list[int]]:
    """Collects a rollout, passes it through the queue and takes it back:
    (the rollout, returns and lengths of the episodes that ended in it)."""
    policy = self._run.policy
    number = env_steps // self._config.rollout_size
    if self._run.agent.recurrent:
      initial_state = self._state
      rollout, returns, lengths = self._collector.collect(self._act_recurrent)
      rollout['initial_state'] = initial_state
    else:
      sample = self._sample or policy.sample
      rollout, returns, lengths = self._collector.collect(
          lambda obs, starts: sample(obs, self._rng))
    rollout['rollout'] = np.int64(number)
    rollout_queue.write(self._client, self._table, rollout,
                        address=self._client.server_address)
    taken = rollout_queue.read(self._client, self._table, tuple(rollout),
                               address=self._client.server_address)
    if int(taken['rollout']) != number:
      raise RuntimeError(f'the rollout queue handed out rollout '
                         f'{int(taken["rollout"])}, expected {number}')
    return taken, returns, lengths

  def __call__(self, env_steps: int) -> None:
    learner = self._run.learner
    taken, returns, lengths = self.rollout(env_steps)
    number = env_steps // self._config.rollout_size
    if self._imitation is not None:
      taken['reward'], gail_metrics = self._imitation(taken, number)
      learner.write_scalars(gail_metrics, env_steps, 'gail')
    batch = learner_batch(self._run.agent, taken, self._config,
                          action_low=self._run.specs.action_low)
    progress_left = max(1.0 - env_steps / self._total, 1e-8)
    metrics = self._updater(batch, progress_left,
                            seed=self._seed * 1_000_003 + number)
    metrics['explained_variance'] = ppo.explained_variance(
        batch['value'], batch['return'])
    metrics['learning_rate'] = float(
        self._updater.optimizer.learning_rate.numpy())
    self.last_metrics = metrics
    learner.env_steps.assign_add(int(np.prod(taken['reward'].shape)))
    after = int(learner.env_steps.numpy())
    learner.write_scalars(metrics, after, 'train')
    self._run.sync()
    self.updated(taken)
    if returns:
      learner.write_scalars({'return': float(np.mean(returns)),
                             'episode_length': float(np.mean(lengths))},
                            after, 'collect')
      if self._bar is not None:
        self._bar.set_postfix(ret=f'{np.mean(returns):.0f}',
                              loss=f'{metrics["loss"]:.3g}', refresh=False)


  def updated(self, taken: dict) -> None:
    """After each update (actor processes: publish)."""


class RemoteOnPolicyPhase(OnPolicyPhase):
  """One rollout of an actor process: wait for it in the queue, take its
  statistics in, update, publish the new weights and statistics."""

  def __init__(self, *args, norm: normalization.Normalization,
               publish_info: dict, actor_wait_s: float, **kwargs):
    super().__init__(*args, **kwargs)
    self._norm, self._publish_info = norm, publish_info
    self._fields = (*vector_rollouts.FIELDS, *rollout_actor.EXTRA_FIELDS,
                    *(rollout_actor.ADDED_PREFIX + key
                      for key in normalization.STATE_KEYS))
    self._wait = distributed.ActorWait(actor_wait_s, self._bar,
                                       'rollout', poll_s=_POLL_S)

  def publish(self) -> None:
    learner = self._run.learner
    rollout_actor.publish(
        self._client, self._run.policy, self._norm.state(),
        int(learner.env_steps.numpy()) // self._config.rollout_size,
        {'env_steps': int(learner.env_steps.numpy()), **self._publish_info})

  def rollout(self, env_steps: int) -> tuple[dict, list[float], list[int]]:
    address = self._client.server_address
    while tables.get_table_info(self._client, self._table).current_size == 0:
      self._wait.wait(env_steps, self._run.learner.train_step)
    taken = rollout_queue.read(self._client, self._table, self._fields,
                               address=address)
    self._wait.arrived()
    want = (self._config.rollout_steps, self._config.num_envs)
    if taken['reward'].shape != want:
      raise ValueError(f'actor {int(taken["actor"])} sent a rollout of '
                       f'{taken["reward"].shape} (steps, copies); the '
                       f'learner takes {want}')
    self._norm.merge(rollout_actor.added_statistics(taken))
    update = env_steps // self._config.rollout_size
    self._run.learner.write_scalars(
        {'policy_lag': float(update - int(taken['policy_version']))},
        env_steps, 'train')
    return (taken, [float(r) for r in taken['episode_returns']],
            [int(n) for n in taken['episode_lengths']])

  def updated(self, taken: dict) -> None:
    del taken
    self.publish()


def make_actor_tables(*, max_rollouts: int = 64) -> list[Any]:
  """The tables of a server for PPO / A2C actor processes
  (pipelines.serve --env ENV --rollouts): the rollout queue they write
  (actors keep it short themselves: `max_unread_rollouts`) and the
  weights table the learner publishes into."""
  return [rollout_queue.make_table(rollout_actor.ROLLOUT_TABLE,
                                   max_rollouts=max_rollouts),
          variables.make_table()]


def make_actor(agent: str, config: rollout_actor.RolloutActorConfig,
               client: Any) -> rollout_actor.RolloutActor:
  """An actor process (pipelines.act --agent ppo/a2c/acktr) for the learner
  that `OnPolicyBuilder` makes with num_actors 0: its statistics are the
  learner's `Normalization` for the published settings."""
  registry.get(agent).check_mode(registry.ONPOLICY)
  specs = envs.env_specs(config.env)
  check_env(specs)
  if specs.image:
    raise ValueError(f'{config.env}: on-policy actor processes do not run '
                     'image envs yet; train with num_actors 1')

  def make_statistics(info):
    return normalization.Normalization(
        specs.observation_shape, int(info['num_envs']),
        gamma=float(info['gamma']),
        observation_clip=float(info['observation_clip']),
        reward_clip=float(info['reward_clip']))

  return rollout_actor.RolloutActor(
      config, client, make_statistics=make_statistics,
      head='categorical' if specs.discrete else 'gaussian',
      observation_size=specs.observation_shape[0])


def train_onpolicy(config: OnPolicyConfig, *, show_progress: bool = True,
                   on_eval: Callable[[dict], None] | None = None,
                   on_update: Callable[[dict], None] | None = None) -> dict:
  """Trains PPO or A2C in `config.env`; resumes from root_dir.

  Returns:
    The last evaluation record.

  Raises:
    resume.ResumeMismatchError: root_dir holds a run of other settings.
    ValueError: a bad config, or an env the agents cannot act in.
    run.TrainingError: training failed (an op error, a non-finite loss).
  """
  return runner.run_experiment(OnPolicyBuilder(
      config, on_eval=on_eval, on_update=on_update,
      show_progress=show_progress))


class OnPolicyBuilder:
  """PPO / A2C (+ GAIL): rollouts through a queue table, each read once."""

  def __init__(self, config: OnPolicyConfig, *,
               on_eval: Callable[[dict], None] | None = None,
               on_update: Callable[[dict], None] | None = None,
               show_progress: bool = True):
    self.config, self._on_eval, self._on_update = config, on_eval, on_update
    self._show_progress = show_progress
    self._collector = None

  @property
  def remote_actors(self) -> bool:
    return self.config.num_actors == 0

  def check(self, specs: envs.EnvSpecs) -> OnPolicyConfig:
    config = self.config
    check(config)
    self._specs = specs
    self._agent_config = agent_settings(config, specs)
    check_env(specs, self._agent_config)
    if self.remote_actors:
      not_remote = [what for what, on in (
          ('a recurrent policy', self._agent_config.recurrent),
          ('GAIL', bool(config.gail_dataset)),
          ('image envs', specs.image)) if on]
      if not config.reverb_address:
        raise ValueError('num_actors 0 learns from actor processes: give '
                         'the reverb_address of their server '
                         '(pipelines.serve --env ENV --rollouts)')
      if not_remote:
        raise ValueError(f'actor processes do not run {" or ".join(not_remote)}'
                         ' yet: train it with num_actors 1')
    elif config.reverb_address:
      raise ValueError('reverb_address is for num_actors 0 (the server of '
                       'the actor processes); an on-policy run with '
                       'num_actors 1 starts its own queue')
    return config

  def prepare(self) -> None:
    # Demonstrations are read and checked before training writes anything.
    self._demonstrations = (load_demonstrations(self.config, self._specs)
                            if self.config.gail_dataset else None)

  def servers(self) -> list:
    if self.remote_actors:
      return []  # The actors' server (pipelines.serve --rollouts) holds it.
    return [([rollout_queue.make_table(ROLLOUT_TABLE)], None)]

  def make_learner(self, servers) -> loop.Learner:
    config, agent_config = self.config, self._agent_config
    if self.remote_actors:
      self._client = tables.connect(config.reverb_address)
      rollout_queue.check_queue(self._client, ROLLOUT_TABLE)
      variables.check_table(self._client)
    else:
      self._client = servers[0].localhost_client()
    model = make_model(self._specs, agent_config)
    self._norm = normalization.Normalization(
        self._specs.observation_shape, agent_config.num_envs,
        gamma=agent_config.gamma,
        observation_clip=agent_config.observation_clip,
        reward_clip=agent_config.reward_clip)
    self._updater = ppo.Updater(model, agent_config)
    self._updater.build()
    self._imitation = None if self._demonstrations is None else GailRewards(
        *self._demonstrations, self._norm, config, agent_config, self._specs)
    extra_state = ({} if self._imitation is None
                   else {'gail': self._imitation.variables})
    learner = loop.Learner(model, config.root_dir,
                           optimizer=self._updater.optimizer,
                           normalization=self._norm.variables, **extra_state)
    self._title = (f'{config.agent}{" + GAIL" if self._imitation else ""} '
                   f'{config.env}, {agent_config.num_envs} env(s), seed '
                   f'{config.seed}')
    learner.set_curve(x='env_steps', title=self._title)
    return learner

  def train(self, learner: loop.Learner, resumed: bool,
            run_dir: resume.RunDirectory) -> dict:
    show_progress = self._show_progress
    config, agent_config = self.config, self._agent_config
    norm, imitation = self._norm, self._imitation
    start = int(learner.env_steps.numpy())
    if resumed:
      norm.load()
      if imitation is not None:
        imitation.load(start // agent_config.rollout_size)

    def write_back() -> None:
      norm.save()
      if imitation is not None:
        imitation.save()

    # A resumed run reseeds from its step count.
    if not self.remote_actors:
      self._collector = vector_rollouts.VectorRollouts(
          config.env, num_envs=agent_config.num_envs,
          rollout_steps=agent_config.rollout_steps,
          seed=config.seed * 1_000_003 + start,
          observe=norm.observation, scale_reward=norm.reward,
          frame_stack=self._specs.frame_stack)

    def statistics():
      stats = norm.statistics()
      return None if stats is None else (*stats, norm.observation_clip)

    # Image frame stacks go to the network as they are (uint8).
    view = None if self._specs.image else norm.observation
    this_run = run.Run(learner, config.agent, self._specs, config.root_dir,
                       write_back=write_back, view=view,
                       export_statistics=statistics, seed=config.seed)
    run_dir.start()
    rng = np.random.default_rng(config.seed * 1_000_003 + start)
    with run.progress(config.env_steps, start, 'env step',
                      f'{config.agent} {config.env}', show_progress) as bar:
      if resumed:
        bar.write(f'resumed at {start} env steps, {learner.train_step} '
                  'gradient steps', file=sys.stderr)
      phase_args = dict(agent_config=agent_config,
                        total_env_steps=config.env_steps, seed=config.seed,
                        rng=rng, bar=bar, imitation=imitation)
      if self.remote_actors:
        phase = RemoteOnPolicyPhase(
            this_run, None, self._updater, self._client, ROLLOUT_TABLE,
            norm=norm, publish_info={
                'num_envs': agent_config.num_envs,
                'rollout_steps': agent_config.rollout_steps,
                'gamma': agent_config.gamma,
                'observation_clip': agent_config.observation_clip,
                'reward_clip': agent_config.reward_clip},
            actor_wait_s=config.actor_wait_s, **phase_args)
        phase.publish()  # Actors wait for the first weights.
      else:
        phase = OnPolicyPhase(this_run, self._collector, self._updater,
                              self._client, ROLLOUT_TABLE, **phase_args)

      def update_done(position):
        if self._on_update is not None:
          self._on_update({'env_steps': position, **phase.last_metrics})

      def evaluate(_):
        this_run.evaluate(config.eval_episodes, config.seed, x='env_steps',
                          title=self._title, metric='average_return',
                          bar=bar, on_eval=self._on_eval)

      run.run_phases(
          lambda: int(learner.env_steps.numpy()), config.env_steps, phase,
          [run.Every(1, update_done, at_end=False),
           run.Every(config.eval_interval, evaluate),
           run.Every(config.checkpoint_interval, this_run.checkpoint)], bar,
          what='on-policy training', unit='env step')
    this_run.export('policy.npz', env_steps=config.env_steps)
    return this_run.final_record()

  def close(self) -> None:
    if self._collector is not None:
      self._collector.close()
      self._collector = None
