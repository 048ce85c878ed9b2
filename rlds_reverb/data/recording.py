"""Records gymnasium rollouts as RLDS episodes and writes them as TFDS data.

Episodes are stepped and buffered by `acting.rollout` (the loop online
collection uses too), in its RLDS layout of T + 1 steps per T env steps:

  step t (0 <= t < T): o_t, a_t, r_t, discount 1.0, infos of o_t
  step T (is_last):    o_T (final observation), zero action/reward,
                       is_terminal = whether the env terminated (not truncated)

Discount is 1.0 on every step, as in the D4RL datasets; consumers derive
terminal discounts from `is_terminal` (see DESIGN.md). Beyond what
collection keeps, a recording stores D4RL's `infos`: the behaviour policy's
`action_log_probs` and, for MuJoCo envs, the `qpos` / `qvel` physics state
of each observation; float observations and actions are stored as float32.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from typing import Any, Callable, Iterator, NamedTuple, Protocol

import gymnasium as gym
import numpy as np
import tqdm
import tree

from rlds_reverb.data import behaviour_policies
from rlds_reverb.data import d4rl_format
from rlds_reverb.data import tfds_writer
from rlds_reverb.acting import atari
from rlds_reverb.acting import envs as acting_envs
from rlds_reverb.acting import rollout


class Policy(Protocol):
  """Maps a batch of observations to (actions, log-probabilities)."""

  def __call__(self, observations: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ...


# Registry entries: (single action space, seed) -> policy.
PolicyFactory = Callable[[gym.spaces.Space, 'int | None'], Policy]


def make_random_policy(action_space: gym.spaces.Box | gym.spaces.Discrete,
                       seed: int | None) -> Policy:
  """Uniform random actions over a bounded Box or a Discrete space;
  log-prob is the uniform one.

  Args:
    action_space: the single (not batched) action space.
    seed: seed of the policy's own generator.

  Returns:
    A policy sampling one action per observation in the batch.

  Raises:
    ValueError: if the action space is unbounded.
  """
  rng = np.random.default_rng(seed)
  if isinstance(action_space, gym.spaces.Discrete):
    start, n = int(action_space.start), int(action_space.n)

    def discrete(observations: Any) -> tuple[np.ndarray, np.ndarray]:
      count = len(tree.flatten(observations)[0])
      return (rng.integers(start, start + n, count).astype(np.int64),
              np.full((count,), -np.log(n), dtype=np.float64))
    return discrete
  low = action_space.low.astype(np.float64)
  high = action_space.high.astype(np.float64)
  if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
    raise ValueError(
        f'policy random needs a bounded action space, got {action_space}')
  log_prob = -float(np.sum(np.log(high - low)))

  def policy(observations: Any) -> tuple[np.ndarray, np.ndarray]:
    n = len(tree.flatten(observations)[0])  # goal envs: a dict of batches
    actions = rng.uniform(low, high, size=(n,) + low.shape)
    return (actions.astype(action_space.dtype),
            np.full((n,), log_prob, dtype=np.float64))

  return policy


POLICIES: dict[str, PolicyFactory] = {'random': make_random_policy}


@dataclasses.dataclass(frozen=True)
class GenerateSummary:
  """What `generate_dataset` wrote.

  Attributes:
    num_episodes: episodes written.
    num_env_steps: transitions written (RLDS steps minus one per episode).
    mean_return: mean undiscounted return over the episodes.
    out_dir: the directory to pass to `rlds_reverb.data.datasets.load`.
    dataset_dir: the TFDS version directory (holds dataset_info.json).
  """

  num_episodes: int
  num_env_steps: int
  mean_return: float
  out_dir: str
  dataset_dir: str


def make_vector_env(env_id: str, num_envs: int,
                    max_episode_steps: int | None) -> gym.vector.SyncVectorEnv:
  """Returns `num_envs` copies of `env_id` in NEXT_STEP autoreset mode.

  Raises:
    ValueError: if `env_id` is not a registered gymnasium env or cannot be
      made.
  """
  if not atari.is_atari(env_id):
    acting_envs.register_robotics_envs(env_id)
    try:
      gym.spec(env_id)
    except gym.error.Error as e:
      raise ValueError(
          f'unknown env id {env_id!r}: not registered with gymnasium ({e})'
      ) from None
  make = functools.partial(acting_envs.make_env, env_id,
                           max_episode_steps=max_episode_steps)
  try:
    return gym.vector.SyncVectorEnv(
        [make] * num_envs, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
  except gym.error.Error as e:  # E.g. a missing optional dependency.
    raise ValueError(f'cannot make env {env_id!r}: {e}') from None


def _stored_dtype(dtype: np.dtype) -> np.dtype:
  # D4RL stores float observations and actions as float32.
  return np.dtype(np.float32) if np.issubdtype(dtype, np.floating) else dtype


def _physics(env: gym.Env) -> Any:
  return getattr(env.unwrapped, 'data', None)  # MuJoCo envs only.


def make_step_spec(envs: gym.vector.SyncVectorEnv,
                   env_id: str) -> tfds_writer.StepSpec:
  """Returns the on-disk step spec of `envs`, taken from its spaces.

  A goal env's dict observation (Box `observation`, `achieved_goal`,
  `desired_goal`) is stored as a dict feature of float32 vectors.

  Atari's Discrete actions are stored as int64, its frames as uint8.

  Raises:
    ValueError: if observations are neither a Box nor a goal dict of Boxes,
      or actions are neither a Box nor Discrete.
  """
  obs_space, act_space = envs.single_observation_space, envs.single_action_space
  if isinstance(obs_space, gym.spaces.Dict):
    boxes = all(isinstance(s, gym.spaces.Box) for s in obs_space.values())
    if not boxes or set(obs_space.keys()) != set(acting_envs.GOAL_KEYS):
      raise ValueError(
          f'env {env_id!r}: a dict observation space must hold the Boxes '
          f'{", ".join(acting_envs.GOAL_KEYS)} (a goal env), got {obs_space}')
    observation_shape = {k: tuple(s.shape) for k, s in obs_space.items()}
    observation_dtype = np.dtype(np.float32)
  else:
    observation_shape = tuple(getattr(obs_space, 'shape', None) or ())
    observation_dtype = _stored_dtype(getattr(obs_space, 'dtype', np.float32))
  if not isinstance(obs_space, (gym.spaces.Box, gym.spaces.Dict)):
    raise ValueError(
        f'env {env_id!r}: observation space must be a Box, got {obs_space}')
  discrete = isinstance(act_space, gym.spaces.Discrete)
  if not (discrete or isinstance(act_space, gym.spaces.Box)):
    raise ValueError(f'env {env_id!r}: action space must be a Box or '
                     f'Discrete, got {act_space}')
  data = _physics(envs.envs[0])
  return tfds_writer.StepSpec(
      observation_shape=observation_shape,
      action_shape=tuple(act_space.shape),
      observation_dtype=observation_dtype,
      action_dtype=(np.dtype(np.int64) if discrete
                    else _stored_dtype(act_space.dtype)),
      qpos_shape=None if data is None else tuple(data.qpos.shape),
      qvel_shape=None if data is None else tuple(data.qvel.shape))


def _physics_infos(envs: gym.vector.SyncVectorEnv
                   ) -> rollout.ObservationInfosFn:
  """Sub-env i -> the MuJoCo state (qpos, qvel) behind its observation."""

  def infos(i: int) -> dict[str, np.ndarray]:
    data = _physics(envs.envs[i])
    return {'qpos': data.qpos.copy(), 'qvel': data.qvel.copy()}
  return infos


def record_episodes(envs: gym.vector.SyncVectorEnv, policy: Policy,
                    num_episodes: int | None, spec: tfds_writer.StepSpec, *,
                    num_env_steps: int | None = None,
                    time_limit: int = 1,
                    seed: int | None = None,
                    progress: tqdm.tqdm | None = None,
                    frame_stack: int = 1
                    ) -> Iterator[tuple[int, dict[str, Any]]]:
  """Runs `envs` until `num_episodes` episodes finish, or until whole
  episodes hold `num_env_steps` transitions; yields them as RLDS.

  Episodes are numbered in the order they start (not finish), so the result
  is not biased towards short episodes; sub-envs that would start an episode
  beyond the limit idle until the others are done. A step budget is how
  D4RL sizes its datasets (1M transitions, however many episodes): where
  episodes terminate early their count is not known in advance.

  Args:
    envs: a vector env in NEXT_STEP autoreset mode.
    policy: maps the batch of observations to actions and log-probs.
    num_episodes: how many episodes to record; None with `num_env_steps`.
    spec: the step spec (from `make_step_spec`).
    num_env_steps: record whole episodes until they hold at least this many
      transitions (`rollout.Rollout`'s `max_env_steps`); None with
      `num_episodes`.
    time_limit: the env's time limit, what a running episode reserves of
      `num_env_steps`.
    seed: passed to `envs.reset` (sub-env i gets seed + i).
    progress: a progress bar advanced by one per recorded env step.
    frame_stack: on an image env, the policy sees stacks of this many
      frames (as the learner's memory stacks them); the episodes keep one
      frame per step.

  Yields:
    (episode index, episode) in the order episodes finish.
  """
  layout = rollout.StepLayout(action_shape=spec.action_shape,
                              action_dtype=spec.action_dtype,
                              observation_dtype=spec.observation_dtype)
  if (num_episodes is None) == (num_env_steps is None):
    raise ValueError('give one of num_episodes and num_env_steps')
  loop = rollout.Rollout(
      envs, layout, seed=seed, max_episodes=num_episodes,
      max_env_steps=num_env_steps, episode_steps_bound=time_limit,
      keep_log_probs=True,
      observation_infos=(None if spec.qpos_shape is None
                         else _physics_infos(envs)),
      frame_stack=frame_stack)
  while not loop.done:
    finished: list[rollout.Episode] = []
    taken = loop.step(policy, finished.append)
    if progress is not None and taken:
      progress.update(taken)
    for episode in finished:
      yield episode.number, {'steps': episode.steps}


def dataset_name(env_id: str, policy: str) -> str:
  """TFDS-safe name: ('HalfCheetah-v5', 'random') -> 'halfcheetah_v5_random'."""
  slug = re.sub(r'[^a-z0-9]+', '_', f'{env_id}_{policy}'.lower()).strip('_')
  return slug if slug[:1].isalpha() else f'env_{slug}'


DATASET_KINDS = ('policy', 'medium-replay', 'medium-expert')
# 'rlds': discount 1.0 on every step (consumers derive terminal discounts
# from is_terminal); 'tfds_d4rl': TFDS's d4rl_mujoco_* discounts
# (`d4rl_format.tfds_encoding`), as a user of d4rl_mujoco_hopper gets them.
ENCODINGS = ('rlds', 'tfds_d4rl')


def _policy_for(name: str, env_id: str, envs: gym.vector.SyncVectorEnv,
                seed: int | None, epsilon: float = 0.0
                ) -> tuple[Policy, int]:
  """'random', a shipped policy name, or an .npz path -> (a Policy, the
  frames per stack it acts on)."""
  if name in POLICIES:
    return POLICIES[name](envs.single_action_space, seed), 1
  loaded = behaviour_policies.load_policy(name, env_id)
  return behaviour_policies.as_recording_policy(
      loaded, envs.single_observation_space, envs.single_action_space, seed,
      name, epsilon), behaviour_policies.frame_stack_of(loaded)


class _Segment(NamedTuple):
  """One policy's part of a dataset: `episodes` or `env_steps` of it."""
  policy: str
  episodes: int | None
  env_steps: int | None
  seed: int | None


def _segments(env_id: str, policy: str, dataset_kind: str,
              num_episodes: int | None, num_env_steps: int | None,
              seed: int | None) -> list[_Segment]:
  """The segments in recording order.

  medium-expert records `medium` then `expert` with the same seed, so it
  is exactly the medium and the expert datasets of that seed, one after
  the other (D4RL's is their concatenation too). medium-replay gives each
  snapshot the env steps it collected in training, as whole episodes.
  """
  if dataset_kind == 'policy':
    return [_Segment(policy, num_episodes, num_env_steps, seed)]
  if dataset_kind == 'medium-expert':
    return [_Segment(name, num_episodes, num_env_steps, seed)
            for name in ('medium', 'expert')]
  segments = []
  for i, segment in enumerate(behaviour_policies.replay_schedule(env_id)):
    name = segment['policy']
    if name != 'random':
      name = behaviour_policies.replay_policy_path(env_id, name)
    segments.append(_Segment(name, None, max(1, segment['env_steps']),
                             None if seed is None else seed + 7919 * i))
  return segments


def _size(segments: list[_Segment]) -> str:
  """'1000 episodes', '1000000 env steps' or both, summed over segments."""
  episodes = sum(s.episodes or 0 for s in segments)
  env_steps = sum(s.env_steps or 0 for s in segments)
  parts = ([f'{episodes} episodes'] if episodes else []) + (
      [f'{env_steps} env steps of whole episodes'] if env_steps else [])
  return ' and '.join(parts)


def generate_dataset(env_id: str, policy: str, num_episodes: int | None,
                     out_dir: str, *, seed: int | None = None,
                     num_envs: int = 4, max_episode_steps: int | None = None,
                     overwrite: bool = False, dataset_kind: str = 'policy',
                     show_progress: bool = True,
                     encoding: str = 'rlds',
                     num_env_steps: int | None = None,
                     epsilon: float = 0.0) -> GenerateSummary:
  """Records rollouts of a behaviour policy in `env_id` as a TFDS dataset.

  On success `out_dir` holds `<name>/1.0.0/` (a standard TFDS dataset) and
  an empty `.complete` marker; on failure it is left empty (see
  `tfds_writer.output_dir`).

  Args:
    env_id: gymnasium env id with Box observation and action spaces.
    policy: 'random', a policy shipped for the env ('medium', 'expert'; see
      `behaviour_policies`) or the path of a policy .npz.
    num_episodes: episodes to record (> 0); for 'medium-expert', of each
      half; ignored for 'medium-replay'. None with `num_env_steps`.
    out_dir: output directory; must be absent or empty unless `overwrite`.
    seed: seeds the envs and the policy; None for fresh randomness.
    num_envs: sub-envs stepped together (capped at `num_episodes`).
    max_episode_steps: time limit in env steps; None keeps the env's own.
    overwrite: replace a non-empty `out_dir` that holds generated data.
    dataset_kind: 'policy' (rollouts of `policy`), 'medium-replay' (the
      shipped replay schedule: each snapshot SAC took on its way to medium
      records the env steps it collected in training, random first) or
      'medium-expert' (`num_episodes` of the shipped medium policy, then as
      many of the expert, each half as its own dataset of the same seed).
    show_progress: show a tqdm bar of recorded env steps.
    encoding: 'rlds' or 'tfds_d4rl' (see `ENCODINGS`); the steps and
      transitions are the same, only the discounts differ.
    num_env_steps: instead of `num_episodes`: whole episodes until they
      hold at least this many transitions (of each half, for
      'medium-expert'), as D4RL sizes its datasets.
    epsilon: exploration noise of a discrete policy .npz (both halves of
      'medium-expert'): its action is replaced by a uniform one with this
      probability (the stored log-probabilities are the mixture's).

  Returns:
    A GenerateSummary.

  Raises:
    ValueError: unknown policy, kind or env id, non-positive counts, a
      negative seed, non-Box spaces, a policy made for other spaces, or an
      env without a time limit and no `max_episode_steps`.
    FileExistsError: `out_dir` is not empty and `overwrite` is False, or it
      is not generated data.
  """
  if encoding not in ENCODINGS:
    raise ValueError(f'unknown encoding {encoding!r}; one of: '
                     f'{", ".join(ENCODINGS)}')
  if dataset_kind not in DATASET_KINDS:
    raise ValueError(f'unknown dataset kind {dataset_kind!r}; one of: '
                     f'{", ".join(DATASET_KINDS)}')
  if dataset_kind == 'medium-expert':
    for name in ('medium', 'expert'):
      behaviour_policies.load_policy(name, env_id)  # Fails early if absent.
  if dataset_kind == 'policy' and policy not in POLICIES:
    behaviour_policies.load_policy(policy, env_id)  # Fails early if unknown.
  if epsilon and (dataset_kind == 'medium-replay' or (
      dataset_kind == 'policy' and policy in POLICIES)):
    what = policy if dataset_kind == 'policy' else 'the replay snapshots'
    raise ValueError(f'epsilon {epsilon} is the exploration noise of a policy '
                     f'.npz (dataset kinds policy and medium-expert), not of '
                     f'{what!r} ({dataset_kind})')
  if dataset_kind != 'medium-replay':
    if (num_episodes is None) == (num_env_steps is None):
      raise ValueError('give one of num_episodes and num_env_steps, got '
                       f'{num_episodes} and {num_env_steps}')
    if num_episodes is not None and num_episodes <= 0:
      raise ValueError(f'num_episodes must be > 0, got {num_episodes}')
    if num_env_steps is not None and num_env_steps <= 0:
      raise ValueError(f'num_env_steps must be > 0, got {num_env_steps}')
  if num_envs <= 0:
    raise ValueError(f'num_envs must be > 0, got {num_envs}')
  if max_episode_steps is not None and max_episode_steps <= 0:
    raise ValueError(f'max_episode_steps must be > 0, got {max_episode_steps}')
  if seed is not None and seed < 0:
    raise ValueError(f'seed must be >= 0, got {seed}')
  envs = make_vector_env(env_id, max(1, min(num_envs, num_episodes or
                                            num_envs)), max_episode_steps)
  try:
    time_limit = max_episode_steps or envs.envs[0].spec.max_episode_steps
    if not time_limit:
      raise ValueError(
          f'env {env_id!r} has no time limit; pass max_episode_steps')
    spec = make_step_spec(envs, env_id)
    segments = _segments(env_id, policy, dataset_kind, num_episodes,
                         num_env_steps, seed)
    # Each policy is built, and so checked against the env, before writing.
    policies = [_policy_for(segment.policy, env_id, envs, segment.seed,
                            epsilon) for segment in segments]
    returns, steps = [], 0

    def counted(bar: tqdm.tqdm):
      nonlocal steps
      offset = 0
      for segment, (act, frame_stack) in zip(segments, policies):
        count = 0
        for key, episode in record_episodes(
            envs, act, segment.episodes, spec,
            num_env_steps=segment.env_steps, time_limit=time_limit,
            seed=segment.seed, progress=bar, frame_stack=frame_stack):
          count += 1
          returns.append(float(np.sum(episode['steps']['reward'])))
          steps += len(episode['steps']['reward']) - 1
          if encoding == 'tfds_d4rl':
            episode = {'steps': d4rl_format.tfds_encoding(episode['steps'])}
          yield offset + key, episode
        offset += count

    label = policy if dataset_kind == 'policy' else dataset_kind
    bound = sum(s.env_steps + time_limit if s.episodes is None
                else s.episodes * time_limit for s in segments)
    with tfds_writer.output_dir(out_dir, overwrite), tqdm.tqdm(
        total=bound, unit='step', smoothing=0.1,
        desc=f'{env_id} {label}', disable=not show_progress) as bar:
      dataset_dir = tfds_writer.write_episodes(
          counted(bar), out_dir,
          name=dataset_name(env_id, os.path.basename(label).split('.')[0]),
          spec=spec, description=(
              f'{_size(segments)} of {env_id}, {label} '
              f'(seed {seed}, time limit {time_limit}'
              f'{f", epsilon {epsilon}" if epsilon else ""}), recorded by '
              'rlds_reverb.data.recording.generate_dataset.'))
      bar.total = bar.n  # Episodes that terminated early end the bar short.
  finally:
    envs.close()
  return GenerateSummary(
      num_episodes=len(returns), num_env_steps=steps,
      mean_return=float(np.mean(returns)), out_dir=os.fspath(out_dir),
      dataset_dir=dataset_dir)
