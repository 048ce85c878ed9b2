"""The in-memory feed against its targets and its peers, in one run.

Data: `--transitions` halfcheetah-shaped transitions (observation 17,
action 6, float32; episodes of `--episode_steps` transitions) pushed as
whole-episode items into an episode table of an in-process Reverb server,
then read into a `TransitionMemory` (`load_seconds`, `bytes_per_transition`
against the raw RLDS step bytes). On that memory:

  uniform_transitions_per_s  memory.sample(B) alone, in a tf.function loop
  per_transitions_per_s      PrioritizedFeed: sample, importance weights,
                             priority update, in a tf.function loop
  learner_steps_per_s        {agent: {feed, in_memory}}: the same TF-Agents
                             learner (loop.Learner.train) fed by the uniform
                             feed, and by pre-made batches (16 batches drawn
                             once, read in turn from a constant): the
                             learner's own speed; learner_ratio_min is the
                             smallest feed / in_memory.
  her_transitions_per_s      HindsightFeed on FetchReach-shaped episodes
                             (future, k=4, each transition drawn
                             independently, rewards from FetchReach-v4's
                             compute_reward).
Peers, same run, one at a time, through a separate interpreter (see
shared/peers.md) when named: --cpprb_python (PrioritizedReplayBuffer,
sample + update_priorities, same size), --sb3_python (HerReplayBuffer on the
same FetchReach-shaped episodes), --d3rlpy_python (BC, TD3+BC, CQL update
steps at the same batch size and thread count).

Targets (issue 12): learner_ratio_min >= 0.9; uniform >= 1M/s; PER >= 500k/s;
HER >= SB3; load <= 10 s; bytes <= 1.2x raw; ours >= 2x d3rlpy for bc and
td3_bc, ahead for cql. Prints one JSON line.

  python bench/feed.py [--transitions 1000000] [--cpprb_python P]
      [--sb3_python P] [--d3rlpy_python P] [--learner_seconds 8]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import rlds
import tensorflow as tf
import tree

import rlds_reverb
from rlds_reverb.replay import her
from rlds_reverb.replay import per
from rlds_reverb.storage import tables
from rlds_reverb.acting import envs
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import offline_data
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from rlds_reverb.replay import hindsight
from rlds_reverb.replay import memory as memory_lib

from halfcheetah_data import make_rlds  # pylint: disable=g-bad-import-order

HERE = os.path.dirname(os.path.abspath(__file__))
LEARNERS = ('bc', 'td3_bc', 'sac', 'cql_sac')
D3RLPY_NAMES = {'bc': 'bc', 'td3_bc': 'td3_bc', 'cql_sac': 'cql'}
PREMADE_BATCHES = 16


def _rate(run, items_per_call: int, seconds: float, rounds: int) -> float:
  """Median items/s over `rounds` timed stretches of about `seconds`."""
  run()  # Trace and warm up.
  rates = []
  for _ in range(rounds):
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
      run()
      calls += 1
    rates.append(calls * items_per_call / (time.perf_counter() - start))
  return statistics.median(rates)


def _touch(batch) -> tf.Tensor:
  """A scalar that needs every field of the batch (nothing is pruned)."""
  return tf.add_n([tf.reduce_sum(tf.cast(tf.reshape(x, [-1])[:1],
                                         tf.float32))
                   for x in tree.flatten(batch)])


def _sampling_loop(draw, calls: int):
  @tf.function
  def run():
    total = tf.constant(0.0)
    for _ in tf.range(calls):
      total += draw()
    return total
  return run


def _halfcheetah_memory(args, server_client) -> tuple[dict, Any]:
  episodes = args.transitions // args.episode_steps
  rlds_data = make_rlds(episodes, args.episode_steps + 1)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  t0 = time.perf_counter()
  stats = offline_data.push_episodes(rlds_data, server_client, 'data')
  push_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  memory = offline_data.load_memory(server_client, 'data', spec)
  load_s = time.perf_counter() - t0
  transitions = int(memory.num_transitions)
  raw_step_bytes = sum(
      np.dtype(s.dtype.as_numpy_dtype).itemsize * int(np.prod(s.shape))
      for s in tree.flatten(rlds_data.element_spec[rlds.STEPS].element_spec))
  return {'transitions': transitions, 'episodes': stats.items,
          'push_seconds': round(push_s, 2), 'load_seconds': round(load_s, 2),
          'bytes_per_transition': round(memory.bytes / transitions, 1),
          'raw_step_bytes': raw_step_bytes,
          'bytes_ratio': round(memory.bytes / transitions / raw_step_bytes,
                               3)}, memory


def _learner_rates(memory, args) -> dict:
  specs = envs.env_specs('HalfCheetah-v5')
  feed = feeds.UniformFeed(memory, args.batch_size)
  premade = tf.nest.map_structure(
      lambda *x: tf.stack(x), *[feed() for _ in range(PREMADE_BATCHES)])
  out = {}
  for kind in args.agents.split(','):
    agent = registry.make_agent(kind, specs.time_step_spec, specs.action_spec,
                              factory.AgentConfig())
    with tempfile.TemporaryDirectory() as root:
      learner = loop.Learner(agent, root, summary_interval=10**9)
      counter = tf.Variable(0, dtype=tf.int32)

      def from_premade():
        i = counter.assign_add(1) % PREMADE_BATCHES
        return tf.nest.map_structure(lambda x: tf.gather(x, i), premade)

      steps = max(1, int(args.learner_calls_steps.get(kind, 50)))
      sources = {'feed': feed, 'in_memory': from_premade}
      rates = {name: [] for name in sources}
      for name, source in sources.items():
        learner.train(source, 2)  # Trace.
      for _ in range(args.rounds):  # Turns: noise falls on both alike.
        for name, source in sources.items():
          calls, start = 0, time.perf_counter()
          while time.perf_counter() - start < args.learner_seconds:
            learner.train(source, steps)
            calls += 1
          rates[name].append(calls * steps / (time.perf_counter() - start))
    out[kind] = {name: round(statistics.median(r), 1)
                 for name, r in rates.items()}
    print(f'{kind}: {out[kind]}', file=sys.stderr)
  return out


def _fetch_episodes(num_episodes: int, seed: int = 0):
  """FetchReach-shaped converted episodes (50 transitions each)."""
  rng = np.random.default_rng(seed)
  steps = 51
  spec = her.goal_data_spec(10, 3, tf.TensorSpec([4], tf.float32))
  episodes = []
  for _ in range(num_episodes):
    achieved = rng.uniform(1.0, 1.5, (steps, 3)).astype(np.float32)
    step_type = np.ones(steps, np.int32)
    step_type[0], step_type[-1] = 0, 2
    episodes.append(spec.__class__(
        step_type=step_type,
        observation={
            'observation': rng.standard_normal((steps, 10), np.float32),
            'achieved_goal': achieved,
            'desired_goal': np.repeat(rng.uniform(1.0, 1.5, (1, 3)), steps,
                                      0).astype(np.float32)},
        action=rng.uniform(-1, 1, (steps, 4)).astype(np.float32),
        policy_info=(),
        next_step_type=np.concatenate([step_type[1:], [0]]).astype(np.int32),
        reward=-np.ones(steps, np.float32),
        discount=np.ones(steps, np.float32)))
  return spec, episodes


def _her(args) -> tuple[float, str]:
  spec, episodes = _fetch_episodes(args.her_episodes)
  memory = memory_lib.from_episodes(spec, episodes, with_episode_bounds=True)
  env = envs.make_env('FetchReach-v4')
  feed = hindsight.HindsightFeed(
      memory, args.batch_size, her.reward_fn_for(env),
      config=her.HerConfig(strategy='future', k=4))
  rate = _rate(_sampling_loop(lambda: _touch(feed()), 100),
               100 * args.batch_size, args.seconds, args.rounds)
  env.close()
  npz = os.path.join(tempfile.mkdtemp(), 'episodes.npz')
  np.savez(npz,
           observation=np.stack([e.observation['observation']
                                 for e in episodes]),
           achieved_goal=np.stack([e.observation['achieved_goal']
                                   for e in episodes]),
           desired_goal=np.stack([e.observation['desired_goal']
                                  for e in episodes]),
           action=np.stack([e.action[:-1] for e in episodes]),
           reward=np.stack([e.reward[:-1] for e in episodes]),
           terminated=np.zeros(len(episodes), bool))
  return rate, npz


def _peer(python: str, script: str, *flags: str) -> dict | None:
  if not python:
    return None
  proc = subprocess.run([python, os.path.join(HERE, script), *flags],
                        capture_output=True, text=True, check=False,
                        timeout=1800)
  if proc.returncode:
    raise SystemExit(f'{script} failed: {proc.stderr[-2000:]}')
  return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--transitions', type=int, default=1_000_000,
                      help='HalfCheetah-shaped transitions loaded into the '
                      'memory (and the size of the cpprb peer).')
  parser.add_argument('--episode_steps', type=int, default=1000,
                      help='Transitions per pushed episode.')
  parser.add_argument('--batch_size', type=int, default=256,
                      help='Transitions per sampled batch, for every feed, '
                      'learner and peer.')
  parser.add_argument('--agents', default=','.join(LEARNERS),
                      help='Comma-separated learners whose steps/s are '
                      f"timed, of {','.join(LEARNERS)}; those d3rlpy has are "
                      'timed there too.')
  parser.add_argument('--seconds', type=float, default=2.0,
                      help='Seconds per timed sampling stretch.')
  parser.add_argument('--learner_seconds', type=float, default=8.0,
                      help='Seconds per timed learner stretch.')
  parser.add_argument('--rounds', type=int, default=3,
                      help='Timed stretches per rate; the median is '
                      'reported.')
  parser.add_argument('--her_episodes', type=int, default=2000,
                      help='FetchReach-shaped episodes (50 transitions).')
  parser.add_argument('--cpprb_python', default='',
                      help='Python interpreter with cpprb that runs '
                      'bench/cpprb_reference.py; empty: no cpprb peer.')
  parser.add_argument('--sb3_python', default='',
                      help='Python interpreter with stable-baselines3 that '
                      'runs bench/sb3_her_reference.py; empty: no SB3 peer.')
  parser.add_argument('--d3rlpy_python', default='',
                      help='Python interpreter with d3rlpy that runs '
                      'bench/d3rlpy_reference.py; empty: no d3rlpy peer.')
  parser.add_argument('--d3rlpy_seconds', type=float, default=20.0,
                      help='Timed seconds per agent of the d3rlpy peer.')
  args = parser.parse_args()
  # Gradient steps per learner.train call: about a second of work each.
  args.learner_calls_steps = {'bc': 200, 'td3_bc': 100, 'sac': 50,
                              'cql_sac': 5}

  server = tables.start_server([episode_table.make_table(
      'data', tf.nest.map_structure(lambda s: s, rlds_reverb
                                    .create_trajectory_data_spec(
                                        make_rlds(1, 3))),
      max_episodes=10**7)])
  try:
    load, memory = _halfcheetah_memory(args, server.localhost_client())
  finally:
    server.stop()
  print(f'loaded: {load}', file=sys.stderr)
  batch = args.batch_size
  uniform = _rate(_sampling_loop(lambda: _touch(memory.sample(batch)), 200),
                  200 * batch, args.seconds, args.rounds)
  prioritized = feeds.PrioritizedFeed(memory, batch, per.PerConfig())

  def per_step():
    experience, info = prioritized()
    weights = per.importance_weights(info.probability, info.num_transitions,
                                     0.4)
    new = tf.random.uniform([batch], 0.1, 2.0, tf.float64)
    prioritized.update(info.rows, new)
    return _touch(experience) + tf.reduce_sum(weights)

  per_rate = _rate(_sampling_loop(per_step, 100), 100 * batch, args.seconds,
                   args.rounds)
  print(f'uniform {uniform:.0f}/s, per {per_rate:.0f}/s', file=sys.stderr)
  learners = _learner_rates(memory, args)
  del prioritized
  her_rate, npz = _her(args)
  print(f'her {her_rate:.0f}/s', file=sys.stderr)

  cpprb = _peer(args.cpprb_python, 'cpprb_reference.py', '--size',
                str(args.transitions), '--batch_size', str(batch),
                '--seconds', str(args.seconds * args.rounds))
  sb3 = _peer(args.sb3_python, 'sb3_her_reference.py', '--episodes_npz', npz,
              '--batch_size', str(batch), '--seconds', str(args.seconds),
              '--rounds', str(args.rounds))
  d3rlpy = _peer(args.d3rlpy_python, 'd3rlpy_reference.py', '--agents',
                 ','.join(D3RLPY_NAMES[a] for a in args.agents.split(',')
                          if a in D3RLPY_NAMES),
                 '--batch_size', str(batch), '--threads', '2',
                 '--seconds', str(args.d3rlpy_seconds))

  ratio_min = min(v['feed'] / v['in_memory'] for v in learners.values())
  result = {
      'learner_steps_per_s': learners,
      'learner_ratio_min': round(ratio_min, 3),
      'uniform_transitions_per_s': round(uniform),
      'per_transitions_per_s': round(per_rate),
      'her_transitions_per_s': round(her_rate),
      **load,
      'cpprb_transitions_per_s': (round(cpprb['cpprb_transitions_per_s'])
                                  if cpprb else None),
      'sb3_her_transitions_per_s': (round(sb3['sb3_transitions_per_s'])
                                    if sb3 else None),
      'd3rlpy_steps_per_s': (
          {k: round(v, 1) for k, v in d3rlpy['d3rlpy_steps_per_s'].items()}
          if d3rlpy else None),
  }
  targets = {
      'learner_ratio_min >= 0.9': ratio_min >= 0.9,
      'uniform >= 1M/s': uniform >= 1e6,
      'per >= 500k/s': per_rate >= 5e5,
      'load <= 10 s': load['load_seconds'] <= 10,
      'bytes <= 1.2x raw': load['bytes_ratio'] <= 1.2,
  }
  if sb3:
    targets['her >= sb3'] = her_rate >= sb3['sb3_transitions_per_s']
  if d3rlpy:
    ours = {D3RLPY_NAMES[k]: v['feed'] for k, v in learners.items()
            if k in D3RLPY_NAMES}
    theirs = d3rlpy['d3rlpy_steps_per_s']
    result['vs_d3rlpy'] = {k: round(ours[k] / theirs[k], 2) for k in theirs
                           if k in ours}
    for k, need in (('bc', 2.0), ('td3_bc', 2.0), ('cql', 1.0)):
      if k in result['vs_d3rlpy']:
        targets[f'{k} >= {need:g}x d3rlpy'] = result['vs_d3rlpy'][k] >= need
  result.update(
      targets=targets, batch_size=batch, peers={'cpprb': cpprb, 'sb3': sb3,
                                                 'd3rlpy': d3rlpy},
      machine=f'{platform.machine()}, {os.cpu_count()} cores',
      tensorflow=tf.__version__, date=time.strftime('%Y-%m-%d'))
  print(json.dumps(result))


if __name__ == '__main__':
  main()
