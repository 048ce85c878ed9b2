"""TF-Agents agents, built with their published settings.

`make_sac`, `make_td3`, `make_bc`, `make_td3_bc` and `make_cql_sac` build
the continuous-control agents TF-Agents ships from specs and a resolved
`AgentConfig` (`registry.make_agent` resolves it and picks the maker; DQN
is `dqn`, the offline methods TF-Agents lacks are in `agents.offline`).
What is not in `AgentConfig` follows the sources the registry names:
TD3+BC's alpha 2.5, actor every 2 steps, policy noise 0.2 clipped at 0.5
(Fujimoto & Gu 2021); CQL-SAC's fixed settings of TF-Agents' kumar20
configs/mujoco.gin.

The critic learners report their TD errors in `LossInfo.extra.td_error`, as
`DqnAgent` does, so that prioritized replay (`rlds_reverb.replay.per`) can set
priorities from them.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Optional

import gin
import tensorflow as tf
from tf_agents.agents.behavioral_cloning import behavioral_cloning_agent
from tf_agents.agents.cql import cql_sac_agent
from tf_agents.agents.ddpg import actor_network as ddpg_actor_network
from tf_agents.agents.ddpg import critic_network
from tf_agents.agents.sac import sac_agent
from tf_agents.agents.td3 import td3_agent
from tf_agents.utils import common

from rlds_reverb import settings
from rlds_reverb.agents.offline import offline_agent

# LossInfo.extra types of the critic learners: their own fields plus
# td_error, so `extra.critic_loss` still reads as in TF-Agents.
_WITH_TD_ERROR: dict[type, type] = {}


def _with_td_error(extra: Any, td_error: tf.Tensor) -> Any:
  """`extra` (a TF-Agents loss namedtuple) with a `td_error` field added."""
  base = type(extra)
  if base not in _WITH_TD_ERROR:
    _WITH_TD_ERROR[base] = collections.namedtuple(
        base.__name__, base._fields + ('td_error',))
  return _WITH_TD_ERROR[base](*extra, td_error=td_error)


@gin.configurable
@dataclasses.dataclass
class AgentConfig:
  """Hyper-parameters of `registry.make_agent`; None: the published value.

  Bind any field from a gin file or `--gin_bindings` as `AgentConfig.<field>`
  (see configs/).
  """
  actor_learning_rate: Optional[float] = settings.setting(None, lower=0)
  """Adam learning rate of the actor (bc: of the cloning network). None: the
  agent's own, 3e-4 (bc 1e-3)."""
  critic_learning_rate: Optional[float] = settings.setting(None, lower=0)
  """Adam learning rate of the critics (and IQL's value function). None:
  the agent's own, 3e-4 (rebrac 1e-3)."""
  alpha_learning_rate: Optional[float] = settings.setting(None, lower=0)
  """Adam learning rate of the entropy temperature (sac, cql_sac, sac_n,
  edac, cal_ql). None: the agent's own, 3e-4 (cal_ql 3e-5)."""
  gamma: float = settings.setting(0.99, lower=0, upper=1)
  """Discount of the TD targets, applied on top of each step's own discount."""
  target_update_tau: float = settings.setting(0.005, lower=0, upper=1)
  """Polyak factor of the soft target-network updates (sac, td3, td3_bc,
  cql_sac)."""
  reward_scale_factor: Optional[float] = None
  """Rewards are multiplied by this in the TD targets. None: 0.1 for sac and
  cql_sac (TF-Agents' haarnoja18 and kumar20 settings), else 1.0."""
  actor_layers: Optional[tuple[int, ...]] = None
  """Hidden layer widths of the actor (bc: of the cloning network). None:
  3x256 for rebrac, sac_n, edac and cal_ql (CORL), else 2x256."""
  critic_layers: Optional[tuple[int, ...]] = None
  """Hidden layer widths of each critic. None: 3x256 for cql_sac (kumar20),
  rebrac, sac_n, edac and cal_ql (CORL), else 2x256."""
  train_steps: Optional[int] = settings.setting(
      None, flag=settings.NO_FLAG, may_change=True)
  """Length of learning-rate schedules in gradient steps (IQL's cosine
  actor schedule); the pipelines pass the offline phase's --steps. None:
  1M, the published runs' length."""
  td3_bc_alpha: float = settings.setting(2.5, lower=0)
  """TD3+BC: weight of the Q term against the BC term (Fujimoto & Gu 2021
  use 2.5)."""
  cql_alpha: float = settings.setting(0.1, lower=0)
  """CQL-SAC: fixed weight of the CQL regulariser (kumar20's
  configs/mujoco_medium.gin: 0.1; no Lagrange tuning)."""
  cql_bc_steps: int = settings.setting(10_000, lower=0)
  """CQL-SAC: the first N gradient steps train the actor by behaviour cloning
  (kumar20: 10k of 1M steps)."""
  dqn_learning_rate: float = settings.setting(2.3e-3, lower=0)
  """dqn, discrete_bc, discrete_cql: Adam learning rate of the Q-network
  (RL Zoo's CartPole-v1 value)."""
  q_layers: tuple[int, ...] = (256, 256)
  """dqn: hidden layer widths of the Q-network (RL Zoo's CartPole-v1)."""
  double_dqn: bool = settings.setting(False, flag='double')
  """dqn: Double DQN targets (the online network picks the next action, the
  target network values it)."""
  dueling: bool = False
  """dqn: dueling Q-network, Q = V + A - mean(A)."""
  target_update_period: int = settings.setting(128, lower=1)
  """dqn, discrete_cql: gradient steps between copies of the Q-network into
  the target network."""
  gradient_clipping: Optional[float] = 10.0
  """dqn: gradient norm clipping (`DqnAgent`'s gradient_clipping); None:
  off."""
  critic_dtype: str = settings.setting(
      'float32', choices=('float32', 'bfloat16'), may_change=True)
  """What the hidden layers of the ensemble critics (iql, awac, rebrac,
  sac_n, edac, cal_ql; IQL's value function too) compute in: 'float32', or
  'bfloat16' for their matmuls (weights, LayerNorm and the Q output stay
  float32; `agents.offline.ensemble`). Faster where the hardware has bfloat16
  matmuls (AMX CPUs, GPUs); the published settings are float32."""
  seed: Optional[int] = settings.setting(None, flag=settings.NO_FLAG)
  """Seed of the agent's own random ops (CQL-SAC's sampled actions); None:
  unseeded. The pipelines pass --seed."""


class TdErrorRecorder:
  """A `td_errors_loss_fn` that also keeps the TD errors it is shown.

  SAC, TD3 and CQL-SAC compute `loss_fn(td_targets, q_predicted)` once per
  critic inside `_train` and keep only the loss; the recorder keeps
  `td_targets - q_predicted` too, for `ReportsTdErrors` to return.
  """

  def __init__(self, loss_fn=tf.math.squared_difference):
    self._loss_fn = loss_fn
    self._errors = []

  def __call__(self, td_targets, predictions):
    self._errors.append(td_targets - predictions)
    return self._loss_fn(td_targets, predictions)

  def clear(self) -> None:
    self._errors = []

  def take(self) -> tf.Tensor:
    """Mean |TD error| over the critics, one per item; clears the record."""
    errors, self._errors = self._errors, []
    if not errors:
      raise RuntimeError('the critic loss computed no TD errors')
    return tf.reduce_mean(tf.abs(tf.stack(errors)), axis=0)


class ReportsTdErrors:
  """Mixin: the train step's `LossInfo.extra` gains a `td_error` field."""

  def _train(self, experience, weights=None):
    recorder = self._td_errors_loss_fn
    recorder.clear()
    loss_info = super()._train(experience, weights)
    return loss_info._replace(
        extra=_with_td_error(loss_info.extra, recorder.take()))


class SacAgent(ReportsTdErrors, sac_agent.SacAgent):
  pass


class CqlSacAgent(ReportsTdErrors, cql_sac_agent.CqlSacAgent):
  pass


class Td3Agent(ReportsTdErrors, td3_agent.Td3Agent):
  pass


class Td3BcAgent(ReportsTdErrors, td3_agent.Td3Agent):
  """TD3+BC (Fujimoto & Gu 2021): TD3 whose actor also imitates the data.

  Actor loss: -lambda * Q(s, pi(s)) + mean((pi(s) - a)^2), with
  lambda = alpha / mean|Q(s, pi(s))| (not differentiated), so the BC term
  keeps its weight whatever the scale of Q. Observations are expected
  normalised (the sampler's job).
  """

  def __init__(self, *args, bc_alpha: float = 2.5, **kwargs):
    super().__init__(*args, **kwargs)
    self._bc_alpha = bc_alpha
    self._data_actions = None

  def _train(self, experience, weights=None):
    # Td3Agent._train calls actor_loss(time_steps) without the dataset's
    # actions; keep them for it (both run in the same trace).
    self._data_actions = self._as_transition(experience).action_step.action
    return super()._train(experience, weights)

  def actor_loss(self, time_steps, weights=None, training=False):
    with tf.name_scope('actor_loss'):
      actions, _ = self._actor_network(
          time_steps.observation, time_steps.step_type, training=training)
      q_values, _ = self._critic_network_1(
          (time_steps.observation, actions), time_steps.step_type,
          training=False)
      lam = tf.stop_gradient(
          self._bc_alpha / (tf.reduce_mean(tf.abs(q_values)) + 1e-6))
      per_example = -lam * q_values
      if self._data_actions is not None:
        per_example += tf.reduce_mean(
            tf.square(actions - self._data_actions), axis=-1)
      loss = common.aggregate_losses(
          per_example_loss=per_example, sample_weight=weights).total_loss
      tf.compat.v2.summary.scalar('actor_loss', loss,
                                  step=self.train_step_counter)
      tf.compat.v2.summary.scalar('td3_bc_lambda', lam,
                                  step=self.train_step_counter)
    return loss


def _first_step_mse(network):
  """BC loss on the first step of each [B, 2] item.

  The default loss would also fit the second step, which for the last
  transition of an episode is the final observation with its meaningless
  zero action.
  """
  def loss_fn(experience, training=False):
    actions, _ = network(experience.observation[:, 0], training=training)
    return tf.reduce_mean(tf.square(actions - experience.action[:, 0]),
                          axis=-1)
  return loss_fn


def _deterministic_actor(observation_spec, action_spec, config):
  return ddpg_actor_network.ActorNetwork(
      observation_spec, action_spec, fc_layer_params=config.actor_layers)


def _critic(observation_spec, action_spec, config, name='CriticNetwork'):
  return critic_network.CriticNetwork(
      (observation_spec, action_spec),
      joint_fc_layer_params=config.critic_layers,
      kernel_initializer='glorot_uniform',
      last_kernel_initializer='glorot_uniform', name=name)


# Legacy Adam: its slots are checkpointed per variable. The new Keras
# optimizer keeps them in a list by position, and TF-Agents' SAC/TD3 order
# the critic variables through an identity set, so a resumed run could hand
# critic 1's moments to critic 2.
_ADAM = tf.keras.optimizers.legacy.Adam


def _sac_kwargs(time_step_spec: Any, action_spec: Any, config: AgentConfig,
                train_step: tf.Variable) -> dict:
  obs_spec = time_step_spec.observation
  return dict(
      actor_network=offline_agent.squashed_gaussian_actor(
          obs_spec, action_spec, config.actor_layers),
      critic_network=_critic(obs_spec, action_spec, config),
      actor_optimizer=_ADAM(config.actor_learning_rate),
      critic_optimizer=_ADAM(config.critic_learning_rate),
      alpha_optimizer=_ADAM(config.alpha_learning_rate),
      target_update_tau=config.target_update_tau, target_update_period=1,
      td_errors_loss_fn=TdErrorRecorder(), gamma=config.gamma,
      reward_scale_factor=config.reward_scale_factor,
      train_step_counter=train_step)


def make_sac(time_step_spec: Any, action_spec: Any, config: AgentConfig,
             train_step: tf.Variable) -> SacAgent:
  agent = SacAgent(time_step_spec, action_spec, **_sac_kwargs(
      time_step_spec, action_spec, config, train_step))
  agent.initialize()
  return agent


def make_cql_sac(time_step_spec: Any, action_spec: Any, config: AgentConfig,
                 train_step: tf.Variable) -> CqlSacAgent:
  agent = CqlSacAgent(
      time_step_spec, action_spec, cql_alpha=config.cql_alpha,
      num_cql_samples=10, include_critic_entropy_term=False,
      use_lagrange_cql_alpha=False, cql_alpha_learning_rate=3e-4,
      cql_tau=10.0, random_seed=config.seed, reward_noise_variance=0.0,
      num_bc_steps=config.cql_bc_steps, softmax_temperature=50.0,
      **_sac_kwargs(time_step_spec, action_spec, config, train_step))
  agent.initialize()
  return agent


def make_bc(time_step_spec: Any, action_spec: Any, config: AgentConfig,
            train_step: tf.Variable) -> Any:
  cloning_network = _deterministic_actor(time_step_spec.observation,
                                         action_spec, config)
  agent = behavioral_cloning_agent.BehavioralCloningAgent(
      time_step_spec, action_spec, cloning_network=cloning_network,
      optimizer=_ADAM(config.actor_learning_rate),
      loss_fn=_first_step_mse(cloning_network), num_outer_dims=2,
      train_step_counter=train_step)
  agent.initialize()
  return agent


def _make_td3(td3_class: type, time_step_spec: Any, action_spec: Any,
              config: AgentConfig, train_step: tf.Variable, **extra) -> Any:
  obs_spec = time_step_spec.observation
  agent = td3_class(
      time_step_spec, action_spec,
      actor_network=_deterministic_actor(obs_spec, action_spec, config),
      critic_network=_critic(obs_spec, action_spec, config),
      actor_optimizer=_ADAM(config.actor_learning_rate),
      critic_optimizer=_ADAM(config.critic_learning_rate),
      exploration_noise_std=0.1, target_update_tau=config.target_update_tau,
      target_update_period=2, actor_update_period=2,
      td_errors_loss_fn=TdErrorRecorder(), gamma=config.gamma,
      reward_scale_factor=config.reward_scale_factor,
      target_policy_noise=0.2, target_policy_noise_clip=0.5,
      train_step_counter=train_step, **extra)
  agent.initialize()
  return agent


def make_td3(time_step_spec: Any, action_spec: Any, config: AgentConfig,
             train_step: tf.Variable) -> Td3Agent:
  return _make_td3(Td3Agent, time_step_spec, action_spec, config, train_step)


def make_td3_bc(time_step_spec: Any, action_spec: Any, config: AgentConfig,
                train_step: tf.Variable) -> Td3BcAgent:
  return _make_td3(Td3BcAgent, time_step_spec, action_spec, config,
                   train_step, bc_alpha=config.td3_bc_alpha)


def actor_network(agent: Any) -> Any:
  """The network whose weights the numpy policy exports."""
  for name in ('_actor_network', '_cloning_network'):
    if hasattr(agent, name):
      return getattr(agent, name)
  raise ValueError(f'{type(agent).__name__} has no actor network')
