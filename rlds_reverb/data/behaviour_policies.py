"""Behaviour policies for recording datasets: random, shipped, or a file.

The shipped policies are numpy snapshots of this project's own online SAC
runs (`rlds_reverb/policies/<env>/`; Pong's of its PPO run), in the roles
D4RL gives its data:
  medium.npz   the snapshot whose stochastic return is closest to D4RL's
               medium level (`ship_from_run(medium_return=...)`)
  expert.npz   the final policy of a run long enough to be an expert
  replay/      the snapshots the run took on its way to `medium`, each of
               which collected `interval` env steps of the replay data
  final.npz    (history) the last policy of an earlier, shorter run
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

from rlds_reverb.acting import numpy_policy

POLICY_DIR = pathlib.Path(__file__).parent.parent / 'policies'
REPLAY_DIR = 'replay'
SCHEDULE_FILE = 'schedule.json'

# D4RL roles we do not ship for an env (by its policy folder), and why: asked
# for by name, they fail with this.
NOT_SHIPPED: dict[str, dict[str, str]] = {}

# Maps a batch of observations to (actions, log-probabilities).
Policy = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]


def env_dir(env_id: str) -> pathlib.Path:
  """'HalfCheetah-v5' -> <package>/policies/halfcheetah_v5."""
  return POLICY_DIR / re.sub(r'[^a-z0-9]+', '_', env_id.lower()).strip('_')


def shipped_names(env_id: str) -> list[str]:
  """Names of the policies shipped for `env_id` (e.g. ['final', 'medium'])."""
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
    why = NOT_SHIPPED.get(env_dir(env_id).name, {}).get(name_or_path)
    if why:
      raise ValueError(f'{why} (env {env_id!r})')
    known = ', '.join(['random'] + shipped_names(env_id))
    raise ValueError(f'unknown policy {name_or_path!r} for env {env_id!r}; known: '
                     f'{known}, or a path to a policy .npz file')
  return numpy_policy.load(str(path))


def frame_stack_of(policy: numpy_policy.NumpyPolicy) -> int:
  """Frames per stack an image policy takes (its input's first axis); 1
  for a vector policy."""
  if policy.conv_kernels is None or policy.input_shape is None:
    return 1
  return int(policy.input_shape[0])


def as_recording_policy(policy: numpy_policy.NumpyPolicy,
                        observation_space: gym.spaces.Box,
                        action_space: gym.spaces.Space, seed: int | None,
                        what: str, epsilon: float = 0.0) -> Policy:
  """Wraps a numpy policy to sample actions (and log-probs) for `recording`;
  a gaussian (PPO) head's actions are clipped to the bounds. An image
  policy acts on frame stacks ([k] + the env's frame shape,
  `frame_stack_of`) while the data keeps one frame per step. `epsilon` > 0
  (discrete actions) replaces the policy's action by a uniform one with
  that probability; the stored log-probability is the mixture's.

  Raises:
    ValueError: the policy's observations or actions are not the env's, or
      a discrete env's policy cannot sample (a Q-network's argmax).
  """
  if policy.conv_kernels is not None:
    frame = list(policy.input_shape or [])[1:]
    if frame != list(observation_space.shape):
      raise ValueError(
          f'policy {what} takes stacks of frames {frame}; the env\'s frames '
          f'are {list(observation_space.shape)}')
  else:
    obs_size = int(np.prod(observation_space.shape))
    if policy.observation_size != obs_size:
      raise ValueError(
          f'policy {what} takes observations of size '
          f'{policy.observation_size}; the env\'s have {obs_size}')
  if isinstance(action_space, gym.spaces.Discrete):
    outputs = int(policy.kernels[-1].shape[1])
    if policy.head != 'categorical' or outputs != int(action_space.n):
      raise ValueError(
          f'policy {what} ({policy.head!r} head, {outputs} outputs) cannot '
          f'sample the env\'s {int(action_space.n)} discrete actions: '
          "recording takes a 'categorical' policy (PPO, A2C, ACKTR)")
  elif policy.action_size != int(np.prod(action_space.shape)):
    raise ValueError(
        f'policy {what} gives actions of size {policy.action_size}; the '
        f'env takes {int(np.prod(action_space.shape))}')
  if not 0.0 <= epsilon <= 1.0:
    raise ValueError(f'epsilon must be in [0, 1], got {epsilon}')
  rng = np.random.default_rng(seed)
  if epsilon > 0:
    if not isinstance(action_space, gym.spaces.Discrete):
      raise ValueError(f'epsilon {epsilon} mixes uniform discrete actions '
                       f'in; the env\'s actions are {action_space}')
    return lambda observations: numpy_policy.sample_categorical(
        numpy_policy.mix_uniform(policy.action_log_probs(observations),
                                 epsilon), policy.action_low, rng)
  if policy.head != 'gaussian':
    return lambda observations: policy.sample(observations, rng)

  def clipped(observations):
    # A PPO actor's samples are unbounded; the data holds what the env
    # took. A clipped sample has no density, so its log-prob is NaN.
    actions, log_probs = policy.sample(observations, rng)
    inside = np.all((actions >= policy.action_low) &
                    (actions <= policy.action_high), axis=-1)
    return (np.clip(actions, policy.action_low, policy.action_high),
            np.where(inside, log_probs, np.nan))

  return clipped


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


def stochastic_return(policy: numpy_policy.NumpyPolicy, env_id: str,
                      episodes: int = 10, seed: int = 0) -> float:
  """Mean return of the policy acting as it records (sampled actions):
  the behaviour return of the data it would record."""
  from rlds_reverb.acting import evaluation  # pylint: disable=g-import-not-at-top
  from rlds_reverb.acting import envs  # pylint: disable=g-import-not-at-top
  env = envs.make_env(env_id)
  try:
    act = as_recording_policy(policy, env.observation_space,
                              env.action_space, seed, 'snapshot')
  finally:
    env.close()
  return evaluation.evaluate(lambda obs: act(obs)[0], env_id, episodes,
                             seed=seed).average_return


def ship_from_run(run_dir: str, env_id: str, *,
                  policy_dir: pathlib.Path | None = None,
                  medium_fraction: float = 1 / 3,
                  medium_return: float | None = None,
                  expert: bool = False, expert_step: int | None = None,
                  episodes: int = 10,
                  initial_collect_steps: int = 10_000) -> dict:
  """Turns an online run's snapshots into the shipped behaviour policies.

  `medium` is the snapshot whose return is closest to `medium_return`
  (D4RL's medium level, about 4,770 on HalfCheetah), measured as the
  policy records: sampled actions, `episodes` episodes each (the closest
  three again over 5x as many), snapshots before the last only; without `medium_return`, the one whose greedy
  evaluation return is closest to `medium_fraction` of the run's last.
  `final` (or `expert`, with `expert`) is the run's last evaluated
  snapshot, or the one at `expert_step` where the last evaluation caught
  the policy in a bad spell (a walker that falls in some episodes);
  snapshots after it are not used. `replay/`
  holds the snapshots before `medium` and a schedule saying how many env
  steps each collected in training (the first `initial_collect_steps`
  were uniform random).

  Returns:
    What was chosen: {'medium_step', 'medium_return', 'final_return', ...}.

  Raises:
    ValueError: the run has no evaluated snapshots, or none at
      `expert_step`.
  """
  policy_dir = policy_dir or env_dir(env_id)
  evals = {}
  with open(os.path.join(run_dir, 'eval.jsonl')) as f:
    for line in f:
      record = json.loads(line)
      evals[record['env_steps']] = record['average_return']
  snapshots = sorted(pathlib.Path(run_dir, 'policies').glob('step_*.npz'))
  steps = {int(p.stem.split('_')[1]): p for p in snapshots}
  evaluated = sorted(s for s in steps if s in evals)
  if not evaluated:
    raise ValueError(f'{run_dir} holds no evaluated policy snapshots')
  if expert_step is not None and expert_step not in evaluated:
    raise ValueError(f'{run_dir} has no evaluated snapshot at expert_step '
                     f'{expert_step}; evaluated ones: {evaluated}')
  final_step = evaluated[-1] if expert_step is None else expert_step
  evaluated = [s for s in evaluated if s <= final_step]
  final_return = evals[final_step]
  sampled = {}
  if medium_return is not None:
    candidates = evaluated[:-1] or evaluated
    sampled = {s: stochastic_return(numpy_policy.load(str(steps[s])), env_id,
                                    episodes) for s in candidates}
    # Returns of one snapshot spread between seeds (a cheetah that flips
    # over scores low); the closest few are measured again, 5x longer.
    closest = sorted(candidates, key=lambda s: abs(sampled[s] -
                                                   medium_return))[:3]
    for s in closest:
      sampled[s] = stochastic_return(numpy_policy.load(str(steps[s])),
                                     env_id, 5 * episodes, seed=1000)
    medium_step = min(closest, key=lambda s: abs(sampled[s] - medium_return))
  else:
    medium_step = min(evaluated, key=lambda s: abs(
        evals[s] - medium_fraction * final_return))
  (policy_dir / REPLAY_DIR).mkdir(parents=True, exist_ok=True)
  numpy_policy.load(str(steps[medium_step])).save(
      str(policy_dir / 'medium.npz'))
  last_name = 'expert' if expert else 'final'
  numpy_policy.load(str(steps[final_step])).save(
      str(policy_dir / f'{last_name}.npz'))
  segments = [{'policy': 'random', 'env_steps': initial_collect_steps}]
  collected_by = [s for s in sorted(steps)
                  if initial_collect_steps <= s < medium_step]
  for start, end in zip(collected_by, collected_by[1:] + [medium_step]):
    name = f'step_{start:08d}'
    numpy_policy.load(str(steps[start])).save(
        str(policy_dir / REPLAY_DIR / f'{name}.npz'))
    segments.append({'policy': name, 'env_steps': end - start})
  chosen = {'medium_step': medium_step, 'medium_return': evals[medium_step],
            'final_step': final_step, 'final_return': final_return,
            'replay_env_steps': sum(s['env_steps'] for s in segments)}
  if sampled:
    chosen.update(medium_stochastic_return=sampled[medium_step],
                  stochastic_returns={str(s): r for s, r in sampled.items()})
  with open(policy_dir / REPLAY_DIR / SCHEDULE_FILE, 'w') as f:
    json.dump({'segments': segments, 'source': chosen}, f, indent=1)
  return chosen
