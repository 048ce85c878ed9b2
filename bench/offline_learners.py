"""Gradient steps/s of every offline learner, in one run, on the same data.

Each learner trains from the in-memory feed the pipelines use
(`feeds.UniformFeed`, or `ReturnToGoFeed` for cal_ql) over `--transitions`
halfcheetah-shaped transitions, several steps per `tf.function` call as
`loop.Learner` runs them, at its published batch size (rebrac 1024, the
others 256) and network sizes. Per learner: `--warmup` untimed steps
(tracing included), then `--steps` timed ones. The reference is TF-Agents'
own TD3+BC (`td3_bc`), timed in the same run: `vs_td3_bc` is each
learner's time per step over its. `hours_per_1m` is what 1M gradient steps,
the published budget, would take at that rate.

`--critic_dtypes float32,bfloat16` times each learner with ensemble critics
(AgentConfig.critic_dtype) once per dtype; a bfloat16 entry is keyed
`<learner>@bfloat16` and has `vs_float32`, its speed over the float32
entry's of the same run.

Prints one JSON line.

  python bench/offline_learners.py [--agents bc,td3_bc,...] [--steps 300] \
      [--critic_dtypes float32,bfloat16]
"""

import argparse
import json
import os
import platform
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf
from tf_agents.trajectories import trajectory

from rlds_reverb.acting import envs
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.experiments import configs
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import run
from rlds_reverb.replay import feeds
from rlds_reverb.replay import memory as memory_lib

DEFAULT_AGENTS = ('bc', 'td3_bc', 'cql_sac', 'iql', 'awac', 'rebrac', 'sac_n',
                  'edac', 'cal_ql')


def _episodes(spec, transitions: int, length: int, seed: int) -> list:
  rng = np.random.default_rng(seed)
  episodes = []
  for _ in range(max(1, transitions // length)):
    steps = length + 1
    step_type = np.ones(steps, np.int32)
    step_type[0], step_type[-1] = 0, 2
    episodes.append(trajectory.Trajectory(
        step_type=step_type,
        observation=rng.standard_normal((steps, 17)).astype(np.float32),
        action=rng.uniform(-1, 1, (steps, 6)).astype(np.float32),
        policy_info=(),
        next_step_type=np.concatenate([step_type[1:], [0]]).astype(np.int32),
        reward=rng.standard_normal(steps).astype(np.float32),
        discount=np.ones(steps, np.float32)))
  del spec
  return episodes


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--agents', default=','.join(DEFAULT_AGENTS),
                      help='comma-separated learners to time, in order')
  parser.add_argument('--transitions', type=int, default=100_000,
                      help='random halfcheetah-shaped transitions in memory, '
                      'in whole episodes of 1000 (at least one)')
  parser.add_argument('--warmup', type=int, default=50,
                      help='untimed gradient steps per learner, tracing '
                      'included')
  parser.add_argument('--steps', type=int, default=300,
                      help='timed gradient steps per learner')
  parser.add_argument('--seed', type=int, default=0,
                      help='seed of the random data and of each learner')
  parser.add_argument('--critic_dtypes', default='float32',
                      help='comma-separated AgentConfig.critic_dtype values '
                      'to time the ensemble-critic learners with')
  args = parser.parse_args()
  dtypes = args.critic_dtypes.split(',')
  specs = envs.env_specs('HalfCheetah-v5')
  data_spec = run.trajectory_spec(specs)
  memory = memory_lib.from_episodes(
      data_spec, _episodes(data_spec, args.transitions, 1000, args.seed))
  figures = {}
  runs = [(kind, dtype) for kind in args.agents.split(',')
          for dtype in (dtypes if kind in registry.names_with_ensemble_critics()
                        else ['float32'])]
  for kind, dtype in runs:
    name = kind if dtype == 'float32' else f'{kind}@{dtype}'
    run.seed_everything(args.seed)
    batch_size = configs.default(configs.OfflineConfig, kind, 'batch_size')
    agent = registry.make_agent(kind, specs.time_step_spec, specs.action_spec,
                              factory.AgentConfig(seed=args.seed,
                                                 critic_dtype=dtype))
    if kind == 'cal_ql':
      feed = feeds.ReturnToGoFeed(memory, batch_size)
    else:
      feed = feeds.UniformFeed(memory, batch_size)
    with tempfile.TemporaryDirectory() as root:
      learner = loop.Learner(agent, root, train_step_fn=feed.train_step(agent))
      learner.train(feed, args.warmup)
      start = time.perf_counter()
      learner.train(feed, args.steps)
      seconds = time.perf_counter() - start
    rate = args.steps / seconds
    figures[name] = {'batch_size': batch_size,
                     'grad_steps_per_s': round(rate, 1),
                     'hours_per_1m': round(1e6 / rate / 3600, 1)}
    if dtype != 'float32' and kind in figures:
      figures[name]['vs_float32'] = round(
          rate / figures[kind]['grad_steps_per_s'], 2)
    print(f'{name}: {rate:.1f} gradient steps/s', file=sys.stderr)
  if 'td3_bc' in figures:
    reference = figures['td3_bc']['grad_steps_per_s']
    for values in figures.values():
      values['vs_td3_bc'] = round(reference / values['grad_steps_per_s'], 2)
  print(json.dumps({
      'bench': 'offline_learners', 'reference': 'td3_bc (TF-Agents Td3Agent '
      '+ BC term), same run', 'transitions': int(memory.num_transitions),
      'warmup_steps': args.warmup, 'timed_steps': args.steps,
      'machine': f'{platform.machine()}, {os.cpu_count()} cores',
      'tensorflow': tf.__version__,
      'date': time.strftime('%Y-%m-%d'), 'learners': figures}))


if __name__ == '__main__':
  main()
