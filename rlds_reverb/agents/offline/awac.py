"""Advantage-Weighted Actor-Critic as a TF-Agents agent.

AWAC (Nair, Gupta, Dalal & Levine 2020, "AWAC: Accelerating Online
Reinforcement Learning with Offline Datasets") fits twin critics by TD
to the policy's own next actions, and trains the actor to clone the data
actions with weights exp(A / lambda), A = Q(s, a) - Q(s, a~pi): a
supervised actor update that stays near the data without a behaviour
model.

Settings follow CORL's `algorithms/offline/awac.py` (tinkoff-ai/CORL) and
its D4RL configs: lambda 1/3 (the configs' awac_lambda 0.3333; the script's
own default is 1.0), weights clipped at 100, Adam 3e-4 for actor and
critics, target critics by Polyak averaging (tau 0.005), gamma 0.99. As in
CORL, the critics' loss is the sum of the two MSEs, the critics step first
and the actor's advantages read the updated critics, and both the data and
the sampled action are valued by the min of the twin critics.

The actor (`AwacConfig.actor`) is by default TF-Agents' tanh-squashed
Gaussian with a state-dependent std ('squashed': the SAC actor, greedy
tanh(mean), the numpy head 'tanh_normal'), which every published AWAC row
here used; 'gaussian' is CORL's, an unsquashed Gaussian with a
state-independent std whose samples and greedy action (the mean) are
clipped to the bounds (the numpy head 'gaussian'). Layer widths come from `factory.AgentConfig` (3x256 by default, as CORL's
AWAC networks). Data actions are pulled just inside the bounds before
their log-likelihood is taken. PER importance weights, when given, weight
the critic loss.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import gin
import tensorflow as tf
import tensorflow_probability as tfp
from tf_agents.agents import tf_agent

from rlds_reverb.agents.offline import ensemble
from rlds_reverb.agents.offline import offline_agent


@gin.configurable
@dataclasses.dataclass
class AwacConfig:
  """AWAC's own settings (CORL's D4RL values); the shared ones (rates,
  layers, gamma, tau, seed) come from `factory.AgentConfig`."""
  awac_lambda: float = 1.0 / 3.0
  """Temperature lambda of the weights exp(A / lambda): small follows Q,
  large clones the data (CORL's D4RL configs: 0.3333)."""
  max_exp_weight: float = 100.0
  """Upper clip of exp(A / lambda) (CORL's exp_adv_max), so a few large
  advantages cannot dominate the actor's batch."""
  actor: str = 'squashed'
  """'squashed': TF-Agents' SAC actor; 'gaussian': CORL's unsquashed
  Gaussian with a state-independent std (`offline_agent.ACTORS`)."""


class AwacAgent(offline_agent.OfflineAgent):
  """AWAC: twin TD critics on pi's next actions, advantage-weighted actor."""

  def __init__(self, time_step_spec: Any, action_spec: Any, *,
               actor_network: Any, q_network: ensemble.EnsembleMlp,
               actor_optimizer: Any, q_optimizer: Any, config: AwacConfig,
               gamma: float, target_update_tau: float,
               reward_scale_factor: float = 1.0,
               train_step_counter: Optional[tf.Variable] = None,
               seed: Optional[int] = None, name: str = 'AwacAgent'):
    super().__init__(time_step_spec, action_spec, actor_network,
                     gamma=gamma, target_update_tau=target_update_tau,
                     reward_scale_factor=reward_scale_factor,
                     train_step_counter=train_step_counter, name=name)
    self._config = config
    self._q_network = q_network
    self._target_q_network = self.target_of(q_network, 'TargetQNetwork')
    self._actor_optimizer = actor_optimizer
    self._q_optimizer = q_optimizer
    # One op seed per sampling op, fixed at trace time (as CQL-SAC).
    self._action_seed_stream = tfp.util.SeedStream(seed=seed,
                                                   salt='awac_actions')

  def _sample(self, observation: Any) -> tf.Tensor:
    """Actions drawn from pi(s), in the bounds, held constant."""
    return tf.stop_gradient(self.clip_to_bounds(
        self.action_distribution(observation).sample(
            seed=self._action_seed_stream())))

  def _train(self, experience: Any,
             weights: Optional[tf.Tensor] = None) -> tf_agent.LossInfo:
    batch = self.transition(experience)
    observation, action = batch.observation, batch.action
    config = self._config

    next_action = self._sample(batch.next_observation)
    next_q = tf.reduce_min(
        self._target_q_network((batch.next_observation, next_action))[0],
        axis=-1)
    td_target = self.td_target(batch, next_q)
    q_variables = self._q_network.trainable_variables
    with tf.GradientTape(watch_accessed_variables=False) as q_tape:
      q_tape.watch(q_variables)
      q_values, _ = self._q_network((observation, action))  # [B, 2]
      errors = td_target[:, None] - q_values
      critic_loss = self.weighted_mean(
          tf.reduce_sum(tf.square(errors), axis=-1), weights)
    self.apply(q_tape, critic_loss, q_variables, self._q_optimizer)

    # The advantages read the critics just updated (CORL's order).
    policy_action = self._sample(observation)
    data_q = tf.reduce_min(self._q_network((observation, action))[0],
                           axis=-1)
    policy_q = tf.reduce_min(
        self._q_network((observation, policy_action))[0], axis=-1)
    advantage = tf.stop_gradient(data_q - policy_q)
    advantage_weight = tf.minimum(tf.exp(advantage / config.awac_lambda),
                                  config.max_exp_weight)
    actor_variables = self._actor_network.trainable_variables
    with tf.GradientTape(watch_accessed_variables=False) as actor_tape:
      actor_tape.watch(actor_variables)
      actor_loss = self.weighted_log_likelihood_loss(
          observation, action, advantage_weight)
    self.apply(actor_tape, actor_loss, actor_variables,
               self._actor_optimizer)
    self.soft_update(self._q_network, self._target_q_network)
    self.train_step_counter.assign_add(1)

    total = critic_loss + actor_loss
    self.summarize(critic_loss=critic_loss, actor_loss=actor_loss,
                   mean_advantage_weight=tf.reduce_mean(advantage_weight))
    return tf_agent.LossInfo(
        loss=total,
        extra=offline_agent.loss_extra(
            'AwacLossInfo', critic_loss=critic_loss, actor_loss=actor_loss,
            td_error=tf.reduce_mean(tf.abs(errors), axis=-1)))


def make_awac(time_step_spec: Any, action_spec: Any, agent_config: Any,
              train_step: Optional[tf.Variable] = None,
              method_config: Optional[AwacConfig] = None) -> AwacAgent:
  """Builds an `AwacAgent` from an `factory.AgentConfig` whose rates, layers,
  gamma, tau and seed are resolved (`registry.make_agent` resolves it);
  `method_config` defaults to `AwacConfig()`."""
  config = method_config if method_config is not None else AwacConfig()
  train_step = (train_step if train_step is not None
                else tf.Variable(0, dtype=tf.int64, name='train_step'))
  obs_spec = time_step_spec.observation
  actor = offline_agent.make_actor(config.actor, obs_spec, action_spec,
                                   agent_config.actor_layers, tanh_mean=False)
  q_network = ensemble.EnsembleMlp(
      (obs_spec, action_spec), 2, agent_config.critic_layers,
      seed=agent_config.seed, hidden_dtype_name=agent_config.critic_dtype,
      name='QNetwork')
  actor.create_variables(obs_spec)
  q_network.create_variables()
  adam = offline_agent.OfflineAgent.make_optimizer
  reward_scale = getattr(agent_config, 'reward_scale_factor', None)
  agent = AwacAgent(
      time_step_spec, action_spec, actor_network=actor, q_network=q_network,
      actor_optimizer=adam(agent_config.actor_learning_rate,
                           actor.trainable_variables),
      q_optimizer=adam(agent_config.critic_learning_rate,
                       q_network.trainable_variables), config=config,
      gamma=agent_config.gamma,
      target_update_tau=agent_config.target_update_tau,
      reward_scale_factor=1.0 if reward_scale is None else reward_scale,
      train_step_counter=train_step, seed=agent_config.seed)
  agent.initialize()
  return agent
