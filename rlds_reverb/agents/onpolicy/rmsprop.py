"""RMSprop as PyTorch defines it, the optimiser of the seed's A2C.

Keras' RMSprop (like TF1's, which OpenAI baselines' A2C uses) divides by
sqrt(v + epsilon); PyTorch's divides by sqrt(v) + epsilon. The seed's
epsilon of 1e-5 puts Keras' floor, sqrt(1e-5), far above the root mean
square gradient of most of a CNN's weights, so Keras' steps on them are
orders of magnitude shorter than the seed's for the same settings
(docs/onpolicy.md, "A2C's optimiser").
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf


class TorchRMSprop(tf.keras.optimizers.RMSprop):
  """v <- rho v + (1 - rho) g^2; w <- w - lr g / (sqrt(v) + epsilon).

  Keeps Keras' RMSprop's slots, so its checkpoints hold the same variables.
  """

  def __init__(self, learning_rate: Any, rho: float, epsilon: float,
               name: str = 'TorchRMSprop'):
    super().__init__(learning_rate, rho=rho, epsilon=epsilon, name=name)

  def update_step(self, gradient: Any, variable: tf.Variable) -> None:
    lr = tf.cast(self.learning_rate, variable.dtype)
    velocity = self._velocities[self._index_dict[self._var_key(variable)]]
    gradient = tf.convert_to_tensor(gradient)  # Sparse ones made dense.
    velocity.assign(self.rho * velocity +
                    (1 - self.rho) * tf.square(gradient))
    variable.assign_sub(lr * gradient / (tf.sqrt(velocity) + self.epsilon))
