"""Exported policies as TF-Agents SavedModels (`PolicySaver`).

A run's policy leaves as `policy.npz` (acting without TensorFlow); TF-Agents
tools load SavedModels. `MlpPolicy` is the npz policy as a TF-Agents
`TFPolicy`, the same weights and the same forward pass in TF ops, with
everything the numpy policy applies to an env observation inside it: the
goal dict flattened to concat(observation, desired_goal), the observation
normalisation and its clip. Built from the exported numpy policy, it is
one code path for every agent (TF-Agents' SAC and DQN as the toolkit's
own IQL or PPO), and its greedy actions equal the npz policy's.

  greedy   the mode, as `NumpyPolicy.greedy` (evaluation)
  collect  tanh-normal and Gaussian heads sample, deterministic heads add
           clipped Gaussian noise, Q-value heads act epsilon-greedily
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import numpy as np
import tensorflow as tf
from tf_agents.policies import policy_saver
from tf_agents.policies import tf_policy
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts

from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import image_networks

GREEDY_DIR = 'greedy'
COLLECT_DIR = 'collect'
# Goal-dict keys of gymnasium-robotics envs (replay.her's).
_OBSERVATION, _ACHIEVED, _DESIRED = 'observation', 'achieved_goal', \
    'desired_goal'


def observation_spec(policy: numpy_policy.NumpyPolicy,
                     goal_sizes: Optional[tuple[int, int]] = None) -> Any:
  """What the SavedModel takes: the env's observation (a goal dict for
  goal envs), float32; an image policy's uint8 frame stacks."""
  if policy.conv_kernels is not None:
    return tf.TensorSpec(policy.input_shape, tf.uint8, 'observation')
  if goal_sizes is None:
    return tf.TensorSpec([policy.observation_size], tf.float32, 'observation')
  obs, goal = goal_sizes
  return {_OBSERVATION: tf.TensorSpec([obs], tf.float32),
          _ACHIEVED: tf.TensorSpec([goal], tf.float32),
          _DESIRED: tf.TensorSpec([goal], tf.float32)}


def action_spec(policy: numpy_policy.NumpyPolicy) -> Any:
  if policy.head in ('q_argmax', 'categorical'):
    return tensor_spec.BoundedTensorSpec(
        [], tf.int64, int(np.min(policy.action_low)),
        int(np.max(policy.action_high)), 'action')
  return tensor_spec.BoundedTensorSpec(
      [policy.action_size], tf.float32, policy.action_low,
      policy.action_high, 'action')


class MlpPolicy(tf_policy.TFPolicy):
  """A `NumpyPolicy` as a TF-Agents policy (greedy, or collect)."""

  def __init__(self, policy: numpy_policy.NumpyPolicy, *,
               goal_sizes: Optional[tuple[int, int]] = None,
               collect: bool = False, noise_std: float = 0.1,
               epsilon: float = 0.05):
    self._np_policy = policy
    self._collect = collect
    self._noise_std, self._epsilon = float(noise_std), float(epsilon)
    self._goal = goal_sizes is not None
    self._kernels = [tf.constant(k, tf.float32) for k in policy.kernels]
    self._biases = [tf.constant(b, tf.float32) for b in policy.biases]
    super().__init__(ts.time_step_spec(observation_spec(policy, goal_sizes)),
                     action_spec(policy))

  def _variables(self):
    return []

  def _distribution(self, time_step, policy_state):
    raise NotImplementedError('MlpPolicy serves actions only')

  def _input(self, observation: Any) -> tf.Tensor:
    if self._goal:
      observation = tf.concat([observation[_OBSERVATION],
                               observation[_DESIRED]], axis=-1)
    x = tf.cast(observation, tf.float32)
    p = self._np_policy
    if p.conv_kernels is not None:
      return self._encode_image(x)
    if p.obs_mean is not None:
      x = (x - tf.constant(p.obs_mean, tf.float32)) / tf.constant(
          p.obs_std, tf.float32)
    if p.obs_clip is not None:
      x = tf.clip_by_value(x, -p.obs_clip, p.obs_clip)
    return x

  def _encode_image(self, x: tf.Tensor) -> tf.Tensor:
    """The numpy policy's convolutions, in TF ops."""
    p = self._np_policy
    if p.obs_scale is not None:
      x = x * p.obs_scale
    for layer in image_networks.frames_to_channels(p.input_shape):
      x = layer(x)
    for kernel, bias, stride in zip(p.conv_kernels, p.conv_biases,
                                    p.conv_strides):
      x = tf.nn.relu(tf.nn.conv2d(x, tf.constant(kernel, tf.float32),
                                  stride, 'VALID') + bias)
    return tf.reshape(x, [tf.shape(x)[0], -1])

  def _last_layer(self, x: tf.Tensor) -> tf.Tensor:
    hidden = tf.tanh if self._np_policy.activation == 'tanh' else tf.nn.relu
    for kernel, bias in zip(self._kernels[:-1], self._biases[:-1]):
      x = hidden(tf.matmul(x, kernel) + bias)
    return tf.matmul(x, self._kernels[-1]) + self._biases[-1]

  def _action(self, time_step, policy_state, seed=None):
    del seed
    p = self._np_policy
    out = self._last_layer(self._input(time_step.observation))
    low = tf.constant(p.action_low, tf.float32)
    high = tf.constant(p.action_high, tf.float32)
    center, magnitude = (high + low) / 2.0, (high - low) / 2.0
    if p.head in ('q_argmax', 'categorical'):
      offset = int(np.min(p.action_low))
      if not self._collect:
        action = tf.argmax(out, axis=-1)
      elif p.head == 'categorical':
        action = tf.random.categorical(out, 1)[:, 0]
      else:
        greedy = tf.argmax(out, axis=-1)
        uniform = tf.random.uniform(tf.shape(greedy), 0,
                                    tf.cast(tf.shape(out)[-1], tf.int64),
                                    tf.int64)
        explore = tf.random.uniform(tf.shape(greedy)) < self._epsilon
        action = tf.where(explore, uniform, greedy)
      action = action + offset
    elif p.head in numpy_policy.GAUSSIAN_HEADS:
      action = (center + magnitude * tf.tanh(out)
                if p.head == 'tanh_mean_gaussian' else out)
      if self._collect:
        action = action + tf.exp(tf.constant(p.log_std, tf.float32)) * (
            tf.random.normal(tf.shape(out)))
      else:
        action = tf.clip_by_value(action, low, high)
    elif p.head == 'tanh_normal':
      mean, log_std = tf.split(out, 2, axis=-1)
      if self._collect:
        mean = mean + tf.exp(log_std) * tf.random.normal(tf.shape(mean))
      action = center + magnitude * tf.tanh(mean)
    else:  # deterministic
      action = center + magnitude * tf.tanh(out)
      if self._collect:
        action = tf.clip_by_value(
            action + self._noise_std * tf.random.normal(tf.shape(action)),
            low, high)
    return policy_step.PolicyStep(action, policy_state, ())


def save(policy: numpy_policy.NumpyPolicy, directory: str, *,
         goal_sizes: Optional[tuple[int, int]] = None,
         train_step: int = 0, **collect_kwargs: Any) -> dict[str, str]:
  """Writes directory/greedy and directory/collect SavedModels; returns
  their paths. Load one with `tf.saved_model.load` or
  `py_tf_eager_policy.SavedModelPyTFEagerPolicy`."""
  paths = {}
  step = tf.Variable(int(train_step), dtype=tf.int64, trainable=False)
  for name, collect in ((GREEDY_DIR, False), (COLLECT_DIR, True)):
    tf_policy_ = MlpPolicy(policy, goal_sizes=goal_sizes, collect=collect,
                           **collect_kwargs)
    path = os.path.join(directory, name)
    policy_saver.PolicySaver(tf_policy_, batch_size=None,
                             train_step=step).save(path)
    paths[name] = path
  return paths


def _flat_observation(observation: Any) -> np.ndarray:
  if isinstance(observation, dict):
    return np.concatenate([observation[_OBSERVATION],
                           observation[_DESIRED]], axis=-1)
  return observation


def _saved_model_dir(path: str) -> str:
  """The SavedModel directory `path` names (itself or its greedy/)."""
  if os.path.isdir(os.path.join(path, GREEDY_DIR)):
    path = os.path.join(path, GREEDY_DIR)
  if not os.path.isfile(os.path.join(path, 'saved_model.pb')):
    raise ValueError(f'{path}: neither a policy .npz nor a SavedModel '
                     'directory (nor one holding greedy/)')
  return path


def frame_stack(path: str) -> int:
  """Frames per observation the saved policy at `path` acts on: k of an
  image policy's frame-major [k, H, W(, C)] stacks, 1 for any other, so
  an evaluation builds the stacks the policy was trained on.

  Raises:
    ValueError: `path` is not a saved policy (as `load_act`).
  """
  if os.path.isfile(path):
    policy = numpy_policy.load(path)
    image = policy.conv_kernels is not None
    return int(policy.input_shape[0]) if image else 1
  specs = tensor_spec.from_pbtxt_file(os.path.join(
      _saved_model_dir(path), policy_saver.POLICY_SPECS_PBTXT))
  observation = specs['collect_data_spec'].observation
  if (isinstance(observation, tf.TensorSpec) and observation.dtype == tf.uint8
      and observation.shape.rank >= 3):
    return int(observation.shape[0])
  return 1


def load_act(path: str) -> Callable[[Any], np.ndarray]:
  """Greedy actions of a saved policy, for `evaluation.evaluate`: a
  `policy.npz`, a SavedModel directory, or a directory holding `greedy/`
  (what a run exports).

  Raises:
    ValueError: `path` is none of these.
  """
  if os.path.isfile(path):
    policy = numpy_policy.load(path)
    return lambda observation: policy.greedy(_flat_observation(observation))
  path = _saved_model_dir(path)
  from tf_agents.policies import py_tf_eager_policy  # pylint: disable=g-import-not-at-top
  saved = py_tf_eager_policy.SavedModelPyTFEagerPolicy(
      path, load_specs_from_pbtxt=True, batch_time_steps=False)

  def act(observation: Any) -> np.ndarray:
    observation = tf.nest.map_structure(
        lambda x: np.asarray(x, np.uint8 if np.asarray(x).dtype == np.uint8
                             else np.float32), observation)
    batch = len(tf.nest.flatten(observation)[0])
    time_step = ts.TimeStep(
        step_type=np.full([batch], int(ts.StepType.MID), np.int32),
        reward=np.zeros([batch], np.float32),
        discount=np.ones([batch], np.float32), observation=observation)
    return np.asarray(saved.action(time_step).action)
  return act
