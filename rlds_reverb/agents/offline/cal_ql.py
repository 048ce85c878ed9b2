"""Cal-QL (Nakamoto et al. 2023, "Cal-QL: Calibrated Offline RL
Pre-Training for Efficient Online Fine-Tuning") as a TF-Agents agent.

CQL pushes down Q on actions the data did not take, which makes its offline
Q-values too small; when fine-tuning starts, the first online returns look
good against them, the policy chases them, and the score dips. Cal-QL keeps
CQL's loss but never pushes the policy's Q below the Monte-Carlo return of
the behaviour policy from that state (`calibrated`), so the dip goes.

Losses (per critic i, batch of (s, a, r, s', G) with G the return-to-go,
`feeds.ReturnToGoFeed`):
  TD:   (Q_i(s, a) - (r + gamma * d * min_j Q'_j(s', a'~pi)))^2
  CQL:  alpha * (temp * logsumexp over [Q_i(s, a_rand) - log U,
                 max(Q_i(s, a_pi(s)), G) - log pi, max(Q_i(s, a_pi(s')), G)
                 - log pi] / temp - Q_i(s, a))
  actor and temperature as SAC.
Settings: CORL's CQL halfcheetah-medium-v2 config (n_actions 10, importance
sampling, temperature 1, min-Q weight 10, policy LR 3e-5, Q LR 3e-4, 3x256
networks, automatic entropy tuning, no entropy in the backup) with the
Cal-QL bound of CORL's `algorithms/finetune/cal_ql.py`; fine-tuning batches
are half offline, half online (its mixing_ratio 0.5). Differences: the
bound stays on while fine-tuning, with the returns-to-go of the online
episodes (CORL switches calibration off at the switch and stores 0 for
online transitions); the critics step before the actor reads them (CORL
computes all losses from the pre-update networks); CORL's orthogonal
initialisation and CQL's Lagrange variant are not reproduced.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gin
import tensorflow as tf
from tf_agents.agents import tf_agent

from rlds_reverb.agents.offline import ensemble
from rlds_reverb.agents.offline import offline_agent


@gin.configurable
@dataclasses.dataclass
class CalQlConfig:
  """Cal-QL's own settings (CORL's CQL halfcheetah-medium-v2 values)."""
  cql_alpha: float = 10.0
  """Weight of the CQL term (CORL's cql_min_q_weight)."""
  num_actions: int = 10
  """Actions sampled per state for each of the three CQL sets."""
  temperature: float = 1.0
  """Temperature of the CQL logsumexp."""
  calibrated: bool = True
  """Bound the policy's Q from below by the return-to-go (False: CQL)."""


def calibrated_q(q_policy: tf.Tensor, mc_return: tf.Tensor) -> tf.Tensor:
  """max(Q(s, a_pi), G(s)): Cal-QL's lower bound, per sampled action."""
  return tf.maximum(q_policy, mc_return[:, None])


class CalQlAgent(offline_agent.OfflineAgent):
  """SAC with the calibrated CQL regulariser on both critics."""

  def __init__(self, time_step_spec: Any, action_spec: Any, *,
               actor_layers, critic_layers, actor_learning_rate: float,
               critic_learning_rate: float, alpha_learning_rate: float,
               gamma: float, target_update_tau: float,
               reward_scale_factor: float = 1.0,
               config: CalQlConfig | None = None, seed: int | None = None,
               critic_dtype: str = 'float32',
               train_step_counter: tf.Variable | None = None):
    self.config = config or CalQlConfig()
    observation_spec = time_step_spec.observation
    actor = offline_agent.squashed_gaussian_actor(
        observation_spec, action_spec, actor_layers)
    self._critic_network = ensemble.EnsembleMlp(
        (observation_spec, action_spec), 2, critic_layers, seed=seed,
        hidden_dtype_name=critic_dtype, name='CriticNetwork')
    self._target_critic_network = ensemble.EnsembleMlp(
        (observation_spec, action_spec), 2, critic_layers,
        hidden_dtype_name=critic_dtype, name='TargetCriticNetwork')
    super().__init__(time_step_spec, action_spec, actor, gamma=gamma,
                     target_update_tau=target_update_tau,
                     reward_scale_factor=reward_scale_factor,
                     train_step_counter=train_step_counter)
    self.copy_weights(self._critic_network, self._target_critic_network)
    self._log_alpha = tf.Variable(0.0, name='log_alpha')
    self._target_entropy = -float(action_spec.shape.num_elements())
    self._actor_optimizer = self.make_optimizer(
        actor_learning_rate, self._actor_network.trainable_variables)
    self._critic_optimizer = self.make_optimizer(
        critic_learning_rate, self._critic_network.trainable_variables)
    self._alpha_optimizer = self.make_optimizer(alpha_learning_rate,
                                                [self._log_alpha])
    self._rng = tf.random.Generator.from_seed(0 if seed is None else seed)

  def _seed(self) -> tf.Tensor:
    """A stateless seed from the agent's checkpointed generator."""
    return tf.cast(self._rng.make_seeds(1)[:, 0], tf.int32)

  def _sample(self, observation: tf.Tensor, count: int
              ) -> tuple[tf.Tensor, tf.Tensor]:
    """`count` policy actions per state, [B, count, A], and log-probs."""
    repeated = tf.repeat(observation, count, axis=0)
    distribution = self.action_distribution(repeated)
    action = distribution.sample(seed=self._seed())
    log_prob = distribution.log_prob(action)
    batch = tf.shape(observation)[0]
    return (tf.reshape(action, [batch, count, -1]),
            tf.reshape(log_prob, [batch, count]))

  def _q_many(self, network: Any, observation: tf.Tensor,
              actions: tf.Tensor) -> tf.Tensor:
    """Q of [B, K, A] actions: [B, K, members]."""
    batch, count = tf.shape(actions)[0], tf.shape(actions)[1]
    q, _ = network((tf.repeat(observation, count, axis=0),
                    tf.reshape(actions, [batch * count, -1])))
    return tf.reshape(q, [batch, count, -1])

  def cql_term(self, observation: tf.Tensor, next_observation: tf.Tensor,
               q_data: tf.Tensor, mc_return: tf.Tensor | None
               ) -> tuple[tf.Tensor, tf.Tensor]:
    """CQL's logsumexp gap per critic [B, members], and the share of
    policy Q-values the bound lifted."""
    n = self.config.num_actions
    low = tf.cast(self.action_spec.minimum, tf.float32)
    high = tf.cast(self.action_spec.maximum, tf.float32)
    batch = tf.shape(observation)[0]
    size = self.action_spec.shape.num_elements()
    random_actions = self._rng.uniform([batch, n, size]) * (high - low) + low
    current, current_log_prob = self._sample(observation, n)
    following, following_log_prob = self._sample(next_observation, n)
    current = tf.stop_gradient(current)
    following = tf.stop_gradient(following)
    q_random = self._q_many(self._critic_network, observation, random_actions)
    q_current = self._q_many(self._critic_network, observation, current)
    q_following = self._q_many(self._critic_network, observation, following)
    lifted = tf.constant(0.0)
    if self.config.calibrated and mc_return is not None:
      bound = mc_return[:, None, None]
      lifted = tf.reduce_mean(tf.cast(
          tf.concat([q_current, q_following], 1) < bound, tf.float32))
      q_current = tf.maximum(q_current, bound)
      q_following = tf.maximum(q_following, bound)
    # Log density of the uniform over the action box.
    log_uniform = -tf.reduce_sum(tf.math.log(high - low) * tf.ones([size]))
    stacked = tf.concat([
        q_random - log_uniform,
        q_current - tf.stop_gradient(current_log_prob)[..., None],
        q_following - tf.stop_gradient(following_log_prob)[..., None]],
                        axis=1)
    temp = self.config.temperature
    ood = tf.reduce_logsumexp(stacked / temp, axis=1) * temp
    return ood - q_data, lifted

  def _train(self, experience, weights=None, mc_return=None):
    batch = self.transition(experience)
    if self.config.calibrated and mc_return is None:
      raise ValueError('calibrated Cal-QL needs each transition\'s return-to-'
                       'go (mc_return; feeds.ReturnToGoFeed gives it); for '
                       'plain CQL set CalQlConfig.calibrated = False')
    if mc_return is not None:
      mc_return = tf.cast(mc_return, tf.float32)
    alpha = tf.exp(self._log_alpha)
    next_action, next_log_prob = self._sample(batch.next_observation, 1)
    next_q = tf.reduce_min(self._q_many(
        self._target_critic_network, batch.next_observation,
        next_action)[:, 0], axis=-1)
    target = self.td_target(batch, next_q)
    critic_variables = self._critic_network.trainable_variables
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(critic_variables)
      q_data, _ = self._critic_network((batch.observation, batch.action),
                                       training=True)
      errors = tf.square(q_data - target[:, None])
      gap, lifted = self.cql_term(batch.observation, batch.next_observation,
                                  q_data, mc_return)
      td_loss = tf.reduce_sum(tf.stack(
          [self.weighted_mean(errors[:, i], weights) for i in range(2)]))
      cql_loss = self.config.cql_alpha * tf.reduce_sum(
          tf.reduce_mean(gap, axis=0))
      critic_loss = td_loss + cql_loss
    self.apply(tape, critic_loss, critic_variables, self._critic_optimizer)

    actor_variables = self._actor_network.trainable_variables
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(actor_variables)
      distribution = self.action_distribution(batch.observation)
      action = distribution.sample(seed=self._seed())
      log_prob = distribution.log_prob(action)
      q_pi = tf.reduce_min(
          self._critic_network((batch.observation, action))[0], axis=-1)
      actor_loss = tf.reduce_mean(alpha * log_prob - q_pi)
    self.apply(tape, actor_loss, actor_variables, self._actor_optimizer)

    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch([self._log_alpha])
      alpha_loss = -tf.reduce_mean(self._log_alpha * tf.stop_gradient(
          log_prob + self._target_entropy))
    self.apply(tape, alpha_loss, [self._log_alpha], self._alpha_optimizer)
    self.soft_update(self._critic_network, self._target_critic_network)
    self.train_step_counter.assign_add(1)
    self.summarize(critic_loss=critic_loss, td_loss=td_loss,
                   cql_loss=cql_loss, actor_loss=actor_loss,
                   alpha=alpha, calql_lifted=lifted)
    return tf_agent.LossInfo(
        loss=critic_loss + actor_loss + alpha_loss,
        extra=offline_agent.loss_extra(
            'CalQlLossInfo', td_loss=td_loss, cql_loss=cql_loss,
            actor_loss=actor_loss, alpha_loss=alpha_loss, alpha=alpha,
            lifted=lifted,
            td_error=tf.reduce_mean(tf.abs(q_data - target[:, None]),
                                    axis=-1)))


def make_cal_ql(time_step_spec: Any, action_spec: Any, agent_config: Any,
                train_step: tf.Variable,
                method_config: CalQlConfig | None = None) -> CalQlAgent:
  agent = CalQlAgent(
      time_step_spec, action_spec, actor_layers=agent_config.actor_layers,
      critic_layers=agent_config.critic_layers,
      actor_learning_rate=agent_config.actor_learning_rate,
      critic_learning_rate=agent_config.critic_learning_rate,
      alpha_learning_rate=agent_config.alpha_learning_rate,
      gamma=agent_config.gamma,
      target_update_tau=agent_config.target_update_tau,
      reward_scale_factor=agent_config.reward_scale_factor,
      config=method_config or CalQlConfig(), seed=agent_config.seed,
      critic_dtype=agent_config.critic_dtype, train_step_counter=train_step)
  agent.initialize()
  return agent

