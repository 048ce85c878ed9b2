"""rlds_reverb.agents.saved_policy: npz policies as TF-Agents SavedModels.

The greedy SavedModel must act as the npz policy does on the same
observations, for every head, with the observation normalisation, its clip
and goal-dict inputs; the collect SavedModel explores within the bounds.
"""

import os

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.policies import py_tf_eager_policy
from tf_agents.trajectories import time_step as ts

from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import saved_policy

OBS, ACT = 5, 3


def _policy(head, rng, *, obs_size=OBS, normalise=True, clip=None):
  outputs = {'tanh_normal': 2 * ACT, 'deterministic': ACT, 'gaussian': ACT,
             'tanh_mean_gaussian': ACT, 'q_argmax': 4, 'categorical': 4}[head]
  discrete = head in ('q_argmax', 'categorical')
  return numpy_policy.NumpyPolicy(
      head=head,
      kernels=[rng.normal(size=(obs_size, 16)).astype(np.float32),
               rng.normal(size=(16, outputs)).astype(np.float32)],
      biases=[rng.normal(size=16).astype(np.float32),
              rng.normal(size=outputs).astype(np.float32)],
      action_low=(np.full(1, 2, np.int64) if discrete else
                  np.full(ACT, -2.0, np.float32)),
      action_high=(np.full(1, 5, np.int64) if discrete else
                   np.full(ACT, 1.0, np.float32)),
      obs_mean=rng.normal(size=obs_size).astype(np.float32) if normalise
      else None,
      obs_std=rng.uniform(0.5, 2, obs_size).astype(np.float32) if normalise
      else None,
      obs_clip=clip,
      activation='tanh' if head == 'gaussian' else 'relu',
      log_std=(np.full(ACT, -0.5, np.float32)
               if head in numpy_policy.GAUSSIAN_HEADS else None))


def _time_step(observation):
  batch = len(tf.nest.flatten(observation)[0])
  return ts.TimeStep(np.ones(batch, np.int32), np.zeros(batch, np.float32),
                     np.ones(batch, np.float32), observation)


@pytest.mark.parametrize('head', numpy_policy.HEADS)
def test_greedy_savedmodel_acts_as_the_npz(head, tmp_path):
  rng = np.random.default_rng(0)
  policy = _policy(head, rng, clip=1.5 if head == 'deterministic' else None)
  paths = saved_policy.save(policy, str(tmp_path / 'policy'), train_step=7)
  observations = rng.normal(size=(64, OBS)).astype(np.float32) * 3
  loaded = tf.saved_model.load(paths['greedy'])
  actions = loaded.action(_time_step(observations)).action.numpy()
  expected = policy.greedy(observations)
  if head in ('q_argmax', 'categorical'):
    np.testing.assert_array_equal(actions, expected)
    assert actions.dtype == np.int64
  else:
    np.testing.assert_allclose(actions, expected, atol=1e-5)
  assert int(loaded.get_train_step()) == 7
  # The py policy TF-Agents' actors and evaluators use.
  py_policy = py_tf_eager_policy.SavedModelPyTFEagerPolicy(
      paths['greedy'], load_specs_from_pbtxt=True)
  single = py_policy.action(ts.TimeStep(
      np.int32(1), np.float32(0), np.float32(1), observations[0]))
  np.testing.assert_allclose(single.action, expected[0], atol=1e-5)
  # Collect actions explore within the bounds.
  collect = tf.saved_model.load(paths['collect'])
  explored = collect.action(_time_step(observations)).action.numpy()
  if head not in numpy_policy.GAUSSIAN_HEADS:  # Unbounded: the env clips.
    assert np.all(explored >= policy.action_low)
    assert np.all(explored <= policy.action_high)
  if head != 'q_argmax':  # epsilon 0.05 may leave 64 draws all greedy.
    assert not np.array_equal(explored, actions)


def test_goal_dict_inputs_are_flattened_and_normalised(tmp_path):
  rng = np.random.default_rng(1)
  policy = _policy('deterministic', rng, obs_size=7, clip=5.0)
  paths = saved_policy.save(policy, str(tmp_path / 'policy'),
                            goal_sizes=(4, 3))
  observation = {'observation': rng.normal(size=(8, 4)).astype(np.float32),
                 'achieved_goal': rng.normal(size=(8, 3)).astype(np.float32),
                 'desired_goal': rng.normal(size=(8, 3)).astype(np.float32)}
  loaded = tf.saved_model.load(paths['greedy'])
  actions = loaded.action(_time_step(observation)).action.numpy()
  expected = policy.greedy(np.concatenate(
      [observation['observation'], observation['desired_goal']], -1))
  np.testing.assert_allclose(actions, expected, atol=1e-5)
  act = saved_policy.load_act(str(tmp_path / 'policy'))
  np.testing.assert_allclose(act(observation), expected, atol=1e-5)


def test_load_act_reads_npz_and_savedmodel_alike(tmp_path):
  rng = np.random.default_rng(2)
  policy = _policy('tanh_normal', rng)
  policy.save(str(tmp_path / 'policy.npz'))
  saved_policy.save(policy, str(tmp_path / 'policy'))
  observations = rng.normal(size=(10, OBS)).astype(np.float32)
  from_npz = saved_policy.load_act(str(tmp_path / 'policy.npz'))
  from_dir = saved_policy.load_act(str(tmp_path / 'policy'))
  from_greedy = saved_policy.load_act(str(tmp_path / 'policy' / 'greedy'))
  np.testing.assert_allclose(from_dir(observations), from_npz(observations),
                             atol=1e-5)
  np.testing.assert_allclose(from_greedy(observations),
                             from_npz(observations), atol=1e-5)
  # Vector policies act on one observation (image ones: test_atari.py).
  assert saved_policy.frame_stack(str(tmp_path / 'policy.npz')) == 1
  assert saved_policy.frame_stack(str(tmp_path / 'policy')) == 1
  os.makedirs(tmp_path / 'empty')
  with pytest.raises(ValueError, match='neither a policy .npz nor'):
    saved_policy.load_act(str(tmp_path / 'empty'))
  with pytest.raises(ValueError, match='neither a policy .npz nor'):
    saved_policy.frame_stack(str(tmp_path / 'empty'))
