"""Atari environments as the toolkit records and trains on them.

`ALE/<Game>-v5` ids are made with ale-py (its wheel ships the ROMs) and
gymnasium's `AtariPreprocessing`, the preprocessing of the Nature DQN
paper that RL Unplugged's Atari data and Stable-Baselines3's Atari
wrappers share: 84x84 grey frames, an action repeated for 4 frames with
the max of the last two, up to 30 no-op actions after a reset. One
observation is one frame (uint8 [84, 84]); frame stacks are built by the
learner's memory at sample time and by the actor's `FrameStackObservation`,
never stored.

What the data keeps as the game gave it: a life lost is not a terminal
and rewards are not clipped. Both are training choices of the learner.
Sticky actions stay as ALE v5 defines them (repeat probability 0.25,
Machado et al. 2018), unless the caller passes `repeat_action_probability`.
The `<Game>NoFrameskip-v4` ids of the older papers (the seed codebase's
PongNoFrameskip-v4, OpenAI Baselines') are the same game without sticky
actions, made with the same preprocessing (Baselines' NoopReset and
MaxAndSkip are AtariPreprocessing's no-ops and frame skip), so a run can
be compared with figures reported on them.
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym

PREFIX = 'ALE/'
_NO_FRAMESKIP_V4 = re.compile(r'[A-Z][A-Za-z]*NoFrameskip-v4')
FRAME_SKIP = 4
SCREEN_SIZE = 84
NOOP_MAX = 30
# ALE v5 ends an episode after 108,000 frames: 27,000 agent steps at a
# frame skip of 4. The time limit counts agent steps, so it sits outside
# the preprocessing.
MAX_EPISODE_STEPS = 108_000 // FRAME_SKIP


def is_atari(env_id: str) -> bool:
  """`ALE/<Game>-v5` or `<Game>NoFrameskip-v4`."""
  return (env_id.startswith(PREFIX)
          or _NO_FRAMESKIP_V4.fullmatch(env_id) is not None)


def _register() -> None:
  try:
    import ale_py  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ValueError(f'Atari envs need ale-py ({e}); it is in setup.py\'s '
                     'requirements') from None
  gym.register_envs(ale_py)


def make_atari(env_id: str, max_episode_steps: int | None = None,
               **kwargs: Any) -> gym.Env:
  """One preprocessed Atari env; `kwargs` go to the ALE env.

  Raises:
    ValueError: not an ALE id, or one ale-py does not know.
  """
  if not is_atari(env_id):
    raise ValueError(f'not an Atari env id (ALE/<Game>-v5 or '
                     f'<Game>NoFrameskip-v4): {env_id!r}')
  _register()
  try:
    env = gym.make(env_id, frameskip=1, **kwargs)
  except gym.error.Error as e:
    raise ValueError(f'cannot make env {env_id!r}: {e}') from None
  env = gym.wrappers.AtariPreprocessing(
      env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE,
      grayscale_obs=True, terminal_on_life_loss=False, scale_obs=False)
  return gym.wrappers.TimeLimit(env, max_episode_steps or MAX_EPISODE_STEPS)
