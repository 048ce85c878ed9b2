r"""TD3 with hindsight experience replay on a goal env (FetchReach), TF-Agents
style, on the toolkit's replay.

The episode table keeps the env's goal dicts; `MemoryReplayBuffer.hindsight`
relabels goals when it draws (future strategy, k = 4: 80% of transitions get
a goal the episode achieved later, rewards recomputed by the env's
`compute_reward`), and hands TF-Agents' `Td3Agent` concat(observation,
goal). The collect and eval policies see the same view of the env's dicts
through `buffer.observation_fn()`. The agent, actors and `Learner` are
TF-Agents'. docs/tf_agents.md.

  python examples/td3_her.py --root_dir /tmp/td3_her
"""

import json
import os

from absl import app
from absl import flags
import gin
import numpy as np
import reverb
import tensorflow as tf
from tf_agents.agents.ddpg import actor_network
from tf_agents.agents.ddpg import critic_network
from tf_agents.agents.td3 import td3_agent
from tf_agents.policies import py_policy
from tf_agents.policies import py_tf_eager_policy
from tf_agents.policies import random_py_policy
from tf_agents.specs import tensor_spec
from tf_agents.train import actor
from tf_agents.train import learner
from tf_agents.train.utils import train_utils
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from rlds_reverb.acting import tf_agents_env
from rlds_reverb.replay import episode_observer
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import her
from rlds_reverb.replay import tf_agents_buffer
from rlds_reverb.storage import tables

FLAGS = flags.FLAGS
flags.DEFINE_string('root_dir', None, 'Where checkpoints, policies and '
                    'summaries go.')
flags.DEFINE_multi_string('gin_file', None, 'gin files of train_eval.')
flags.DEFINE_multi_string('gin_bindings', None, 'gin bindings, e.g. '
                          '"train_eval.num_iterations=1000".')


class GoalView(py_policy.PyPolicy):
  """A policy on concat(observation, goal), acting on the env's goal
  dicts."""

  def __init__(self, policy: py_policy.PyPolicy, time_step_spec, view):
    super().__init__(time_step_spec, policy.action_spec)
    self._policy, self._view = policy, view

  def _action(self, time_step, policy_state):
    return self._policy.action(time_step._replace(
        observation=self._view(time_step.observation)), policy_state)


@gin.configurable
def train_eval(root_dir: str,
               env_name: str = 'FetchReach-v4',
               num_iterations: int = 20_000,
               initial_collect_steps: int = 1000,
               replay_capacity: int = 1_000_000,
               batch_size: int = 256,
               fc_layer_params=(256, 256),
               learning_rate: float = 1e-3,
               exploration_noise_std: float = 0.2,
               relabel_k: int = 4,
               checkpoint_interval: int = 5000,
               eval_interval: int = 5000,
               eval_episodes: int = 10,
               seed: int = 0) -> dict:
  """Trains TD3 + HER on `env_name`; returns the last evaluation."""
  tf.random.set_seed(seed)
  np.random.seed(seed)
  collect_env = tf_agents_env.GymnasiumEnvironment(env_name, seed=seed)
  eval_env = tf_agents_env.GymnasiumEnvironment(env_name, seed=seed + 1)
  env_time_step_spec = tensor_spec.from_spec(collect_env.time_step_spec())
  action_spec = tensor_spec.from_spec(collect_env.action_spec())
  goal_obs = env_time_step_spec.observation
  flat_size = int(goal_obs[her.OBSERVATION].shape[0] +
                  goal_obs[her.DESIRED_GOAL].shape[0])
  time_step_spec = ts.time_step_spec(tf.TensorSpec([flat_size], tf.float32))

  train_step = train_utils.create_train_step()
  agent = td3_agent.Td3Agent(
      time_step_spec, action_spec,
      actor_network=actor_network.ActorNetwork(
          time_step_spec.observation, action_spec,
          fc_layer_params=fc_layer_params),
      critic_network=critic_network.CriticNetwork(
          (time_step_spec.observation, action_spec),
          joint_fc_layer_params=fc_layer_params),
      actor_optimizer=tf.keras.optimizers.Adam(learning_rate),
      critic_optimizer=tf.keras.optimizers.Adam(learning_rate),
      exploration_noise_std=exploration_noise_std, target_update_tau=0.05,
      gamma=0.98, train_step_counter=train_step)
  agent.initialize()

  # The toolkit: episodes with their goal dicts, relabelled when drawn.
  episode_spec = trajectory.Trajectory(
      step_type=env_time_step_spec.step_type, observation=goal_obs,
      action=action_spec, policy_info=(),
      next_step_type=env_time_step_spec.step_type,
      reward=env_time_step_spec.reward, discount=env_time_step_spec.discount)
  server = tables.start_server([episode_table.make_table(
      'episodes', episode_spec, max_episodes=replay_capacity // 50)])
  client = reverb.Client(f'localhost:{server.port}')
  observer = episode_observer.EpisodeObserver(client, 'episodes')
  actor.Actor(collect_env, random_py_policy.RandomPyPolicy(
      collect_env.time_step_spec(), collect_env.action_spec()), train_step,
              steps_per_run=initial_collect_steps,
              observers=[observer]).run()
  buffer = tf_agents_buffer.MemoryReplayBuffer.hindsight(
      client, 'episodes', collect_env.gym, batch_size=batch_size,
      capacity=replay_capacity,
      config=her.HerConfig(strategy='future', k=relabel_k))

  agent_learner = learner.Learner(
      root_dir, train_step, agent,
      experience_dataset_fn=lambda: buffer.as_draws(batch_size, 2),
      checkpoint_interval=checkpoint_interval)
  view = buffer.observation_fn()
  env_spec = collect_env.time_step_spec()
  collect_actor = actor.Actor(
      collect_env, GoalView(py_tf_eager_policy.PyTFEagerPolicy(
          agent.collect_policy, use_tf_function=True), env_spec, view),
      train_step, steps_per_run=1, observers=[observer])
  eval_actor = actor.Actor(
      eval_env, GoalView(py_tf_eager_policy.PyTFEagerPolicy(
          agent.policy, use_tf_function=True), env_spec, view), train_step,
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
          'episodes_in_memory': len(buffer.memory.episode_rows()), **metrics}


def main(_):
  gin.parse_config_files_and_bindings(FLAGS.gin_file, FLAGS.gin_bindings)
  print(json.dumps(train_eval(FLAGS.root_dir)), flush=True)


if __name__ == '__main__':
  flags.mark_flag_as_required('root_dir')
  app.run(main)
