"""DQN for discrete actions: TF-Agents' DqnAgent / DdqnAgent, dueling optional.

Defaults are RL Zoo's tuned DQN settings for CartPole-v1 (256-256 ReLU MLP,
Adam 2.3e-3, Huber loss, gradient norm clipped at 10, a hard target copy
after every training phase), which reach the maximum return within 50k env
steps there. Double DQN (van Hasselt et al. 2016) is TF-Agents' DdqnAgent;
the dueling head (Wang et al. 2016) is `DuelingQNetwork` below, since
TF-Agents ships none.

Acting is numpy (`acting.numpy_policy`, head 'q_argmax'): a dueling head
Q = V + A - mean(A) is linear in the last hidden layer, so it exports as one
equivalent Dense layer and the numpy forward pass is a plain MLP.

Image observations (uint8 frame stacks, Atari) get the Nature DQN encoder
(`image_networks`) in place of the MLP layers; the numpy policy runs its
convolutions too.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.networks import encoding_network
from tf_agents.networks import network
from tf_agents.networks import q_network
from tf_agents.utils import common

from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import export
from rlds_reverb.agents import image_networks


def num_actions(action_spec: Any) -> int:
  return int(action_spec.maximum) - int(action_spec.minimum) + 1


class DuelingQNetwork(network.Network):
  """Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a') on a shared MLP encoder."""

  def __init__(self, input_tensor_spec: Any, action_spec: Any,
               fc_layer_params: tuple[int, ...] = (256, 256),
               name: str = 'DuelingQNetwork'):
    super().__init__(input_tensor_spec=input_tensor_spec, state_spec=(),
                     name=name)
    self._encoder = encoding_network.EncodingNetwork(
        input_tensor_spec,
        **image_networks.encoder_kwargs(input_tensor_spec, fc_layer_params),
        activation_fn=tf.keras.activations.relu,
        kernel_initializer=tf.compat.v1.variance_scaling_initializer(
            scale=2.0, mode='fan_in', distribution='truncated_normal'),
        batch_squash=False)
    self._value_layer = tf.keras.layers.Dense(1, name='value')
    self._advantage_layer = tf.keras.layers.Dense(num_actions(action_spec),
                                                  name='advantage')

  def call(self, observation, step_type=None, network_state=(),
           training=False):
    hidden, network_state = self._encoder(
        observation, step_type=step_type, network_state=network_state,
        training=training)
    value = self._value_layer(hidden, training=training)
    advantage = self._advantage_layer(hidden, training=training)
    q_values = value + advantage - tf.reduce_mean(advantage, axis=-1,
                                                  keepdims=True)
    return q_values, network_state


def make_q_network(observation_spec: Any, action_spec: Any,
                   layers: tuple[int, ...], dueling: bool) -> network.Network:
  """`layers` are the hidden widths of a vector observation's MLP; an
  image observation gets the Nature encoder instead."""
  if dueling:
    return DuelingQNetwork(observation_spec, action_spec, layers)
  return q_network.QNetwork(
      observation_spec, action_spec,
      **image_networks.encoder_kwargs(observation_spec, layers))


def make_dqn_agent(time_step_spec: Any, action_spec: Any, config: Any,
                   train_step: tf.Variable) -> dqn_agent.DqnAgent:
  """A DqnAgent (DdqnAgent with `config.double_dqn`) from an AgentConfig.

  Raises:
    ValueError: the action spec is not a scalar integer range.
  """
  if action_spec.dtype.is_floating or action_spec.shape.rank != 0:
    raise ValueError(f'dqn needs one discrete action (a scalar integer '
                     f'spec), got {action_spec}; use sac or td3 for '
                     'continuous actions')
  net = make_q_network(time_step_spec.observation, action_spec,
                       tuple(config.q_layers), config.dueling)
  agent_class = dqn_agent.DdqnAgent if config.double_dqn else (
      dqn_agent.DqnAgent)
  agent = agent_class(
      time_step_spec, action_spec, q_network=net,
      optimizer=tf.keras.optimizers.legacy.Adam(config.dqn_learning_rate),
      epsilon_greedy=0.0,  # acting is numpy, epsilon-greedy there.
      target_update_tau=1.0,
      target_update_period=config.target_update_period,
      td_errors_loss_fn=common.element_wise_huber_loss, gamma=config.gamma,
      gradient_clipping=config.gradient_clipping,
      train_step_counter=train_step)
  agent.initialize()
  return agent


def q_layers(net: network.Network) -> tuple[list[np.ndarray],
                                            list[np.ndarray]]:
  """Kernels and biases of a Q-network as one MLP (dueling head merged)."""
  hidden = export.dense_layers(net._encoder)  # pylint: disable=protected-access
  if isinstance(net, DuelingQNetwork):
    value, advantage = net._value_layer, net._advantage_layer  # pylint: disable=protected-access
    a_kernel, a_bias = advantage.kernel.numpy(), advantage.bias.numpy()
    # V + A - mean(A), written as one Dense layer on the last hidden layer.
    last_kernel = (value.kernel.numpy() + a_kernel
                   - a_kernel.mean(axis=1, keepdims=True))
    last_bias = value.bias.numpy() + a_bias - a_bias.mean()
  else:
    last = net._q_value_layer  # pylint: disable=protected-access
    last_kernel, last_bias = last.kernel.numpy(), last.bias.numpy()
  kernels = [layer.kernel.numpy() for layer in hidden] + [last_kernel]
  biases = [layer.bias.numpy() for layer in hidden] + [last_bias]
  return kernels, biases


def export_q_policy(agent: dqn_agent.DqnAgent, action_spec: Any,
                    metadata: dict[str, Any] | None = None
                    ) -> numpy_policy.NumpyPolicy:
  """The agent's Q-network as a numpy argmax / epsilon-greedy policy."""
  kernels, biases = q_layers(agent._q_network)  # pylint: disable=protected-access
  return numpy_policy.NumpyPolicy(
      head='q_argmax', kernels=kernels, biases=biases,
      **export.conv_weights(agent._q_network),  # pylint: disable=protected-access
      action_low=np.asarray(int(action_spec.minimum), np.int64),
      action_high=np.asarray(int(action_spec.maximum), np.int64),
      metadata=dict(metadata or {}))


def update_q_policy(policy: numpy_policy.NumpyPolicy,
                    agent: dqn_agent.DqnAgent) -> None:
  """Refreshes an exported Q policy in place from the agent (the actor's
  and the evaluator's sync): the Dense layers and, for frame stacks, the
  encoder's convolutions, which act as much as the Dense layers do."""
  policy.kernels, policy.biases = q_layers(agent._q_network)  # pylint: disable=protected-access
  convs = export.conv_weights(agent._q_network)  # pylint: disable=protected-access
  if convs:
    policy.conv_kernels = convs['conv_kernels']
    policy.conv_biases = convs['conv_biases']


def epsilon(env_steps: int, decay_steps: int, final: float,
            start: float = 1.0) -> float:
  """Linear exploration schedule: `start` at step 0, `final` from decay_steps."""
  if decay_steps <= 0:
    return final
  fraction = min(env_steps / decay_steps, 1.0)
  return start + fraction * (final - start)
