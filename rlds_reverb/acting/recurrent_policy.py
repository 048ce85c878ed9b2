"""A recurrent (GRU) actor as plain numpy: acting without TensorFlow.

The recurrent on-policy learner (`rlds_reverb.agents.actor_critic`) runs a
Keras `GRUCell` on the observation and its actor MLP on the cell's output.
Actors and evaluation step one env step at a time, where a TF call per step
costs more than the network itself, so this module replays the same
arithmetic in numpy, as `numpy_policy` does for the feed-forward actors.
The two must agree to float32 rounding: PPO's ratio compares the log-probs
the actor recorded with the learner's, and any drift between them reads as
a policy change.

The cell is Keras' default GRU (reset_after=True): the reset gate scales
the recurrent candidate after its bias, not the state before the matmul.
Its weights keep Keras' layout: `kernel` [in, 3u], `recurrent_kernel`
[u, 3u], `bias` [2, 3u] (input bias, then recurrent bias), gates in the
order update (z), reset (r), candidate (h) along the last axis.

The state is the cell's output h; it is reset to zeros at the step where an
episode starts, so an episode never sees its predecessor's memory. Callers
that roll out (`sample`) carry the state themselves; `greedy` keeps its own
for evaluation, where the rows of a batch are episodes that all start
together.

Files are `numpy_policy`-style .npz files with a 'recurrent' marker, so a
loader can tell the two apart (`is_recurrent_file`) before it picks one.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import numpy as np

from rlds_reverb.acting import numpy_policy

HEADS = ('gaussian', 'categorical')
_MARKER = 'gru'


def _sigmoid(x: np.ndarray) -> np.ndarray:
  # Via tanh: exact identity, and no overflow warning for large |x|.
  return 0.5 * (np.tanh(0.5 * x) + 1.0)


@dataclasses.dataclass
class RecurrentPolicy:
  """A GRU cell, then a tanh MLP, then a Gaussian or categorical head.

  Attributes:
    head: one of HEADS.
    gru_kernel: the cell's input weights [observation size, 3 * units].
    gru_recurrent_kernel: the cell's state weights [units, 3 * units].
    gru_bias: [2, 3 * units]: input bias, recurrent bias (Keras' layout for
      reset_after=True, which needs the two apart).
    kernels: the actor MLP's weight matrices [in, out] on the GRU output,
      first layer first; hidden layers are tanh, the last is linear.
    biases: one bias vector per kernel.
    action_low, action_high: the action bounds (greedy gaussian actions are
      clipped to them; categorical actions are action_low..action_high).
    log_std: the 'gaussian' head's state-independent log standard
      deviations [action size]; None for 'categorical'.
    obs_mean, obs_std: normalisation applied to observations, or None.
    obs_clip: normalised observations are clipped to +-obs_clip, or None.
    metadata: JSON-able facts about where the weights came from.
  """

  head: str
  gru_kernel: np.ndarray
  gru_recurrent_kernel: np.ndarray
  gru_bias: np.ndarray
  kernels: list[np.ndarray]
  biases: list[np.ndarray]
  action_low: np.ndarray
  action_high: np.ndarray
  log_std: np.ndarray | None
  obs_mean: np.ndarray | None = None
  obs_std: np.ndarray | None = None
  obs_clip: float | None = None
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

  def __post_init__(self):
    if self.head not in HEADS:
      raise ValueError(f'head must be one of {HEADS}, got {self.head!r}')
    if (self.head == 'gaussian') != (self.log_std is not None):
      raise ValueError("log_std goes with the 'gaussian' head, and only "
                       f"with it; head {self.head!r}, log_std "
                       f"{'given' if self.log_std is not None else 'None'}")
    self.gru_kernel = np.asarray(self.gru_kernel, np.float32)
    self.gru_recurrent_kernel = np.asarray(self.gru_recurrent_kernel,
                                           np.float32)
    self.gru_bias = np.asarray(self.gru_bias, np.float32)
    self.kernels = [np.asarray(k, np.float32) for k in self.kernels]
    self.biases = [np.asarray(b, np.float32) for b in self.biases]
    self.action_low = np.asarray(self.action_low)
    self.action_high = np.asarray(self.action_high)
    if self.log_std is not None:
      self.log_std = np.asarray(self.log_std, np.float32)
    self._check_shapes()
    if (self.obs_mean is None) != (self.obs_std is None):
      raise ValueError('obs_mean and obs_std go together; got obs_mean '
                       f"{'given' if self.obs_mean is not None else 'None'}, "
                       f"obs_std "
                       f"{'given' if self.obs_std is not None else 'None'}")
    self._eval_state: np.ndarray | None = None

  def _check_shapes(self) -> None:
    kernel = self.gru_kernel
    if kernel.ndim != 2 or kernel.shape[1] == 0 or kernel.shape[1] % 3:
      raise ValueError('gru_kernel must be [observation size, 3 * units], '
                       f'got shape {kernel.shape}')
    units = kernel.shape[1] // 3
    if self.gru_recurrent_kernel.shape != (units, 3 * units):
      raise ValueError(f'gru_recurrent_kernel must be [{units}, '
                       f'{3 * units}] for gru_kernel of shape '
                       f'{kernel.shape}, got shape '
                       f'{self.gru_recurrent_kernel.shape}')
    if self.gru_bias.shape != (2, 3 * units):
      raise ValueError(f'gru_bias must be [2, {3 * units}] (input and '
                       'recurrent bias, reset_after=True), got shape '
                       f'{self.gru_bias.shape}')
    if not self.kernels or len(self.kernels) != len(self.biases):
      raise ValueError(f'need one bias per kernel, got {len(self.kernels)} '
                       f'kernels and {len(self.biases)} biases')
    size = units
    for i, (k, b) in enumerate(zip(self.kernels, self.biases)):
      if k.ndim != 2 or k.shape[0] != size:
        want = 'the GRU units' if i == 0 else f'kernel_{i - 1}\'s outputs'
        raise ValueError(f'kernel_{i} must have {size} rows ({want}), got '
                         f'shape {k.shape}')
      if b.shape != (k.shape[1],):
        raise ValueError(f'bias_{i} must have shape ({k.shape[1]},) for '
                         f'kernel_{i} of shape {k.shape}, got shape '
                         f'{b.shape}')
      size = k.shape[1]
    if self.head == 'gaussian':
      if self.log_std.shape != (size,):
        raise ValueError(f'log_std must have shape ({size},), the MLP\'s '
                         f'output size, got shape {self.log_std.shape}')
    else:
      count = int(np.max(self.action_high)) - int(np.min(self.action_low)) + 1
      if count != size:
        raise ValueError(f'a categorical head over actions '
                         f'{self.action_low}..{self.action_high} needs '
                         f'{count} logits, the MLP gives {size}')

  @property
  def state_size(self) -> int:
    """The GRU units: the width of the state callers carry."""
    return int(self.gru_recurrent_kernel.shape[0])

  @property
  def observation_size(self) -> int:
    return int(self.gru_kernel.shape[0])

  def initial_state(self, batch: int) -> np.ndarray:
    """The state before any step: zeros, as Keras' GRU starts."""
    if batch < 0:
      raise ValueError(f'batch must be >= 0, got {batch}')
    return np.zeros((batch, self.state_size), np.float32)

  def _normalise(self, observations: np.ndarray) -> np.ndarray:
    x = np.asarray(observations, dtype=np.float32)
    if x.ndim != 2 or x.shape[-1] != self.observation_size:
      raise ValueError(f'policy takes observations [batch, '
                       f'{self.observation_size}], got shape {x.shape}')
    return numpy_policy.normalise(x, self.obs_mean, self.obs_std,
                                  self.obs_clip)

  def _gru(self, x: np.ndarray, h: np.ndarray) -> np.ndarray:
    x_z, x_r, x_h = np.split(x @ self.gru_kernel + self.gru_bias[0], 3, -1)
    r_z, r_r, r_h = np.split(
        h @ self.gru_recurrent_kernel + self.gru_bias[1], 3, -1)
    z = _sigmoid(x_z + r_z)
    r = _sigmoid(x_r + r_r)
    candidate = np.tanh(x_h + r * r_h)
    return (z * h + (1.0 - z) * candidate).astype(np.float32)

  def step(self, observations: np.ndarray, state: np.ndarray,
           starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One env step: (head output [B, k], new state [B, units]).

    `starts` is required, not defaulted to "no episode starts", because a
    forgotten reset silently leaks one episode's memory into the next.

    Args:
      observations: [B, observation size], raw (normalised here).
      state: [B, units], the state after the previous step of each row.
      starts: [B] bool, True where this step is an episode's first; those
        rows start from zeros.

    Raises:
      ValueError: shapes that do not fit the policy or each other.
    """
    x = self._normalise(observations)
    batch = x.shape[0]
    h = np.asarray(state, dtype=np.float32)
    if h.shape != (batch, self.state_size):
      raise ValueError(f'state must be [{batch}, {self.state_size}] for '
                       f'observations of shape {x.shape}, got shape '
                       f'{h.shape}')
    starts = np.asarray(starts, dtype=bool)
    if starts.shape != (batch,):
      raise ValueError(f'starts must be [{batch}] for observations of shape '
                       f'{x.shape}, got shape {starts.shape}')
    h = np.where(starts[:, None], np.float32(0.0), h)
    h = self._gru(x, h)
    out = h
    for kernel, bias in zip(self.kernels[:-1], self.biases[:-1]):
      out = np.tanh(out @ kernel + bias)
    out = out @ self.kernels[-1] + self.biases[-1]
    return out.astype(np.float32), h

  def sample(self, observations: np.ndarray, state: np.ndarray,
             starts: np.ndarray, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Explores: (actions, their log-probabilities, new state).

    Same conventions as `NumpyPolicy.sample` for these heads, so collection
    code treats both alike: gaussian samples are not clipped (PPO's ratio
    needs the density of what was drawn; the env clips), log-probs are
    float64; categorical actions are offset by action_low, int64.
    """
    out, new_state = self.step(observations, state, starts)
    if self.head == 'categorical':
      actions, log_prob = numpy_policy.sample_categorical(
          out, self.action_low, rng)
    else:
      actions, log_prob = numpy_policy.sample_gaussian(out, self.log_std, rng)
    return actions, log_prob, new_state

  def greedy(self, observations: np.ndarray) -> np.ndarray:
    """The mode, for evaluation, which calls with observations only.

    The state lives here because evaluation's act function carries none:
    the rows of the batch are separate episodes that all start at the first
    call after `reset()` (or after the batch size changes, which can only
    mean a new set of episodes).
    """
    x = np.asarray(observations)
    batch = x.shape[0] if x.ndim else 0
    if self._eval_state is None or self._eval_state.shape[0] != batch:
      state = self.initial_state(batch)
      starts = np.ones(batch, bool)
    else:
      state, starts = self._eval_state, np.zeros(batch, bool)
    out, self._eval_state = self.step(x, state, starts)
    if self.head == 'categorical':
      low = np.min(self.action_low).astype(np.int64)
      return (np.argmax(out, axis=-1) + low).astype(np.int64)
    return np.clip(out, self.action_low, self.action_high).astype(np.float32)

  def reset(self) -> None:
    """Forgets greedy's state: the next greedy call starts new episodes."""
    self._eval_state = None

  def save(self, path: str) -> None:
    """Writes an .npz (float32 weights, metadata as JSON, the marker)."""
    numpy_policy.save_arrays(
        path, self, recurrent=np.asarray(_MARKER),
        gru_kernel=self.gru_kernel.astype(np.float32),
        gru_recurrent_kernel=self.gru_recurrent_kernel.astype(np.float32),
        gru_bias=self.gru_bias.astype(np.float32))


def is_recurrent_file(path: str) -> bool:
  """Whether the .npz at `path` holds a RecurrentPolicy (has the marker).

  Lets a caller choose between this module's `load` and `numpy_policy`'s
  without a failed load on the wrong one. A file that is not an .npz at
  all holds no marker: False, and the chosen loader says what is wrong.

  Raises:
    FileNotFoundError: no file at `path`.
  """
  data = _open_npz(path)
  if data is None:
    return False
  with data:
    return 'recurrent' in data.files


def _open_npz(path: str) -> Any:
  """The open NpzFile at `path`, or None where it is no .npz."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f'no policy file at {path}')
  try:
    data = np.load(path, allow_pickle=False)
  except (ValueError, OSError, EOFError):
    return None
  if not isinstance(data, np.lib.npyio.NpzFile):
    return None
  return data


def load(path: str) -> RecurrentPolicy:
  """Reads a policy written by `RecurrentPolicy.save`.

  Raises:
    FileNotFoundError: no file at `path`.
    ValueError: the file is not such a policy.
  """
  data = _open_npz(path)
  if data is None:
    raise ValueError(f'{path} is not a policy file: not an .npz')
  with data:
    if 'recurrent' not in data.files:
      raise ValueError(f'{path} is not a recurrent policy file: no '
                       "'recurrent' marker (a numpy_policy file?)")
    marker = str(data['recurrent'])
    if marker != _MARKER:
      raise ValueError(f'{path} holds a recurrent policy of kind '
                       f'{marker!r}; this module reads {_MARKER!r}')
    try:
      count = sum(1 for key in data.files if key.startswith('kernel_'))
      return RecurrentPolicy(
          head=str(data['head']),
          gru_kernel=data['gru_kernel'],
          gru_recurrent_kernel=data['gru_recurrent_kernel'],
          gru_bias=data['gru_bias'],
          kernels=[data[f'kernel_{i}'] for i in range(count)],
          biases=[data[f'bias_{i}'] for i in range(count)],
          action_low=data['action_low'], action_high=data['action_high'],
          log_std=data['log_std'] if 'log_std' in data.files else None,
          obs_mean=data['obs_mean'] if 'obs_mean' in data.files else None,
          obs_std=data['obs_std'] if 'obs_std' in data.files else None,
          obs_clip=(float(data['obs_clip']) if 'obs_clip' in data.files
                    else None),
          metadata=json.loads(str(data['metadata'])))
    except KeyError as e:
      raise ValueError(f'{path} is not a policy file: missing {e}') from None
