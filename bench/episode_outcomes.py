"""What a policy's evaluation episodes are: which fail, and where they go.

An evaluation's mean hides its episodes. ReBRAC on our medium-expert
swings between expert-level evaluations and ones with a return spread of
3,000-4,000 (docs/results/offline.md), and EDAC on medium sits near a
score of 0 for its first 60k steps while its critics, on the data's
states, rate its actions close to the data's. Both questions are about the
states the policy's own episodes reach. This runs each policy's greedy
episodes, as the run's evaluation does (episode i seeded seed + i), and
gives per episode: the return, whether the cheetah turned over (the
torso's pitch, observation 1 of HalfCheetah, beyond +-pi/2) and from which
step, the mean forward speed, and where it left the data for good (the
first of 50 steps in a row all further from every data state than the
held-out states' 90th percentile). Over the visited states it measures how
far they lie from the data's (the distance to the nearest of the data's
states, each dimension scaled by the data's std) and, for agents with a
critic ensemble (EDAC, SAC-N), what the critics say there: their minimum
and spread at the greedy action, against the same on the data's states;
with `--critic_reference`, also at another policy's actions (the data's
own policy) and how often they rate those above the actor's own; with
`--critics_from`, another checkpoint's critics do the rating, so actors
and critics of two moments of a run can be crossed. Along each episode
it also measures the critics' Bellman gap: their value of the greedy
action less the step's reward and their discounted value of the next
state, first step apart (the reset state, a data state).

Prints ONE JSON line. The reference is the data itself: the share of the
data's states turned over and the same nearest-state distance for
held-out data states, so a policy "off the data" is off by more than the
data's own episodes are from one another.

  python bench/episode_outcomes.py --dataset data/halfcheetah_v5_medium_expert \\
      --agent rebrac --gin_file configs/rebrac_halfcheetah_medium_expert.gin \\
      --critic_dtype bfloat16 --episodes 20 \\
      --checkpoints runs/offline_rl/medium_expert_1m_rebrac_bf16/rebrac_seed0/checkpoints/ckpt-500000

Observation normalisation is not applied: for the learners that train on
raw observations (ReBRAC, EDAC, SAC-N, CQL-SAC, BC) and numpy policy files
(which carry their own).
"""

import argparse
import json
import os
import platform
import time
from typing import Any, Optional

import gin
import numpy as np
import tensorflow as tf

from rlds_reverb import datasets
from rlds_reverb.acting import envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.learners import agents
from rlds_reverb.learners import offline
from rlds_reverb.learners import run
# pylint: disable=unused-import,g-bad-import-order (gin: every learner's
# configurable is registered before the gin files are parsed)
from rlds_reverb.learners import awac, cal_ql, iql, rebrac, sac_n
# pylint: enable=unused-import,g-bad-import-order

_MACHINE = f'{os.cpu_count()} cores, {platform.machine()}, no GPU'
# HalfCheetah's observation: qpos[1:] then qvel; 1 is the torso's pitch,
# 8 the forward speed.
PITCH, SPEED = 1, 8
TURNED_OVER = np.pi / 2


def data_states(path: str, num_episodes: int, seed: int, start_steps: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """`pick_episodes` over the dataset's episodes."""
  episodes = []
  for episode in datasets.load(path):
    steps = episode['steps'].batch(1_000_000).get_single_element()
    episodes.append(steps['observation'].numpy())
  if len(episodes) < 2 * num_episodes:
    raise ValueError(f'{path} has {len(episodes)} episodes; '
                     f'--data_episodes {num_episodes} needs twice as many')
  return pick_episodes(episodes, num_episodes, seed, start_steps)


def pick_episodes(episodes: list[np.ndarray], num_episodes: int, seed: int,
                  start_steps: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Observations of `num_episodes` episodes spread over the data, of as
  many other ones (held out: the reference for the distances), and the
  first `start_steps` of the first set: the start from rest, which every
  episode passes through but which is a small share of the data."""
  order = np.random.default_rng(seed).permutation(len(episodes))
  picked = [episodes[i] for i in order[:num_episodes]]
  held_out = [episodes[i] for i in order[num_episodes:2 * num_episodes]]
  return (np.concatenate(picked), np.concatenate(held_out),
          np.concatenate([e[:start_steps] for e in picked]))


def nearest_distance(states: np.ndarray, data: np.ndarray,
                     scale: np.ndarray) -> np.ndarray:
  """Distance from each state to its nearest data state, per-dimension
  scaled by `scale`."""
  data = (data / scale).astype(np.float32)
  data_sq = np.sum(data**2, axis=1)
  out = []
  for chunk in np.array_split(states / scale, max(1, len(states) // 256)):
    chunk = chunk.astype(np.float32)
    d2 = (np.sum(chunk**2, axis=1)[:, None] - 2 * chunk @ data.T +
          data_sq[None, :])
    out.append(np.sqrt(np.maximum(d2.min(axis=1), 0.0)))
  return np.concatenate(out)


def departure(distance: np.ndarray, threshold: float, run: int
              ) -> Optional[int]:
  """The first step of `run` consecutive steps all further than
  `threshold` from the data (None: never): where an episode leaves it for
  good, not one outlying step (a tenth of held-out data states lie past
  their 90th percentile too)."""
  beyond = np.concatenate([[0], np.cumsum(distance > threshold)])
  full = np.flatnonzero(beyond[run:] - beyond[:-run] == run)
  return int(full[0]) if full.size else None


def run_episodes(policy: numpy_policy.NumpyPolicy, env_id: str,
                 num_episodes: int, seed: int,
                 lead: Optional[numpy_policy.NumpyPolicy] = None,
                 lead_steps: int = 0) -> list[dict[str, Any]]:
  """Greedy episodes, one env each, seeded as the run's evaluation; with
  `lead`, that policy acts for the first `lead_steps` of each."""
  episodes = []
  for i in range(num_episodes):
    env = envs.make_env(env_id)
    try:
      obs, _ = env.reset(seed=seed + i)
      observations, actions, rewards, done = [obs], [], [], False
      while not done:
        acting = lead if lead is not None and len(actions) < lead_steps else (
            policy)
        action = acting.greedy(obs[None].astype(np.float32))[0]
        obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(float(reward))
        done = terminated or truncated
    finally:
      env.close()
    episodes.append({'return': float(np.sum(rewards)),
                     'observations': np.asarray(observations, np.float32),
                     'actions': np.asarray(actions, np.float32),
                     'rewards': np.asarray(rewards, np.float32)})
  return episodes


def discounted_return(rewards: np.ndarray, gamma: float) -> float:
  """What the critics estimate, measured: sum_k gamma^k r_k."""
  return float(np.sum(rewards * gamma**np.arange(len(rewards))))


def handoff_figures(policy: numpy_policy.NumpyPolicy,
                    lead: numpy_policy.NumpyPolicy, lead_steps: int,
                    args: argparse.Namespace, critic: Optional[Any] = None,
                    lead_alone: Optional[list[dict[str, Any]]] = None
                    ) -> dict[str, Any]:
  """The policy's episodes when `lead` starts each one: whether it keeps
  going from where the lead leaves the cheetah, though it cannot get there
  itself. The score is the whole episode's, the lead's steps included;
  speed and turn-overs are of the policy's own steps. With `critic`: at
  the handoff state, the critics' minimum at the policy's action and at
  the lead's, beside the discounted return each then earns (the lead
  going on alone): do they rank the two as what follows does?
  `lead_alone`: the lead's own episodes, the same for every policy and
  handoff, so a caller probing many can run them once."""
  episodes = run_episodes(policy, args.env, args.episodes, args.seed, lead,
                          lead_steps)
  rows = [episode_figures(e['observations'][lead_steps:], e['return'],
                          args.env) for e in episodes]
  scores = [row['score'] for row in rows]
  over = [r['turned_over_from'] for r in rows
          if r['turned_over_from'] is not None]
  return {'lead_steps': lead_steps,
          'score_mean': round(float(np.mean(scores)), 1),
          'score_std': round(float(np.std(scores)), 1),
          'speed': round(float(np.mean([r['speed'] for r in rows])), 2),
          'turned_over_episodes': len(over),
          # How long the policy keeps the cheetah upright once it acts.
          'turned_over_after_median': float(np.median(over)) if over else None,
          **(_handoff_values(policy, lead, lead_steps, args, critic, episodes,
                             lead_alone)
             if critic is not None else {})}


def _handoff_values(policy: numpy_policy.NumpyPolicy,
                    lead: numpy_policy.NumpyPolicy, lead_steps: int,
                    args: argparse.Namespace, critic: Any,
                    episodes: list[dict[str, Any]],
                    alone: Optional[list[dict[str, Any]]] = None
                    ) -> dict[str, float]:
  # The lead's own episodes pass the same states up to the handoff
  # (same seeds, greedy): its return from there is the alternative's.
  if alone is None:
    alone = run_episodes(lead, args.env, args.episodes, args.seed)
  states = np.stack([e['observations'][lead_steps] for e in episodes])
  earned = lambda runs: float(np.mean([discounted_return(
      e['rewards'][lead_steps:] * args.reward_scale, args.gamma)
                                       for e in runs]))
  return {
      'critic_min_q': round(float(critic_values(critic, policy, states).min(
          axis=1).mean()), 1),
      'discounted_return': round(earned(episodes), 1),
      'lead_critic_min_q': round(float(critic_values(critic, lead, states).min(
          axis=1).mean()), 1),
      'lead_discounted_return': round(earned(alone), 1)}


def episode_figures(observations: np.ndarray, episode_return: float,
                    env_id: str) -> dict[str, Any]:
  """Score, the first step turned over (None: never) and the share of
  steps turned over, and the mean forward speed (from that step on too)."""
  over = np.flatnonzero(np.abs(observations[:, PITCH]) > TURNED_OVER)
  return {
      'score': round(envs.normalized_score(env_id, episode_return), 1),
      'turned_over_from': int(over[0]) if over.size else None,
      'turned_over_share': round(float(over.size / len(observations)), 3),
      'speed': round(float(observations[:, SPEED].mean()), 2),
      # Does it get going again once over?
      'speed_after_turning_over': (
          round(float(observations[over[0]:, SPEED].mean()), 2)
          if over.size else None)}


def critic_values(critic: Any, policy: numpy_policy.NumpyPolicy,
                  states: np.ndarray) -> np.ndarray:
  """The ensemble's values at the greedy action, [states, critics]."""
  actions = policy.greedy(states).astype(np.float32)
  return critic((states.astype(np.float32), actions))[0].numpy()


def critic_figures(critic: Any, policy: numpy_policy.NumpyPolicy,
                   states: np.ndarray,
                   reference: Optional[numpy_policy.NumpyPolicy] = None
                   ) -> dict[str, float]:
  """The ensemble's minimum and spread at the greedy action; with a
  `reference` policy, its minimum at the reference's actions too and the
  share of states where that beats the policy's own: whether the critics
  would lead the actor elsewhere at these states, or agree with it; and
  how far apart the two act there (mean |difference| per action entry),
  whether the actor has moved from the reference or come back to it."""
  q = critic_values(critic, policy, states)
  figures = {'min_q': round(float(q.min(axis=1).mean()), 1),
             'q_std': round(float(q.std(axis=1).mean()), 2)}
  if reference is not None:
    other = critic_values(critic, reference, states).min(axis=1)
    figures['reference_min_q'] = round(float(other.mean()), 1)
    figures['reference_preferred_share'] = round(
        float(np.mean(other > q.min(axis=1))), 3)
    figures['reference_action_distance'] = round(float(np.mean(np.abs(
        policy.greedy(states) - reference.greedy(states)))), 3)
  return figures


def bellman_gap(critic: Any, policy: numpy_policy.NumpyPolicy,
                observations: np.ndarray, rewards: np.ndarray,
                gamma: float) -> np.ndarray:
  """Per step of an episode, the critics' minimum at the greedy action
  less what the step then earned: reward plus the discounted minimum at
  the next state (greedy action, no entropy term; HalfCheetah never
  terminates). Positive: the critics promised more than the step gave,
  the overestimate that draws an actor to an action."""
  q = critic_values(critic, policy, observations).min(axis=1)
  return q[:-1] - (rewards + gamma * q[1:])


def outcomes(policy: numpy_policy.NumpyPolicy, critic: Optional[Any],
             args: argparse.Namespace, data: np.ndarray, scale: np.ndarray,
             rng: np.random.Generator, off_data: float,
             reference: Optional[numpy_policy.NumpyPolicy] = None,
             starts: Optional[np.ndarray] = None) -> dict[str, Any]:
  """One policy's episodes and the figures of its visited states;
  `off_data`: the distance past which a state counts as off the data;
  `reference`: a policy whose actions the critics rate there too;
  `starts`: the data's start-from-rest states, rated apart."""
  episodes = run_episodes(policy, args.env, args.episodes, args.seed)
  rows, distances = [], []
  for e in episodes:
    distance = nearest_distance(e['observations'], data, scale)
    distances.append(distance)
    rows.append({**episode_figures(e['observations'], e['return'], args.env),
                 'off_data_share': round(float(np.mean(distance > off_data)),
                                         3),
                 'left_data_at': departure(distance, off_data,
                                           args.departure_steps)})
  left = [r['left_data_at'] for r in rows if r['left_data_at'] is not None]
  visited = np.concatenate([e['observations'] for e in episodes])
  sample = rng.choice(len(visited), min(args.states, len(visited)),
                      replace=False)
  visited, distance = visited[sample], np.concatenate(distances)[sample]
  scores = [row['score'] for row in rows]
  figures = {
      'score_mean': round(float(np.mean(scores)), 1),
      'score_std': round(float(np.std(scores)), 1),
      'turned_over_episodes': sum(r['turned_over_from'] is not None
                                  for r in rows),
      'distance_median': round(float(np.median(distance)), 2),
      'distance_p90': round(float(np.percentile(distance, 90)), 2),
      'left_data_episodes': len(left),
      'left_data_at_median': float(np.median(left)) if left else None,
      'episodes': rows}
  if critic is not None:
    gaps = np.stack([bellman_gap(critic, policy, e['observations'],
                                 e['rewards'] * args.reward_scale,
                                 args.gamma) for e in episodes])
    figures['bellman_gap'] = {
        'first_step': round(float(gaps[:, 0].mean()), 1),
        'steps_1_to_9': round(float(gaps[:, 1:10].mean()), 1),
        'all_steps': round(float(gaps.mean()), 2)}
    # The reset states are data states, but each data episode has one.
    figures['critic_reset_states'] = critic_figures(
        critic, policy, np.stack([e['observations'][0] for e in episodes]),
        reference)
    figures['critic_visited'] = critic_figures(critic, policy, visited,
                                               reference)
    held = data[rng.choice(len(data), len(visited), replace=False)]
    figures['critic_data'] = critic_figures(critic, policy, held, reference)
    if starts is not None:
      figures['critic_data_start'] = critic_figures(critic, policy, starts,
                                                    reference)
  return figures


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--dataset', required=True,
                      help='The run\'s dataset: the reference states.')
  parser.add_argument('--env', default='HalfCheetah-v5')
  parser.add_argument('--agent', default='rebrac',
                      help='Agent of the --checkpoints.')
  parser.add_argument('--gin_file', action='append', default=[],
                      help='The runs\' gin files (network sizes, N critics).')
  parser.add_argument('--critic_dtype', default='float32',
                      choices=('float32', 'bfloat16'))
  parser.add_argument('--checkpoints', default='',
                      help='Comma-separated checkpoints of --agent runs.')
  parser.add_argument('--policy_files', default='',
                      help='Comma-separated numpy policies (e.g. the ones '
                      'that recorded the data).')
  parser.add_argument('--critic_reference', default='',
                      help='A numpy policy (e.g. the one that recorded the '
                      'data) whose actions the checkpoints\' critics rate '
                      'at the same states as their own actor\'s.')
  parser.add_argument('--critics_from', default='',
                      help='A checkpoint of the same run whose critics rate '
                      'every --checkpoints policy instead of its own: '
                      'crossing actors and critics of two moments tells '
                      'which of them changed.')
  parser.add_argument('--gamma', type=float, default=0.99,
                      help='The run\'s discount, for the Bellman gap.')
  parser.add_argument('--reward_scale', type=float, default=1.0,
                      help='The run\'s reward scale, for the Bellman gap.')
  parser.add_argument('--episodes', type=int, default=20,
                      help='Greedy episodes per policy.')
  parser.add_argument('--data_episodes', type=int, default=50,
                      help='Data episodes as the reference states (and as '
                      'many held out).')
  parser.add_argument('--handoff_from', default='',
                      help='A policy file (.npz) that starts each episode '
                      'before the checkpoint\'s policy takes over (the '
                      'handoff figures): does a policy that cannot get '
                      'going keep going once started?')
  parser.add_argument('--handoff_steps', default='20,100',
                      help='Comma-separated: the steps --handoff_from acts '
                      'for, one set of episodes each.')
  parser.add_argument('--start_steps', type=int, default=20,
                      help='The critics are also rated at the first this '
                      'many steps of each reference data episode '
                      '(critic_data_start): the start from rest, which '
                      'every episode passes and the data holds little of.')
  parser.add_argument('--states', type=int, default=5000,
                      help='Visited states sampled for the distances.')
  parser.add_argument('--departure_steps', type=int, default=50,
                      help='An episode has left the data at the first of '
                      'this many consecutive steps all further from it than '
                      'the held-out states\' 90th percentile.')
  parser.add_argument('--seed', type=int, default=0)
  args = parser.parse_args()
  if not args.checkpoints and not args.policy_files:
    parser.error('give --checkpoints or --policy_files')
  if args.agent in offline.NORMALIZED_OBSERVATIONS and args.checkpoints:
    parser.error(f'--agent {args.agent} trains on normalised observations; '
                 'this probe feeds raw ones (use its exported policy file)')
  gin.parse_config_files_and_bindings(args.gin_file, [])
  start = time.perf_counter()
  rng = np.random.default_rng(args.seed)
  data, held_out, starts = data_states(args.dataset, args.data_episodes,
                                       args.seed, args.start_steps)
  scale = data.std(axis=0) + 1e-6
  held = held_out[rng.choice(len(held_out), args.states, replace=False)]
  reference = nearest_distance(held, data, scale)
  off_data = float(np.percentile(reference, 90))
  specs = envs.env_specs(args.env)
  reference_policy = (numpy_policy.load(args.critic_reference)
                      if args.critic_reference else None)
  lead = numpy_policy.load(args.handoff_from) if args.handoff_from else None
  lead_alone = None  # the lead's own episodes, run once when first needed
  handoff_steps = [int(n) for n in args.handoff_steps.split(',') if n]
  def restore(path: str) -> Any:
    agent = agents.make_agent(args.agent, specs.time_step_spec,
                              specs.action_spec, agents.AgentConfig(
                                  seed=args.seed,
                                  critic_dtype=args.critic_dtype))
    status = tf.train.Checkpoint(agent=agent).restore(path)
    status.expect_partial().assert_existing_objects_matched()
    return agent

  critics_from = (restore(args.critics_from).critic_network
                  if args.critics_from else None)
  rows = []
  for path in filter(None, args.checkpoints.split(',')):
    agent = restore(path)
    critic = (critics_from if critics_from is not None else
              getattr(agent, 'critic_network', None))
    policy = run.export_policy(agent, args.agent, specs)
    rows.append({'checkpoint': path, **outcomes(
        policy, critic, args, data, scale, rng, off_data, reference_policy,
        starts)})
    if lead is not None:
      if critic is not None and lead_alone is None:
        lead_alone = run_episodes(lead, args.env, args.episodes, args.seed)
      rows[-1]['handoff'] = [
          handoff_figures(policy, lead, steps, args, critic, lead_alone)
          for steps in handoff_steps]
    print(json.dumps({k: v for k, v in rows[-1].items() if k != 'episodes'}),
          flush=True)
  for path in filter(None, args.policy_files.split(',')):
    rows.append({'policy_file': path, **outcomes(
        numpy_policy.load(path), None, args, data, scale, rng, off_data)})
    print(json.dumps({k: v for k, v in rows[-1].items() if k != 'episodes'}),
          flush=True)
  print(json.dumps({
      'probe': 'episode_outcomes', 'dataset': args.dataset,
      'agent': args.agent, 'gin_files': args.gin_file,
      'critic_dtype': args.critic_dtype, 'seed': args.seed,
      'critic_reference': args.critic_reference or None,
      'critics_from': args.critics_from or None,
      'handoff_from': args.handoff_from or None,
      'episodes_per_policy': args.episodes,
      'reference': {
          'data_turned_over_share': round(float(np.mean(
              np.abs(np.concatenate([data, held_out])[:, PITCH]) >
              TURNED_OVER)), 4),
          'held_out_distance_median': round(float(np.median(reference)), 2),
          'held_out_distance_p90': round(float(np.percentile(reference, 90)),
                                         2)},
      'policies': rows, 'seconds': round(time.perf_counter() - start),
      'machine': _MACHINE, 'date': time.strftime('%Y-%m-%d')}), flush=True)


if __name__ == '__main__':
  main()
