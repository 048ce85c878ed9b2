"""The on-policy learners' networks: a separate actor and critic MLP.

The layout of the PPO paper's MuJoCo runs and of the seed codebase: tanh
hidden layers (64, 64), orthogonal initialisation (sqrt 2 on hidden layers,
1 on the Gaussian mean and the value, 0.01 on categorical logits), a
Gaussian policy whose
log standard deviation is a learned vector independent of the state
(continuous actions) or a categorical one (discrete actions). The actor
exports to a numpy policy (heads 'gaussian' / 'categorical'), so actors and
evaluation act without TensorFlow, as for every other agent here.

Image observations (uint8 frame stacks) take the seed codebase's CNN base
instead (`CnnActorCritic`): the Nature DQN encoder shared by a linear
actor and a linear critic, ReLU, orthogonal initialisation.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from rlds_reverb.acting import numpy_policy
from rlds_reverb.acting import recurrent_policy
from rlds_reverb.agents import image_networks

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


ACTIVATIONS = ('tanh', 'relu')


def _mlp(sizes: Sequence[int], out: int, out_gain: float, name: str, *,
         activation: str = 'tanh', orthogonal: bool = True
         ) -> tf.keras.Sequential:
  """Hidden layers of `activation`, orthogonally initialised (gain sqrt 2,
  `out_gain` on the output) or with Keras' default (Glorot uniform)."""
  init = ((lambda gain: tf.keras.initializers.Orthogonal(gain)) if orthogonal
          else (lambda gain: 'glorot_uniform'))
  layers = [tf.keras.layers.Dense(size, activation=activation,
                                  kernel_initializer=init(math.sqrt(2.0)))
            for size in sizes]
  layers.append(tf.keras.layers.Dense(out, kernel_initializer=init(out_gain)))
  return tf.keras.Sequential(layers, name=name)


class _Heads(tf.Module):
  """The actor and critic MLPs, the log std and the step counter that both
  models share; a subclass's `_make_trunk` makes what feeds the heads (in
  the name scope, before them) and `_build` calls everything once.

  Attributes:
    discrete: categorical policy over `num_actions` actions; else Gaussian
      over `action_size` dimensions.
    train_step_counter: gradient steps taken (minibatch updates).
  """

  recurrent = False

  def __init__(self, observation_size: int, *, action_size: int,
               num_actions: int, hidden: Sequence[int],
               initial_log_std: float, name: str, activation: str = 'tanh',
               orthogonal_init: bool = True):
    super().__init__(name=name)
    if (action_size > 0) == (num_actions > 0):
      raise ValueError('give one of action_size (continuous) and num_actions '
                       f'(discrete); got {action_size} and {num_actions}')
    if activation not in ACTIVATIONS:
      raise ValueError(f'activation must be one of {ACTIVATIONS}, got '
                       f'{activation!r}')
    self.observation_size = int(observation_size)
    self.discrete = num_actions > 0
    self.num_actions, self.action_size = int(num_actions), int(action_size)
    self.hidden = tuple(int(h) for h in hidden)
    self.activation = activation
    outputs = num_actions if self.discrete else action_size
    mlp = lambda sizes, out, gain, name: _mlp(  # noqa: E731
        sizes, out, gain, name, activation=activation,
        orthogonal=orthogonal_init)
    with self.name_scope:
      self._make_trunk()
      self.actor = mlp(self.hidden, outputs, 0.01 if self.discrete else 1.0,
                       'actor')
      self.critic = mlp(self.hidden, 1, 1.0, 'critic')
      self.log_std = (None if self.discrete else tf.Variable(
          tf.fill([action_size], float(initial_log_std)), name='log_std'))
      self.train_step_counter = tf.Variable(0, dtype=tf.int64,
                                            name='train_step')
    self._build()

  def _make_trunk(self) -> None:
    pass

  def _build(self) -> None:
    dummy = tf.zeros([1, self.observation_size])
    self.actor(dummy)
    self.critic(dummy)


class ActorCritic(_Heads):
  """Policy and value networks on the observation."""

  def __init__(self, observation_size: int, *, action_size: int = 0,
               num_actions: int = 0, hidden: Sequence[int] = (64, 64),
               initial_log_std: float = 0.0, activation: str = 'tanh',
               orthogonal_init: bool = True, name: str = 'actor_critic'):
    super().__init__(observation_size, action_size=action_size,
                     num_actions=num_actions, hidden=hidden,
                     initial_log_std=initial_log_std, name=name,
                     activation=activation, orthogonal_init=orthogonal_init)

  def value(self, observations: tf.Tensor) -> tf.Tensor:
    return self.critic(observations)[:, 0]

  def log_prob_and_entropy(self, observations: tf.Tensor, actions: tf.Tensor
                           ) -> tuple[tf.Tensor, tf.Tensor]:
    """log pi(a|s) [B] and the policy's entropy [B]."""
    return policy_terms(self.actor(observations), actions, self.log_std)

  def evaluate(self, observations: tf.Tensor, actions: tf.Tensor
               ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """log pi(a|s), entropy and V(s) [B] each: what an update needs."""
    log_prob, entropy = self.log_prob_and_entropy(observations, actions)
    return log_prob, entropy, self.value(observations)

  @property
  def trainable_weights(self) -> list[tf.Variable]:
    return _heads_weights(self)


def policy_terms(out: tf.Tensor, actions: tf.Tensor,
                 log_std: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
  """log-probabilities of `actions` and entropies under the head's output
  (logits where `log_std` is None, else the Gaussian mean; its log std [d]
  or one per sample [B, d])."""
  if log_std is None:
    log_probs = tf.nn.log_softmax(out)
    taken = tf.gather(log_probs, tf.cast(actions, tf.int32), batch_dims=1)
    entropy = -tf.reduce_sum(tf.exp(log_probs) * log_probs, axis=-1)
    return taken, entropy
  z = (tf.cast(actions, tf.float32) - out) * tf.exp(-log_std)
  log_prob = tf.reduce_sum(-0.5 * tf.square(z) - _LOG_SQRT_2PI - log_std,
                           axis=-1)
  entropy = tf.reduce_sum(log_std + 0.5 + _LOG_SQRT_2PI, axis=-1
                          ) * tf.ones_like(log_prob)
  return log_prob, entropy


def _heads_weights(model: _Heads, trunk: Sequence[tf.Variable] = ()
                   ) -> list[tf.Variable]:
  weights = (list(trunk) + model.actor.trainable_weights +
             model.critic.trainable_weights)
  return weights + ([model.log_std] if model.log_std is not None else [])


class RecurrentActorCritic(_Heads):
  """The seed codebase's recurrent policy: a GRU on the observation whose
  state feeds the actor and the critic MLPs.

  The state is reset to zeros where an episode starts and otherwise carried
  on, across rollouts too; the learner unrolls it over each env copy's
  rollout from the state the actor had at its start.
  """

  recurrent = True

  def __init__(self, observation_size: int, *, action_size: int = 0,
               num_actions: int = 0, hidden: Sequence[int] = (64,),
               state_size: int = 64, initial_log_std: float = 0.0,
               name: str = 'recurrent_actor_critic'):
    self.state_size = state_size
    super().__init__(observation_size, action_size=action_size,
                     num_actions=num_actions, hidden=hidden,
                     initial_log_std=initial_log_std, name=name)

  def _make_trunk(self) -> None:
    self.cell = tf.keras.layers.GRUCell(self.state_size)

  def _build(self) -> None:
    self.step(tf.zeros([1, self.observation_size]), self.initial_state(1))
    features = tf.zeros([1, self.state_size])
    self.actor(features)
    self.critic(features)

  def initial_state(self, batch: int) -> tf.Tensor:
    return tf.zeros([batch, self.state_size])

  def step(self, observations: tf.Tensor, state: tf.Tensor) -> tf.Tensor:
    """The next state (= the features the heads see) [B, state_size]."""
    _, (new_state,) = self.cell(tf.cast(observations, tf.float32), [state])
    return new_state

  def unroll(self, observations: tf.Tensor, starts: tf.Tensor,
             state: tf.Tensor) -> tf.Tensor:
    """States after each step [N, T, state_size] of N sequences
    [N, T, obs], reset where `starts` [N, T] is set, from `state` [N, H]."""
    inputs = (tf.transpose(tf.cast(observations, tf.float32), [1, 0, 2]),
              tf.transpose(tf.cast(starts, tf.float32)))

    def one_step(previous, step_inputs):
      x, start = step_inputs
      return self.step(x, previous * (1.0 - start[:, None]))

    states = tf.scan(one_step, inputs, initializer=state)
    return tf.transpose(states, [1, 0, 2])

  def log_prob_and_entropy_of(self, features: tf.Tensor, actions: tf.Tensor
                              ) -> tuple[tf.Tensor, tf.Tensor]:
    return policy_terms(self.actor(features), actions, self.log_std)

  def value_of(self, features: tf.Tensor) -> tf.Tensor:
    return self.critic(features)[:, 0]

  @property
  def trainable_weights(self) -> list[tf.Variable]:
    return _heads_weights(self, self.cell.trainable_weights)


class CnnActorCritic(_Heads):
  """The seed's CNNBase: one Nature encoder (`image_networks`) whose 512
  features feed a linear actor and a linear critic; frames are scaled to
  [0, 1] inside it."""

  def __init__(self, observation_shape: Sequence[int], *,
               action_size: int = 0, num_actions: int = 0,
               initial_log_std: float = 0.0, name: str = 'cnn_actor_critic'):
    self.observation_shape = tuple(int(d) for d in observation_shape)
    if len(self.observation_shape) not in (3, 4):
      raise ValueError('CnnActorCritic takes frame-major stacks [k, H, W] '
                       f'or [k, H, W, C], got shape {self.observation_shape}')
    super().__init__(0, action_size=action_size, num_actions=num_actions,
                     hidden=(), initial_log_std=initial_log_std, name=name)

  def _make_trunk(self) -> None:
    relu_init = lambda: tf.keras.initializers.Orthogonal(math.sqrt(2.0))
    layers = image_networks.stack_to_channels(self.observation_shape)
    layers += [tf.keras.layers.Conv2D(filters, size, stride,
                                      activation='relu',
                                      kernel_initializer=relu_init())
               for filters, size, stride in image_networks.NATURE_CONV]
    layers.append(tf.keras.layers.Flatten())
    layers += [tf.keras.layers.Dense(units, activation='relu',
                                     kernel_initializer=relu_init())
               for units in image_networks.NATURE_FC]
    self.trunk = tf.keras.Sequential(layers, name='trunk')

  def _build(self) -> None:
    features = self.trunk(tf.zeros((1,) + self.observation_shape, tf.uint8))
    self.actor(features)
    self.critic(features)

  def value(self, observations: tf.Tensor) -> tf.Tensor:
    return self.critic(self.trunk(observations))[:, 0]

  def log_prob_and_entropy(self, observations: tf.Tensor, actions: tf.Tensor
                           ) -> tuple[tf.Tensor, tf.Tensor]:
    return policy_terms(self.actor(self.trunk(observations)), actions,
                         self.log_std)

  def evaluate(self, observations: tf.Tensor, actions: tf.Tensor
               ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """log pi(a|s), entropy and V(s) [B] each, from one pass of the shared
    encoder (most of a step's cost)."""
    features = self.trunk(observations)
    log_prob, entropy = policy_terms(self.actor(features), actions,
                                     self.log_std)
    return log_prob, entropy, self.critic(features)[:, 0]

  @property
  def trainable_weights(self) -> list[tf.Variable]:
    return _heads_weights(self, self.trunk.trainable_weights)

  def sampler(self, action_low: Any) -> Callable[..., Any]:
    """(observations, rng) -> (actions, log-probabilities), as the numpy
    policy's `sample` draws them, with the actor's outputs computed by this
    model's own graph: TensorFlow's convolutions act about twice as fast as
    the numpy ones, and an in-process collector needs no weight sync."""
    outputs = tf.function(lambda x: self.actor(self.trunk(x)))

    def sample(observations: np.ndarray, rng: np.random.Generator
               ) -> tuple[np.ndarray, np.ndarray]:
      out = outputs(observations).numpy()
      if self.discrete:
        return numpy_policy.sample_categorical(out, action_low, rng)
      return numpy_policy.sample_gaussian(out, self.log_std.numpy(), rng)
    return sample


# Every on-policy model kind.
MODELS = (ActorCritic, RecurrentActorCritic, CnnActorCritic)


def _dense_weights(model: tf.keras.Sequential
                   ) -> tuple[list[np.ndarray], list[np.ndarray]]:
  dense = [layer for layer in model.layers
           if isinstance(layer, tf.keras.layers.Dense)]
  return ([layer.kernel.numpy() for layer in dense],
          [layer.bias.numpy() for layer in dense])


def _conv_weights(model: CnnActorCritic) -> dict[str, Any]:
  convs = [layer for layer in model.trunk.layers
           if isinstance(layer, tf.keras.layers.Conv2D)]
  return {'conv_kernels': [c.kernel.numpy() for c in convs],
          'conv_biases': [c.bias.numpy() for c in convs],
          'conv_strides': [int(c.strides[0]) for c in convs],
          'obs_scale': image_networks.PIXEL_SCALE,
          'input_shape': list(model.observation_shape)}


def _actor_weights(model: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """The actor's layers from the observation (a CNN's trunk Dense first)."""
  kernels, biases = _dense_weights(model.actor)
  if isinstance(model, CnnActorCritic):
    trunk_kernels, trunk_biases = _dense_weights(model.trunk)
    kernels, biases = trunk_kernels + kernels, trunk_biases + biases
  return kernels, biases


def export(model: ActorCritic | RecurrentActorCritic | CnnActorCritic,
           action_low: np.ndarray, action_high: np.ndarray,
           metadata: dict[str, Any] | None = None) -> Any:
  """The actor as a numpy policy (observations as the model sees them):
  a `NumpyPolicy`, or a `RecurrentPolicy` for a recurrent model."""
  kernels, biases = _actor_weights(model)
  if model.recurrent:
    kernel, recurrent_kernel, bias = (w.numpy() for w in model.cell.weights)
    return recurrent_policy.RecurrentPolicy(
        head='categorical' if model.discrete else 'gaussian',
        gru_kernel=kernel, gru_recurrent_kernel=recurrent_kernel,
        gru_bias=bias, kernels=kernels, biases=biases,
        action_low=np.asarray(action_low),
        action_high=np.asarray(action_high),
        log_std=None if model.discrete else model.log_std.numpy(),
        metadata=dict(metadata or {}))
  image = isinstance(model, CnnActorCritic)
  return numpy_policy.NumpyPolicy(
      head='categorical' if model.discrete else 'gaussian',
      kernels=kernels, biases=biases,
      action_low=np.asarray(action_low), action_high=np.asarray(action_high),
      metadata=dict(metadata or {}),
      activation='relu' if image else model.activation,
      log_std=None if model.discrete else model.log_std.numpy(),
      **(_conv_weights(model) if image else {}))


def update_weights(policy: Any,
                   model: ActorCritic | RecurrentActorCritic | CnnActorCritic
                   ) -> None:
  """Copies the model's actor of now into `policy` (a recurrent one's
  evaluation state starts afresh)."""
  policy.kernels, policy.biases = _actor_weights(model)
  if isinstance(model, CnnActorCritic):
    weights = _conv_weights(model)
    policy.conv_kernels = weights['conv_kernels']
    policy.conv_biases = weights['conv_biases']
  if not model.discrete:
    policy.log_std = model.log_std.numpy()
  if model.recurrent:
    (policy.gru_kernel, policy.gru_recurrent_kernel,
     policy.gru_bias) = (w.numpy() for w in model.cell.weights)
    policy.reset()
