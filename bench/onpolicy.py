r"""Env steps/s of on-policy PPO: collection alone, and with learning.

For each number of env copies N (default 1, 4, 8), on one env (default
HalfCheetah-v5):
  collect  the numpy actor (a freshly made PPO actor, Gaussian head) steps N
           copies in rollouts of --rollout_size env steps, with observation
           normalisation and reward scaling, as a run collects;
  learn    a whole PPO run (`onpolicy.train_onpolicy`: collection, the
           rollout through a Reverb queue, GAE, 10 epochs x 32 minibatches),
           timed from the end of its first update (graph traced) to the end
           of its last.
Rollouts are --rollout_size env steps whatever N (rollout_steps = size / N),
so every N does the same learning work per env step. The reference is the
1-copy collection rate of the same run (`vs_collect_1`).

  python bench/onpolicy.py [--env HalfCheetah-v5] [--copies 1,4,8] \
      [--rollouts 20] [--rollout_size 2048]

Prints one JSON line.
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))

import numpy as np  # pylint: disable=g-import-not-at-top

# pylint: disable=g-import-not-at-top
from rlds_reverb.acting import envs
from rlds_reverb.acting import vector_rollouts
from rlds_reverb.agents import actor_critic
from rlds_reverb.agents.onpolicy import normalization
from rlds_reverb.experiments import onpolicy
from rlds_reverb.agents.onpolicy import ppo


def collect_rate(env: str, copies: int, rollout_size: int,
                 rollouts: int) -> float:
  specs = envs.env_specs(env)
  agent_config = ppo.defaults_for('ppo', specs.discrete)
  model = onpolicy.make_model(specs, agent_config)
  policy = actor_critic.export(model, specs.action_low, specs.action_high)
  norm = normalization.Normalization(specs.observation_shape, copies,
                                     gamma=0.99)
  collector = vector_rollouts.VectorRollouts(
      env, num_envs=copies, rollout_steps=rollout_size // copies, seed=0,
      observe=norm.observation, scale_reward=norm.reward)
  rng = np.random.default_rng(0)
  act = lambda obs, starts: policy.sample(obs, rng)
  collector.collect(act)  # warm-up
  start = time.perf_counter()
  for _ in range(rollouts):
    collector.collect(act)
  seconds = time.perf_counter() - start
  collector.close()
  return rollouts * (rollout_size // copies) * copies / seconds


def learn_rate(env: str, copies: int, rollout_size: int,
               rollouts: int) -> tuple[float, float]:
  specs = envs.env_specs(env)
  agent_config = ppo.defaults_for('ppo', specs.discrete, num_envs=copies,
                                  rollout_steps=rollout_size // copies)
  times = []
  with tempfile.TemporaryDirectory() as root:
    steps = agent_config.rollout_size * (rollouts + 1)
    onpolicy.train_onpolicy(
        onpolicy.OnPolicyConfig(env=env, root_dir=root, agent='ppo',
                                env_steps=steps, eval_interval=10 * steps,
                                eval_episodes=1, checkpoint_interval=10 * steps,
                                ppo_config=agent_config),
        show_progress=False,
        on_update=lambda _: times.append(time.perf_counter()))
  seconds = times[-1] - times[0]
  env_steps = agent_config.rollout_size * (len(times) - 1)
  gradient_steps = (len(times) - 1) * agent_config.epochs * (
      agent_config.minibatches)
  return env_steps / seconds, gradient_steps / seconds


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--env', default='HalfCheetah-v5',
                      help='environment the actor steps and PPO trains on')
  parser.add_argument('--copies', default='1,4,8',
                      help='comma-separated numbers of env copies to measure; '
                      'vs_collect_1 needs 1 first')
  parser.add_argument('--rollouts', type=int, default=20,
                      help='timed rollouts per measurement')
  parser.add_argument('--rollout_size', type=int, default=2048,
                      help='env steps per rollout, split across the copies')
  args = parser.parse_args()
  copies = [int(c) for c in args.copies.split(',')]
  rows = []
  for n in copies:
    collect = collect_rate(args.env, n, args.rollout_size, args.rollouts)
    learn, gradient = learn_rate(args.env, n, args.rollout_size,
                                 args.rollouts)
    rows.append({'copies': n, 'collect_env_steps_per_s': round(collect, 1),
                 'learn_env_steps_per_s': round(learn, 1),
                 'gradient_steps_per_s': round(gradient, 1)})
    print(f'{n} copies: collect {collect:.0f}, with learning {learn:.0f} env '
          f'steps/s', file=sys.stderr)
  reference = rows[0]['collect_env_steps_per_s'] if copies[0] == 1 else None
  for row in rows:
    row['vs_collect_1'] = (None if reference is None else round(
        row['collect_env_steps_per_s'] / reference, 2))
  print(json.dumps({
      'bench': 'onpolicy', 'env': args.env, 'rollout_size':
      args.rollout_size, 'timed_rollouts': args.rollouts,
      'reference': 'collection with 1 env copy, this run', 'rows': rows,
      'machine': f'{platform.machine()}, {os.cpu_count()} cores',
      'date': time.strftime('%Y-%m-%d')}))


if __name__ == '__main__':
  main()
