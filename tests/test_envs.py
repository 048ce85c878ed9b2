"""rlds_reverb.acting.envs: env specs and their errors."""

import pytest
import tensorflow as tf

from rlds_reverb.acting import envs


def test_env_errors():
  with pytest.raises(ValueError, match="cannot make env 'NoSuchEnv-v0'"):
    envs.env_specs('NoSuchEnv-v0')
  with pytest.raises(ValueError, match='observation space must be a Box'):
    envs.env_specs('FrozenLake-v1')
  cartpole = envs.env_specs('CartPole-v1')  # Discrete actions: int64 0..1.
  assert cartpole.discrete and cartpole.action_spec.dtype == tf.int64
  assert (cartpole.action_spec.minimum, cartpole.action_spec.maximum) == (0, 1)
