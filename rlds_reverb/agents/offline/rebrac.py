"""ReBRAC (Tarasov et al. 2023, "Revisiting the Minimalist Approach to
Offline RL") as a TF-Agents agent.

TD3+BC with the design choices that the paper shows matter: a BC penalty in
the actor (beta_1 * |pi(s) - a|^2, Q normalised by its mean magnitude) and in
the critic target (beta_2 * |a'_pi - a'|^2 subtracted from the next Q, a'
the dataset's next action), LayerNorm in the critics, deeper networks (3x256),
batch 1024 and learning rates 1e-3. Settings and per-dataset coefficients
follow CORL's configs/offline/rebrac/<env>/<dataset>.yaml; ours are in
configs/rebrac_halfcheetah_*.gin.

What differs: the dataset's next action comes from step 1 of each [B, 2]
item; where an episode was cut by its time limit that step is the final
observation's zero action (one transition in 1,000 on D4RL's MuJoCo data),
so the critic's BC penalty there compares with zero. Terminal steps do not
bootstrap, so they are unaffected. n-step returns are refused (the next
action would belong to another step).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gin
import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.agents.ddpg import actor_network as ddpg_actor_network

from rlds_reverb.agents.offline import ensemble
from rlds_reverb.agents.offline import offline_agent


@gin.configurable
@dataclasses.dataclass
class RebracConfig:
  """ReBRAC's own settings (CORL's halfcheetah-medium-v2 values)."""
  actor_bc_coef: float = 0.001
  """beta_1: weight of |pi(s) - a|^2 in the actor loss."""
  critic_bc_coef: float = 0.01
  """beta_2: weight of |a'_pi - a'|^2 subtracted from the next Q."""
  critic_layer_norm: bool = True
  """LayerNorm after each hidden layer of the critics."""
  normalize_q: bool = True
  """Divide the actor's Q term by mean |Q| (held constant), as TD3+BC."""
  policy_noise: float = 0.2
  """Std of the target policy smoothing noise."""
  noise_clip: float = 0.5
  """Clip of that noise."""
  actor_update_period: int = 2
  """Critic steps per actor (and target) update."""


def bc_penalty(actions: tf.Tensor, data_actions: tf.Tensor) -> tf.Tensor:
  """Squared distance to the data's action, summed over action dims: [B]."""
  return tf.reduce_sum(tf.square(actions - data_actions), axis=-1)


class RebracAgent(offline_agent.OfflineAgent):
  """TD3 with actor and critic BC penalties and LayerNorm critics."""

  def __init__(self, time_step_spec: Any, action_spec: Any, *,
               actor_layers, critic_layers, actor_learning_rate: float,
               critic_learning_rate: float, gamma: float,
               target_update_tau: float, reward_scale_factor: float = 1.0,
               config: RebracConfig | None = None, seed: int | None = None,
               critic_dtype: str = 'float32',
               train_step_counter: tf.Variable | None = None):
    self.config = config or RebracConfig()
    observation_spec = time_step_spec.observation
    actor = ddpg_actor_network.ActorNetwork(
        observation_spec, action_spec, fc_layer_params=tuple(actor_layers),
        name='ActorNetwork')
    self._target_actor_network = ddpg_actor_network.ActorNetwork(
        observation_spec, action_spec, fc_layer_params=tuple(actor_layers),
        name='TargetActorNetwork')
    critic_kwargs = dict(layer_norm=self.config.critic_layer_norm,
                         hidden_bias=0.1, last_layer_bound=3e-3,
                         hidden_dtype_name=critic_dtype)
    self._critic_network = ensemble.EnsembleMlp(
        (observation_spec, action_spec), 2, critic_layers, seed=seed,
        name='CriticNetwork', **critic_kwargs)
    self._target_critic_network = ensemble.EnsembleMlp(
        (observation_spec, action_spec), 2, critic_layers,
        name='TargetCriticNetwork', **critic_kwargs)
    super().__init__(time_step_spec, action_spec, actor, gamma=gamma,
                     target_update_tau=target_update_tau,
                     reward_scale_factor=reward_scale_factor,
                     train_step_counter=train_step_counter)
    self._target_actor_network.create_variables(observation_spec)
    self._critic_network.create_variables()
    self._target_critic_network.create_variables()
    self.copy_weights(self._actor_network, self._target_actor_network)
    self.copy_weights(self._critic_network, self._target_critic_network)
    self._actor_optimizer = self.make_optimizer(
        actor_learning_rate, self._actor_network.trainable_variables)
    self._critic_optimizer = self.make_optimizer(
        critic_learning_rate, self._critic_network.trainable_variables)
    self._seed_stream = tf.random.Generator.from_seed(
        0 if seed is None else seed)

  def critic_target(self, batch: offline_agent.Transition,
                    next_data_action: tf.Tensor) -> tf.Tensor:
    """r + gamma * d * (min Q'(s', a'_pi) - beta_2 * |a'_pi - a'|^2)."""
    low = tf.cast(self.action_spec.minimum, tf.float32)
    high = tf.cast(self.action_spec.maximum, tf.float32)
    next_action, _ = self._target_actor_network(batch.next_observation)
    noise = tf.clip_by_value(
        self._seed_stream.normal(tf.shape(next_action)) *
        self.config.policy_noise, -self.config.noise_clip,
        self.config.noise_clip)
    next_action = tf.clip_by_value(next_action + noise, low, high)
    next_q = tf.reduce_min(self._target_critic_network(
        (batch.next_observation, next_action))[0], axis=-1)
    next_q -= self.config.critic_bc_coef * bc_penalty(next_action,
                                                      next_data_action)
    return self.td_target(batch, next_q)

  def actor_loss(self, observation: tf.Tensor, data_action: tf.Tensor
                 ) -> tuple[tf.Tensor, tf.Tensor]:
    """beta_1 * BC - lambda * Q; returns (loss, the mean BC term)."""
    action, _ = self._actor_network(observation, training=True)
    q = tf.reduce_min(self._critic_network((observation, action))[0],
                      axis=-1)
    scale = (tf.stop_gradient(1.0 / (tf.reduce_mean(tf.abs(q)) + 1e-6))
             if self.config.normalize_q else 1.0)
    bc = bc_penalty(action, data_action)
    loss = tf.reduce_mean(self.config.actor_bc_coef * bc - scale * q)
    return loss, tf.reduce_mean(bc)

  def _train(self, experience, weights=None):
    batch = self.transition(experience)
    next_data_action = tf.cast(experience.action[:, 1], tf.float32)
    target = self.critic_target(batch, next_data_action)
    critic_variables = self._critic_network.trainable_variables
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(critic_variables)
      q = self._critic_network((batch.observation, batch.action),
                               training=True)[0]
      errors = tf.square(q - target[:, None])
      critic_loss = tf.reduce_sum(tf.stack(
          [self.weighted_mean(errors[:, i], weights)
           for i in range(q.shape[-1])]))
    self.apply(tape, critic_loss, critic_variables, self._critic_optimizer)

    def update_actor():
      actor_variables = self._actor_network.trainable_variables
      with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(actor_variables)
        loss, bc = self.actor_loss(batch.observation, batch.action)
      self.apply(tape, loss, actor_variables, self._actor_optimizer)
      self.soft_update(self._actor_network, self._target_actor_network)
      self.soft_update(self._critic_network, self._target_critic_network)
      return loss, bc

    update = tf.equal(
        self.train_step_counter % self.config.actor_update_period, 0)
    actor_loss, actor_bc = tf.cond(
        update, update_actor, lambda: (tf.constant(0.0), tf.constant(0.0)))
    self.train_step_counter.assign_add(1)
    self.summarize(critic_loss=critic_loss, actor_loss=actor_loss,
                   actor_bc=actor_bc)
    td_error = tf.reduce_mean(tf.abs(q - target[:, None]), axis=-1)
    return tf_agent.LossInfo(
        loss=critic_loss + actor_loss,
        extra=offline_agent.loss_extra(
            'RebracLossInfo', critic_loss=critic_loss, actor_loss=actor_loss,
            actor_bc=actor_bc, td_error=td_error))


def make_rebrac(time_step_spec: Any, action_spec: Any, agent_config: Any,
                train_step: tf.Variable,
                method_config: RebracConfig | None = None) -> RebracAgent:
  agent = RebracAgent(
      time_step_spec, action_spec, actor_layers=agent_config.actor_layers,
      critic_layers=agent_config.critic_layers,
      actor_learning_rate=agent_config.actor_learning_rate,
      critic_learning_rate=agent_config.critic_learning_rate,
      gamma=agent_config.gamma,
      target_update_tau=agent_config.target_update_tau,
      reward_scale_factor=agent_config.reward_scale_factor,
      config=method_config or RebracConfig(), seed=agent_config.seed,
      critic_dtype=agent_config.critic_dtype, train_step_counter=train_step)
  agent.initialize()
  return agent
