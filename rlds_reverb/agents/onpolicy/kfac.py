"""K-FAC for Dense and Conv2D layers in TF2: the natural-gradient step of
ACKTR (Wu et al. 2017), written for the toolkit.

No maintained TF2 K-FAC library exists, so this is a small one. Each layer
with weights W (kernel and bias stacked as one [in + 1, out] matrix) keeps
two running factors of its Fisher block F ~ A (x) G (Martens & Grosse
2015):

  A = E[a a^T]    a: the layer's input with a 1 appended (the bias)
  G = E[g g^T]    g: d(per-sample Fisher loss) / d(layer's output, before
                  its activation)

For a convolution (KFC, Grosse & Martens 2016) a runs over the input
patches and g over the output positions; with T positions A averages over
all of them and G sums over positions, so that A (x) G = T E_t[a a^T] (x)
E_t[g g^T], the block under spatially uncorrelated derivatives.

A step: eigendecompose A = Qa Da Qa^T and G = Qg Dg Qg^T (every
`inverse_interval` steps), take the damped natural gradient of each layer

  V = Qa [(Qa^T grad Qg) / (da dg^T + damping)] Qg^T
    = (A (x) G + damping I)^-1 grad

scale all layers by nu = min(1, sqrt(kl_clip / (lr^2 sum V . grad))), the
trust region that keeps the step's predicted KL under kl_clip, and apply it
with momentum SGD. A Gaussian policy's state-independent log std is one
more block with a = 1 (the seed codebase's AddBias).

The Fisher loss is the sampled one of ACKTR: -log pi(a|s) of actions drawn
from the policy, and -(V - (V + noise))^2 for the critic (a Gaussian
output of unit variance), whose gradients by the pre-activations give g.
Defaults are the seed codebase's and OpenAI baselines' (lr 0.25, momentum
0.9, stat decay 0.99, kl clip 0.001, damping 0.01, inverses every 10
steps).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np
import tensorflow as tf


@dataclasses.dataclass
class Capture:
  """What one layer's factors need from a forward pass.

  Attributes:
    kind: 'dense', 'conv' or 'bias' (the Gaussian log std).
    inputs: the layer's input (a Conv2D's [B, H, W, C]; a Dense's [B, in]).
    output: the layer's output before its activation; the Fisher loss's
      gradient by it is g.
    variables: kernel then bias (one variable for 'bias').
    strides, padding: a convolution's.
  """
  kind: str
  inputs: tf.Tensor
  output: tf.Tensor
  variables: tuple[tf.Variable, ...]
  strides: int = 1
  padding: str = 'VALID'
  kernel_size: tuple[int, int] = (1, 1)


def _dense(layer: tf.keras.layers.Dense, x: tf.Tensor,
           captures: list[Capture]) -> tf.Tensor:
  x = tf.cast(x, tf.float32)
  z = tf.matmul(x, layer.kernel)
  if layer.use_bias:
    z = z + layer.bias
  captures.append(Capture('dense', x, z, tuple(
      [layer.kernel] + ([layer.bias] if layer.use_bias else []))))
  return layer.activation(z)


def _conv(layer: tf.keras.layers.Conv2D, x: tf.Tensor,
          captures: list[Capture]) -> tf.Tensor:
  if layer.data_format != 'channels_last' or tuple(
      layer.dilation_rate) != (1, 1) or layer.groups != 1:
    raise ValueError(f'K-FAC takes channels-last, undilated, ungrouped '
                     f'Conv2D layers; {layer.name} is not')
  if layer.strides[0] != layer.strides[1]:
    raise ValueError(f'K-FAC takes square strides; {layer.name} has '
                     f'{layer.strides}')
  x = tf.cast(x, tf.float32)
  padding = layer.padding.upper()
  z = tf.nn.conv2d(x, layer.kernel, layer.strides[0], padding)
  if layer.use_bias:
    z = z + layer.bias
  captures.append(Capture(
      'conv', x, z,
      tuple([layer.kernel] + ([layer.bias] if layer.use_bias else [])),
      strides=int(layer.strides[0]), padding=padding,
      kernel_size=tuple(int(k) for k in layer.kernel_size)))
  return layer.activation(z)


def run_sequential(model: tf.keras.Sequential, x: tf.Tensor,
                   captures: list[Capture]) -> tf.Tensor:
  """`model(x)`, layer by layer, capturing each Dense and Conv2D layer's
  input and pre-activation output; other layers (Rescaling, Flatten) must
  hold no weights."""
  for layer in model.layers:
    if isinstance(layer, tf.keras.layers.Dense):
      x = _dense(layer, x, captures)
    elif isinstance(layer, tf.keras.layers.Conv2D):
      x = _conv(layer, x, captures)
    elif layer.trainable_weights:
      raise ValueError(f'K-FAC handles Dense and Conv2D layers; '
                       f'{layer.name} ({type(layer).__name__}) has weights')
    else:
      x = layer(x)
  return x


def log_std_capture(log_std: tf.Variable, batch: Any,
                    captures: list[Capture],
                    tape: tf.GradientTape | None = None) -> tf.Tensor:
  """The log std broadcast to [batch, d] through a zero output whose
  gradient is each sample's (the log std's 'bias' block); `tape` watches
  that output."""
  zeros = tf.zeros(tf.stack([batch, log_std.shape[0]]))
  if tape is not None:
    tape.watch(zeros)
  captures.append(Capture('bias', tf.ones([batch, 1]), zeros, (log_std,)))
  return log_std + zeros


def _patches(capture: Capture) -> tf.Tensor:
  """The input patches [B * positions, kh * kw * C], ordered as the
  kernel's [kh, kw, C, out] reshaped to rows."""
  kh, kw = capture.kernel_size
  s = capture.strides
  patches = tf.image.extract_patches(
      capture.inputs, sizes=[1, kh, kw, 1], strides=[1, s, s, 1],
      rates=[1, 1, 1, 1], padding=capture.padding)
  return tf.reshape(patches, [-1, patches.shape[-1]])


def factors(capture: Capture, output_grad: tf.Tensor, batch: Any
            ) -> tuple[tf.Tensor, tf.Tensor]:
  """This batch's A and G of one layer. `output_grad` is the gradient of
  the batch's mean Fisher loss by the layer's output, so each sample's is
  `batch` times it."""
  size = tf.cast(batch, tf.float32)
  grads = tf.reshape(output_grad * size, [-1, output_grad.shape[-1]])
  rows = tf.cast(tf.shape(grads)[0], tf.float32)
  if capture.kind == 'conv':
    inputs = _patches(capture)
  else:
    inputs = tf.reshape(capture.inputs, [-1, capture.inputs.shape[-1]])
  if capture.kind != 'bias' and len(capture.variables) == 2:
    inputs = tf.concat([inputs, tf.ones_like(inputs[:, :1])], axis=1)
  a = tf.matmul(inputs, inputs, transpose_a=True) / rows
  # Rows are samples x positions: E_t over positions in A, sum over them
  # in G (see the module's docstring).
  g = tf.matmul(grads, grads, transpose_a=True) / size
  return a, g


def as_matrix(capture: Capture, grads: Sequence[tf.Tensor]) -> tf.Tensor:
  """A layer's gradients as one [in (+1), out] matrix (kernel rows, then
  the bias row)."""
  if capture.kind == 'bias':
    return tf.reshape(grads[0], [1, -1])
  kernel = tf.reshape(grads[0], [-1, grads[0].shape[-1]])
  if len(grads) == 2:
    kernel = tf.concat([kernel, grads[1][None]], axis=0)
  return kernel


def from_matrix(capture: Capture, matrix: tf.Tensor) -> list[tf.Tensor]:
  """`as_matrix`'s inverse: one tensor per variable."""
  if capture.kind == 'bias':
    return [tf.reshape(matrix, capture.variables[0].shape)]
  kernel = capture.variables[0]
  rows = matrix[:-1] if len(capture.variables) == 2 else matrix
  parts = [tf.reshape(rows, kernel.shape)]
  if len(capture.variables) == 2:
    parts.append(matrix[-1])
  return parts


class KfacOptimizer(tf.Module):
  """Running K-FAC factors, their eigenbases, and the momentum of the
  natural-gradient steps of the layers `captures` names.

  Built on the first `apply` (the layers are known then); every variable
  is an attribute, so a `tf.train.Checkpoint` holding the optimizer holds
  them all.
  """

  def __init__(self, learning_rate: float = 0.25, *, momentum: float = 0.9,
               stat_decay: float = 0.99, kl_clip: float = 0.001,
               damping: float = 0.01, inverse_interval: int = 10,
               name: str = 'kfac'):
    super().__init__(name=name)
    for label, value in (('learning_rate', learning_rate),
                         ('kl_clip', kl_clip), ('damping', damping)):
      if not value > 0:
        raise ValueError(f'K-FAC {label} must be > 0, got {value}')
    if not 0 <= momentum < 1 or not 0 <= stat_decay < 1:
      raise ValueError(f'K-FAC momentum and stat_decay must be in [0, 1), '
                       f'got {momentum} and {stat_decay}')
    if inverse_interval < 1:
      raise ValueError(f'K-FAC inverse_interval must be >= 1, got '
                       f'{inverse_interval}')
    self.learning_rate = tf.Variable(float(learning_rate), trainable=False,
                                     name='learning_rate')
    self.momentum, self.stat_decay = float(momentum), float(stat_decay)
    self.kl_clip, self.damping = float(kl_clip), float(damping)
    self.inverse_interval = int(inverse_interval)
    self.iterations = tf.Variable(0, dtype=tf.int64, trainable=False,
                                  name='iterations')
    self.blocks: list[dict[str, tf.Variable]] = []

  def build(self, captures: Sequence[Capture]) -> None:
    """Makes each layer's variables (once; later calls check the layout)."""
    if self.blocks:
      if len(self.blocks) != len(captures):
        raise ValueError(f'K-FAC was built for {len(self.blocks)} layers, '
                         f'called with {len(captures)}')
      return
    for index, capture in enumerate(captures):
      shape = self._matrix_shape(capture)
      zeros = lambda n, what: tf.Variable(  # noqa: E731
          tf.zeros([n, n] if what[0] in 'aqg' else [n]), trainable=False,
          name=f'layer{index}_{what}')
      rows, cols = shape
      self.blocks.append({
          'a': zeros(rows, 'a'), 'g': zeros(cols, 'g'),
          'q_a': zeros(rows, 'q_a'), 'q_g': zeros(cols, 'q_g'),
          'd_a': zeros(rows, 'd_a'), 'd_g': zeros(cols, 'd_g'),
          'velocity': tf.Variable(tf.zeros(shape), trainable=False,
                                  name=f'layer{index}_velocity')})

  @staticmethod
  def _matrix_shape(capture: Capture) -> tuple[int, int]:
    if capture.kind == 'bias':
      return 1, int(capture.variables[0].shape[0])
    kernel = capture.variables[0].shape
    rows = 1
    for size in kernel[:-1]:
      rows *= int(size)
    return rows + (len(capture.variables) == 2), int(kernel[-1])

  def update_factors(self, captures: Sequence[Capture],
                     output_grads: Sequence[tf.Tensor], batch: int) -> None:
    """Folds this batch's factors into the running ones (the first batch
    sets them)."""
    first = tf.equal(self.iterations, 0)
    decay = tf.where(first, 0.0, self.stat_decay)
    for block, capture, grad in zip(self.blocks, captures, output_grads):
      a, g = factors(capture, grad, batch)
      block['a'].assign(decay * block['a'] + (1.0 - decay) * a)
      block['g'].assign(decay * block['g'] + (1.0 - decay) * g)

  def _refresh_eigenbases(self) -> None:
    for block in self.blocks:
      for side in ('a', 'g'):
        values, vectors = _eigh(block[side])
        # Eigenvalues below 1e-6 are rounding noise of a PSD matrix.
        block['d_' + side].assign(tf.where(values > 1e-6, values, 0.0))
        block['q_' + side].assign(vectors)

  def natural_gradients(self, gradients: Sequence[tf.Tensor]
                        ) -> list[tf.Tensor]:
    """(A (x) G + damping I)^-1 grad of each layer, from the eigenbases."""
    steps = []
    for block, grad in zip(self.blocks, gradients):
      q_a, q_g = block['q_a'], block['q_g']
      rotated = tf.matmul(tf.matmul(q_a, grad, transpose_a=True), q_g)
      scaled = rotated / (block['d_a'][:, None] * block['d_g'][None, :] +
                          self.damping)
      steps.append(tf.matmul(tf.matmul(q_a, scaled), q_g, transpose_b=True))
    return steps

  def apply(self, captures: Sequence[Capture],
            gradients: Sequence[Sequence[tf.Tensor]],
            output_grads: Sequence[tf.Tensor], batch: int
            ) -> dict[str, tf.Tensor]:
    """One K-FAC step: update the factors, refresh the eigenbases when due,
    and move each layer's variables along its clipped natural gradient
    with momentum. `gradients` are each layer's loss gradients (per
    variable). Returns the step's trust-region scale nu and
    sum V . grad."""
    self.build(captures)
    self.update_factors(captures, output_grads, batch)
    tf.cond(tf.equal(self.iterations % self.inverse_interval, 0),
            self._refresh_eigenbases_op, lambda: tf.constant(False))
    matrices = [as_matrix(c, g) for c, g in zip(captures, gradients)]
    steps = self.natural_gradients(matrices)
    lr = self.learning_rate
    vg = tf.add_n([tf.reduce_sum(v * g) for v, g in zip(steps, matrices)])
    nu = tf.minimum(1.0, tf.sqrt(self.kl_clip / tf.maximum(
        vg * lr * lr, 1e-20)))
    for block, capture, step in zip(self.blocks, captures, steps):
      # The seed's SGD(lr (1 - momentum), momentum) on nu V.
      velocity = block['velocity']
      velocity.assign(self.momentum * velocity + nu * step)
      for variable, delta in zip(capture.variables,
                                 from_matrix(capture, velocity)):
        variable.assign_sub(lr * (1.0 - self.momentum) * delta)
    self.iterations.assign_add(1)
    return {'kfac_nu': nu, 'kfac_vg': vg}

  def _refresh_eigenbases_op(self) -> tf.Tensor:
    self._refresh_eigenbases()
    return tf.constant(True)


def _eigh(matrix: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """LAPACK's divide-and-conquer eigh through numpy, in float64: a CNN's
  fully connected factor is large, and TF's eigh is the slower one
  (docs/onpolicy.md)."""

  def decompose(m):
    values, vectors = np.linalg.eigh(m.astype(np.float64))
    return values.astype(np.float32), vectors.astype(np.float32)

  values, vectors = tf.numpy_function(decompose, [matrix],
                                      (tf.float32, tf.float32))
  values.set_shape(matrix.shape[:1])
  vectors.set_shape(matrix.shape)
  return values, vectors


def forward(model: Any, observations: tf.Tensor,
            tape: tf.GradientTape | None = None
            ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor | None, list[Capture]]:
  """The actor's output, the value and the log std (broadcast to [B, d])
  of an on-policy model (`actor_critic.ActorCritic` or `CnnActorCritic`),
  with every layer captured in the order the optimizer keeps them; `tape`
  watches the log std's per-sample output."""
  if getattr(model, 'recurrent', False):
    raise ValueError('ACKTR (K-FAC) takes feed-forward models; the '
                     'recurrent GRU policy is not supported')
  captures: list[Capture] = []
  features = observations
  trunk = getattr(model, 'trunk', None)
  if trunk is not None:
    features = run_sequential(trunk, observations, captures)
  out = run_sequential(model.actor, features, captures)
  value = run_sequential(model.critic, features, captures)[:, 0]
  log_std = None
  if model.log_std is not None:
    log_std = log_std_capture(model.log_std, tf.shape(observations)[0],
                              captures, tape)
  return out, value, log_std, captures


def check_covers(captures: Sequence[Capture],
                 weights: Sequence[tf.Variable]) -> None:
  """Raises ValueError unless the captured layers hold exactly `weights`
  (a weight K-FAC did not see would never move)."""
  seen = {id(v) for v in variables_of(captures)}
  missed = [w.name for w in weights if id(w) not in seen]
  if missed or len(seen) != len(weights):
    raise ValueError(f'K-FAC captures {len(seen)} weights of the model\'s '
                     f'{len(weights)}; not captured: {missed}')


def variables_of(captures: Sequence[Capture]) -> list[tf.Variable]:
  return [v for capture in captures for v in capture.variables]


def group(flat: Sequence[Any], captures: Sequence[Capture]
          ) -> list[list[Any]]:
  """`flat` (one entry per variable, in `variables_of` order) per layer."""
  grouped, at = [], 0
  for capture in captures:
    grouped.append(list(flat[at:at + len(capture.variables)]))
    at += len(capture.variables)
  return grouped

