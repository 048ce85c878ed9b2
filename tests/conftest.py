"""Shared fixtures and helpers of the test suite.

The test of `rlds_reverb/<pkg>/<x>.py` is `tests/test_<x>.py`, the test of
`python -m pipelines.<name>` is `tests/test_cli_<name>.py` (docs/tests.md
has the map). What more than one of those files needs lives here:

  fixtures  `specs` (HalfCheetah-v5 env specs), `cartpole` (CartPole-v1 env
            specs), `cheetah` (a tiny recorded HalfCheetah dataset and its
            episodes read back);
  helpers   `chi_square`, `chi_square_bound` (statistical bounds),
            `_rlds` (in-memory RLDS episodes, float64 by default),
            `_fixed_batch` (a [B, 2] HalfCheetah-shaped Trajectory batch),
            `_dqn` (a small seeded CartPole DQN agent), `bench_module` (a
            bench/ script imported as a module), `_Server` (a Reverb
            server with a queue of 2-step items and an episode table),
            `_episodes` (a generated dataset read back as arrays).

Test modules import the helpers with `from conftest import ...`, and the
RLDS episode builders with `import rlds_fixtures as fx`; a pipeline left
running in the background is `pipeline_process.PipelineProcess`; one that
ends on its input is `preloaded_cli.run` (a fork of a preloaded
interpreter). tests/ has no
__init__.py: pytest's default import mode puts it on sys.path before it
imports this file; the lines below make that hold under any import mode.
"""

import os
import sys

# As the pipelines do (pipelines/__init__.py): one BLAS thread for numpy's
# small per-step forward passes, set before numpy loads.
os.environ.setdefault('OPENBLAS_NUM_THREADS', '1')

_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
if _TESTS_DIR not in sys.path:
  sys.path.insert(0, _TESTS_DIR)

# pylint: disable=g-import-not-at-top,wrong-import-position
import importlib.util
import types
from typing import Any, List

import numpy as np
import pytest
import reverb
import rlds
import tensorflow as tf
from tf_agents.specs import tensor_spec

from rlds_reverb.data import datasets
from rlds_reverb.data import recording
from rlds_reverb.acting import envs
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.replay import episode_table
# pylint: enable=g-import-not-at-top,wrong-import-position


# Environment specs.


@pytest.fixture(scope='module')
def specs():
  return envs.env_specs('HalfCheetah-v5')


@pytest.fixture(scope='module')
def cartpole():
  return envs.env_specs('CartPole-v1')


# bench/ scripts (not a package: each runs as `python bench/<name>.py`) and
# tools/ modules (`python -m tools.<name>`, run from the repository).


def bench_module(name: str) -> types.ModuleType:
  path = os.path.join(_TESTS_DIR, '..', 'bench', f'{name}.py')
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def tools_module(name: str) -> types.ModuleType:
  repository = os.path.dirname(os.path.abspath(_TESTS_DIR))
  if repository not in sys.path:
    sys.path.insert(0, repository)
  return importlib.import_module(f'tools.{name}')


# Statistics.


def chi_square(observed, expected) -> float:
  observed, expected = np.asarray(observed, float), np.asarray(expected, float)
  return float(np.sum((observed - expected) ** 2 / expected))


def chi_square_bound(dof: int) -> float:
  """dof + 6 sd of the chi-square: a correct sampler exceeds it with
  probability below 1e-6 for the dofs used here."""
  return dof + 6.0 * np.sqrt(2.0 * dof)


# Data and agents for the learners.


def _rlds(steps_per_episode, dtype=np.float64, obs_size=17, act_size=6,
          observation=None):
  """In-memory RLDS episodes with the given dtype (float64: D4RL v1 style)."""
  episodes = []
  for n in steps_per_episode:
    rng = np.random.default_rng(n)
    steps = {
        'observation': (observation[:n] if observation is not None else
                        rng.normal(size=(n, obs_size)).astype(dtype)),
        'action': rng.uniform(-1, 1, (n, act_size)).astype(dtype),
        'reward': rng.normal(size=n).astype(dtype),
        'discount': np.ones(n, dtype),
        'is_first': np.arange(n) == 0, 'is_last': np.arange(n) == n - 1,
        'is_terminal': np.zeros(n, bool)}
    episodes.append(tf.data.Dataset.from_tensors(
        {rlds.STEPS: tf.data.Dataset.from_tensor_slices(steps)}))
  out = episodes[0]
  for e in episodes[1:]:
    out = out.concatenate(e)
  return out


def _fixed_batch(batch_size=64, seed=0):
  """A [B, 2] Trajectory batch of random HalfCheetah-shaped transitions."""
  from tf_agents.trajectories import trajectory  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  obs = rng.normal(size=(batch_size, 2, 17)).astype(np.float32)
  return trajectory.Trajectory(
      step_type=tf.constant([[0, 1]] * batch_size, tf.int32),
      observation=tf.constant(obs),
      action=tf.constant(rng.uniform(-0.9, 0.9, (batch_size, 2, 6)),
                         tf.float32),
      policy_info=(),
      next_step_type=tf.constant([[1, 1]] * batch_size, tf.int32),
      reward=tf.constant(rng.normal(size=(batch_size, 2)), tf.float32),
      discount=tf.ones((batch_size, 2), tf.float32))


def _dqn(cartpole, **config):
  tf.random.set_seed(0)
  return registry.make_agent('dqn', cartpole.time_step_spec,
                           cartpole.action_spec,
                           factory.AgentConfig(q_layers=(32, 32), **config))


# Reverb.


class _Server:
  """A real Reverb server with a queue of 2-step items and an episode table."""

  def __init__(self, spec: Any):
    self.server = reverb.Server([
        reverb.Table.queue('pairs', 10_000,
                           signature=tensor_spec.add_outer_dim(spec)),
        episode_table.make_table('episodes', spec, max_episodes=10_000)])
    self.client = reverb.Client(f'localhost:{self.server.port}')

  def pairs(self) -> List[Any]:
    size = self.client.server_info()['pairs'].current_size
    if not size:
      return []
    return [s.data for s in self.client.sample(
        'pairs', num_samples=size, emit_timesteps=False,
        unpack_as_table_signature=True)]

  def stop(self):
    self.server.stop()


# A tiny recorded dataset (test_recording.py, test_cli_generate.py).

CHEETAH_SEED = 7
CHEETAH_LIMIT = 20  # Env steps per HalfCheetah episode (time limit).


def _episodes(path: str) -> list[dict[str, np.ndarray]]:
  """Reads a dataset back as a list of {field: stacked array over steps}."""
  out = []
  for episode in datasets.load(path):
    steps = list(episode['steps'].as_numpy_iterator())
    out.append({
        key: np.stack([s[key] for s in steps])
        for key in steps[0] if key != 'infos'
    } | {
        f'infos/{key}': np.stack([s['infos'][key] for s in steps])
        for key in steps[0]['infos']
    })
  return out


@pytest.fixture(scope='module')
def cheetah(tmp_path_factory):
  """3 HalfCheetah episodes on 2 sub-envs, so one episode follows a reset."""
  out = str(tmp_path_factory.mktemp('cheetah'))
  summary = recording.generate_dataset(
      'HalfCheetah-v5', 'random', 3, out, seed=CHEETAH_SEED, num_envs=2,
      max_episode_steps=CHEETAH_LIMIT, show_progress=False)
  return summary, _episodes(out)


def converted_episodes(rlds_data):
  """The data spec and the episodes as converted trajectories (terminal fix
  on): what a memory stores."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tree  # pylint: disable=g-import-not-at-top
  import rlds_reverb  # pylint: disable=g-import-not-at-top
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  converted = [tree.map_structure(np.asarray, e.trajectory) for e in
               rlds_reverb.convert_rlds_to_episodes(
                   rlds_data, zero_terminal_discount=True
               ).as_numpy_iterator()]
  return spec, converted
