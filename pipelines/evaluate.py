r"""Evaluates a saved policy in its environment: return and D4RL score.

  python -m pipelines.evaluate --policy runs/sac_seed0/policy --env HalfCheetah-v5
  python -m pipelines.evaluate --policy runs/sac_seed0/policy.npz --env HalfCheetah-v5

--policy is what a pipelines.train run exports: the policy.npz, or the
TF-Agents SavedModels beside it (the directory holding greedy/ and
collect/, or one SavedModel directory). Greedy actions, full episodes with
the env's own time limit; prints one JSON line: the average return, its
spread, the D4RL-normalised score where D4RL has references for the env,
and the success rate of goal envs.

Bad input ends with one line on stderr (`evaluate: error: ...`), exit
code 1 (2 for bad flags).
"""

import json
import os

# TensorFlow's C++ start-up chatter would bury the errors.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from pipelines import cli

_PROG = 'evaluate'

_POLICY = flags.DEFINE_string(
    'policy', None, 'A policy .npz, a SavedModel directory, or the directory '
    'of a run\'s SavedModels (holding greedy/). Required.')
_ENV = flags.DEFINE_string(
    'env', None, 'gymnasium env id the policy was trained on (e.g. '
    'HalfCheetah-v5). Required.')
_EPISODES = flags.DEFINE_integer(
    'episodes', 10, 'Evaluation episodes, run side by side.', lower_bound=1)
_SEED = flags.DEFINE_integer(
    'seed', 0, 'Episode i runs in an env seeded with seed + i.', lower_bound=0)
_REPEAT_ACTION_PROBABILITY = flags.DEFINE_float(
    'repeat_action_probability', None,
    'Atari (ALE/..., ...NoFrameskip-v4) only: the probability that the '
    'emulator repeats the previous action instead of the one given, per '
    'frame (sticky actions, Machado et al. 2018). Unset: the env\'s own '
    '(ALE v5: 0.25); 0: deterministic actions, as the NoFrameskip-v4 envs '
    'of older papers.', lower_bound=0, upper_bound=1)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(_PROG, ValueError(f'unexpected arguments: {" ".join(argv[1:])}'),
             code=2)
  if not _POLICY.value or not _ENV.value:
    cli.fail(_PROG, ValueError('--policy and --env are required'), code=2)
  # pylint: disable=g-import-not-at-top
  from rlds_reverb.acting import atari
  from rlds_reverb.acting import evaluation
  from rlds_reverb.agents import saved_policy
  # pylint: enable=g-import-not-at-top
  if not os.path.exists(_POLICY.value):
    cli.fail(_PROG, ValueError(f'--policy {_POLICY.value}: no such file or '
                               'directory'))
  env_kwargs = {}
  if _REPEAT_ACTION_PROBABILITY.value is not None:
    if not atari.is_atari(_ENV.value):
      cli.fail(_PROG, ValueError(
          '--repeat_action_probability is for Atari envs (ALE/..., '
          '...NoFrameskip-v4), not '
          f'{_ENV.value!r}'), code=2)
    env_kwargs['repeat_action_probability'] = _REPEAT_ACTION_PROBABILITY.value
  try:
    act = saved_policy.load_act(_POLICY.value)
    result = evaluation.evaluate(
        act, _ENV.value, _EPISODES.value, _SEED.value,
        frame_stack=saved_policy.frame_stack(_POLICY.value),
        env_kwargs=env_kwargs)
  except ValueError as e:
    cli.fail(_PROG, e)
  print(json.dumps({'policy': _POLICY.value, 'env': _ENV.value,
                    **env_kwargs, **result.to_dict(),
                    'returns': [round(r, 2) for r in result.returns]}),
        flush=True)


if __name__ == '__main__':
  app.run(main, flags_parser=cli.flags_parser(_PROG))
