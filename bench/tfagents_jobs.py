"""TF-Agents training jobs on three feeds, side by side in one run.

Each figure is `tf_agents.train.Learner.run` (TF-Agents' own Learner,
unchanged) on the same agent, with `experience_dataset_fn` giving:

  reverb_as_dataset  TF-Agents' `ReverbReplayBuffer.as_dataset(B, 2)
                     .prefetch(50)` (as its SAC and CQL-SAC examples) on a
                     uniform table of the 2-step items TF-Agents' observer
                     writes (filled here by the toolkit's push, the same
                     items)
  rlds_reverb        `MemoryReplayBuffer.uniform(...).as_dataset(B, 2)` on
                     an episode table of the same data (a tf.data pipeline)
  rlds_reverb_in_graph  `MemoryReplayBuffer.as_draws(B, 2)`: the same draws
                     made by ops of the Learner's own train function
  in_memory          16 batches drawn once, read in turn from a constant
                     dataset: the learner's own speed
  toolkit_loop       not TF-Agents' Learner: the toolkit's own
                     `experiments.loop.Learner.train` on the same agent and
                     the same in-graph draws (what `pipelines.train` runs),
                     to weigh moving the toolkit onto TF-Agents' Learner

Data: `--transitions` halfcheetah-shaped transitions (observation 17,
action 6) for sac, td3 and cql_sac; CartPole-shaped ones (observation 4,
two actions) for dqn, which also runs `rlds_reverb_per`: the prioritized
buffer with importance weights in and `PriorityUpdate` out
(`per_vs_uniform` = rlds_reverb_per / rlds_reverb) and
`rlds_reverb_per_in_graph`, the same through `as_draws`
(`per_vs_uniform_in_graph` = rlds_reverb_per_in_graph /
rlds_reverb_in_graph). Agents: TF-Agents'
SacAgent, Td3Agent, CqlSacAgent (2x256 actor, 2x256 critic) and DqnAgent
(2x256), batch `--batch_size`. Rates are medians over `--rounds` turns of
`--seconds` each, the feeds taking turns so noise falls on all alike.

Targets (issue 44): ratio_vs_in_memory_min (rlds_reverb_in_graph /
in_memory) >= 0.9; speedup_vs_as_dataset (rlds_reverb_in_graph /
reverb_as_dataset) >= 2 for sac and td3 (as_dataset_ratio_vs_in_memory:
the tf.data pipeline's ratio); per_vs_uniform for dqn >= 0.8. Prints one JSON line.

  python bench/tfagents_jobs.py [--transitions 1000000] [--agents sac,td3,cql_sac,dqn]
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import reverb
import rlds
import tensorflow as tf
from tf_agents.agents.cql import cql_sac_agent
from tf_agents.agents.ddpg import actor_network
from tf_agents.agents.ddpg import critic_network
from tf_agents.agents.dqn import dqn_agent
from tf_agents.agents.sac import sac_agent
from tf_agents.agents.sac import tanh_normal_projection_network
from tf_agents.agents.td3 import td3_agent
from tf_agents.networks import actor_distribution_network
from tf_agents.networks import q_network
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.specs import tensor_spec
from tf_agents.train import learner as tf_learner
from tf_agents.train.utils import train_utils
from tf_agents.trajectories import time_step as ts

import rlds_reverb
from rlds_reverb.experiments import loop
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from rlds_reverb.replay import per
from rlds_reverb.replay import tf_agents_buffer
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from halfcheetah_data import make_rlds  # pylint: disable=g-bad-import-order

PREMADE_BATCHES = 16
EPISODE_STEPS = 1000
LAYERS = (256, 256)


def _cartpole_rlds(num_episodes: int, num_steps: int, seed: int = 0
                   ) -> tf.data.Dataset:
  rng = np.random.default_rng(seed)
  index = np.arange(num_steps)
  steps = {
      rlds.OBSERVATION: rng.standard_normal((num_episodes, num_steps, 4),
                                            dtype=np.float32),
      rlds.ACTION: rng.integers(0, 2, (num_episodes, num_steps)),
      rlds.REWARD: np.ones((num_episodes, num_steps), np.float32),
      rlds.DISCOUNT: np.ones((num_episodes, num_steps), np.float32),
      rlds.IS_FIRST: np.tile(index == 0, (num_episodes, 1)),
      rlds.IS_LAST: np.tile(index == num_steps - 1, (num_episodes, 1)),
      rlds.IS_TERMINAL: np.zeros((num_episodes, num_steps), bool),
  }
  return tf.data.Dataset.from_tensor_slices(steps).map(
      lambda s: {rlds.STEPS: tf.data.Dataset.from_tensor_slices(s)})


def _server(rlds_data, spec) -> tuple[reverb.Server, reverb.Client]:
  """The same data twice: 2-step items (uniform) and whole episodes."""
  signature = tensor_spec.add_outer_dim(spec)
  server = reverb.Server([
      reverb.Table(name='pairs', sampler=reverb.selectors.Uniform(),
                   remover=reverb.selectors.Fifo(), max_size=10**8,
                   rate_limiter=reverb.rate_limiters.MinSize(1),
                   signature=signature),
      episode_table.make_table('episodes', spec, max_episodes=10**6),
      feeds.make_priority_table('episodes')])
  client = reverb.Client(f'localhost:{server.port}')
  for table, length, priority in (('pairs', 2, 1.0),
                                  ('episodes', None, episode_table.UNREAD)):
    rlds_reverb.push_rlds_to_table(rlds_data, client, table,
                                   sequence_length=length, priority=priority,
                                   num_workers=2)
  return server, client


def _continuous_agent(kind: str, time_step_spec, action_spec):
  train_step = train_utils.create_train_step()
  observation_spec = time_step_spec.observation
  critic = critic_network.CriticNetwork(
      (observation_spec, action_spec), joint_fc_layer_params=LAYERS,
      kernel_initializer='glorot_uniform',
      last_kernel_initializer='glorot_uniform')
  adam = tf.keras.optimizers.Adam
  if kind == 'td3':
    return td3_agent.Td3Agent(
        time_step_spec, action_spec,
        actor_network=actor_network.ActorNetwork(
            observation_spec, action_spec, fc_layer_params=LAYERS),
        critic_network=critic, actor_optimizer=adam(3e-4),
        critic_optimizer=adam(3e-4), train_step_counter=train_step)
  actor = actor_distribution_network.ActorDistributionNetwork(
      observation_spec, action_spec, fc_layer_params=LAYERS,
      continuous_projection_net=(
          tanh_normal_projection_network.TanhNormalProjectionNetwork))
  common = dict(actor_network=actor, critic_network=critic,
                actor_optimizer=adam(3e-4), critic_optimizer=adam(3e-4),
                alpha_optimizer=adam(3e-4), train_step_counter=train_step)
  if kind == 'sac':
    return sac_agent.SacAgent(time_step_spec, action_spec, **common)
  return cql_sac_agent.CqlSacAgent(
      time_step_spec, action_spec, cql_alpha=5.0, num_cql_samples=10,
      include_critic_entropy_term=False, use_lagrange_cql_alpha=False,
      **common)


def _dqn_agent(time_step_spec, action_spec):
  return dqn_agent.DqnAgent(
      time_step_spec, action_spec,
      q_network=q_network.QNetwork(time_step_spec.observation, action_spec,
                                   fc_layer_params=LAYERS),
      optimizer=tf.keras.optimizers.Adam(1e-3),
      train_step_counter=train_utils.create_train_step())


def _premade(buffer, batch_size: int) -> tf.data.Dataset:
  batches = list(buffer.as_dataset(batch_size, num_steps=2).take(
      PREMADE_BATCHES))
  stacked = tf.nest.map_structure(lambda *x: tf.stack(x), *batches)
  return tf.data.Dataset.from_tensor_slices(stacked).cache().repeat()


def _ours(buffer, batch_size: int, args) -> tf.data.Dataset:
  dataset = buffer.as_dataset(batch_size, num_steps=2)
  return dataset.prefetch(args.prefetch) if args.prefetch else dataset


def _rates(agent, sources: dict, args, learner_kwargs: dict) -> dict:
  """Learner.run steps/s per source: one Learner per source, in turns."""
  learners = {}
  for name, make_dataset in sources.items():
    root = tempfile.mkdtemp()
    kwargs = learner_kwargs.get(name, {})
    learners[name] = tf_learner.Learner(
        root, agent.train_step_counter, agent,
        experience_dataset_fn=make_dataset, checkpoint_interval=10**9,
        summary_interval=10**9, **kwargs)
    learners[name].run(iterations=2)  # Trace.
  rates = {name: [] for name in sources}
  for _ in range(args.rounds):
    for name, learner in learners.items():
      calls, start = 0, time.perf_counter()
      while time.perf_counter() - start < args.seconds:
        learner.run(iterations=args.iterations)
        calls += 1
      rates[name].append(calls * args.iterations /
                         (time.perf_counter() - start))
  return {name: round(statistics.median(r), 1) for name, r in rates.items()}


def _toolkit_loop_rate(agent, draws, args) -> float:
  """The toolkit's own loop (`experiments.loop.Learner.train`): steps/s
  on `draws`, the batches of an `as_draws`."""
  learner = loop.Learner(agent, tempfile.mkdtemp(),
                         summary_interval=10**9)
  source = lambda: next(draws)[0]  # The Trajectory; not the SampleInfo.
  learner.train(source, 2)  # Trace.
  rates = []
  for _ in range(args.rounds):
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
      learner.train(source, args.iterations)
      calls += 1
    rates.append(calls * args.iterations / (time.perf_counter() - start))
  return round(statistics.median(rates), 1)


def _continuous(args, kinds: list) -> dict:
  rlds_data = make_rlds(args.transitions // (EPISODE_STEPS - 1),
                        EPISODE_STEPS)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  server, client = _server(rlds_data, spec)
  buffer = tf_agents_buffer.MemoryReplayBuffer.uniform(client, 'episodes',
                                                       poll_every=0)
  theirs = reverb_replay_buffer.ReverbReplayBuffer(
      spec, 'pairs', sequence_length=2, local_server=server)
  time_step_spec = ts.time_step_spec(spec.observation)
  action_spec = tensor_spec.BoundedTensorSpec(spec.action.shape, tf.float32,
                                              -1.0, 1.0)
  batch = args.batch_size
  out = {}
  for kind in kinds:
    agent = _continuous_agent(kind, time_step_spec, action_spec)
    agent.initialize()
    out[kind] = _rates(agent, {
        'reverb_as_dataset': lambda: theirs.as_dataset(
            batch, num_steps=2).prefetch(50),
        'rlds_reverb': lambda: _ours(buffer, batch, args),
        'rlds_reverb_in_graph': lambda: buffer.as_draws(batch, 2),
        'in_memory': lambda: _premade(buffer, batch)}, args, {})
    out[kind]['toolkit_loop'] = _toolkit_loop_rate(
        agent, buffer.as_draws(batch, 2), args)
    print(f'{kind}: {out[kind]}', file=sys.stderr, flush=True)
  server.stop()
  return out


def _dqn(args) -> dict:
  rlds_data = _cartpole_rlds(args.transitions // (EPISODE_STEPS - 1),
                             EPISODE_STEPS)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  server, client = _server(rlds_data, spec)
  batch = args.batch_size
  buffer = tf_agents_buffer.MemoryReplayBuffer.uniform(client, 'episodes',
                                                       poll_every=0)
  prioritized = tf_agents_buffer.MemoryReplayBuffer.prioritized(
      client, 'episodes', batch_size=batch, poll_every=0,
      config=per.PerConfig(beta_steps=10**6))
  theirs = reverb_replay_buffer.ReverbReplayBuffer(
      spec, 'pairs', sequence_length=2, local_server=server)
  time_step_spec = ts.time_step_spec(spec.observation)
  action_spec = tensor_spec.BoundedTensorSpec([], spec.action.dtype, 0, 1)
  agent = _dqn_agent(time_step_spec, action_spec)
  agent.initialize()
  weighted = tf_agents_buffer.importance_weighted(
      prioritized.as_dataset(batch, num_steps=2), prioritized,
      agent.train_step_counter)
  rates = _rates(agent, {
      'reverb_as_dataset': lambda: theirs.as_dataset(
          batch, num_steps=2).prefetch(50),
      'rlds_reverb': lambda: _ours(buffer, batch, args),
      'rlds_reverb_in_graph': lambda: buffer.as_draws(batch, 2),
      'in_memory': lambda: _premade(buffer, batch),
      'rlds_reverb_per': lambda: (weighted.prefetch(args.prefetch)
                                  if args.prefetch else weighted),
      'rlds_reverb_per_in_graph': lambda: tf_agents_buffer.importance_weighted(
          prioritized.as_draws(batch, 2), prioritized,
          agent.train_step_counter)}, args, {
          name: dict(
              after_train_strategy_step_fn=tf_agents_buffer.PriorityUpdate(
                  prioritized),
              use_kwargs_in_agent_train=True,
              run_optimizer_variable_init=False)
          for name in ('rlds_reverb_per', 'rlds_reverb_per_in_graph')})
  rates['toolkit_loop'] = _toolkit_loop_rate(
      agent, buffer.as_draws(batch, 2), args)
  print(f'dqn: {rates}', file=sys.stderr, flush=True)
  server.stop()
  return rates


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--transitions', type=int, default=1_000_000,
                      help='transitions of random data per agent family, in '
                      'whole episodes of 999 (rounded down)')
  parser.add_argument('--batch_size', type=int, default=256,
                      help='transitions per training batch, for every feed')
  parser.add_argument('--agents', default='sac,td3,cql_sac,dqn',
                      help='comma-separated TF-Agents agents to time, of '
                      'sac, td3, cql_sac and dqn')
  parser.add_argument('--seconds', type=float, default=8.0,
                      help='seconds of each timed turn of a feed')
  parser.add_argument('--rounds', type=int, default=3,
                      help='timed turns per feed; the median steps/s is '
                      'reported')
  parser.add_argument('--iterations', type=int, default=50,
                      help='Learner.run iterations per call')
  parser.add_argument('--prefetch', type=int, default=0,
                      help='batches the rlds_reverb datasets prefetch (0: '
                      'none, as the buffer gives them)')
  args = parser.parse_args()
  kinds = args.agents.split(',')
  unknown = sorted(set(kinds) - {'sac', 'td3', 'cql_sac', 'dqn'})
  if unknown:
    parser.error(f'--agents: unknown {",".join(unknown)}; of sac, td3, '
                 'cql_sac, dqn')
  steps = _continuous(args, [k for k in kinds if k != 'dqn'])
  if 'dqn' in kinds:
    steps['dqn'] = _dqn(args)
  ratio = {k: round(v['rlds_reverb_in_graph'] / v['in_memory'], 3)
           for k, v in steps.items()}
  speedup = {k: round(v['rlds_reverb_in_graph'] / v['reverb_as_dataset'], 2)
             for k, v in steps.items()}
  result = {
      'learner_steps_per_s': steps,
      'ratio_vs_in_memory': ratio,
      'ratio_vs_in_memory_min': min(ratio.values()),
      'speedup_vs_as_dataset': speedup,
      'as_dataset_ratio_vs_in_memory': {
          k: round(v['rlds_reverb'] / v['in_memory'], 3)
          for k, v in steps.items()},
  }
  targets = {'ratio_vs_in_memory_min >= 0.9':
             result['ratio_vs_in_memory_min'] >= 0.9}
  for k in ('sac', 'td3'):
    if k in speedup:
      targets[f'{k} speedup_vs_as_dataset >= 2'] = speedup[k] >= 2
  if 'dqn' in steps:
    result['per_vs_uniform'] = round(
        steps['dqn']['rlds_reverb_per'] / steps['dqn']['rlds_reverb'], 3)
    result['per_vs_uniform_in_graph'] = round(
        steps['dqn']['rlds_reverb_per_in_graph'] /
        steps['dqn']['rlds_reverb_in_graph'], 3)
    targets['dqn per_vs_uniform >= 0.8'] = result['per_vs_uniform'] >= 0.8
  result['toolkit_loop_vs_tf_agents_learner'] = {
      k: round(v['toolkit_loop'] / v['rlds_reverb_in_graph'], 3)
      for k, v in steps.items()}
  result.update(
      targets=targets, transitions=args.transitions, prefetch=args.prefetch,
      batch_size=args.batch_size, seconds=args.seconds, rounds=args.rounds,
      machine=f'{platform.machine()}, {os.cpu_count()} cores',
      tensorflow=tf.__version__, date=time.strftime('%Y-%m-%d'))
  print(json.dumps(result))


if __name__ == '__main__':
  main()
