"""rlds_reverb.data.validate: the values of an episode, named where they fail."""

import numpy as np
import pytest
from tf_agents.trajectories import trajectory

from rlds_reverb.data import validate


def _episode(steps=4, goal=False):
  """A valid converted episode (numpy, time first)."""
  observation = np.zeros((steps, 6), np.float32)
  if goal:
    observation = {'observation': observation,
                   'desired_goal': np.zeros((steps, 3), np.float64)}
  return trajectory.Trajectory(
      step_type=np.array([0] + [1] * (steps - 2) + [2], np.int32),
      observation=observation,
      action=np.zeros((steps, 2), np.float32),
      policy_info={'log_prob': np.zeros(steps, np.float32)},
      next_step_type=np.array([1] * (steps - 2) + [2, 0], np.int32),
      reward=np.ones(steps, np.float32),
      discount=np.array([1.0, 0.5, 0.0, 1.0], np.float32)[:steps])


def test_valid_episode_passes():
  validate.check_episode(_episode(), 'episode 0')
  validate.check_episode(_episode(goal=True), 'episode 0')


@pytest.mark.parametrize('field, step, index, value, message', [
    ('observation', 2, (5,), np.nan, 'episode 3, step 2: observation[5] is nan'),
    ('action', 0, (1,), np.inf, 'episode 3, step 0: action[1] is inf'),
    ('reward', 3, (), -np.inf, 'episode 3, step 3: reward is -inf'),
    ('discount', 1, (), 7.0, 'episode 3, step 1: discount is 7.0, not in '
     '[0, 1]'),
    ('discount', 1, (), -0.5, 'episode 3, step 1: discount is -0.5, not in '
     '[0, 1]'),
    ('discount', 2, (), np.nan, 'episode 3, step 2: discount is nan'),
])
def test_first_bad_value_is_named(field, step, index, value, message):
  episode = _episode()
  getattr(episode, field)[(step, *index)] = value
  with pytest.raises(validate.InvalidDataError) as error:
    validate.check_episode(episode, 'episode 3')
  assert str(error.value) == message


def test_nested_fields_and_first_step_wins():
  episode = _episode(goal=True)
  episode.observation['desired_goal'][3, 2] = np.nan
  episode.observation['desired_goal'][1, 0] = np.inf
  with pytest.raises(validate.InvalidDataError,
                     match=r"^episode 1, step 1: observation\['desired_goal'\]"
                     r'\[0\] is inf$'):
    validate.check_episode(episode, 'episode 1')
  episode = _episode()
  episode.policy_info['log_prob'][0] = np.nan
  with pytest.raises(validate.InvalidDataError,
                     match=r"policy_info\['log_prob'\] is nan"):
    validate.check_episode(episode, 'episode 1')


def test_integer_fields_and_no_discount_path():
  episode = _episode()._replace(discount=np.full(4, 7.0, np.float32))
  validate.check_episode(episode, 'episode 0', discount_path=None)
  assert issubclass(validate.InvalidDataError, ValueError)
