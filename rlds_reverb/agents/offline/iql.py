"""Implicit Q-Learning as a TF-Agents agent.

IQL (Kostrikov, Nair & Levine 2021, "Offline Reinforcement Learning with
Implicit Q-Learning") never queries Q at actions outside the data: V(s)
is fitted by expectile regression to the target critic's Q(s, a) at data
actions, Q(s, a) regresses to r + gamma V(s'), and the actor is cloned
from the data with weights exp(beta (Q - V)) (advantage-weighted
regression).

Settings follow CORL's `algorithms/offline/iql.py` (tinkoff-ai/CORL), its
D4RL MuJoCo configs: expectile 0.7, beta 3.0, weights clipped at 100, twin
Q and V of 2x256, target Q by Polyak averaging (tau 0.005), gamma 0.99,
Adam 3e-4 everywhere with the actor's rate on a cosine decay to zero over
the training run. As in CORL, each step fits V and Q and the actor from
the same (pre-update) V, and the twin critics' loss is their mean MSE.

The actor (`IqlConfig.actor`) is by default TF-Agents' tanh-squashed
Gaussian with a state-dependent std ('squashed': the SAC actor, the numpy
head 'tanh_normal'), which every published IQL row here used; 'gaussian'
is CORL's, a Gaussian with a tanh mean and a state-independent std (the
numpy head 'tanh_mean_gaussian'). The greedy action is tanh(mean) in
both. Data actions are pulled just inside the bounds before their
log-likelihood is taken, where a squashed density is finite. PER
importance weights, when given, weight the V and Q losses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import gin
import tensorflow as tf
from tf_agents.agents import tf_agent

from rlds_reverb.agents.offline import ensemble
from rlds_reverb.agents.offline import offline_agent

# The offline phase length when the config does not give one (CORL's
# max_timesteps), for the actor's cosine schedule.
_DEFAULT_TRAIN_STEPS = 1_000_000


class PeriodicCosine(tf.keras.optimizers.schedules.LearningRateSchedule):
  """lr0 * (1 + cos(pi * step / period)) / 2, not clamped at `period`.

  PyTorch's CosineAnnealingLR, which CORL's IQL uses over the offline
  phase: past it (fine-tuning) the rate rises again rather than staying
  at zero, as Keras' CosineDecay would leave the actor frozen.
  """

  def __init__(self, initial_learning_rate: float, period: int):
    self.initial_learning_rate = float(initial_learning_rate)
    self.period = int(period)

  def __call__(self, step):
    phase = tf.cast(step, tf.float32) / float(self.period)
    return self.initial_learning_rate * 0.5 * (
        1.0 + tf.cos(tf.constant(3.141592653589793) * phase))

  def get_config(self) -> dict:
    return {'initial_learning_rate': self.initial_learning_rate,
            'period': self.period}


@gin.configurable
@dataclasses.dataclass
class IqlConfig:
  """IQL's own settings (CORL's D4RL MuJoCo values); the shared ones (rates,
  layers, gamma, tau, seed) come from `factory.AgentConfig`."""
  expectile: float = 0.7
  """Expectile of V's regression on target Q (CORL's iql_tau): above 0.5, V
  tracks the upper part of Q over the data actions."""
  temperature: float = 3.0
  """Inverse temperature beta of the advantage weights exp(beta * A)
  (CORL's beta): small clones the data, large follows Q."""
  max_exp_advantage: float = 100.0
  """Upper clip of exp(beta * A) (CORL's EXP_ADV_MAX), so a few large
  advantages cannot dominate the actor's batch."""
  actor: str = 'squashed'
  """'squashed': TF-Agents' SAC actor; 'gaussian': CORL's tanh-mean
  Gaussian with a state-independent std (`offline_agent.ACTORS`)."""


def expectile_loss(diff: tf.Tensor, expectile: float,
                   weights: Optional[tf.Tensor] = None) -> tf.Tensor:
  """mean(|expectile - 1(diff < 0)| * diff^2): an asymmetric squared loss
  whose minimiser over V is the `expectile` expectile of V + diff.

  `weights` (PER importance weights, [B]) weight the mean.
  """
  diff = tf.convert_to_tensor(diff, tf.float32)
  scale = tf.abs(expectile - tf.cast(diff < 0.0, diff.dtype))
  return offline_agent.OfflineAgent.weighted_mean(scale * tf.square(diff),
                                                  weights)


class IqlAgent(offline_agent.OfflineAgent):
  """IQL: expectile V, TD-fitted twin Q, advantage-weighted actor."""

  def __init__(self, time_step_spec: Any, action_spec: Any, *,
               actor_network: Any, q_network: ensemble.EnsembleMlp,
               value_network: ensemble.EnsembleMlp, actor_optimizer: Any,
               q_optimizer: Any, value_optimizer: Any, config: IqlConfig,
               gamma: float, target_update_tau: float,
               reward_scale_factor: float = 1.0,
               train_step_counter: Optional[tf.Variable] = None,
               name: str = 'IqlAgent'):
    super().__init__(time_step_spec, action_spec, actor_network,
                     gamma=gamma, target_update_tau=target_update_tau,
                     reward_scale_factor=reward_scale_factor,
                     train_step_counter=train_step_counter, name=name)
    self._config = config
    self._q_network = q_network
    self._target_q_network = self.target_of(q_network, 'TargetQNetwork')
    self._value_network = value_network
    self._actor_optimizer = actor_optimizer
    self._q_optimizer = q_optimizer
    self._value_optimizer = value_optimizer

  def _train(self, experience: Any,
             weights: Optional[tf.Tensor] = None) -> tf_agent.LossInfo:
    batch = self.transition(experience)
    observation, action = batch.observation, batch.action
    config = self._config

    # Everything below reads the networks before any of them is updated
    # (V, Q and the actor all see this step's V, as in CORL).
    target_q = tf.stop_gradient(tf.reduce_min(
        self._target_q_network((observation, action))[0], axis=-1))
    next_v, _ = self._value_network(batch.next_observation)
    td_target = self.td_target(batch, next_v[:, 0])

    value_variables = self._value_network.trainable_variables
    with tf.GradientTape(watch_accessed_variables=False) as value_tape:
      value_tape.watch(value_variables)
      value = self._value_network(observation)[0][:, 0]
      value_loss = expectile_loss(target_q - value, config.expectile,
                                  weights)

    q_variables = self._q_network.trainable_variables
    with tf.GradientTape(watch_accessed_variables=False) as q_tape:
      q_tape.watch(q_variables)
      q_values, _ = self._q_network((observation, action))  # [B, 2]
      errors = td_target[:, None] - q_values
      critic_loss = self.weighted_mean(
          tf.reduce_mean(tf.square(errors), axis=-1), weights)

    advantage = tf.stop_gradient(target_q - value)
    advantage_weight = tf.minimum(tf.exp(config.temperature * advantage),
                                  config.max_exp_advantage)
    actor_variables = self._actor_network.trainable_variables
    with tf.GradientTape(watch_accessed_variables=False) as actor_tape:
      actor_tape.watch(actor_variables)
      actor_loss = self.weighted_log_likelihood_loss(
          observation, action, advantage_weight)

    self.apply(value_tape, value_loss, value_variables,
               self._value_optimizer)
    self.apply(q_tape, critic_loss, q_variables, self._q_optimizer)
    self.apply(actor_tape, actor_loss, actor_variables,
               self._actor_optimizer)
    self.soft_update(self._q_network, self._target_q_network)
    self.train_step_counter.assign_add(1)

    total = value_loss + critic_loss + actor_loss
    self.summarize(value_loss=value_loss, critic_loss=critic_loss,
                   actor_loss=actor_loss,
                   mean_advantage_weight=tf.reduce_mean(advantage_weight))
    return tf_agent.LossInfo(
        loss=total,
        extra=offline_agent.loss_extra(
            'IqlLossInfo', value_loss=value_loss, critic_loss=critic_loss,
            actor_loss=actor_loss,
            td_error=tf.reduce_mean(tf.abs(errors), axis=-1)))


def make_iql(time_step_spec: Any, action_spec: Any, agent_config: Any,
             train_step: Optional[tf.Variable] = None,
             method_config: Optional[IqlConfig] = None) -> IqlAgent:
  """Builds an `IqlAgent` from an `factory.AgentConfig` whose rates, layers,
  gamma, tau and seed are resolved (`registry.make_agent` resolves it);
  `method_config` defaults to `IqlConfig()`."""
  config = method_config if method_config is not None else IqlConfig()
  train_step = (train_step if train_step is not None
                else tf.Variable(0, dtype=tf.int64, name='train_step'))
  obs_spec = time_step_spec.observation
  seed = agent_config.seed
  actor = offline_agent.make_actor(config.actor, obs_spec, action_spec,
                                   agent_config.actor_layers, tanh_mean=True)
  q_network = ensemble.EnsembleMlp(
      (obs_spec, action_spec), 2, agent_config.critic_layers, seed=seed,
      hidden_dtype_name=agent_config.critic_dtype, name='QNetwork')
  # Its own seed, so V does not start from Q's first-layer draw.
  value_network = ensemble.EnsembleMlp(
      obs_spec, 1, agent_config.critic_layers,
      seed=None if seed is None else seed + 1,
      hidden_dtype_name=agent_config.critic_dtype, name='ValueNetwork')
  actor.create_variables(obs_spec)
  for network in (q_network, value_network):
    network.create_variables()
  train_steps = getattr(agent_config, 'train_steps', None)
  actor_schedule = PeriodicCosine(
      agent_config.actor_learning_rate,
      int(train_steps or _DEFAULT_TRAIN_STEPS))
  adam = offline_agent.OfflineAgent.make_optimizer
  reward_scale = getattr(agent_config, 'reward_scale_factor', None)
  agent = IqlAgent(
      time_step_spec, action_spec, actor_network=actor, q_network=q_network,
      value_network=value_network,
      actor_optimizer=adam(actor_schedule, actor.trainable_variables),
      q_optimizer=adam(agent_config.critic_learning_rate,
                       q_network.trainable_variables),
      value_optimizer=adam(agent_config.critic_learning_rate,
                           value_network.trainable_variables),
      config=config, gamma=agent_config.gamma,
      target_update_tau=agent_config.target_update_tau,
      reward_scale_factor=1.0 if reward_scale is None else reward_scale,
      train_step_counter=train_step)
  agent.initialize()
  return agent
