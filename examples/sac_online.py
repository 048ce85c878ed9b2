r"""SAC online, TF-Agents' haarnoja18 example with the toolkit's replay.

TF-Agents' `examples/sac/haarnoja18/sac_train_eval.py` writes every env step
into a uniform Reverb table of 2-step items (`ReverbAddTrajectoryObserver`)
and samples it item by item (`ReverbReplayBuffer.as_dataset`). Here the
actors' observer writes whole episodes into an episode table
(`EpisodeObserver`) and `MemoryReplayBuffer` draws the batches in memory,
reading new episodes as they arrive; the agent, the actors, the Learner and
its triggers are TF-Agents'. docs/tf_agents.md.

  python examples/sac_online.py --root_dir /tmp/sac \
      --gin_bindings 'train_eval.env_name="HalfCheetah-v5"'
"""

import json
import os

from absl import app
from absl import flags
import gin
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.agents.ddpg import critic_network
from tf_agents.agents.sac import sac_agent
from tf_agents.agents.sac import tanh_normal_projection_network
from tf_agents.metrics import py_metrics
from tf_agents.networks import actor_distribution_network
from tf_agents.policies import greedy_policy
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
               env_name: str = 'HalfCheetah-v5',
               num_iterations: int = 1_000_000,
               initial_collect_steps: int = 10_000,
               replay_capacity: int = 1_000_000,
               batch_size: int = 256,
               actor_fc_layers=(256, 256),
               critic_joint_fc_layers=(256, 256),
               learning_rate: float = 3e-4,
               reward_scale_factor: float = 0.1,
               policy_save_interval: int = 10_000,
               eval_interval: int = 10_000,
               eval_episodes: int = 10,
               seed: int = 0) -> dict:
  """Trains SAC online on `env_name`; returns the last evaluation."""
  tf.random.set_seed(seed)
  np.random.seed(seed)
  collect_env = tf_agents_env.GymnasiumEnvironment(env_name, seed=seed)
  eval_env = tf_agents_env.GymnasiumEnvironment(env_name, seed=seed + 1)
  observation_spec, action_spec, time_step_spec = (
      spec_utils.get_tensor_specs(collect_env))

  train_step = train_utils.create_train_step()
  actor_net = actor_distribution_network.ActorDistributionNetwork(
      observation_spec, action_spec, fc_layer_params=actor_fc_layers,
      continuous_projection_net=(
          tanh_normal_projection_network.TanhNormalProjectionNetwork))
  critic_net = critic_network.CriticNetwork(
      (observation_spec, action_spec),
      joint_fc_layer_params=critic_joint_fc_layers,
      kernel_initializer='glorot_uniform',
      last_kernel_initializer='glorot_uniform')
  agent = sac_agent.SacAgent(
      time_step_spec, action_spec, actor_network=actor_net,
      critic_network=critic_net,
      actor_optimizer=tf.keras.optimizers.Adam(learning_rate),
      critic_optimizer=tf.keras.optimizers.Adam(learning_rate),
      alpha_optimizer=tf.keras.optimizers.Adam(learning_rate),
      target_update_tau=0.005, target_update_period=1,
      td_errors_loss_fn=tf.math.squared_difference, gamma=0.99,
      reward_scale_factor=reward_scale_factor, train_step_counter=train_step)
  agent.initialize()

  # The toolkit: an episode table, filled by the actors' observer, drawn
  # in memory (new episodes read every 100 batches).
  server = tables.start_server([episode_table.make_table(
      'episodes', tensor_spec.from_spec(agent.collect_data_spec),
      max_episodes=max(replay_capacity // 10, 1))])
  client = reverb.Client(f'localhost:{server.port}')
  observer = episode_observer.EpisodeObserver(client, 'episodes')

  random_policy = random_py_policy.RandomPyPolicy(
      collect_env.time_step_spec(), collect_env.action_spec())
  actor.Actor(collect_env, random_policy, train_step,
              steps_per_run=initial_collect_steps,
              observers=[observer]).run()
  buffer = tf_agents_buffer.MemoryReplayBuffer.uniform(
      client, 'episodes', capacity=replay_capacity)

  saved_model_dir = os.path.join(root_dir, learner.POLICY_SAVED_MODEL_DIR)
  agent_learner = learner.Learner(
      root_dir, train_step, agent,
      experience_dataset_fn=lambda: buffer.as_draws(batch_size, 2),
      triggers=[triggers.PolicySavedModelTrigger(
          saved_model_dir, agent, train_step,
          interval=policy_save_interval),
                triggers.StepPerSecondLogTrigger(train_step, interval=1000)],
      checkpoint_interval=policy_save_interval)

  env_steps = py_metrics.EnvironmentSteps()
  collect_actor = actor.Actor(
      collect_env, py_tf_eager_policy.PyTFEagerPolicy(
          agent.collect_policy, use_tf_function=True), train_step,
      steps_per_run=1, observers=[observer, env_steps],
      summary_dir=os.path.join(root_dir, learner.TRAIN_DIR))
  eval_actor = actor.Actor(
      eval_env, py_tf_eager_policy.PyTFEagerPolicy(
          greedy_policy.GreedyPolicy(agent.policy), use_tf_function=True),
      train_step,
      episodes_per_run=eval_episodes,
      metrics=actor.eval_metrics(eval_episodes),
      summary_dir=os.path.join(root_dir, 'eval'))

  metrics = {}
  while agent_learner.train_step_numpy < num_iterations:
    collect_actor.run()
    agent_learner.run(iterations=1)
    step = agent_learner.train_step_numpy
    if step % eval_interval == 0 or step >= num_iterations:
      eval_actor.run_and_log()
      metrics = {m.name: float(m.result()) for m in eval_actor.metrics}
  observer.close()
  server.stop()
  return {'train_step': int(agent_learner.train_step_numpy),
          'env_steps': initial_collect_steps + int(env_steps.result()),
          'episodes_in_memory': len(buffer.memory.episode_rows()),
          **metrics}


def main(_):
  gin.parse_config_files_and_bindings(FLAGS.gin_file, FLAGS.gin_bindings)
  print(json.dumps(train_eval(FLAGS.root_dir)), flush=True)


if __name__ == '__main__':
  flags.mark_flag_as_required('root_dir')
  app.run(main)
