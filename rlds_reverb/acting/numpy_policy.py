"""Policies as plain numpy: MLP weights in an .npz, no TensorFlow at run time.

Acting (data generation, evaluation, online collection) runs one tiny MLP
per environment step; a TF-Agents policy call costs a graph dispatch per
step, a numpy forward pass a few microseconds. The learner's actor network
is exported to this form after training (or every few thousand steps for the
online actor; `rlds_reverb.agents.export` reads the TF network, this
module never imports TensorFlow), and shipped behaviour policies are these
files.

Three heads, matching the TF-Agents networks the learners use:
  'tanh_normal'  ActorDistributionNetwork + TanhNormalProjectionNetwork (SAC,
                 CQL-SAC): output splits into mean and log std, the action is
                 tanh(mean + std * noise) scaled to the action bounds.
  'deterministic' ddpg.ActorNetwork (TD3, TD3+BC, BC): tanh output scaled
                 to the action bounds.
  'q_argmax'     QNetwork / DuelingQNetwork (DQN): the outputs are Q-values
                 of the discrete actions action_low..action_high; greedy is
                 their argmax, exploration epsilon-greedy.
  'gaussian'     on-policy actors (PPO, A2C) and AWAC's: the output is the
                 mean of a Gaussian with a state-independent `log_std`;
                 samples are not squashed (the env clips them), greedy is
                 the mean clipped to the bounds.
  'tanh_mean_gaussian'  IQL's actor: as 'gaussian', but the mean is the
                 output's tanh scaled to the action bounds.
  'categorical'  on-policy actors with discrete actions: the outputs are
                 logits of action_low..action_high.
Hidden layers are relu, or tanh where `activation` says so (PPO's).
Image policies (the Nature DQN encoder, `agents.image_networks`) run their
valid convolutions first, on uint8 frame-major stacks ([k, H, W] or
[k, H, W, C]) scaled by `obs_scale` and moved to channel-last ([H, W, k]
or [H, W, k * C]) as the Keras networks move them, and flatten
channel-last as Keras does.
Observations are normalised with (obs - obs_mean) / obs_std first when the
policy carries those statistics (TD3+BC trains on normalised states).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

HEADS = ('tanh_normal', 'deterministic', 'q_argmax', 'gaussian',
         'tanh_mean_gaussian', 'categorical')
# The heads whose policies carry a state-independent `log_std`.
GAUSSIAN_HEADS = ('gaussian', 'tanh_mean_gaussian')
ACTIVATIONS = ('relu', 'tanh')
_LOG_SQRT_2PI = 0.5 * np.log(2.0 * np.pi)


def normalise(observations: np.ndarray, obs_mean: np.ndarray | None,
              obs_std: np.ndarray | None, obs_clip: float | None
              ) -> np.ndarray:
  """(obs - obs_mean) / obs_std, clipped to +-obs_clip, as float32; each
  part only where the policy carries it."""
  x = np.asarray(observations, dtype=np.float32)
  if obs_mean is not None:
    x = ((x - obs_mean) / obs_std).astype(np.float32)
  if obs_clip is not None:
    x = np.clip(x, -obs_clip, obs_clip)
  return x


def conv2d(x: np.ndarray, kernel: np.ndarray, bias: np.ndarray,
           stride: int) -> np.ndarray:
  """A valid 2-D convolution of [B, H, W, C] by [kh, kw, C, F], as Keras'
  Conv2D computes it, through one matrix product of the strided windows."""
  kh, kw = kernel.shape[:2]
  windows = np.lib.stride_tricks.sliding_window_view(
      x, (kh, kw), axis=(1, 2))[:, ::stride, ::stride]  # [B, h, w, C, kh, kw]
  return np.tensordot(windows, kernel.transpose(2, 0, 1, 3),
                      axes=([3, 4, 5], [0, 1, 2])) + bias


def sample_gaussian(mean: np.ndarray, log_std: np.ndarray,
                    rng: np.random.Generator
                    ) -> tuple[np.ndarray, np.ndarray]:
  """Unclipped samples of N(mean, exp(log_std)^2) (float32) and their
  log-densities (float64): PPO's ratio needs the density of what was drawn,
  and the env clips."""
  mean = np.asarray(mean, np.float64)
  log_std = np.asarray(log_std, np.float64)
  noise = rng.standard_normal(mean.shape)
  actions = mean + np.exp(log_std) * noise
  log_prob = np.sum(-0.5 * noise**2 - _LOG_SQRT_2PI - log_std, axis=-1)
  return actions.astype(np.float32), log_prob


def sample_categorical(logits: np.ndarray, action_low: Any,
                       rng: np.random.Generator
                       ) -> tuple[np.ndarray, np.ndarray]:
  """Draws from softmax(logits): actions offset by action_low (int64) and
  their log-probabilities (float64)."""
  logits = np.asarray(logits, np.float64)
  log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  cumulative = np.cumsum(np.exp(log_probs), axis=-1)
  draws = rng.random(logits.shape[:-1] + (1,)) * cumulative[..., -1:]
  chosen = np.minimum(np.sum(cumulative < draws, axis=-1),
                      logits.shape[-1] - 1)
  log_prob = np.take_along_axis(log_probs, chosen[..., None], -1)[..., 0]
  low = np.int64(np.min(action_low))
  return (chosen + low).astype(np.int64), log_prob


def mix_uniform(log_probs: np.ndarray, epsilon: float) -> np.ndarray:
  """log((1 - epsilon) pi + epsilon / n): the distribution of a policy
  whose action is replaced by a uniform one with probability `epsilon`
  (exploration noise on discrete actions, as DQN's epsilon-greedy)."""
  n = log_probs.shape[-1]
  return np.log((1.0 - epsilon) * np.exp(np.asarray(log_probs, np.float64))
                + epsilon / n)


@dataclasses.dataclass
class NumpyPolicy:
  """An MLP actor: relu hidden layers, linear last layer, a head on top.

  Attributes:
    head: one of HEADS.
    kernels: weight matrices [in, out], first layer first.
    biases: bias vectors, one per kernel.
    action_low, action_high: the action bounds the head scales to.
    obs_mean, obs_std: normalisation applied to observations, or None.
    obs_clip: normalised observations are clipped to +-obs_clip (HER's
      running normalisation), or None.
    metadata: JSON-able facts about where the weights came from.
    activation: of the hidden layers, one of ACTIVATIONS.
    log_std: a GAUSSIAN_HEADS head's log standard deviations [action
      size].
    conv_kernels, conv_biases, conv_strides: valid ReLU convolutions run
      on the observation before the MLP (image policies), or None.
    obs_scale: image observations are multiplied by it first (1/255).
    input_shape: an image policy's observation shape (frame-major stacks
      [k, H, W] or [k, H, W, C]).
  """

  head: str
  kernels: list[np.ndarray]
  biases: list[np.ndarray]
  action_low: np.ndarray
  action_high: np.ndarray
  obs_mean: np.ndarray | None = None
  obs_std: np.ndarray | None = None
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
  obs_clip: float | None = None
  activation: str = 'relu'
  log_std: np.ndarray | None = None
  conv_kernels: list[np.ndarray] | None = None
  conv_biases: list[np.ndarray] | None = None
  conv_strides: list[int] | None = None
  obs_scale: float | None = None
  input_shape: list[int] | None = None

  def __post_init__(self):
    if self.head not in HEADS:
      raise ValueError(f'head must be one of {HEADS}, got {self.head!r}')
    if self.activation not in ACTIVATIONS:
      raise ValueError(f'activation must be one of {ACTIVATIONS}, got '
                       f'{self.activation!r}')
    if (self.head in GAUSSIAN_HEADS) != (self.log_std is not None):
      raise ValueError(f'log_std goes with the heads {GAUSSIAN_HEADS}, and '
                       f"only with them; head {self.head!r}, log_std "
                       f"{'given' if self.log_std is not None else 'None'}")
    if not self.kernels or len(self.kernels) != len(self.biases):
      raise ValueError(f'need one bias per kernel, got {len(self.kernels)} '
                       f'kernels and {len(self.biases)} biases')
    convs = (self.conv_kernels, self.conv_biases, self.conv_strides)
    if any(c is not None for c in convs) and (
        any(c is None for c in convs) or len({len(c) for c in convs}) != 1):
      raise ValueError('conv_kernels, conv_biases and conv_strides go '
                       'together, one of each per convolution')
    self._center = (self.action_high + self.action_low) / 2.0
    self._magnitude = (self.action_high - self.action_low) / 2.0

  @property
  def observation_size(self) -> int:
    return int(self.kernels[0].shape[0])

  @property
  def action_size(self) -> int:
    return int(self.action_low.shape[0])

  def _encode_image(self, observations: np.ndarray) -> np.ndarray:
    x = np.asarray(observations)
    if self.input_shape is None or list(x.shape[1:]) != list(
        self.input_shape):
      raise ValueError(f'policy takes image stacks [batch] + '
                       f'{self.input_shape}, got shape {x.shape}')
    x = x.astype(np.float32)
    if self.obs_scale is not None:
      x = x * np.float32(self.obs_scale)
    x = np.moveaxis(x, 1, 3)  # [B, H, W, k(, C)]
    x = x.reshape(x.shape[:3] + (-1,))
    for kernel, bias, stride in zip(self.conv_kernels, self.conv_biases,
                                    self.conv_strides):
      x = np.maximum(conv2d(x, kernel, bias, stride), 0.0)
    return x.reshape(len(x), -1).astype(np.float32)

  def _last_layer(self, observations: np.ndarray) -> np.ndarray:
    if self.conv_kernels is not None:
      observations = self._encode_image(observations)
    x = np.asarray(observations, dtype=np.float32)
    if x.shape[-1] != self.observation_size:
      raise ValueError(f'policy takes observations of size '
                       f'{self.observation_size}, got shape {x.shape}')
    # The dense layers run in float64 and the heads round to float32: a
    # float32 product's last bits depend on which BLAS kernel the CPU gets
    # (OpenBLAS picks one per CPU model), and one bit of an action makes a
    # MuJoCo episode diverge, so a float32 pass records a different dataset
    # of the same seed on each kind of CPU. float64's differences are far
    # below float32's rounding, where they (almost always) vanish.
    x = normalise(x, self.obs_mean, self.obs_std, self.obs_clip).astype(
        np.float64)
    hidden = np.tanh if self.activation == 'tanh' else (
        lambda h: np.maximum(h, 0.0))
    for kernel, bias in zip(self.kernels[:-1], self.biases[:-1]):
      x = hidden(x @ kernel + bias)
    return x @ self.kernels[-1] + self.biases[-1]

  def greedy(self, observations: np.ndarray) -> np.ndarray:
    """The mode: what evaluation runs (TF-Agents' GreedyPolicy)."""
    out = self._last_layer(observations)
    if self.head in ('q_argmax', 'categorical'):
      return (np.argmax(out, axis=-1) + self.action_low).astype(np.int64)
    if self.head == 'gaussian':
      return np.clip(out, self.action_low, self.action_high).astype(
          np.float32)
    if self.head == 'tanh_normal':
      out = out[..., :self.action_size]
    # 'deterministic', 'tanh_mean_gaussian' and 'tanh_normal': tanh(mean).
    return (self._center + self._magnitude * np.tanh(out)).astype(np.float32)

  def action_log_probs(self, observations: np.ndarray) -> np.ndarray:
    """A categorical policy's log-probabilities of every action [B, n]."""
    if self.head != 'categorical':
      raise ValueError("action_log_probs needs a 'categorical' head, not "
                       f'{self.head!r}')
    logits = self._last_layer(observations).astype(np.float64)
    return logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)

  def sample(self, observations: np.ndarray, rng: np.random.Generator,
             noise_std: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Explores: returns (actions, log-probabilities of those actions).

    The tanh-normal head samples its own distribution (log-probs exact).
    The deterministic head adds Gaussian noise of `noise_std` (in action
    units, clipped to the bounds, as TD3's collect policy); its log-prob is
    NaN, since a clipped Gaussian has no density at the bounds. The
    gaussian and categorical heads sample their distributions; gaussian
    samples (either Gaussian head's) are unbounded (what PPO's ratio needs;
    the env clips them).
    """
    if self.head == 'q_argmax':
      raise ValueError("a 'q_argmax' policy explores with epsilon_greedy")
    out = self._last_layer(observations)
    if self.head == 'categorical':
      return sample_categorical(out, self.action_low, rng)
    if self.head == 'gaussian':
      return sample_gaussian(out, self.log_std, rng)
    if self.head == 'tanh_mean_gaussian':
      return sample_gaussian(self._center + self._magnitude * np.tanh(out),
                             self.log_std, rng)
    if self.head == 'deterministic':
      actions = self._center + self._magnitude * np.tanh(out)
      if noise_std > 0:
        actions = actions + rng.normal(0.0, noise_std, actions.shape)
      actions = np.clip(actions, self.action_low, self.action_high)
      return (actions.astype(np.float32),
              np.full(actions.shape[:-1], np.nan, dtype=np.float64))
    mean, log_std = np.split(out.astype(np.float64), 2, axis=-1)
    std = np.exp(log_std)
    noise = rng.standard_normal(mean.shape)
    pre_tanh = mean + std * noise
    squashed = np.tanh(pre_tanh)
    # log(1 - tanh(u)^2), stable for large |u|.
    log_det = 2.0 * (np.log(2.0) - pre_tanh - np.logaddexp(0.0, -2.0 * pre_tanh))
    log_prob = np.sum(-0.5 * noise**2 - _LOG_SQRT_2PI - log_std - log_det
                      - np.log(self._magnitude), axis=-1)
    actions = self._center + self._magnitude * squashed
    return actions.astype(np.float32), log_prob

  def epsilon_greedy(self, observations: np.ndarray, rng: np.random.Generator,
                     epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """DQN's exploration: a uniform action with probability epsilon.

    Returns (actions, their log-probabilities under the epsilon-greedy
    distribution).
    """
    if self.head != 'q_argmax':
      raise ValueError(f'epsilon_greedy needs a q_argmax policy, this one is '
                       f'{self.head!r}')
    q_values = self._last_layer(observations)
    count = q_values.shape[-1]
    greedy = np.argmax(q_values, axis=-1)
    explore = rng.random(greedy.shape) < epsilon
    chosen = np.where(explore, rng.integers(0, count, greedy.shape), greedy)
    probability = epsilon / count + (1.0 - epsilon) * (chosen == greedy)
    return ((chosen + self.action_low).astype(np.int64),
            np.log(probability))

  def save(self, path: str) -> None:
    """Writes an .npz (float32 weights, metadata as JSON)."""
    extra = ({} if self.activation == 'relu' else
             {'activation': np.asarray(self.activation)})
    save_arrays(path, self, **extra)


def save_arrays(path: str, policy: Any, **extra: np.ndarray) -> None:
  """Writes what every policy file holds (head, MLP weights as float32,
  action bounds, observation statistics, log std, metadata as JSON) and
  `extra`, through a temporary file: a crash never leaves half a policy."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  arrays = {**extra, 'head': np.asarray(policy.head),
            'action_low': policy.action_low,
            'action_high': policy.action_high,
            'metadata': np.asarray(json.dumps(policy.metadata,
                                              sort_keys=True))}
  for i, (kernel, bias) in enumerate(zip(policy.kernels, policy.biases)):
    arrays[f'kernel_{i}'] = kernel.astype(np.float32)
    arrays[f'bias_{i}'] = bias.astype(np.float32)
  if policy.obs_mean is not None:
    arrays['obs_mean'] = policy.obs_mean
    arrays['obs_std'] = policy.obs_std
  if policy.obs_clip is not None:
    arrays['obs_clip'] = np.asarray(policy.obs_clip)
  if policy.log_std is not None:
    arrays['log_std'] = policy.log_std.astype(np.float32)
  if getattr(policy, 'conv_kernels', None) is not None:
    for i, (kernel, bias) in enumerate(zip(policy.conv_kernels,
                                           policy.conv_biases)):
      arrays[f'conv_kernel_{i}'] = kernel.astype(np.float32)
      arrays[f'conv_bias_{i}'] = bias.astype(np.float32)
    arrays['conv_strides'] = np.asarray(policy.conv_strides, np.int64)
    if policy.input_shape is not None:
      arrays['input_shape'] = np.asarray(policy.input_shape, np.int64)
    if policy.obs_scale is not None:
      arrays['obs_scale'] = np.asarray(policy.obs_scale, np.float32)
  tmp = f'{path}.tmp.npz'
  np.savez_compressed(tmp, **arrays)
  os.replace(tmp, path)


def load(path: str) -> NumpyPolicy:
  """Reads a policy written by `NumpyPolicy.save`.

  Raises:
    FileNotFoundError: no file at `path`.
    ValueError: the file is not such a policy.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f'no policy file at {path}')
  with np.load(path, allow_pickle=False) as data:
    if 'recurrent' in data.files:
      raise ValueError(f'{path} is a recurrent (GRU) policy: load it with '
                       'rlds_reverb.acting.recurrent_policy.load')
    try:
      count = sum(1 for key in data.files if key.startswith('kernel_'))
      convs = sum(1 for key in data.files if key.startswith('conv_kernel_'))
      image = {} if not convs else dict(
          conv_kernels=[data[f'conv_kernel_{i}'] for i in range(convs)],
          conv_biases=[data[f'conv_bias_{i}'] for i in range(convs)],
          conv_strides=[int(s) for s in data['conv_strides']],
          obs_scale=(float(data['obs_scale']) if 'obs_scale' in data.files
                     else None),
          input_shape=([int(d) for d in data['input_shape']]
                       if 'input_shape' in data.files else None))
      return NumpyPolicy(
          head=str(data['head']),
          kernels=[data[f'kernel_{i}'] for i in range(count)],
          biases=[data[f'bias_{i}'] for i in range(count)],
          action_low=data['action_low'], action_high=data['action_high'],
          obs_mean=data['obs_mean'] if 'obs_mean' in data.files else None,
          obs_std=data['obs_std'] if 'obs_std' in data.files else None,
          obs_clip=(float(data['obs_clip']) if 'obs_clip' in data.files
                    else None),
          metadata=json.loads(str(data['metadata'])),
          activation=(str(data['activation']) if 'activation' in data.files
                      else 'relu'),
          log_std=data['log_std'] if 'log_std' in data.files else None,
          **image)
    except KeyError as e:
      raise ValueError(f'{path} is not a policy file: missing {e}') from None
