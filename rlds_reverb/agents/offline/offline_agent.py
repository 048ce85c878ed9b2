"""What the offline actor-critic agents (IQL, AWAC, ReBRAC, SAC-N, EDAC,
Cal-QL) share, as a TF-Agents `TFAgent`.

TF-Agents has none of these methods; written as `TFAgent`s they take the
same [B, 2] trajectories as its SAC and TD3 (so the run loop, prioritized
replay, checkpoints and the numpy export work unchanged), report their TD
errors in `LossInfo.extra.td_error`, and keep their actor under
`_actor_network` (exported with the head `HEAD` names).
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable, Optional, Sequence

import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.agents.sac import tanh_normal_projection_network
from tf_agents.networks import actor_distribution_network
from tf_agents.networks import normal_projection_network
from tf_agents.policies import actor_policy
from tf_agents.trajectories import trajectory

# The pieces of a transition batch every loss reads.
Transition = collections.namedtuple(
    'Transition', ['observation', 'action', 'reward', 'discount',
                   'next_observation'])

# Squashed-Gaussian log-probs of data actions on the bounds are -inf: data
# actions are pulled this far inside the bounds first (CORL clips the same).
_ACTION_EPSILON = 1e-4

# The actors an advantage-weighted learner (IQL, AWAC) can clone into:
# 'squashed' is TF-Agents' SAC actor, 'gaussian' CORL's (and the methods'
# papers') unsquashed Gaussian with a state-independent std.
ACTORS = ('squashed', 'gaussian')

# CORL's clamp of the Gaussian actors' log std.
LOG_STD_BOUNDS = (-20.0, 2.0)


def squashed_gaussian_actor(observation_spec: Any, action_spec: Any,
                            layers: Sequence[int],
                            std_transform: Optional[Callable] = None
                            ) -> actor_distribution_network.ActorDistributionNetwork:
  """TF-Agents' SAC actor (tanh-squashed Gaussian, state-dependent std),
  the actor every stochastic learner here shares so that the numpy
  export's 'tanh_normal' head serves them all."""
  projection = tanh_normal_projection_network.TanhNormalProjectionNetwork
  if std_transform is not None:
    projection = functools.partial(projection, std_transform=std_transform)
  return actor_distribution_network.ActorDistributionNetwork(
      observation_spec, action_spec, fc_layer_params=tuple(layers),
      continuous_projection_net=projection)


def clipped_exp(log_std: tf.Tensor) -> tf.Tensor:
  """exp(log_std) with log_std clamped to LOG_STD_BOUNDS, as CORL clamps
  its Gaussian actors' (a module function: the network is checkpointed)."""
  return tf.exp(tf.clip_by_value(log_std, *LOG_STD_BOUNDS))


def gaussian_actor(observation_spec: Any, action_spec: Any,
                   layers: Sequence[int], *, tanh_mean: bool
                   ) -> actor_distribution_network.ActorDistributionNetwork:
  """CORL's actor for advantage-weighted regression: a Gaussian, not
  squashed, with one learnt log std per action dimension (not per state).

  Its log-likelihood of a data action has no tanh Jacobian term, which
  for a squashed actor grows without bound near the bounds; whether that
  matters to a run is not shown (on hopper-medium-expert both actors
  collapse). `tanh_mean` maps the mean into the bounds (IQL's actor);
  without it the mean is free and the policy clips its actions (AWAC's).
  """
  def projection(spec):
    return normal_projection_network.NormalProjectionNetwork(
        spec, mean_transform=(normal_projection_network.tanh_squash_to_spec
                              if tanh_mean else None),
        std_transform=clipped_exp, state_dependent_std=False,
        std_bias_initializer_value=0.0)
  return actor_distribution_network.ActorDistributionNetwork(
      observation_spec, action_spec, fc_layer_params=tuple(layers),
      continuous_projection_net=projection)


def make_actor(kind: str, observation_spec: Any, action_spec: Any,
               layers: Sequence[int], *, tanh_mean: bool
               ) -> actor_distribution_network.ActorDistributionNetwork:
  """The actor `kind` (one of ACTORS) of an advantage-weighted learner."""
  if kind == 'squashed':
    return squashed_gaussian_actor(observation_spec, action_spec, layers)
  if kind == 'gaussian':
    return gaussian_actor(observation_spec, action_spec, layers,
                          tanh_mean=tanh_mean)
  raise ValueError(f'unknown actor {kind!r}; one of: {", ".join(ACTORS)}')


class OfflineAgent(tf_agent.TFAgent):
  """A TFAgent trained from [B, 2] trajectories by `_train`.

  Subclasses build their networks and optimizers, call this constructor
  with the actor, and implement `_train(experience, weights)`.
  """

  def __init__(self, time_step_spec: Any, action_spec: Any,
               actor_network: Any, *, gamma: float, target_update_tau: float,
               reward_scale_factor: float = 1.0,
               train_step_counter: Optional[tf.Variable] = None,
               name: Optional[str] = None):
    tf.Module.__init__(self, name=name)
    self._actor_network = actor_network
    actor_network.create_variables(time_step_spec.observation)
    self._gamma = float(gamma)
    self._tau = float(target_update_tau)
    # A variable: IQL's scale comes from the data, after the agent is made.
    self._reward_scale = tf.Variable(float(reward_scale_factor),
                                     trainable=False, name='reward_scale')
    policy = actor_policy.ActorPolicy(time_step_spec, action_spec,
                                      actor_network, training=False)
    super().__init__(time_step_spec, action_spec, policy, policy,
                     train_sequence_length=2,
                     train_step_counter=train_step_counter)

  def _initialize(self):
    return tf.no_op()

  # ------------------------------------------------------------ helpers
  def transition(self, experience: Any) -> Transition:
    """s, a, r (scaled), discount, s' of each [B, 2] item (n-step feeds
    put their summed reward and discount on step 0)."""
    time_steps, policy_steps, next_time_steps = trajectory.to_transition(
        experience)
    squeeze = lambda x: tf.nest.map_structure(lambda t: t[:, 0], x)
    return Transition(
        observation=squeeze(time_steps.observation),
        action=tf.cast(squeeze(policy_steps.action), tf.float32),
        reward=self._reward_scale * tf.cast(
            squeeze(next_time_steps.reward), tf.float32),
        discount=tf.cast(squeeze(next_time_steps.discount), tf.float32),
        next_observation=squeeze(next_time_steps.observation))

  @property
  def reward_scale(self) -> tf.Variable:
    return self._reward_scale

  def td_target(self, batch: Transition, next_value: tf.Tensor) -> tf.Tensor:
    """r + gamma * discount * V(s'), held constant."""
    return tf.stop_gradient(batch.reward +
                            self._gamma * batch.discount * next_value)

  @staticmethod
  def copy_weights(source: Any, target: Any) -> None:
    """target <- source: a target network starts as its network."""
    for s, t in zip(source.variables, target.variables):
      t.assign(s)

  @classmethod
  def target_of(cls, network: Any, name: str) -> Any:
    """A built copy of a critic ensemble that starts equal to it."""
    target = network.copy(name=name)
    target.create_variables()
    cls.copy_weights(network, target)
    return target

  def soft_update(self, source: Any, target: Any) -> None:
    """target <- tau * source + (1 - tau) * target, variable by variable."""
    for s, t in zip(source.variables, target.variables):
      t.assign(self._tau * s + (1.0 - self._tau) * t)

  def action_distribution(self, observation: Any, training: bool = True
                          ) -> Any:
    """The actor's distribution: in the action bounds for a squashed
    actor, unbounded for a Gaussian one (`clip_to_bounds` its samples)."""
    distribution, _ = self._actor_network(observation, step_type=(),
                                          network_state=(), training=training)
    return distribution

  def inside_bounds(self, action: tf.Tensor) -> tf.Tensor:
    """Data actions moved just inside the action bounds, where a squashed
    Gaussian has a finite density."""
    low = tf.cast(self.action_spec.minimum, tf.float32)
    high = tf.cast(self.action_spec.maximum, tf.float32)
    margin = _ACTION_EPSILON * (high - low) / 2.0
    return tf.clip_by_value(action, low + margin, high - margin)

  def clip_to_bounds(self, action: tf.Tensor) -> tf.Tensor:
    """Actions clipped to the action bounds (a Gaussian actor's samples, as
    CORL clamps them; a no-op on a squashed actor's)."""
    return tf.clip_by_value(action,
                            tf.cast(self.action_spec.minimum, tf.float32),
                            tf.cast(self.action_spec.maximum, tf.float32))

  def weighted_log_likelihood_loss(self, observation: Any, action: tf.Tensor,
                                   weight: tf.Tensor) -> tf.Tensor:
    """-mean(weight * log pi(a | s)) over data actions: the actor loss of
    advantage-weighted regression (IQL's and AWAC's actors; `weight` is
    held constant by the caller)."""
    log_prob = self.action_distribution(observation).log_prob(
        self.inside_bounds(action))
    return -tf.reduce_mean(weight * log_prob)

  @staticmethod
  def weighted_mean(per_example: tf.Tensor,
                    weights: Optional[tf.Tensor]) -> tf.Tensor:
    """Mean over the batch, weighted by PER importance weights if given."""
    if weights is None:
      return tf.reduce_mean(per_example)
    return tf.reduce_mean(per_example * tf.cast(weights, per_example.dtype))

  @staticmethod
  def make_optimizer(learning_rate: Any, variables: list) -> Any:
    """Legacy Adam with its slots made now: a slot made on first use
    inside a `tf.cond` branch of a traced step would fail, and a fresh
    agent restoring a checkpoint needs them to exist."""
    optimizer = tf.keras.optimizers.legacy.Adam(learning_rate)
    optimizer._create_all_weights(variables)  # pylint: disable=protected-access
    return optimizer

  @staticmethod
  def apply(tape: tf.GradientTape, loss: tf.Tensor, variables: list,
            optimizer: Any) -> None:
    gradients = tape.gradient(loss, variables)
    optimizer.apply_gradients(zip(gradients, variables))

  def summarize(self, **scalars: tf.Tensor) -> None:
    for name, value in scalars.items():
      tf.compat.v2.summary.scalar(name, value, step=self.train_step_counter)


def loss_extra(name: str, **fields: tf.Tensor) -> Any:
  """A namedtuple `name` of the loss parts (one type per field set)."""
  key = (name, tuple(fields))
  if key not in _EXTRA_TYPES:
    _EXTRA_TYPES[key] = collections.namedtuple(name, list(fields))
  return _EXTRA_TYPES[key](**fields)


_EXTRA_TYPES: dict = {}
