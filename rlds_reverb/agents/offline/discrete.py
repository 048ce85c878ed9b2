"""Offline learners for discrete actions, RL Unplugged's Atari baselines:
behaviour cloning and conservative Q-learning (Kumar et al. 2020, CQL(H)
on DQN) from the same Q-network as the toolkit's DQN (an MLP for vectors,
the Nature encoder for frame stacks, `agents.dqn.make_q_network`).

Both are TF-Agents `DqnAgent`s with their own loss, so they train, act,
export (numpy head 'q_argmax': greedy is the argmax of the network's
outputs) and checkpoint as DQN does.

  discrete_bc   softmax cross-entropy of the network's outputs (the logits
                of the data's policy) against the data's actions
  discrete_cql  DQN's TD loss (Huber, target network, Double DQN optional)
                + alpha * E[log sum_a exp Q(s, a) - Q(s, a_data)]: Q of
                actions the data never took is pushed down, of those it took
                up
"""

from __future__ import annotations

import dataclasses
from typing import Any

import gin
import tensorflow as tf
from tf_agents.agents import tf_agent
from tf_agents.agents.dqn import dqn_agent
from tf_agents.utils import common

from rlds_reverb.agents import dqn


@gin.configurable
@dataclasses.dataclass
class DiscreteCqlConfig:
  """CQL(H)'s own setting."""
  alpha: float = 1.0
  """Weight of the conservative term (Kumar et al. 2020 use 1.0 on most
  Atari datasets, 4.0 on some)."""


def _data_q(q_values: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
  return tf.gather(q_values, tf.cast(actions, tf.int32), batch_dims=1)


class DiscreteBcAgent(dqn_agent.DqnAgent):
  """A DqnAgent whose loss is behaviour cloning: cross-entropy of its
  outputs as logits against the data's actions (the first step of each
  [B, 2] item; the second is the next observation's)."""

  def _loss(self, experience, td_errors_loss_fn=None, gamma=1.0,
            reward_scale_factor=1.0, weights=None, training=False):
    del td_errors_loss_fn, gamma, reward_scale_factor
    time_steps, policy_steps, _ = self._as_transition(experience)
    logits, _ = self._q_network(time_steps.observation,
                                step_type=time_steps.step_type,
                                training=training)
    offset = tf.cast(self.action_spec.minimum, policy_steps.action.dtype)
    per_item = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.cast(policy_steps.action - offset, tf.int32),
        logits=logits)
    if weights is not None:
      per_item *= weights
    loss = tf.reduce_mean(per_item)
    tf.compat.v2.summary.scalar('bc_loss', loss, step=self.train_step_counter)
    return tf_agent.LossInfo(loss, dqn_agent.DqnLossInfo(
        td_loss=per_item, td_error=tf.zeros_like(per_item)))


class DiscreteCqlAgent(dqn_agent.DqnAgent):
  """DQN (or Double DQN) plus CQL(H)'s conservative term."""

  def __init__(self, *args: Any, alpha: float = 1.0, **kwargs: Any):
    super().__init__(*args, **kwargs)
    self._alpha = float(alpha)

  def _loss(self, experience, td_errors_loss_fn=None, gamma=1.0,
            reward_scale_factor=1.0, weights=None, training=False):
    loss_info = super()._loss(
        experience, td_errors_loss_fn=td_errors_loss_fn, gamma=gamma,
        reward_scale_factor=reward_scale_factor, weights=weights,
        training=training)
    time_steps, policy_steps, _ = self._as_transition(experience)
    q_values, _ = self._q_network(time_steps.observation,
                                  step_type=time_steps.step_type,
                                  training=training)
    offset = tf.cast(self.action_spec.minimum, policy_steps.action.dtype)
    gap = (tf.reduce_logsumexp(q_values, axis=-1)
           - _data_q(q_values, policy_steps.action - offset))
    if weights is not None:
      gap *= weights
    conservative = tf.reduce_mean(gap)
    tf.compat.v2.summary.scalar('cql_gap', conservative,
                                step=self.train_step_counter)
    return tf_agent.LossInfo(loss_info.loss + self._alpha * conservative,
                             loss_info.extra)


def _make(agent_class: type, time_step_spec: Any, action_spec: Any,
          config: Any, train_step: tf.Variable, **extra: Any) -> Any:
  if action_spec.dtype.is_floating or action_spec.shape.rank != 0:
    raise ValueError(f'{agent_class.__name__} needs one discrete action (a '
                     f'scalar integer spec), got {action_spec}')
  net = dqn.make_q_network(time_step_spec.observation, action_spec,
                           tuple(config.q_layers), config.dueling)
  agent = agent_class(
      time_step_spec, action_spec, q_network=net,
      optimizer=tf.keras.optimizers.legacy.Adam(config.dqn_learning_rate),
      epsilon_greedy=0.0, target_update_tau=1.0,
      target_update_period=config.target_update_period,
      td_errors_loss_fn=common.element_wise_huber_loss, gamma=config.gamma,
      gradient_clipping=config.gradient_clipping,
      train_step_counter=train_step, **extra)
  agent.initialize()
  return agent


def make_discrete_bc(time_step_spec: Any, action_spec: Any, config: Any,
                     train_step: tf.Variable) -> DiscreteBcAgent:
  return _make(DiscreteBcAgent, time_step_spec, action_spec, config,
               train_step)


def make_discrete_cql(time_step_spec: Any, action_spec: Any, config: Any,
                      train_step: tf.Variable,
                      method_config: DiscreteCqlConfig | None = None
                      ) -> DiscreteCqlAgent:
  method_config = method_config or DiscreteCqlConfig()
  agent_class = DiscreteCqlAgent
  if config.double_dqn:
    agent_class = type('DiscreteCqlDdqnAgent',
                       (DiscreteCqlAgent, dqn_agent.DdqnAgent), {})
  return _make(agent_class, time_step_spec, action_spec, config, train_step,
               alpha=method_config.alpha)
