"""Networks for image observations: the Nature DQN encoder (Mnih et al.
2015) that DQN, PPO and A2C share on Atari.

Frames arrive as uint8 stacks [H, W, k] (`replay.memory` stacks them at
sample time, the actor's frame stacker at acting time); the network scales
them to [0, 1] itself, so nothing upstream ever holds float frames. The
encoder is three valid convolutions (32 8x8 stride 4, 64 4x4 stride 2,
64 3x3 stride 1, ReLU) and a 512-unit ReLU layer, as in the paper and in
Stable-Baselines3's `NatureCNN`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

NATURE_CONV = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
NATURE_FC = (512,)
PIXEL_SCALE = 1.0 / 255.0


def is_image(spec: Any) -> bool:
  """A stacked image observation: uint8 [H, W, C]."""
  return (isinstance(spec, tf.TensorSpec) and spec.dtype == tf.uint8
          and spec.shape.rank == 3)


def encoder_kwargs(observation_spec: Any,
                   fc_layers: tuple[int, ...]) -> dict[str, Any]:
  """Keyword arguments of a TF-Agents encoding network (QNetwork,
  EncodingNetwork, ActorDistributionNetwork, ValueNetwork) for the
  observation: the Nature encoder for images, `fc_layers` otherwise."""
  if not is_image(observation_spec):
    return {'fc_layer_params': tuple(fc_layers)}
  return {'preprocessing_layers': tf.keras.layers.Rescaling(PIXEL_SCALE),
          'conv_layer_params': NATURE_CONV,
          'fc_layer_params': NATURE_FC}
