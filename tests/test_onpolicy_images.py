"""PPO, A2C and ACKTR on image observations: frame stacks in the on-policy
rollouts, the CNN actor-critic in a real Atari run, and what is refused."""

import json
import os

import gymnasium as gym
import numpy as np
import pytest

from rlds_reverb.acting import envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.acting import vector_rollouts
from rlds_reverb.agents import actor_critic
from rlds_reverb.agents.onpolicy import ppo
from rlds_reverb.experiments import onpolicy

_STEPS_ENV = 'ImageSteps-v0'
_LIMIT = 9


class _ImageSteps(gym.Env):
  """6x6 frames whose every pixel is the episode's step count (0 at the
  reset); episodes terminate at random or are truncated at 9 steps."""

  observation_space = gym.spaces.Box(0, 255, (6, 6), np.uint8)
  action_space = gym.spaces.Discrete(2)

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self._t = 0
    return self._frame(), {}

  def step(self, action):
    self._t += 1
    terminated = bool(self.np_random.random() < 0.1)
    return self._frame(), 1.0, terminated, False, {}

  def _frame(self):
    return np.full((6, 6), self._t, np.uint8)


if _STEPS_ENV not in gym.registry:
  gym.register(_STEPS_ENV, entry_point=_ImageSteps,
               max_episode_steps=_LIMIT)


def _expected_stack(step: int, k: int = 4) -> np.ndarray:
  """Frames step-k+1 .. step, the episode's first frame (0) repeated
  before it starts."""
  return np.maximum(np.arange(step - k + 1, step + 1), 0)


def test_rollout_stacks_equal_hand_built_ones_and_restart_with_episodes():
  rng = np.random.default_rng(0)
  rollouts = vector_rollouts.VectorRollouts(
      _STEPS_ENV, num_envs=3, rollout_steps=25, seed=0, frame_stack=4)
  act = lambda obs, starts: (rng.integers(0, 2, len(obs)),
                             np.zeros(len(obs), np.float32))
  seen = {'start': 0, 'truncated': 0, 'terminated': 0}
  for _ in range(2):  # Episodes run on across rollouts.
    rollout, _, _ = rollouts.collect(act)
    observation = rollout['observation']
    assert observation.dtype == np.uint8
    assert observation.shape == (25, 3, 4, 6, 6)
    for t in range(25):
      for i in range(3):
        stack = observation[t, i]
        step = int(stack[-1, 0, 0])
        # Every pixel of a frame is alike; the first axis is the stack.
        np.testing.assert_array_equal(stack, np.broadcast_to(
            stack[:, :1, :1], stack.shape))
        np.testing.assert_array_equal(stack[:, 0, 0], _expected_stack(step))
        assert rollout['episode_start'][t, i] == (step == 0)
        seen['start'] += step == 0
        if rollout['truncated'][t, i]:
          seen['truncated'] += 1
          assert step == _LIMIT - 1
          final = rollout['final_observation'][t, i]
          np.testing.assert_array_equal(final[:, 0, 0],
                                        _expected_stack(_LIMIT))
        seen['terminated'] += bool(rollout['terminated'][t, i])
  assert all(count > 0 for count in seen.values()), seen
  rollouts.close()


def _pong_run(agent, root, env_steps, **settings):
  return onpolicy.OnPolicyConfig(
      env='ALE/Pong-v5', agent=agent, root_dir=str(root),
      env_steps=env_steps, eval_interval=env_steps, eval_episodes=1,
      checkpoint_interval=16, seed=3,
      ppo_config=ppo.defaults_for(agent, True, image=True, num_envs=2,
                                  rollout_steps=8, **settings))


# A2C's image run takes PPO's update path (one epoch, one minibatch):
# PPO's case covers it, ACKTR's has its own step.
@pytest.mark.parametrize('agent, settings', [
    ('ppo', dict(epochs=1, minibatches=2)), ('acktr', {})])
def test_atari_run_trains_checkpoints_resumes_and_exports(agent, settings,
                                                          tmp_path):
  """Pong: 2 copies x 8 steps a rollout; a first run of one update, then
  a resumed one that continues from its checkpoint; the exported policy
  takes uint8 frame stacks (it acts as the model does:
  test_image_agents)."""
  root = tmp_path / agent
  first, second = [], []
  onpolicy.train_onpolicy(_pong_run(agent, root, 16, **settings),
                          show_progress=False, on_update=first.append)
  record = onpolicy.train_onpolicy(_pong_run(agent, root, 32, **settings),
                                   show_progress=False,
                                   on_update=second.append)
  assert [u['env_steps'] for u in first] == [16]
  assert [u['env_steps'] for u in second] == [32]
  assert all(np.isfinite(u['loss']) for u in first + second)
  # Pong's score runs from -21 to 21.
  assert -21 <= record['average_return'] <= 21
  with open(os.path.join(root, 'eval.jsonl')) as f:
    assert [json.loads(line)['env_steps'] for line in f] == [16, 32]
  policy = numpy_policy.load(str(root / 'policy.npz'))
  assert policy.head == 'categorical'
  assert list(policy.input_shape) == [4, 84, 84]
  frames = np.random.default_rng(0).integers(0, 255, (3, 4, 84, 84),
                                             dtype=np.uint8)
  actions = policy.greedy(frames)
  assert actions.shape == (3,) and set(actions) <= set(range(6))


def test_image_settings_are_the_seeds_atari_ones_and_refusals():
  config = ppo.defaults_for('ppo', True, image=True)
  assert (config.num_envs, config.rollout_steps, config.epochs,
          config.minibatches) == (8, 128, 4, 4)
  assert config.observation_clip == 0 and config.clip_ratio == 0.1
  assert ppo.defaults_for('acktr', True, image=True).num_envs == 32
  specs = envs.env_specs('ALE/Pong-v5')
  assert specs.image and specs.frame_stack == 4
  model = onpolicy.make_model(specs, config)
  assert isinstance(model, actor_critic.CnnActorCritic)
  assert model.observation_shape == (4, 84, 84)
  with pytest.raises(ValueError, match='recurrent policy takes vectors'):
    onpolicy.check_env(specs, ppo.defaults_for('ppo', True, recurrent=True,
                                               observation_clip=0.0))
  with pytest.raises(ValueError, match='pass --observation_clip 0'):
    onpolicy.check_env(specs, ppo.defaults_for('ppo', True, image=True,
                                               observation_clip=5.0))
