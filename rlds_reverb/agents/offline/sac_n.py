"""SAC-N and EDAC (An et al. 2021, "Uncertainty-Based Offline Reinforcement
Learning with Diversified Q-Ensemble", arXiv:2110.01548) as one TF-Agents
agent.

SAC-N is SAC with N critics whose minimum is the target and the actor's
objective; with enough critics the minimum is pessimistic enough for
offline data. EDAC adds a term that spreads the critics' gradients with
respect to the data action (`diversity_loss`), so fewer critics suffice;
here EDAC is `SacNAgent` with `eta > 0`.

Settings follow CORL (tinkoff-ai/CORL, algorithms/offline/sac_n.py and
edac.py, and their configs/offline/{sac_n,edac}/halfcheetah/*.yaml): N=10
critics of 3x256 relu with every hidden bias 0.1 and the output layer drawn
from U(-3e-3, 3e-3), a 3x256 actor, gamma 0.99, tau 0.005, Adam 3e-4 for
actor, critics and temperature, a learned temperature (log alpha from 0,
target entropy -action_dim), batch 256, and EDAC's eta 1.0 on
halfcheetah-medium (5.0 on medium-expert). Each step updates, as CORL does
(the EDAC paper's order), the temperature, then the actor, then the critics,
then the target critics.

What differs from CORL:
  * The actor is TF-Agents' `ActorDistributionNetwork` with a
    `TanhNormalProjectionNetwork` head (one Dense layer giving mean and log
    std; the numpy export's 'tanh_normal' head reads it). CORL's actor has
    separate mean and log-std layers drawn from U(-1e-3, 1e-3) and hidden
    biases of 0.1; `SacNConfig.edac_actor_init` re-draws our actor that way
    (`edac_actor_init`), else it keeps TF-Agents' initialisers (variance
    scaling kernels, zero biases). The log std is clipped to [-5, 2] as
    CORL does; the numpy export's `sample` does not clip (its `greedy`,
    tanh of the mean, is exact either way).
  * The temperature loss uses the same sampled actions as the actor loss
    (CORL samples the actor once more for it).
  * Prioritized-replay weights scale the critics' squared errors only; the
    diversity, actor and temperature losses are unweighted (CORL has no
    prioritized replay).
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

# EDAC's eta when none is bound: CORL's halfcheetah-medium-v2 value.
EDAC_ETA = 1.0
# Critic initialisation of the EDAC paper, as CORL's VectorizedCritic.
CRITIC_HIDDEN_BIAS = 0.1
CRITIC_LAST_LAYER_BOUND = 3e-3
# CORL's (the EDAC paper's) clip of the actor's log std.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
# Added to the gradient norms before dividing (CORL's 1e-10).
_NORM_EPSILON = 1e-10


@gin.configurable
@dataclasses.dataclass
class SacNConfig:
  """What SAC-N and EDAC add to `factory.AgentConfig`.

  Bind from gin as `SacNConfig.<field>`.
  """
  num_critics: int = 10
  """Number of critics N (CORL's halfcheetah configs: 10 for SAC-N and
  EDAC)."""
  eta: Optional[float] = None
  """Weight of EDAC's gradient-diversity term. None: 0 for make_sac_n (no
  term), EDAC_ETA (1.0, CORL's halfcheetah-medium) for make_edac."""
  edac_actor_init: bool = False
  """Start the actor as the EDAC paper and CORL do (`edac_actor_init`)
  instead of with TF-Agents' initialisers."""


# The EDAC paper's actor initialisation, as CORL's edac.py sets it.
ACTOR_HIDDEN_BIAS = 0.1
ACTOR_HEAD_BOUND = 1e-3


def edac_actor_init(actor: Any, seed: Optional[int] = None) -> None:
  """Re-draws a `squashed_gaussian_actor`'s weights as CORL's EDAC actor
  starts: hidden kernels from PyTorch's Linear default U(+-1/sqrt(fan_in)),
  hidden biases ACTOR_HIDDEN_BIAS, and the mean and log-std head (kernel and
  bias) from U(+-ACTOR_HEAD_BOUND), so the first policy is close to
  tanh(N(0, 1)) in every state rather than a random function of it.

  Raises:
    ValueError: the actor has no 'projection_layer' (not that actor).
  """
  variables = actor.variables
  if not any('projection_layer' in v.name for v in variables):
    raise ValueError('edac_actor_init needs the squashed Gaussian actor '
                     '(a TanhNormalProjectionNetwork projection_layer)')
  for i, variable in enumerate(variables):
    shape = variable.shape
    layer_seed = None if seed is None else seed * 1013 + i
    if 'projection_layer' in variable.name:
      bound = ACTOR_HEAD_BOUND
    elif 'bias' in variable.name:
      variable.assign(tf.fill(shape, ACTOR_HIDDEN_BIAS))
      continue
    else:
      bound = 1.0 / float(shape[0]) ** 0.5
    variable.assign(tf.keras.initializers.RandomUniform(
        -bound, bound, seed=layer_seed)(shape, variable.dtype))


def _clipped_std(log_std: tf.Tensor) -> tf.Tensor:
  return tf.exp(tf.clip_by_value(log_std, LOG_STD_MIN, LOG_STD_MAX))


def _member_values(critic: ensemble.EnsembleMlp, observation: Any,
                   member_actions: tf.Tensor) -> tf.Tensor:
  """Q_i(s, a_i) for member-specific action copies a_i: [N, B].

  `EnsembleMlp.call` feeds one input to every member; here member i gets
  its own copy of the actions, so one backward pass gives each member's
  gradient with respect to its copy (CORL feeds [N, B, in] inputs the same
  way). The layers are those of `EnsembleMlp.call`; tests/test_sac_n.py
  checks the gradients against finite differences of the public call.
  """
  # pylint: disable=protected-access
  n = critic.num_members
  states = tf.tile(critic.flatten(observation)[None], [n, 1, 1])
  return critic.members(tf.concat([states, member_actions], axis=-1))


def diversity_loss(critic: ensemble.EnsembleMlp, observation: Any,
                   action: tf.Tensor, eta: float) -> tf.Tensor:
  """EDAC's ensemble-gradient diversity term.

  With g_i = dQ_i(s, a)/da at the data action and u_i = g_i / (|g_i| +
  1e-10), the term is

      eta / (N - 1) * mean over the batch of sum_{i != j} <u_i, u_j>,

  differentiable in the critic's weights (second order). N identical
  members give eta * N (every ordered pair has cosine 1); members whose
  gradients are orthogonal give 0.

  Args:
    critic: the ensemble, N >= 2 members on (observation, action).
    observation: [B, ...] observations (a nest, as the critic takes).
    action: [B, action_dim] data actions.
    eta: the term's weight.

  Returns:
    The scalar term.

  Raises:
    ValueError: the critic has fewer than 2 members.
  """
  n = critic.num_members
  if n < 2:
    raise ValueError(f'diversity_loss needs >= 2 critics, got {n}')
  action = tf.cast(action, tf.float32)
  member_actions = tf.tile(action[None], [n, 1, 1])  # [N, B, A]
  with tf.GradientTape(watch_accessed_variables=False) as tape:
    tape.watch(member_actions)
    q_sum = tf.reduce_sum(_member_values(critic, observation,
                                         member_actions))
  # Members are independent, so d(sum Q)/d(copy i) is member i's gradient.
  gradients = tape.gradient(q_sum, member_actions)
  # sqrt has an infinite derivative at 0; a zero gradient (every unit dead)
  # would make the second-order gradient NaN. The floor changes no value
  # that the 1e-10 does not already swamp.
  norms = tf.sqrt(tf.maximum(
      tf.reduce_sum(tf.square(gradients), axis=-1, keepdims=True), 1e-24))
  unit = gradients / (norms + _NORM_EPSILON)
  # sum_{i != j} <u_i, u_j> = |sum_i u_i|^2 - sum_i |u_i|^2.
  pairs = (tf.reduce_sum(tf.square(tf.reduce_sum(unit, axis=0)), axis=-1) -
           tf.reduce_sum(tf.square(unit), axis=[0, 2]))  # [B]
  return eta / (n - 1) * tf.reduce_mean(pairs)


class SacNAgent(offline_agent.OfflineAgent):
  """SAC-N, and EDAC when `eta > 0`, trained from [B, 2] trajectories."""

  def __init__(self, time_step_spec: Any, action_spec: Any, *,
               actor_network: Any, critic_network: ensemble.EnsembleMlp,
               target_critic_network: ensemble.EnsembleMlp,
               actor_optimizer: Any, critic_optimizer: Any,
               alpha_optimizer: Any, eta: float = 0.0,
               gamma: float = 0.99, target_update_tau: float = 0.005,
               reward_scale_factor: float = 1.0,
               seed: Optional[int] = None,
               train_step_counter: Optional[tf.Variable] = None,
               name: str = 'SacNAgent'):
    """The target critic starts as a copy of the critic.

    Raises:
      ValueError: `eta` is negative, or positive with fewer than 2 critics,
        or the two critics differ in size.
    """
    if eta < 0:
      raise ValueError(f'eta must be >= 0, got {eta}')
    if eta > 0 and critic_network.num_members < 2:
      raise ValueError(f'eta > 0 (EDAC) needs >= 2 critics, got '
                       f'{critic_network.num_members}')
    if target_critic_network.num_members != critic_network.num_members:
      raise ValueError(
          f'target critic has {target_critic_network.num_members} members, '
          f'the critic {critic_network.num_members}')
    super().__init__(time_step_spec, action_spec, actor_network,
                     gamma=gamma, target_update_tau=target_update_tau,
                     reward_scale_factor=reward_scale_factor,
                     train_step_counter=train_step_counter, name=name)
    critic_network.create_variables()
    target_critic_network.create_variables()
    self.copy_weights(critic_network, target_critic_network)
    self._critic_network = critic_network
    self._target_critic_network = target_critic_network
    self._actor_optimizer = actor_optimizer
    self._critic_optimizer = critic_optimizer
    self._alpha_optimizer = alpha_optimizer
    self._log_alpha = tf.Variable(0.0, dtype=tf.float32, name='log_alpha')
    self._target_entropy = -float(action_spec.shape.num_elements())
    self._eta = float(eta)
    self._seed_stream = tfp.util.SeedStream(seed, salt='SacNAgent')

  @property
  def critic_network(self) -> ensemble.EnsembleMlp:
    """The N critics (Q_i(s, a): [B, N]), for probes of their estimates."""
    return self._critic_network

  def _sample(self, observation: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """a ~ pi(.|s) (reparameterised) and log pi(a|s), [B, A] and [B]."""
    distribution = self.action_distribution(observation)
    action = distribution.sample(seed=self._seed_stream())
    # The tanh bijector caches the pre-tanh sample, so this log-prob does
    # not invert tanh (unstable at the bounds).
    return action, distribution.log_prob(action)

  def _train(self, experience: Any, weights: Optional[tf.Tensor] = None
             ) -> tf_agent.LossInfo:
    batch = self.transition(experience)
    actor_variables = self._actor_network.trainable_variables
    critic_variables = self._critic_network.trainable_variables

    # Temperature, then actor (one sample serves both), then critics.
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(actor_variables)
      action, log_pi = self._sample(batch.observation)
    with tf.GradientTape() as alpha_tape:
      alpha_loss = -self._log_alpha * tf.stop_gradient(
          tf.reduce_mean(log_pi) + self._target_entropy)
    self.apply(alpha_tape, alpha_loss, [self._log_alpha],
               self._alpha_optimizer)
    alpha = tf.exp(self._log_alpha)

    with tape:
      q_pi, _ = self._critic_network((batch.observation, action))
      actor_loss = tf.reduce_mean(
          tf.stop_gradient(alpha) * log_pi - tf.reduce_min(q_pi, axis=1))
    self.apply(tape, actor_loss, actor_variables, self._actor_optimizer)

    next_action, next_log_pi = self._sample(batch.next_observation)
    next_q, _ = self._target_critic_network(
        (batch.next_observation, next_action))
    target = self.td_target(
        batch, tf.reduce_min(next_q, axis=1) - alpha * next_log_pi)
    with tf.GradientTape(watch_accessed_variables=False) as tape:
      tape.watch(critic_variables)
      q, _ = self._critic_network((batch.observation, batch.action))
      errors = q - target[:, None]  # [B, N]
      critic_loss = self.weighted_mean(
          tf.reduce_sum(tf.square(errors), axis=1), weights)
      diversity = (diversity_loss(self._critic_network, batch.observation,
                                  batch.action, self._eta)
                   if self._eta > 0 else tf.constant(0.0))
      loss = critic_loss + diversity
    self.apply(tape, loss, critic_variables, self._critic_optimizer)
    self.soft_update(self._critic_network, self._target_critic_network)
    self.train_step_counter.assign_add(1)

    self.summarize(critic_loss=critic_loss, diversity_loss=diversity,
                   actor_loss=actor_loss, alpha_loss=alpha_loss, alpha=alpha)
    total = critic_loss + diversity + actor_loss + alpha_loss
    return tf_agent.LossInfo(
        loss=total,
        extra=offline_agent.loss_extra(
            'SacNLossInfo', critic_loss=critic_loss,
            diversity_loss=diversity, actor_loss=actor_loss,
            alpha_loss=alpha_loss, alpha=alpha,
            td_error=tf.reduce_mean(tf.abs(errors), axis=1)))


def _make(time_step_spec: Any, action_spec: Any,
          agent_config: Any, train_step: Optional[tf.Variable],
          num_critics: int, eta: float, name: str,
          actor_init: bool = False) -> SacNAgent:
  if num_critics < 1:
    raise ValueError(f'num_critics must be >= 1, got {num_critics}')
  obs_spec = time_step_spec.observation
  seed = agent_config.seed

  def critic(network_name):
    return ensemble.EnsembleMlp(
        (obs_spec, action_spec), num_critics, agent_config.critic_layers,
        hidden_bias=CRITIC_HIDDEN_BIAS,
        last_layer_bound=CRITIC_LAST_LAYER_BOUND, seed=seed,
        hidden_dtype_name=agent_config.critic_dtype, name=network_name)

  actor = offline_agent.squashed_gaussian_actor(
      obs_spec, action_spec, agent_config.actor_layers,
      std_transform=_clipped_std)
  critic_network = critic('CriticEnsemble')
  actor.create_variables(obs_spec)
  if actor_init:
    edac_actor_init(actor, seed)
  critic_network.create_variables()
  adam = offline_agent.OfflineAgent.make_optimizer
  agent = SacNAgent(
      time_step_spec, action_spec, actor_network=actor,
      critic_network=critic_network,
      target_critic_network=critic('TargetCriticEnsemble'),
      actor_optimizer=adam(agent_config.actor_learning_rate,
                           actor.trainable_variables),
      critic_optimizer=adam(agent_config.critic_learning_rate,
                            critic_network.trainable_variables),
      # log alpha is made by the agent; its one slot pair on first use.
      alpha_optimizer=adam(agent_config.alpha_learning_rate, []),
      eta=eta, gamma=agent_config.gamma,
      target_update_tau=agent_config.target_update_tau,
      reward_scale_factor=agent_config.reward_scale_factor,
      seed=seed,
      train_step_counter=(train_step if train_step is not None else
                          tf.Variable(0, dtype=tf.int64, name='train_step')),
      name=name)
  agent.initialize()
  return agent


def make_sac_n(time_step_spec: Any, action_spec: Any, agent_config: Any,
               train_step: Optional[tf.Variable] = None,
               method_config: Optional[SacNConfig] = None) -> SacNAgent:
  """SAC-N: N critics, no diversity term, from a resolved `agent_config`
  (`registry.make_agent` resolves it).

  Raises:
    ValueError: `method_config.eta` is set and not 0 (that is EDAC:
      make_edac), or `method_config.num_critics` < 1.
  """
  config = method_config if method_config is not None else SacNConfig()
  if config.eta:
    raise ValueError(f'SAC-N has no diversity term, got eta={config.eta}; '
                     'build EDAC with make_edac')
  return _make(time_step_spec, action_spec, agent_config, train_step,
               config.num_critics, 0.0, 'SacNAgent',
               config.edac_actor_init)


def make_edac(time_step_spec: Any, action_spec: Any, agent_config: Any,
              train_step: Optional[tf.Variable] = None,
              method_config: Optional[SacNConfig] = None) -> SacNAgent:
  """EDAC: SAC-N plus the diversity term (eta unset: EDAC_ETA), from a
  resolved `agent_config` (`registry.make_agent` resolves it).

  Raises:
    ValueError: `method_config.eta` <= 0, or `method_config.num_critics`
      < 2.
  """
  config = method_config if method_config is not None else SacNConfig()
  eta = config.eta if config.eta is not None else EDAC_ETA
  if eta <= 0:
    raise ValueError(f'EDAC needs eta > 0, got {eta}; eta 0 is SAC-N '
                     '(make_sac_n)')
  if config.num_critics < 2:
    raise ValueError(f'EDAC needs num_critics >= 2, got '
                     f'{config.num_critics}')
  return _make(time_step_spec, action_spec, agent_config, train_step,
               config.num_critics, eta, 'EdacAgent',
               config.edac_actor_init)
