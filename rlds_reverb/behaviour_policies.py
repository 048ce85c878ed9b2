"""Behaviour policies for recording datasets: random, shipped, or a file.

The shipped policies are numpy snapshots of this project's own online SAC
runs (`rlds_reverb/policies/<env>/`), in the roles D4RL gives its data:
  medium.npz   a snapshot whose return is about a third of the run's final
  expert.npz   the run's final policy
  replay/      the snapshots the run took on its way to `medium`, each of
               which collected `interval` env steps of the replay data
They load without TensorFlow (`numpy_policy`), so recording never traces a
graph, and they act stochastically, as D4RL's behaviour policies did, with
exact log-probabilities for `infos/action_log_probs`.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
from typing import Callable

import gymnasium as gym
import numpy as np

from rlds_reverb.learners import numpy_policy

POLICY_DIR = pathlib.Path(__file__).parent / 'policies'
REPLAY_DIR = 'replay'
SCHEDULE_FILE = 'schedule.json'

# Maps a batch of observations to (actions, log-probabilities).
Policy = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def env_dir(env_id: str) -> pathlib.Path:
  """'HalfCheetah-v5' -> <package>/policies/halfcheetah_v5."""
  return POLICY_DIR / re.sub(r'[^a-z0-9]+', '_', env_id.lower()).strip('_')


def shipped_names(env_id: str) -> list[str]:
  """Names of the policies shipped for `env_id` (e.g. ['expert', 'medium'])."""
  directory = env_dir(env_id)
  return sorted(p.stem for p in directory.glob('*.npz')) if directory.is_dir(
  ) else []


def load_policy(name_or_path: str, env_id: str) -> numpy_policy.NumpyPolicy:
  """A shipped policy by name, or an .npz path (`NumpyPolicy.save`).

  Raises:
    ValueError: no such shipped policy for the env, or a bad file.
  """
  if name_or_path.endswith('.npz') or os.sep in name_or_path:
    return numpy_policy.load(name_or_path)
  path = env_dir(env_id) / f'{name_or_path}.npz'
  if not path.is_file():
    known = ', '.join(['random'] + shipped_names(env_id))
    raise ValueError(f'unknown policy {name_or_path!r} for env {env_id!r}; known: '
                     f'{known}, or a path to a policy .npz file')
  return numpy_policy.load(str(path))


def as_recording_policy(policy: numpy_policy.NumpyPolicy,
                        observation_space: gym.spaces.Box,
                        action_space: gym.spaces.Box, seed: int | None,
                        what: str) -> Policy:
  """Wraps a numpy policy to sample actions (and log-probs) for `recording`.

  Raises:
    ValueError: the policy's observation or action size is not the env's.
  """
  obs_size = int(np.prod(observation_space.shape))
  act_size = int(np.prod(action_space.shape))
  if (policy.observation_size, policy.action_size) != (obs_size, act_size):
    raise ValueError(
        f'policy {what} maps {policy.observation_size} observations to '
        f'{policy.action_size} actions; the env has {obs_size} and {act_size}')
  rng = np.random.default_rng(seed)
  return lambda observations: policy.sample(observations, rng)


def replay_schedule(env_id: str) -> list[dict]:
  """The medium-replay schedule: [{policy: name or 'random', env_steps: n}].

  Raises:
    ValueError: nothing shipped for `env_id`.
  """
  path = env_dir(env_id) / REPLAY_DIR / SCHEDULE_FILE
  if not path.is_file():
    raise ValueError(f'no medium-replay schedule shipped for env {env_id!r} '
                     f'(looked for {path})')
  with open(path) as f:
    return json.load(f)['segments']


def replay_policy_path(env_id: str, name: str) -> str:
  return str(env_dir(env_id) / REPLAY_DIR / f'{name}.npz')
