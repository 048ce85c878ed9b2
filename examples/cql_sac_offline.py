r"""CQL-SAC offline from an RLDS dataset: TF-Agents' kumar20 example with the
toolkit's loader, push and replay buffer in it.

TF-Agents' `examples/cql_sac/kumar20/cql_sac_train_eval.py` loads with
`rlds.load` (which does not exist), keeps `data_shuffle_buffer_size` (100)
2-step items in a FIFO table and samples them item by item with
`ReverbReplayBuffer.as_dataset`. Here the same agent, networks and
`tf_agents.train.Learner` train from the whole dataset: it goes into a
Reverb episode table once (`rlds_reverb.push_rlds_to_table`, terminal
discounts fixed) and `MemoryReplayBuffer.as_draws` draws the batches in
memory. docs/tf_agents.md shows the lines that change and why.

  python examples/cql_sac_offline.py --root_dir /tmp/cql \
      --gin_bindings 'train_eval.dataset="d4rl_mujoco_halfcheetah/v2-medium"'
"""

import json
import os

from absl import app
from absl import flags
import gin
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.agents.cql import cql_sac_agent
from tf_agents.agents.ddpg import critic_network
from tf_agents.agents.sac import tanh_normal_projection_network
from tf_agents.networks import actor_distribution_network
from tf_agents.policies import greedy_policy
from tf_agents.policies import py_tf_eager_policy
from tf_agents.specs import tensor_spec
from tf_agents.train import actor
from tf_agents.train import learner
from tf_agents.train import triggers
from tf_agents.train.utils import train_utils

import rlds_reverb
from rlds_reverb.acting import envs
from rlds_reverb.acting import tf_agents_env
from rlds_reverb.data import datasets
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import tf_agents_buffer
from rlds_reverb.storage import tables

FLAGS = flags.FLAGS
flags.DEFINE_string('root_dir', None, 'Where checkpoints, policies and '
                    'summaries go.')
flags.DEFINE_multi_string('gin_file', None, 'gin files of train_eval.')
flags.DEFINE_multi_string('gin_bindings', None, 'gin bindings, e.g. '
                          '"train_eval.num_gradient_updates=1000".')


@gin.configurable
def train_eval(root_dir: str,
               dataset: str = 'd4rl_mujoco_halfcheetah/v2-medium',
               env_name: str = 'HalfCheetah-v5',
               num_gradient_updates: int = 1_000_000,
               batch_size: int = 256,
               actor_fc_layers=(256, 256),
               critic_joint_fc_layers=(256, 256, 256),
               learning_rate: float = 3e-4,
               actor_learning_rate: float = 1e-4,
               cql_alpha: float = 5.0,
               num_cql_samples: int = 10,
               bc_steps: int = 10_000,
               softmax_temperature: float = 1.0,
               reward_scale_factor: float = 1.0,
               policy_save_interval: int = 10_000,
               eval_interval: int = 10_000,
               eval_episodes: int = 10,
               learner_iterations_per_call: int = 1000,
               seed: int = 0) -> dict:
  """Trains CQL-SAC on `dataset`; returns the last evaluation's metrics."""
  tf.random.set_seed(seed)
  np.random.seed(seed)
  eval_env = tf_agents_env.GymnasiumEnvironment(env_name, seed=seed)

  # The toolkit: the whole dataset into an episode table, drawn in memory.
  rlds_data = datasets.load(dataset)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  server = tables.start_server([episode_table.make_table(
      'episodes', spec, max_episodes=10_000_000)])
  client = reverb.Client(f'localhost:{server.port}')
  rlds_reverb.push_rlds_to_table(
      rlds_data, client, 'episodes', sequence_length=None,
      priority=episode_table.UNREAD, zero_terminal_discount=True)
  buffer = tf_agents_buffer.MemoryReplayBuffer.uniform(
      client, 'episodes', poll_every=0)

  time_step_spec = eval_env.time_step_spec()
  observation_spec, action_spec = (time_step_spec.observation,
                                   eval_env.action_spec())
  time_step_spec = tensor_spec.from_spec(time_step_spec)
  observation_spec = tensor_spec.from_spec(observation_spec)
  action_spec = tensor_spec.from_spec(action_spec)
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
  agent = cql_sac_agent.CqlSacAgent(
      time_step_spec, action_spec, actor_network=actor_net,
      critic_network=critic_net,
      # Legacy Adam checkpoints its moments per variable: the new one keeps
      # them by position, and a restored run could swap the two critics'.
      actor_optimizer=tf.keras.optimizers.legacy.Adam(actor_learning_rate),
      critic_optimizer=tf.keras.optimizers.legacy.Adam(learning_rate),
      alpha_optimizer=tf.keras.optimizers.legacy.Adam(learning_rate),
      cql_alpha=cql_alpha, num_cql_samples=num_cql_samples,
      softmax_temperature=softmax_temperature, random_seed=seed,
      include_critic_entropy_term=False, use_lagrange_cql_alpha=False,
      target_update_tau=0.005, target_update_period=1,
      td_errors_loss_fn=tf.math.squared_difference, gamma=0.99,
      reward_scale_factor=reward_scale_factor, num_bc_steps=bc_steps,
      train_step_counter=train_step)
  agent.initialize()

  saved_model_dir = os.path.join(root_dir, learner.POLICY_SAVED_MODEL_DIR)
  agent_learner = learner.Learner(
      root_dir, train_step, agent,
      experience_dataset_fn=lambda: buffer.as_draws(batch_size, 2),
      triggers=[triggers.PolicySavedModelTrigger(
          saved_model_dir, agent, train_step,
          interval=policy_save_interval),
                triggers.StepPerSecondLogTrigger(train_step, interval=1000)],
      checkpoint_interval=policy_save_interval, summary_interval=1000)

  eval_actor = actor.Actor(
      eval_env, py_tf_eager_policy.PyTFEagerPolicy(
          greedy_policy.GreedyPolicy(agent.policy), use_tf_function=True),
      train_step,
      episodes_per_run=eval_episodes,
      metrics=actor.eval_metrics(eval_episodes),
      summary_dir=os.path.join(root_dir, 'eval'))

  metrics = {}
  while agent_learner.train_step_numpy < num_gradient_updates:
    agent_learner.run(iterations=min(
        learner_iterations_per_call,
        num_gradient_updates - agent_learner.train_step_numpy))
    if agent_learner.train_step_numpy % eval_interval == 0 or (
        agent_learner.train_step_numpy >= num_gradient_updates):
      eval_actor.run_and_log()
      metrics = {m.name: float(m.result()) for m in eval_actor.metrics}
      metrics['normalized_score'] = envs.normalized_score(
          env_name, metrics['AverageReturn'])  # D4RL's; None: no reference
      print(json.dumps({'train_step': int(agent_learner.train_step_numpy),
                        'policy': 'greedy', **metrics}), flush=True)
  server.stop()
  return {'train_step': int(agent_learner.train_step_numpy), **metrics}


def main(_):
  gin.parse_config_files_and_bindings(FLAGS.gin_file, FLAGS.gin_bindings)
  print(json.dumps(train_eval(FLAGS.root_dir)), flush=True)


if __name__ == '__main__':
  flags.mark_flag_as_required('root_dir')
  app.run(main)
