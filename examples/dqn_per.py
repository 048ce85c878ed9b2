r"""DQN with prioritized replay, TF-Agents style, on the toolkit's replay.

TF-Agents' DQN examples sample uniformly; its Reverb PER needs a learner of
one's own. Here TF-Agents' `DqnAgent`, `Actor` and unchanged `Learner`
train with proportional PER drawn in memory: `MemoryReplayBuffer.
prioritized` draws, `importance_weighted` hands the agent its importance
weights (the Learner's `use_kwargs_in_agent_train`), `PriorityUpdate`
writes |td_error| + eps back after each step, and the priorities go to the
Reverb store at every checkpoint. docs/tf_agents.md.

  python examples/dqn_per.py --root_dir /tmp/dqn_per
"""

import json
import os

from absl import app
from absl import flags
import gin
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.agents.dqn import dqn_agent
from tf_agents.metrics import py_metrics
from tf_agents.networks import q_network
from tf_agents.policies import py_tf_eager_policy
from tf_agents.policies import random_py_policy
from tf_agents.specs import tensor_spec
from tf_agents.train import actor
from tf_agents.train import learner
from tf_agents.train import triggers
from tf_agents.train.utils import spec_utils
from tf_agents.train.utils import train_utils

from rlds_reverb.acting import tf_agents_env
from rlds_reverb.replay import episode_observer
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from rlds_reverb.replay import per
from rlds_reverb.replay import tf_agents_buffer
from rlds_reverb.storage import tables

FLAGS = flags.FLAGS
flags.DEFINE_string('root_dir', None, 'Where checkpoints, policies and '
                    'summaries go.')
flags.DEFINE_multi_string('gin_file', None, 'gin files of train_eval.')
flags.DEFINE_multi_string('gin_bindings', None, 'gin bindings, e.g. '
                          '"train_eval.num_iterations=1000".')


@gin.configurable
def train_eval(root_dir: str,
               env_name: str = 'CartPole-v1',
               num_iterations: int = 50_000,
               initial_collect_steps: int = 1000,
               collect_steps_per_iteration: int = 1,
               replay_capacity: int = 100_000,
               batch_size: int = 64,
               fc_layer_params=(100,),
               learning_rate: float = 1e-3,
               epsilon_greedy: float = 0.1,
               target_update_period: int = 100,
               alpha: float = 0.6,
               beta0: float = 0.4,
               checkpoint_interval: int = 10_000,
               eval_interval: int = 5000,
               eval_episodes: int = 10,
               seed: int = 0) -> dict:
  """Trains DQN with PER on `env_name`; returns the last evaluation."""
  tf.random.set_seed(seed)
  np.random.seed(seed)
  collect_env = tf_agents_env.GymnasiumEnvironment(env_name, seed=seed)
  eval_env = tf_agents_env.GymnasiumEnvironment(env_name, seed=seed + 1)
  observation_spec, action_spec, time_step_spec = (
      spec_utils.get_tensor_specs(collect_env))

  train_step = train_utils.create_train_step()
  agent = dqn_agent.DqnAgent(
      time_step_spec, action_spec,
      q_network=q_network.QNetwork(observation_spec, action_spec,
                                   fc_layer_params=fc_layer_params),
      optimizer=tf.keras.optimizers.Adam(learning_rate),
      epsilon_greedy=epsilon_greedy,
      target_update_period=target_update_period,
      td_errors_loss_fn=tf.math.squared_difference, gamma=0.99,
      train_step_counter=train_step)
  agent.initialize()

  # The toolkit: an episode table with its priority side table, filled by
  # the actors' observer; PER drawn in memory.
  server = tables.start_server([
      episode_table.make_table(
          'episodes', tensor_spec.from_spec(agent.collect_data_spec),
          max_episodes=replay_capacity),
      feeds.make_priority_table('episodes')])
  client = reverb.Client(f'localhost:{server.port}')
  observer = episode_observer.EpisodeObserver(client, 'episodes')
  actor.Actor(collect_env, random_py_policy.RandomPyPolicy(
      collect_env.time_step_spec(), collect_env.action_spec()), train_step,
              steps_per_run=initial_collect_steps,
              observers=[observer]).run()
  buffer = tf_agents_buffer.MemoryReplayBuffer.prioritized(
      client, 'episodes', batch_size=batch_size, capacity=replay_capacity,
      config=per.PerConfig(alpha=alpha, beta0=beta0,
                           beta_steps=num_iterations))
  weighted = tf_agents_buffer.importance_weighted(
      buffer.as_draws(batch_size, 2), buffer, train_step)

  agent_learner = learner.Learner(
      root_dir, train_step, agent,
      experience_dataset_fn=lambda: weighted,
      after_train_strategy_step_fn=tf_agents_buffer.PriorityUpdate(buffer),
      use_kwargs_in_agent_train=True, run_optimizer_variable_init=False,
      triggers=[triggers.PolicySavedModelTrigger(
          os.path.join(root_dir, learner.POLICY_SAVED_MODEL_DIR), agent,
          train_step, interval=checkpoint_interval)],
      checkpoint_interval=checkpoint_interval)

  env_steps = py_metrics.EnvironmentSteps()
  collect_actor = actor.Actor(
      collect_env, py_tf_eager_policy.PyTFEagerPolicy(
          agent.collect_policy, use_tf_function=True), train_step,
      steps_per_run=collect_steps_per_iteration,
      observers=[observer, env_steps])
  eval_actor = actor.Actor(
      eval_env, py_tf_eager_policy.PyTFEagerPolicy(
          agent.policy, use_tf_function=True), train_step,
      episodes_per_run=eval_episodes,
      metrics=actor.eval_metrics(eval_episodes),
      summary_dir=os.path.join(root_dir, 'eval'))

  metrics = {}
  while agent_learner.train_step_numpy < num_iterations:
    collect_actor.run()
    agent_learner.run(iterations=1)
    step = agent_learner.train_step_numpy
    if step % checkpoint_interval == 0:
      buffer.write_priorities()  # The store keeps what the memory learned.
    if step % eval_interval == 0 or step >= num_iterations:
      eval_actor.run_and_log()
      metrics = {m.name: float(m.result()) for m in eval_actor.metrics}
  observer.close()
  priorities = buffer.replay.feed().raw_priorities()
  server.stop()
  return {'train_step': int(agent_learner.train_step_numpy),
          'env_steps': initial_collect_steps + int(env_steps.result()),
          'max_priority': float(priorities.max()),
          'distinct_priorities': int(len(np.unique(priorities[priorities > 0]))),
          **metrics}


def main(_):
  gin.parse_config_files_and_bindings(FLAGS.gin_file, FLAGS.gin_bindings)
  print(json.dumps(train_eval(FLAGS.root_dir)), flush=True)


if __name__ == '__main__':
  flags.mark_flag_as_required('root_dir')
  app.run(main)
