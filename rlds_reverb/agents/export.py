"""TF-Agents actor networks -> numpy policies (`acting.numpy_policy`).

The acting layer runs policies without TensorFlow; this module is the one
place that reads a TF-Agents network's Keras Dense layers into a
`NumpyPolicy`, once at export and in place at each refresh of the online
actor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from tf_agents.agents.sac import tanh_normal_projection_network
from tf_agents.networks import normal_projection_network

from rlds_reverb.acting import numpy_policy


def dense_layers(network: Any,
                 kind: type = tf.keras.layers.Dense) -> list[Any]:
  """The Keras Dense layers (or layers of `kind`) of a TF-Agents actor
  network, in call order."""
  found = []

  def walk(layer):
    if isinstance(layer, kind):
      found.append(layer)
      return
    if isinstance(layer, tf.keras.Sequential):  # The image preprocessing.
      for sub in layer.layers:
        walk(sub)
      return
    # TF-Agents networks keep their sub-layers in these attributes.
    for name in ('_encoder', '_flat_preprocessing_layers',
                 '_postprocessing_layers', '_mlp_layers',
                 '_projection_networks', '_projection_layer',
                 '_means_projection_layer'):
      child = getattr(layer, name, None)
      if child is None:
        continue
      for sub in (child if isinstance(child, (list, tuple)) else [child]):
        walk(sub)

  walk(network)
  return found


def _normal_projection(network: Any) -> Any:
  """The network's NormalProjectionNetwork with a state-independent std
  (IQL's and AWAC's Gaussian actors), or None."""
  projection = getattr(network, '_projection_networks', None)
  if isinstance(projection, normal_projection_network.NormalProjectionNetwork
                ) and not projection._state_dependent_std:  # pylint: disable=protected-access
    return projection
  return None


def network_head(network: Any, default: str) -> str:
  """The numpy head that serves `network`: 'tanh_normal' for TF-Agents'
  SAC actor, a Gaussian actor's ('gaussian', or 'tanh_mean_gaussian' when
  its mean is tanh-squashed), else `default` (the agent's registered
  head)."""
  if isinstance(getattr(network, '_projection_networks', None),
                tanh_normal_projection_network.TanhNormalProjectionNetwork):
    return 'tanh_normal'
  projection = _normal_projection(network)
  if projection is None:
    return default
  return ('gaussian' if projection._mean_transform is None  # pylint: disable=protected-access
          else 'tanh_mean_gaussian')


def _log_std(network: Any) -> np.ndarray | None:
  """A Gaussian actor's log std per action dimension, as it acts (after
  its std transform), or None for other networks."""
  projection = _normal_projection(network)
  if projection is None:
    return None
  bias = projection._bias.bias  # pylint: disable=protected-access
  std = projection._std_transform(bias)  # pylint: disable=protected-access
  return np.log(np.asarray(std, np.float64)).astype(np.float32)


def from_network(network: Any, head: str, action_spec: Any, *,
                 obs_mean: np.ndarray | None = None,
                 obs_std: np.ndarray | None = None,
                 metadata: dict[str, Any] | None = None
                 ) -> numpy_policy.NumpyPolicy:
  """Copies the weights of a built TF-Agents actor network.

  Raises:
    ValueError: the network has no Dense layers (not built, or not an MLP).
  """
  layers = dense_layers(network)
  if not layers or not layers[0].weights:
    raise ValueError('actor network has no built Dense layers to export')
  kernels = [layer.kernel.numpy() for layer in layers]
  biases = [layer.bias.numpy() for layer in layers]
  return numpy_policy.NumpyPolicy(
      head=head, kernels=kernels, biases=biases, **conv_weights(network),
      action_low=np.asarray(action_spec.minimum, np.float32) *
      np.ones(action_spec.shape, np.float32),
      action_high=np.asarray(action_spec.maximum, np.float32) *
      np.ones(action_spec.shape, np.float32),
      obs_mean=obs_mean, obs_std=obs_std, metadata=dict(metadata or {}),
      log_std=_log_std(network) if head in numpy_policy.GAUSSIAN_HEADS
      else None)


def conv_weights(network: Any) -> dict[str, Any]:
  """The convolutions of an image encoder as `NumpyPolicy` fields (none for
  an MLP): kernels [kh, kw, in, out], biases, strides, the pixel scale."""
  convs = dense_layers(network, tf.keras.layers.Conv2D)
  if not convs:
    return {}
  for conv in convs:
    if conv.padding != 'valid' or conv.dilation_rate != (1, 1) or (
        conv.strides[0] != conv.strides[1]):
      raise ValueError(f'cannot export {conv.name}: numpy policies run '
                       'valid, undilated convolutions with square strides')
  scales = dense_layers(network, tf.keras.layers.Rescaling)
  return {'conv_kernels': [c.kernel.numpy() for c in convs],
          'conv_biases': [c.bias.numpy() for c in convs],
          'conv_strides': [int(c.strides[0]) for c in convs],
          'obs_scale': float(scales[0].scale) if scales else None,
          'input_shape': network.input_tensor_spec.shape.as_list()}


def update_weights(policy: numpy_policy.NumpyPolicy, network: Any) -> None:
  """Refreshes `policy` in place from `network` (the online actor's sync)."""
  for i, layer in enumerate(dense_layers(network)):
    policy.kernels[i] = layer.kernel.numpy()
    policy.biases[i] = layer.bias.numpy()
  if policy.log_std is not None:
    policy.log_std = _log_std(network)
  for i, conv in enumerate(dense_layers(network, tf.keras.layers.Conv2D)):
    policy.conv_kernels[i] = conv.kernel.numpy()
    policy.conv_biases[i] = conv.bias.numpy()
