r"""Records gymnasium rollouts as an RLDS dataset in TFDS format.

Example:

  python -m pipelines.generate --env HalfCheetah-v5 --policy random \
      --episodes 20 --out data/halfcheetah_random

The result loads with `rlds_reverb.data.datasets.load(OUT)` and with
`tfds.builder_from_directory(OUT/<name>/1.0.0)`; for HalfCheetah its steps
match the TFDS `d4rl_mujoco_halfcheetah` v2 configs. `OUT/.complete` marks a
finished write.
"""

import os
import time

# TensorFlow's C++ start-up chatter (CUDA probing, CPU features) would bury
# the one-line errors and summary this tool prints. The caller can override.
os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')

from absl import app  # pylint: disable=g-import-not-at-top
from absl import flags

from pipelines import cli
from rlds_reverb.data import recording

_PROG = 'generate'

_ENV = flags.DEFINE_string(
    'env', None, 'gymnasium env id with a Box action space and a Box '
    'observation space (e.g. HalfCheetah-v5) or a goal dict of Boxes '
    '(observation, achieved_goal, desired_goal; e.g. FetchReach-v4, stored '
    'as a dict observation feature), or an Atari game as ALE/<Game>-v5 '
    '(e.g. ALE/Pong-v5: one 84x84 grey uint8 frame per step, frame skip 4, '
    'up to 30 no-ops at reset, sticky actions as v5 defines them; lives '
    'and rewards kept as the game gives them; time limit 27000 steps) or '
    'as <Game>NoFrameskip-v4 (the same without sticky actions).')
_POLICY = flags.DEFINE_string(
    'policy', 'random',
    'Behaviour policy: random, a policy shipped for --env (HalfCheetah-v5, '
    'Hopper-v5 and Walker2d-v5: medium and expert, D4RL\'s roles, from our '
    'SAC runs; '
    'HalfCheetah-v5 also final, '
    'the last policy of an earlier 150k-step run; numpy snapshots acting '
    'stochastically, with exact action log-probs; see docs/datasets.md), '
    'or the path of a policy .npz (for Atari, a categorical CNN policy as '
    'pipelines.train --agent ppo/a2c/acktr exports it: it samples its '
    'actions from its softmax, on stacks of its input\'s frame count, while '
    'the data keeps one frame per step).')
_DATASET_KIND = flags.DEFINE_enum(
    'dataset_kind', 'policy', list(recording.DATASET_KINDS),
    'policy: --episodes rollouts of --policy. medium-replay: the replay data '
    'of the SAC run up to the medium snapshot, re-collected by its shipped '
    'snapshots (--episodes, --env_steps and --policy are ignored). '
    'medium-expert: '
    '--episodes of the medium policy, then --episodes of the expert, each '
    'half equal to that policy\'s own dataset of the same --seed (--policy '
    'is ignored). Also spelled --dataset-kind.')
_EPISODES = flags.DEFINE_integer(
    'episodes', None, 'Number of episodes to record (> 0); with '
    '--dataset-kind medium-expert, of each half. Give this or --env_steps.')
_ENV_STEPS = flags.DEFINE_integer(
    'env_steps', None, 'Instead of --episodes: record whole episodes until '
    'they hold at least this many transitions (> 0; of each half for '
    'medium-expert), as D4RL sizes its datasets (1000000). Where episodes '
    'terminate early (Hopper, Walker2d) their count follows from the '
    'policy.')
_OUT = flags.DEFINE_string(
    'out', None, 'Output directory; pass it to rlds_reverb.data.datasets.load. Must '
    'be absent or empty unless --overwrite.')
_SEED = flags.DEFINE_integer(
    'seed', 0, 'Seed of the envs (sub-env i gets seed + i) and the policy.')
_NUM_ENVS = flags.DEFINE_integer(
    'num_envs', 4, 'Sub-envs stepped together in one process (capped at '
    '--episodes).')
_MAX_EPISODE_STEPS = flags.DEFINE_integer(
    'max_episode_steps', None, 'Time limit in env steps; episodes that hit '
    'it are stored as truncated (is_last without is_terminal). Default: the '
    "env's registered limit (1000 for HalfCheetah-v5).")
_ENCODING = flags.DEFINE_enum(
    'encoding', 'rlds', list(recording.ENCODINGS),
    'rlds: discount 1.0 on every step, terminations in is_terminal. '
    "tfds_d4rl: TFDS's d4rl_mujoco_* encoding (discount 0.0 on the last "
    'real step of a terminated episode and on every last step), as '
    'd4rl_mujoco_hopper users get it. Both hold the same steps and give '
    'the same transitions (docs/datasets.md).')
_EPSILON = flags.DEFINE_float(
    'epsilon', 0.0, 'Exploration noise of a discrete --policy .npz (Atari), '
    'or of both halves of --dataset_kind medium-expert: '
    'each action is replaced by a uniform one with this probability, and '
    'each step\'s infos/action_log_probs is the mixture\'s log-probability '
    '(0: the policy\'s own samples; in [0, 1]).')
_OVERWRITE = flags.DEFINE_bool(
    'overwrite', False, 'Replace --out if it already holds generated data.')


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    cli.fail(_PROG, ValueError(f'unexpected arguments: {" ".join(argv[1:])}'),
             code=2)
  for flag in (_ENV, _OUT):
    if flag.value is None:
      cli.fail(_PROG, ValueError(f'--{flag.name} is required'), code=2)
  if _DATASET_KIND.value != 'medium-replay' and (
      (_EPISODES.value is None) == (_ENV_STEPS.value is None)):
    cli.fail(_PROG, ValueError('give one of --episodes and --env_steps'),
             code=2)
  cli.quiet_logging()
  start = time.perf_counter()
  try:
    summary = recording.generate_dataset(
        _ENV.value, _POLICY.value, _EPISODES.value, _OUT.value,
        seed=_SEED.value, num_envs=_NUM_ENVS.value,
        max_episode_steps=_MAX_EPISODE_STEPS.value,
        overwrite=_OVERWRITE.value, dataset_kind=_DATASET_KIND.value,
        encoding=_ENCODING.value, num_env_steps=_ENV_STEPS.value,
        epsilon=_EPSILON.value)
  except cli.USER_ERRORS as e:
    cli.fail(_PROG, e)
  seconds = time.perf_counter() - start
  print(f'{_PROG}: {summary.num_episodes} episodes, {summary.num_env_steps} '
        f'steps, mean return {summary.mean_return:.3f}, '
        f'{summary.num_env_steps / seconds:.0f} steps/s, wrote '
        f'{summary.out_dir}')


def _dashes_to_underscores(argv: list[str]) -> list[str]:
  """Accepts --dataset-kind for --dataset_kind (the spelling in the docs)."""
  return [a.replace('--dataset-kind', '--dataset_kind', 1) for a in argv]


if __name__ == '__main__':
  parse = cli.flags_parser(_PROG)
  app.run(main, flags_parser=lambda argv: parse(_dashes_to_underscores(argv)))
