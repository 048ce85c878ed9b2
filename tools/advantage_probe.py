"""Trains IQL or AWAC on a locomotion dataset and reports, every few
thousand steps, the advantage weights the actor sees on kinds of
transitions (the falls, the steps before them, episode starts) beside a
short greedy evaluation.

Written to find why IQL and AWAC collapse on hopper-medium-expert
(docs/results/offline_locomotion.md): the run loop reports only the mean
weight, which hides where the weights go. It trains the registry's agent
as `pipelines.train` does (observation normalisation, IQL's reward scale,
uniform batches of 256) but from flat arrays in memory, so it needs no
Reverb server; `--actor gaussian` trains CORL's actor (IQL: a Gaussian
with a tanh mean and one learned log-std per action dimension;
`offline_agent.gaussian_actor`) to tell the actor's form from the
weights.

  python -m tools.advantage_probe --dataset data/hopper_v5_medium_expert \\
      --env Hopper-v5 --agent iql --seed 2 --steps 30000 --out probe.jsonl
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from absl import app
from absl import flags
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from rlds_reverb.acting import envs
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.agents.offline import offline_agent
from rlds_reverb.data import datasets
from rlds_reverb.experiments import offline_data


def define_flags() -> None:
  """The flags, defined when run as a program only: the tests import this
  module beside pipelines whose flags share names."""
  flags.DEFINE_string(
      'dataset', None, 'Local TFDS-format RLDS dataset directory (the --out of '
      'pipelines.generate) or TFDS name (required).')
  flags.DEFINE_string('env', 'Hopper-v5', 'Gymnasium id to evaluate in.')
  flags.DEFINE_enum('agent', 'iql', ['iql', 'awac'],
                    'Advantage-weighted learner to train.')
  flags.DEFINE_enum(
      'actor', 'squashed', list(offline_agent.ACTORS),
      "squashed: the toolkit's default, TF-Agents' tanh-squashed Gaussian "
      "(state-dependent std); gaussian: CORL's (IQL: tanh mean; AWAC: free "
      'mean, clipped; a state-independent log-std): IqlConfig.actor and '
      'AwacConfig.actor.')
  flags.DEFINE_integer('seed', 0, 'Seed of the networks and batches.')
  flags.DEFINE_integer('steps', 30_000, 'Gradient steps in all.')
  flags.DEFINE_integer('every', 2_000, 'Gradient steps between two reports.')
  flags.DEFINE_integer(
      'eval_episodes', 3, 'Greedy episodes per report (env seeds 100, ...).')
  flags.DEFINE_integer(
      'samples', 4_000, 'Transitions per kind the weights are measured on.')
  flags.DEFINE_string(
      'cache', None, 'Optional .npz where the flat arrays are kept between '
      'runs (reading 2M steps takes a few minutes).')
  flags.DEFINE_string('out', None, 'Optional JSON-lines file of the reports.')


FLAGS = flags.FLAGS
_BATCH = 256
_FIELDS = ('observation', 'action', 'reward', 'discount', 'next_observation',
           'episode', 't', 'steps_to_end', 'terminated')


def flat_transitions(dataset: str) -> dict[str, np.ndarray]:
  """One row per transition of an RLDS dataset, with where it sits in its
  episode (`t`, `steps_to_end`) and whether that episode terminated."""
  columns: dict[str, list[np.ndarray]] = {key: [] for key in _FIELDS}
  whole = datasets.load(dataset).map(
      lambda e: e['steps'].batch(1_000_000).get_single_element())
  for index, steps in enumerate(tfds.as_numpy(whole)):
    n = len(steps['reward']) - 1  # The last step holds the final o_T.
    if n < 1:
      continue
    parts = dict(
        observation=steps['observation'][:-1],
        action=steps['action'][:-1], reward=steps['reward'][:-1],
        discount=steps['discount'][:-1],
        next_observation=steps['observation'][1:],
        episode=np.full(n, index), t=np.arange(n),
        steps_to_end=n - 1 - np.arange(n),
        terminated=np.full(n, bool(steps['is_terminal'][-1])))
    for key, value in parts.items():
      columns[key].append(np.asarray(value))
  return {key: np.concatenate(value) for key, value in columns.items()}


def transition_kinds(data: dict[str, np.ndarray], samples: int,
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
  """Row indices of each kind of transition (up to `samples` each).

  Short episodes are the falls of the medium policy (under 200 steps);
  full ones (the time limit) are mostly the expert's."""
  lengths = np.bincount(data['episode'])[data['episode']]
  ended, to_end, t = data['terminated'], data['steps_to_end'], data['t']
  full = lengths == lengths.max()
  short = ended & (lengths < 200)
  kinds = {
      'fall': ended & (to_end == 0),
      'before_fall': ended & (to_end >= 1) & (to_end <= 10),
      'short_start': short & (t < 20),
      'short_middle': short & (t >= 20) & (to_end > 10),
      'full_start': full & (t < 20),
      'full_middle': full & (t >= 20),
  }
  return {name: rng.choice(np.flatnonzero(mask),
                           min(samples, int(mask.sum())), replace=False)
          for name, mask in kinds.items() if mask.any()}


def _advantages(agent: Any, name: str, observation: tf.Tensor,
                action: tf.Tensor) -> tuple[np.ndarray, np.ndarray, float]:
  """The actor's advantages, as its `_train` computes them, their Q, and
  the factor the weights exponentiate them by."""
  if name == 'iql':
    q = tf.reduce_min(agent._target_q_network((observation, action))[0], -1)  # pylint: disable=protected-access
    value = agent._value_network(observation)[0][:, 0]  # pylint: disable=protected-access
    return (q - value).numpy(), q.numpy(), agent._config.temperature  # pylint: disable=protected-access
  q_network = agent._q_network  # pylint: disable=protected-access
  q = tf.reduce_min(q_network((observation, action))[0], -1)
  policy_q = tf.reduce_min(
      q_network((observation, agent._sample(observation)))[0], -1)  # pylint: disable=protected-access
  return (q - policy_q).numpy(), q.numpy(), 1.0 / agent._config.awac_lambda  # pylint: disable=protected-access


def main(argv: list[str]) -> None:
  del argv
  name, seed, steps = FLAGS.agent, FLAGS.seed, FLAGS.steps
  cache = FLAGS.cache
  if cache and os.path.exists(cache):
    with np.load(cache) as saved:
      data = dict(saved)
  else:
    data = flat_transitions(FLAGS.dataset)
    if cache:
      np.savez(cache, **data)
  observations = data['observation'].astype(np.float64)
  mean = observations.mean(0)
  std = observations.std(0) + 1e-3  # As offline_data's statistics.
  normalize = lambda o: ((o - mean) / std).astype(np.float32)
  specs = envs.env_specs(FLAGS.env)
  tf.random.set_seed(seed)
  agent = registry.make_agent(
      name, specs.time_step_spec, specs.action_spec,
      registry.resolve(name, factory.AgentConfig(seed=seed,
                                                 train_steps=steps)),
      method_config=registry.get(name).method_config(actor=FLAGS.actor))
  if registry.get(name).scales_rewards:
    returns = np.bincount(data['episode'], weights=data['reward'])
    agent.reward_scale.assign(offline_data.reward_scale(returns))

  observation = tf.constant(normalize(data['observation']))
  next_observation = tf.constant(normalize(data['next_observation']))
  action, reward = tf.constant(data['action']), tf.constant(data['reward'])
  discount = tf.constant(data['discount'])
  size = len(data['reward'])

  def pair(x: tf.Tensor, second: tf.Tensor) -> tf.Tensor:
    return tf.stack([x, second], axis=1)

  @tf.function
  def train(count: tf.Tensor) -> tf.Tensor:
    loss = tf.constant(0.0)
    for _ in tf.range(count):
      rows = tf.random.uniform([_BATCH], 0, size, dtype=tf.int32)
      a, r, d = (tf.gather(x, rows) for x in (action, reward, discount))
      kind = tf.fill([_BATCH, 2], ts.StepType.MID)
      loss = agent.train(trajectory.Trajectory(
          kind, pair(tf.gather(observation, rows),
                     tf.gather(next_observation, rows)),
          pair(a, tf.zeros_like(a)), (), kind, pair(r, tf.zeros_like(r)),
          pair(d, tf.ones_like(d)))).loss
    return loss

  kinds = transition_kinds(data, FLAGS.samples, np.random.default_rng(0))
  env = envs.make_env(FLAGS.env)

  def evaluate() -> list[list[float]]:
    results = []
    for episode in range(FLAGS.eval_episodes):
      obs, _ = env.reset(seed=100 + episode)
      total, length, done = 0.0, 0, False
      while not done:
        greedy = agent.clip_to_bounds(agent.action_distribution(
            tf.constant(normalize(obs[None])), training=False).mode())
        obs, r, terminated, truncated, _ = env.step(greedy.numpy()[0])
        total, length = total + float(r), length + 1
        done = terminated or truncated
      results.append([round(total, 1), length])
    return results

  out = open(FLAGS.out, 'a') if FLAGS.out else None
  start = time.perf_counter()
  done = 0
  while done < steps:
    count = min(FLAGS.every, steps - done)
    loss = float(train(tf.constant(count)))
    done += count
    report = {'agent': name, 'actor': FLAGS.actor, 'seed': seed,
              'train_step': done, 'loss': round(loss, 4),
              'seconds': round(time.perf_counter() - start),
              'eval': evaluate(), 'kinds': {}}
    for kind, rows in kinds.items():
      advantage, q, factor = _advantages(
          agent, name, tf.gather(observation, rows), tf.gather(action, rows))
      weight = np.minimum(np.exp(factor * advantage), 100.0)
      report['kinds'][kind] = {
          'advantage_mean': round(float(advantage.mean()), 3),
          'advantage_std': round(float(advantage.std()), 3),
          'weight_mean': round(float(weight.mean()), 2),
          'weight_at_cap': round(float((weight >= 100.0).mean()), 3),
          'q_mean': round(float(q.mean()), 1)}
    line = json.dumps(report)
    print(line, flush=True)
    if out is not None:
      out.write(line + '\n')
      out.flush()
  if out is not None:
    out.close()


if __name__ == '__main__':
  define_flags()
  flags.mark_flag_as_required('dataset')
  app.run(main)
