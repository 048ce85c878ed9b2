"""Ensembles of MLPs evaluated as one batched matmul per layer.

SAC-N and EDAC train ten or more critics; one Keras model per critic would
cost one kernel launch per layer per critic. Here the members' weights are
stacked ([N, in, out]) and a layer is one `einsum`, so N critics cost about
what one wide critic costs. The same network with N=2 is the twin critic of
IQL, AWAC, ReBRAC and Cal-QL, and with N=1 and the observation alone IQL's
value function. Optional LayerNorm after each hidden layer (ReBRAC's
critic) normalises each member on its own.

`hidden_dtype_name='bfloat16'` runs the hidden layers' matmuls in bfloat16
(CPUs with AMX and GPUs do these several times faster) while the weights,
LayerNorm statistics and the output layer stay float32: Q-values, whose TD
differences are small against their size, are not rounded to bfloat16's
8-bit mantissa, and the optimizer updates float32 weights.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Optional, Sequence, Union

import tensorflow as tf
from tf_agents.networks import network

# The dtypes the hidden layers may compute in.
COMPUTE_DTYPES = ('float32', 'bfloat16')
# CPU flags (/proc/cpuinfo) of native bfloat16 matmuls; without them
# TensorFlow emulates bfloat16 on the CPU, far slower than float32.
BFLOAT16_CPU_FLAGS = ('amx_bf16', 'avx512_bf16')


class SlowDtypeWarning(UserWarning):
  """bfloat16 asked for where no hardware computes it natively."""


def hidden_dtype(name: Union[str, tf.DType]) -> tf.DType:
  """The hidden layers' dtype from its name.

  Raises:
    ValueError: not one of COMPUTE_DTYPES.
  """
  name = tf.as_dtype(name).name if isinstance(name, tf.DType) else name
  if name not in COMPUTE_DTYPES:
    raise ValueError(f'the hidden layers compute in one of '
                     f'{", ".join(COMPUTE_DTYPES)}, got {name!r}')
  return tf.as_dtype(name)


def has_bfloat16_instructions(cpuinfo: str) -> bool:
  """Whether a /proc/cpuinfo text names native bfloat16 matmuls."""
  return bool(set(cpuinfo.split()) & set(BFLOAT16_CPU_FLAGS))


def _cpuinfo() -> Optional[str]:
  try:
    with open('/proc/cpuinfo') as f:
      return f.read()
  except OSError:
    return None  # Not Linux: nothing to tell.


def warn_if_emulated(name: Union[str, tf.DType]) -> None:
  """Warns when bfloat16 is asked for on a CPU that lacks it and no GPU:
  a run there would train many times slower than in float32."""
  if hidden_dtype(name) != tf.bfloat16 or tf.config.list_physical_devices(
      'GPU'):
    return
  cpuinfo = _cpuinfo()
  if cpuinfo is None or has_bfloat16_instructions(cpuinfo):
    return
  warnings.warn(SlowDtypeWarning(
      "critic_dtype 'bfloat16' on a CPU without bfloat16 instructions "
      f'(/proc/cpuinfo names none of {", ".join(BFLOAT16_CPU_FLAGS)}) and '
      'no GPU: TensorFlow emulates bfloat16 here and the critics train many '
      'times slower than in float32 (docs/offline_rl.md, bfloat16 '
      "critics); use 'float32' (a bfloat16 run resumes in float32)"),
                stacklevel=3)


def _uniform(shape: Sequence[int], bound: float, seed: Optional[int]):
  initializer = tf.keras.initializers.RandomUniform(-bound, bound, seed=seed)
  return lambda: initializer(shape, tf.float32)


class EnsembleMlp(network.Network):
  """N independent MLPs on the same (flattened, concatenated) input.

  Output: [B, N], one scalar per member. Weights start as PyTorch's Linear
  default (uniform +-1/sqrt(fan_in)), the initialisation CORL's
  implementations use, so each member starts differently.
  """

  def __init__(self, input_tensor_spec: Any, num_members: int,
               hidden_layers: Sequence[int], *, layer_norm: bool = False,
               hidden_bias: Optional[float] = None,
               last_layer_bound: Optional[float] = None,
               seed: Optional[int] = None,
               hidden_dtype_name: Union[str, tf.DType] = 'float32',
               name: str = 'EnsembleMlp'):
    """`hidden_bias` sets every hidden bias to a constant (EDAC: 0.1);
    `last_layer_bound` draws the output layer from +-bound (SAC-N/EDAC:
    3e-3) instead of the default; `hidden_dtype_name` is what the hidden
    layers compute in (the module docstring)."""
    super().__init__(input_tensor_spec, state_spec=(), name=name)
    self.hidden_dtype = hidden_dtype(hidden_dtype_name)
    if num_members < 1:
      raise ValueError(f'an ensemble needs >= 1 member, got {num_members}')
    self.num_members = int(num_members)
    self.layer_norm = layer_norm
    in_size = sum(int(s.shape.num_elements())
                  for s in tf.nest.flatten(input_tensor_spec))
    sizes = [in_size] + [int(h) for h in hidden_layers] + [1]
    self._kernels, self._biases, self._scales, self._offsets = [], [], [], []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
      last = i == len(sizes) - 2
      bound = (last_layer_bound if last and last_layer_bound is not None
               else 1.0 / math.sqrt(fan_in))
      layer_seed = None if seed is None else seed * 1009 + 2 * i
      self._kernels.append(tf.Variable(
          _uniform([self.num_members, fan_in, fan_out], bound, layer_seed),
          name=f'kernel_{i}'))
      if not last and hidden_bias is not None:
        bias = lambda n=fan_out: tf.fill([self.num_members, 1, n],
                                         float(hidden_bias))
      else:
        bias = _uniform([self.num_members, 1, fan_out], bound,
                        None if seed is None else layer_seed + 1)
      self._biases.append(tf.Variable(bias, name=f'bias_{i}'))
      if layer_norm and not last:
        self._scales.append(tf.Variable(
            tf.ones([self.num_members, 1, fan_out]), name=f'ln_scale_{i}'))
        self._offsets.append(tf.Variable(
            tf.zeros([self.num_members, 1, fan_out]), name=f'ln_offset_{i}'))
    self.create_variables()  # Built now: targets copy from it at once.

  def members(self, x: tf.Tensor) -> tf.Tensor:
    """Q of each member: x [B, in] (shared) or [N, B, in] (one set of rows
    per member, as EDAC's per-member action gradients need) -> [N, B].

    Hidden layers are Dense -> ReLU (-> LayerNorm), the order of ReBRAC's
    critic (CORL's rebrac.py).
    """
    dtype, last = self.hidden_dtype, len(self._kernels) - 1
    pattern = 'bi,nio->nbo' if x.shape.rank == 2 else 'nbi,nio->nbo'
    h = self._dense(pattern, x, 0, dtype if last else tf.float32)
    for i in range(1, len(self._kernels)):
      h = tf.nn.relu(h)
      if self.layer_norm:
        h = tf.cast(h, tf.float32)
        mean, variance = tf.nn.moments(h, axes=[-1], keepdims=True)
        h = ((h - mean) * tf.math.rsqrt(variance + 1e-5) *
             self._scales[i - 1] + self._offsets[i - 1])
      h = self._dense('nbi,nio->nbo', h, i,
                      tf.float32 if i == last else dtype)
    return h[..., 0]

  def _dense(self, pattern: str, x: tf.Tensor, layer: int,
             dtype: tf.DType) -> tf.Tensor:
    """Layer `layer` computed in `dtype` (float32 weights cast to it)."""
    cast = lambda t: t if t.dtype == dtype else tf.cast(t, dtype)
    return (tf.einsum(pattern, cast(x), cast(self._kernels[layer])) +
            cast(self._biases[layer]))

  def flatten(self, inputs: Any) -> tf.Tensor:
    """The input nest as one float32 row per item: [B, in]."""
    flat = [tf.reshape(tf.cast(x, tf.float32), [tf.shape(x)[0], -1])
            for x in tf.nest.flatten(inputs)]
    return tf.concat(flat, axis=-1)

  def call(self, inputs, step_type=(), network_state=(), training=False):
    del step_type, training
    return tf.transpose(self.members(self.flatten(inputs))), network_state
