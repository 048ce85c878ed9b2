"""Offline training from goal-conditioned RLDS data with hindsight relabelling.

The dataset's episodes go whole into an embedded HER table (`her.make_table`,
each episode at its number of transitions); the learner samples relabelled
batches from it (`her.dataset`) and is evaluated by success rate in the
goal env every `eval_interval` gradient steps. Random-policy Fetch data holds
no successes for its own goals, so without relabelling there is nothing to
learn from: HER is what turns it into a curriculum of reached goals.
"""

from __future__ import annotations

import os
from typing import Any

import rlds
import tensorflow as tf
import tqdm

from rlds_reverb import convert
from rlds_reverb import her
from rlds_reverb import push
from rlds_reverb import tables
from rlds_reverb.acting import envs
from rlds_reverb.acting import evaluation
from rlds_reverb.learners import agents
from rlds_reverb.learners import loop
from rlds_reverb.learners import online

HER_OFFLINE_AGENTS = ('td3', 'td3_bc', 'sac')
HER_TABLE = 'her_episodes'
_MAX_EPISODES = 1_000_000


def check_goal_data(rlds_data: tf.data.Dataset, specs: envs.EnvSpecs
                    ) -> tf.data.Dataset:
  """Checks a goal dataset against the env and casts its floats to float32.

  Raises:
    ValueError: flat observations, a missing goal key, or a shape that is not
      the env's (named: field, key, shape, what the env needs).
  """
  convert.create_trajectory_data_spec(rlds_data)  # validates the RLDS spec
  step_spec = rlds_data.element_spec[rlds.STEPS].element_spec
  observation = step_spec[rlds.OBSERVATION]
  if not isinstance(observation, dict):
    raise ValueError(
        f'dataset step field observation is flat ({observation.shape}); HER '
        f'needs goal-conditioned data with dict observations '
        f'({", ".join(envs.GOAL_KEYS)}), e.g. pipelines.generate --env '
        f'{specs.env_id}')
  obs_size, goal_size = specs.goal_sizes
  expected = {'observation': [obs_size], 'achieved_goal': [goal_size],
              'desired_goal': [goal_size]}
  for key, shape in expected.items():
    if key not in observation:
      raise ValueError(f'dataset observation has no {key!r}; it has '
                       f'{", ".join(sorted(observation))}')
    if observation[key].shape.as_list() != shape:
      raise ValueError(
          f'dataset observation[{key!r}] has shape '
          f'{observation[key].shape.as_list()} but env {specs.env_id} '
          f'needs {shape}')
  action = step_spec[rlds.ACTION]
  if action.shape.as_list() != specs.action_spec.shape.as_list():
    raise ValueError(f'dataset step field action has shape '
                     f'{action.shape.as_list()} but env {specs.env_id} needs '
                     f'{specs.action_spec.shape.as_list()}')

  def cast_steps(steps):
    out = {k: steps[k] for k in (rlds.IS_FIRST, rlds.IS_LAST,
                                 rlds.IS_TERMINAL)}
    out[rlds.OBSERVATION] = {k: tf.cast(steps[rlds.OBSERVATION][k],
                                        tf.float32) for k in expected}
    for k in (rlds.ACTION, rlds.REWARD, rlds.DISCOUNT):
      out[k] = tf.cast(steps[k], tf.float32)
    return out

  return rlds_data.map(lambda episode: {
      **episode, rlds.STEPS: episode[rlds.STEPS].map(cast_steps)})


def _update_normalizer(rlds_data: tf.data.Dataset,
                       normalizer: her.GoalNormalizer) -> None:
  """Statistics of every step's observation and goals, in large batches."""
  steps = rlds_data.flat_map(lambda episode: episode[rlds.STEPS]).map(
      lambda step: step[rlds.OBSERVATION]).batch(10_000)
  for observation in steps.as_numpy_iterator():
    her.update_normalizer(normalizer, [{rlds.OBSERVATION: observation}])


def train_her_offline(config: Any, rlds_data: tf.data.Dataset, *,
                      show_progress: bool = True) -> dict:
  """Trains `config.agent` on `rlds_data` with HER; returns a summary.

  `config` is an `offline.OfflineConfig` with `her_config` set.

  Raises:
    ValueError: an env that is not a goal env, an agent or option HER
      offline does not take, or data that does not fit the env.
  """
  specs = envs.env_specs(config.env)
  if not specs.goal_conditioned:
    raise ValueError(f'HER needs a goal env (dict observations with '
                     f'{", ".join(envs.GOAL_KEYS)}); {config.env} has a flat '
                     'observation')
  if config.agent not in HER_OFFLINE_AGENTS:
    raise ValueError(f'agent {config.agent} does not train offline with HER; '
                     f'one of: {", ".join(HER_OFFLINE_AGENTS)}')
  for unsupported, why in (
      (config.reverb_address, 'reverb_address (HER pushes the dataset into '
       'its own episode table)'),
      (config.online_finetune_steps, 'online_finetune_steps'),
      (config.replay != 'uniform', 'prioritized replay')):
    if unsupported:
      raise ValueError(f'offline HER does not take {why}')
  rlds_data = check_goal_data(rlds_data, specs)
  data_spec = convert.create_trajectory_data_spec(rlds_data)
  os.makedirs(config.root_dir, exist_ok=True)
  server = tables.start_server(
      [her.make_table(HER_TABLE, data_spec, max_episodes=_MAX_EPISODES)],
      checkpoint_dir=os.path.join(config.root_dir, online.REVERB_CHECKPOINTS))
  reward_env = envs.make_env(config.env)
  try:
    client = server.localhost_client()
    address = f'localhost:{server.port}'
    agent = agents.make_agent(config.agent, specs.time_step_spec,
                              specs.action_spec, config.agent_config)
    normalizer = (her.GoalNormalizer(*specs.goal_sizes)
                  if config.her_normalize else None)
    extra = {'normalizer': normalizer} if normalizer is not None else {}
    learner = loop.Learner(agent, config.root_dir, **extra)
    learner.restore()
    if not tables.get_table_info(client, HER_TABLE).current_size:
      with tqdm.tqdm(desc=f'push {config.dataset}', unit='step',
                     disable=not show_progress) as bar:
        push.push_rlds_to_table(rlds_data, client, HER_TABLE,
                                sequence_length=None,
                                priority_fn=her.transition_priority,
                                progress=bar.update)
      tables.checkpoint(client)
    if normalizer is not None and not normalizer.count.numpy():
      _update_normalizer(rlds_data, normalizer)
    episodes = tables.get_table_info(client, HER_TABLE).current_size
    batches = iter(her.dataset(
        address, HER_TABLE, data_spec, config.batch_size,
        her.reward_fn_for(reward_env), config=config.her_config,
        terminated_fn=her.terminated_fn_for(reward_env),
        normalizer=normalizer))
    policy = online.export_policy(agent, config.agent, specs,
                                  dataset=config.dataset, seed=config.seed)
    flatten = her.ObservationFlattener(normalizer)
    title = (f'{config.agent} offline, HER {config.her_config.strategy} '
             f'k={config.her_config.k:g}, {config.dataset}, seed '
             f'{config.seed}')
    record = None
    phases = loop.TrainPhases(learner, batches, config.train_steps,
                              (config.eval_interval,
                               config.checkpoint_interval))
    with tqdm.tqdm(total=config.train_steps, initial=min(
        learner.train_step, config.train_steps), unit='grad step',
                   desc=f'{config.agent} offline HER',
                   disable=not show_progress) as bar:
      for after, loss, todo in phases:
        bar.update(todo)
        bar.set_postfix(loss=f'{loss:.3g}')
        if after % config.eval_interval == 0 or after == config.train_steps:
          online.sync_policy(policy, agent, config.agent)
          result = evaluation.evaluate(
              lambda obs: policy.greedy(flatten(obs)), config.env,
              config.eval_episodes, seed=10_000 + config.seed)
          record = learner.log_eval({**result.to_dict(), 'phase': 'offline'},
                                    x='train_step', title=title,
                                    y='success_rate')
          bar.write(f'eval at {after} gradient steps: success rate '
                    f'{result.success_rate:.2f}, return '
                    f'{result.average_return:.1f}')
        if (after % config.checkpoint_interval == 0 or
            after == config.train_steps):
          learner.save()
    if record is None:
      records = learner.eval_records()
      record = records[-1] if records else {}
    her.with_normalizer(online.export_policy(
        agent, config.agent, specs, dataset=config.dataset, seed=config.seed,
        train_step=learner.train_step), normalizer).save(
            os.path.join(config.root_dir, 'policy_offline.npz'))
    return {'agent': config.agent, 'dataset': config.dataset,
            'env': config.env, 'seed': config.seed,
            'her': config.her_config.strategy, 'k': config.her_config.k,
            'episodes': int(episodes), 'train_steps': learner.train_step,
            'success_rate': record.get('success_rate'),
            'average_return': record.get('average_return'),
            'grad_steps_per_s': phases.steps_per_second}
  finally:
    reward_env.close()
    server.stop()
