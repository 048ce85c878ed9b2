"""Networks for image observations: the Nature DQN encoder (Mnih et al.
2015) that DQN, PPO and A2C share on Atari.

Frames arrive as uint8 frame-major stacks [k, H, W] or [k, H, W, C]
(`replay.memory` stacks them at sample time, the actor's frame stacker at
acting time: a stack is then a gather of whole frames). The network scales
them to [0, 1] and moves the frames to the channel axis itself ([H, W, k]
or [H, W, k * C], frame-major channels), in float inside its own graph,
so nothing upstream ever holds float frames or transposes bytes. The
encoder is three valid convolutions (32 8x8 stride 4, 64 4x4 stride 2,
64 3x3 stride 1, ReLU) and a 512-unit ReLU layer, as in the paper and in
Stable-Baselines3's `NatureCNN`.
"""

from __future__ import annotations

from typing import Any, Sequence

import tensorflow as tf

NATURE_CONV = ((32, 8, 4), (64, 4, 2), (64, 3, 1))
NATURE_FC = (512,)
PIXEL_SCALE = 1.0 / 255.0


def is_image(spec: Any) -> bool:
  """A stacked image observation: uint8 [k, H, W] or [k, H, W, C]."""
  return (isinstance(spec, tf.TensorSpec) and spec.dtype == tf.uint8
          and spec.shape.rank in (3, 4))


def channels_last_shape(stack_shape: Sequence[int]) -> list[int]:
  """The [H, W, channels] a stack of `stack_shape` becomes in the network."""
  k, height, width = (int(d) for d in stack_shape[:3])
  channels = int(stack_shape[3]) if len(stack_shape) == 4 else 1
  return [height, width, k * channels]


def frames_to_channels(stack_shape: Sequence[int]
                       ) -> list[tf.keras.layers.Layer]:
  """Keras layers (no weights) from stacks [B, k, H, W(, C)] to
  [B, H, W, k(*C)]."""
  if len(stack_shape) == 3:
    return [tf.keras.layers.Permute((2, 3, 1))]
  return [tf.keras.layers.Permute((2, 3, 1, 4)),
          tf.keras.layers.Reshape(channels_last_shape(stack_shape))]


def stack_to_channels(stack_shape: Sequence[int]
                      ) -> list[tf.keras.layers.Layer]:
  """Keras layers from uint8 stacks [B, k, H, W(, C)] to float [B, H, W,
  k(*C)] in [0, 1]: scale first, so the move happens in float in-graph."""
  return ([tf.keras.layers.Rescaling(PIXEL_SCALE)]
          + frames_to_channels(stack_shape))


def encoder_kwargs(observation_spec: Any,
                   fc_layers: tuple[int, ...]) -> dict[str, Any]:
  """Keyword arguments of a TF-Agents encoding network (QNetwork,
  EncodingNetwork, ActorDistributionNetwork, ValueNetwork) for the
  observation: the Nature encoder for images, `fc_layers` otherwise."""
  if not is_image(observation_spec):
    return {'fc_layer_params': tuple(fc_layers)}
  return {'preprocessing_layers': tf.keras.Sequential(
              stack_to_channels(observation_spec.shape.as_list())),
          'conv_layer_params': NATURE_CONV,
          'fc_layer_params': NATURE_FC}
