"""EDAC's slow start on medium: is it the greedy action or the policy?

EDAC on our medium stays near a normalised score of 0 for its first
60k-70k gradient steps, where every other learner is near BC's level
within 10k (docs/results/offline.md). The scores there are of the greedy
policy, tanh(mean) of the actor's tanh-normal. This trains EDAC offline as
`pipelines.train --agent edac` does and, at each evaluation, also runs the
stochastic policy (actions sampled from that tanh-normal) and measures, on
observations of the dataset, how often the greedy action sits at a bound
(|a| > 0.99) against how often the data's actions do, and how far sampled
actions lie from the greedy one. A greedy policy far below the stochastic
one, with saturated actions, puts the slow start in the mode of a wide
distribution rather than in what the actor learned. On the same states it
measures how far the greedy actions lie from the data's and what the
critics say of both (their minimum, the actor's objective, and their
spread, the pessimism EDAC relies on): an actor that leaves the data's
actions for ones the whole ensemble rates higher, with no more spread
there, is exploiting the critics where they all extrapolate alike.

Prints ONE JSON line: per evaluation, the greedy and stochastic normalised
scores and those action figures; no reference library has this probe, so
the reference is the same run's own greedy score.

  python bench/edac_start.py --dataset data/halfcheetah_v5_medium \
      --steps 20000 --eval_interval 2000 \
      --gin_file configs/edac_halfcheetah_medium.gin --critic_dtype bfloat16

`--checkpoints` measures finished runs' actors the same way, without
training or evaluating (the reference: policies that do run).
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
from rlds_reverb.acting import evaluation
from rlds_reverb.acting import numpy_policy
from rlds_reverb.learners import agents
from rlds_reverb.learners import offline
from rlds_reverb.learners import run
# pylint: disable=unused-import,g-bad-import-order (gin: every learner's
# configurable is registered before the gin files are parsed)
from rlds_reverb.learners import awac, cal_ql, iql, rebrac, sac_n
# pylint: enable=unused-import,g-bad-import-order

_MACHINE = f'{os.cpu_count()} cores, {platform.machine()}, no GPU'


def dataset_steps(path: str, limit: int) -> tuple[np.ndarray, np.ndarray]:
  """The first `limit` (observation, action) pairs of the dataset."""
  observations, actions = [], []
  for episode in datasets.load(path).take(max(1, limit // 1000 + 1)):
    for step in episode['steps'].as_numpy_iterator():
      observations.append(step['observation'])
      actions.append(step['action'])
  return (np.asarray(observations[:limit], np.float32),
          np.asarray(actions[:limit], np.float32))


def action_figures(policy: numpy_policy.NumpyPolicy, critic: Optional[Any],
                   observations: np.ndarray, data_actions: np.ndarray,
                   rng: np.random.Generator) -> dict:
  """The actor's actions on the data's states against the data's, and
  the critics' minimum and spread (std over the N critics) at both,
  averaged over the states (no critic: the actions only)."""
  greedy = policy.greedy(observations)
  sampled = policy.sample(observations, rng)[0]
  mean = lambda x, digits: round(float(np.mean(x)), digits)
  figures = {
      'greedy_saturated': mean(np.abs(greedy) > 0.99, 3),
      'sampled_to_greedy': mean(np.abs(sampled - greedy), 3),
      'greedy_to_data': mean(np.abs(greedy - data_actions), 3)}
  if critic is None:
    return figures
  q_data = critic((observations, data_actions))[0].numpy()  # [B, N]
  q_greedy = critic((observations, greedy.astype(np.float32)))[0].numpy()
  return {
      **figures,
      'min_q_data': mean(q_data.min(axis=1), 1),
      'min_q_greedy': mean(q_greedy.min(axis=1), 1),
      'q_std_data': mean(q_data.std(axis=1), 2),
      'q_std_greedy': mean(q_greedy.std(axis=1), 2)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--dataset', required=True)
  parser.add_argument('--env', default='HalfCheetah-v5')
  parser.add_argument('--steps', type=int, default=20000,
                      help='Gradient steps.')
  parser.add_argument('--eval_interval', type=int, default=2000)
  parser.add_argument('--eval_episodes', type=int, default=5,
                      help='Episodes of each policy at each evaluation.')
  parser.add_argument('--gin_file', action='append', default=[])
  parser.add_argument('--critic_dtype', default='float32',
                      choices=('float32', 'bfloat16'))
  parser.add_argument('--seed', type=int, default=0)
  parser.add_argument('--root', default='runs/edac_start',
                      help='Run directory (resumes if it holds a run).')
  parser.add_argument('--checkpoints', default=None,
                      help='Comma-separated checkpoints of EDAC runs (same '
                      'gin files and --critic_dtype): measure their actions '
                      'on the data instead of training.')
  parser.add_argument('--policy_files', default=None,
                      help='With --checkpoints: numpy policies (e.g. the '
                      'one that recorded the data) measured the same way, '
                      'without critics.')
  args = parser.parse_args()
  gin.parse_config_files_and_bindings(args.gin_file, [])
  observations, data_actions = dataset_steps(args.dataset, 2000)
  rng = np.random.default_rng(args.seed)
  rows = []
  greedy_evaluate = run.Run.evaluate

  def evaluate(this_run: run.Run, episodes: int, seed: int, **kwargs) -> dict:
    """The run's own (greedy) evaluation, then the probe's figures."""
    record = greedy_evaluate(this_run, episodes, seed, **kwargs)
    policy = this_run.policy
    stochastic = evaluation.evaluate(
        lambda obs: policy.sample(this_run.act_input(obs), rng)[0],
        this_run.specs.env_id, episodes, seed=10_000 + seed)
    rows.append({
        'train_step': record['train_step'],
        'greedy_score': round(record['normalized_score'], 2),
        'stochastic_score': round(envs.normalized_score(
            args.env, stochastic.average_return), 2),
        **action_figures(policy, this_run.agent.critic_network,
                         this_run.act_input(observations), data_actions,
                         rng)})
    print(json.dumps(rows[-1]), flush=True)
    return record

  if args.checkpoints:
    specs = envs.env_specs(args.env)
    for path in args.checkpoints.split(','):
      agent = agents.make_agent('edac', specs.time_step_spec,
                                specs.action_spec, agents.AgentConfig(
                                    seed=args.seed,
                                    critic_dtype=args.critic_dtype))
      tf.train.Checkpoint(agent=agent).restore(path).expect_partial()
      rows.append({'checkpoint': path, **action_figures(
          run.export_policy(agent, 'edac', specs), agent.critic_network,
          observations, data_actions, rng)})
    for path in args.policy_files.split(',') if args.policy_files else []:
      rows.append({'policy_file': path, **action_figures(
          numpy_policy.load(path), None, observations, data_actions, rng)})
    print(json.dumps({'probe': 'edac_start', 'dataset': args.dataset,
                      'gin_files': args.gin_file, 'checkpoints': rows,
                      'machine': _MACHINE,
                      'date': time.strftime('%Y-%m-%d')}), flush=True)
    return
  run.Run.evaluate = evaluate  # The probe rides on the run's evaluations.
  start = time.perf_counter()
  offline.train_offline(offline.OfflineConfig(
      agent='edac', dataset=args.dataset, env=args.env,
      root_dir=args.root, train_steps=args.steps,
      eval_interval=args.eval_interval, checkpoint_interval=args.steps,
      eval_episodes=args.eval_episodes, seed=args.seed,
      batch_size=agents.DEFAULT_BATCH_SIZE.get('edac', 256),
      agent_config=agents.AgentConfig(seed=args.seed, train_steps=args.steps,
                                      critic_dtype=args.critic_dtype)),
                        show_progress=False)
  print(json.dumps({
      'probe': 'edac_start', 'dataset': args.dataset, 'steps': args.steps,
      'seed': args.seed, 'gin_files': args.gin_file,
      'critic_dtype': args.critic_dtype,
      'data_saturated': round(float(np.mean(np.abs(data_actions) > 0.99)), 3),
      'evaluations': rows, 'reference': 'the same run\'s greedy score',
      'seconds': round(time.perf_counter() - start),
      'machine': _MACHINE, 'date': time.strftime('%Y-%m-%d')}), flush=True)


if __name__ == '__main__':
  main()
