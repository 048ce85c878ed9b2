"""PPO and A2C updates, written in TF on the toolkit's own GAE.

TF-Agents' PPOClipAgent treats a time-limit LAST step as terminal and
bootstraps GAE from V(s_{T-1}) (tensorflow/agents#953), so the learner is
ours: returns and advantages come from `gae.advantages` (terminals stop the
bootstrap, truncations bootstrap on the real final observation), and one
`tf.function` call runs a whole update:

  PPO  epochs x minibatches of: clipped surrogate
       -min(r A, clip(r, 1 - eps, 1 + eps) A), r = pi(a|s) / pi_old(a|s);
       value loss (V - R)^2 (optionally clipped around the old V, as PPO2
       and the seed codebase do); minus an entropy bonus; gradients clipped by
       global norm; advantages normalised once over the rollout.
  A2C  one step on the whole rollout: -log pi(a|s) A + (V - R)^2 and the
       entropy term, RMSprop (the A2C paper's optimiser), n-step returns
       (lambda 1).
  ACKTR  A2C's loss and rollout, its step the K-FAC natural gradient in a
       trust region (`kfac`), no gradient clipping (as the seed codebase).

The learning rate falls linearly to 0 over the run (the seed codebase's
--use-linear-lr-decay); RL Zoo's CartPole setting decays PPO's clip range
too.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

import gin
import numpy as np
import tensorflow as tf

from rlds_reverb import settings
from rlds_reverb.agents import actor_critic
from rlds_reverb.agents.onpolicy import kfac
from rlds_reverb.agents.onpolicy import rmsprop

ALGORITHMS = ('ppo', 'a2c', 'acktr')
# What an update reports (means over its gradient steps).
_STATS = ('loss', 'policy_loss', 'value_loss', 'entropy', 'approx_kl',
          'clip_fraction', 'grad_norm')


@gin.configurable
@dataclasses.dataclass
class PpoConfig:
  """How an on-policy agent learns; `defaults_for` fills the per-env ones.

  Bind any field from gin as `PpoConfig.<field>`; the pipelines' flags of
  the same name override.
  """
  algorithm: str = settings.setting('ppo', flag=settings.NO_FLAG)
  """ppo (clipped surrogate, epochs x minibatches), a2c (one step per
  rollout, RMSprop) or acktr (one K-FAC step per rollout)."""
  num_envs: int = settings.setting(1, lower=1)
  """Env copies stepped together; a rollout is num_envs x rollout_steps."""
  rollout_steps: int = settings.setting(2048, lower=1)
  """Steps of each copy per rollout (PPO's n_steps; A2C's n of n-step)."""
  gamma: float = settings.setting(0.99, lower=0, upper=1)
  """Discount."""
  gae_lambda: float = settings.setting(0.95, lower=0, upper=1)
  """GAE's lambda (1: n-step returns)."""
  learning_rate: float = settings.setting(3e-4, lower=0)
  """Adam's (PPO), RMSprop's (A2C) or K-FAC's (ACKTR) learning rate at the
  start."""
  lr_decay: bool = True
  """The learning rate falls linearly to 0 over the run."""
  clip_decay: bool = False
  """PPO: the clip range falls linearly to 0 over the run too (RL Zoo's
  CartPole setting; the seed codebase keeps it)."""
  epochs: int = settings.setting(10, lower=1)
  """PPO: passes over each rollout."""
  minibatches: int = settings.setting(32, lower=1)
  """PPO: minibatches per pass (rollout size / minibatches each)."""
  clip_ratio: float = settings.setting(0.2, lower=0)
  """PPO: the surrogate's clip range epsilon."""
  clip_value: bool = False
  """PPO: clip the value loss around the old values by the clip range (as
  PPO2 and the seed codebase do)."""
  value_coef: float = settings.setting(0.5, lower=0)
  """Weight of the value loss."""
  entropy_coef: float = settings.setting(0.0, lower=0)
  """Weight of the entropy bonus."""
  max_grad_norm: float = settings.setting(0.5, lower=0)
  """Gradients clipped to this global norm."""
  normalize_advantages: bool = True
  """Advantages to zero mean, unit std over the whole rollout (the seed
  codebase's PPO)."""
  hidden: Sequence[int] = (64, 64)
  """Hidden layer sizes of the actor and of the critic."""
  activation: str = settings.setting('tanh',
                                     choices=actor_critic.ACTIVATIONS)
  """Of the actor's and the critic's hidden layers (MLP policies)."""
  orthogonal_init: bool = True
  """Orthogonal initialisation (gain sqrt 2 on hidden layers, 1 on the mean
  and the value, 0.01 on logits); off: Keras' Glorot uniform (RL Zoo's
  ortho_init False)."""
  initial_log_std: float = 0.0
  """A Gaussian policy's log standard deviation at the start."""
  recurrent: bool = False
  """A GRU on the observation feeds the actor and the critic (the seed's
  recurrent policy); minibatches are then whole env copies' sequences, so
  minibatches must divide num_envs."""
  recurrent_size: int = settings.setting(64, lower=1)
  """The GRU's state size."""
  observation_clip: float = settings.setting(10.0, lower=0)
  """Normalised observations are clipped to +-this; 0: no observation
  normalisation."""
  reward_clip: float = settings.setting(10.0, lower=0)
  """Rewards scaled by the running std of the discounted return, clipped to
  +-this; 0: no reward scaling."""
  proper_time_limits: bool = True
  """Truncated steps bootstrap on their final observation's value; off:
  treated as terminal (for comparison)."""
  rmsprop_alpha: float = 0.99
  """A2C: RMSprop's decay."""
  rmsprop_epsilon_in_sqrt: bool = False
  """A2C: RMSprop divides by sqrt(v + epsilon), as Keras' and TF1's do
  (OpenAI baselines' A2C); off: by sqrt(v) + epsilon, as PyTorch's does
  (the seed's A2C). With epsilon 1e-5 the first takes far shorter steps."""
  optimizer_epsilon: float = 1e-5
  """Epsilon of Adam / RMSprop."""
  kfac_momentum: float = settings.setting(0.9, lower=0, upper=0.999)
  """ACKTR: momentum of the natural-gradient steps."""
  kfac_stat_decay: float = settings.setting(0.99, lower=0, upper=0.999)
  """ACKTR: decay of the running Kronecker factors."""
  kfac_kl_clip: float = settings.setting(0.001, lower=0)
  """ACKTR: the trust region, the largest KL a step is predicted to move
  the policy by."""
  kfac_damping: float = settings.setting(0.01, lower=0)
  """ACKTR: added to the factors' eigenvalue products (Tikhonov)."""
  kfac_inverse_interval: int = settings.setting(10, lower=1)
  """ACKTR: steps between eigendecompositions of the factors."""

  @property
  def rollout_size(self) -> int:
    return self.num_envs * self.rollout_steps


# The fields only PPO reads (A2C takes one unclipped step per rollout).
PPO_ONLY = ('epochs', 'minibatches', 'clip_ratio', 'clip_value', 'clip_decay')
# The fields only ACKTR reads.
KFAC_ONLY = ('kfac_momentum', 'kfac_stat_decay', 'kfac_kl_clip',
             'kfac_damping', 'kfac_inverse_interval')

# Settings from RL Zoo's tuned hyper-parameters (PPO and A2C on CartPole-v1,
# PPO on MuJoCo), used where the user sets nothing; keyed by (algorithm,
# discrete actions).
_DEFAULTS = {
    # The seed codebase's MuJoCo command (its PPO clips the value loss, and
    # its value loss is value_loss_coef 0.5 x 0.5 (V - R)^2: our 0.25).
    ('ppo', False): dict(clip_value=True, value_coef=0.25),
    ('ppo', True): dict(num_envs=8, rollout_steps=32, gamma=0.98,
                        gae_lambda=0.8, learning_rate=1e-3, clip_decay=True,
                        epochs=20, minibatches=1, observation_clip=0.0,
                        reward_clip=0.0),
    ('a2c', False): dict(num_envs=4, rollout_steps=5, gae_lambda=1.0,
                         learning_rate=7e-4, lr_decay=False, epochs=1,
                         minibatches=1, normalize_advantages=False),
    ('a2c', True): dict(num_envs=8, rollout_steps=5, gae_lambda=1.0,
                        learning_rate=7e-4, lr_decay=False, epochs=1,
                        minibatches=1, normalize_advantages=False,
                        observation_clip=0.0, reward_clip=0.0),
}
# ACKTR: A2C's settings with OpenAI baselines' and the seed's K-FAC step
# (lr 0.25, 20-step rollouts; entropy 0.01 for discrete actions).
_ACKTR = dict(rollout_steps=20, learning_rate=0.25)
_DEFAULTS[('acktr', False)] = {**_DEFAULTS[('a2c', False)], **_ACKTR}
_DEFAULTS[('acktr', True)] = {**_DEFAULTS[('a2c', True)], **_ACKTR,
                              'entropy_coef': 0.01}


# Image observations (Atari: discrete actions): the seed codebase's
# README commands for PongNoFrameskip-v4. Frames are scaled in the network,
# never normalised; rewards keep their scale (Pong's are +-1 already).
_IMAGE_DEFAULTS = {
    'ppo': dict(num_envs=8, rollout_steps=128, learning_rate=2.5e-4,
                clip_ratio=0.1, clip_value=True, epochs=4, minibatches=4,
                entropy_coef=0.01, value_coef=0.25, observation_clip=0.0,
                reward_clip=0.0),
    'a2c': dict(num_envs=16, rollout_steps=5, gae_lambda=1.0,
                learning_rate=7e-4, lr_decay=False, epochs=1, minibatches=1,
                normalize_advantages=False, entropy_coef=0.01,
                observation_clip=0.0, reward_clip=0.0),
}
_IMAGE_DEFAULTS['acktr'] = {**_IMAGE_DEFAULTS['a2c'], **_ACKTR,
                            'num_envs': 32}


def env_defaults(algorithm: str, discrete: bool, image: bool = False
                 ) -> dict:
  """The fields whose default depends on the algorithm and the env's kind
  of actions and observations."""
  if algorithm not in ALGORITHMS:
    raise ValueError(f'algorithm must be one of {", ".join(ALGORITHMS)}, '
                     f'got {algorithm!r}')
  if image:
    return dict(_IMAGE_DEFAULTS[algorithm])
  return dict(_DEFAULTS[(algorithm, discrete)])


def sequence_minibatches(values: dict) -> int:
  """The most minibatches up to the configured number that whole
  sequences allow (a divisor of num_envs): a recurrent policy's default."""
  minibatches = values.get('minibatches', PpoConfig.minibatches)
  num_envs = values.get('num_envs', PpoConfig.num_envs)
  return math.gcd(minibatches, num_envs)


def defaults_for(algorithm: str, discrete: bool, image: bool = False,
                 **overrides) -> PpoConfig:
  """The config of `algorithm` for an env with discrete or continuous
  actions (and image observations), with `overrides` (the fields a user
  set) on top; a recurrent config's minibatches, unless set, divide
  num_envs."""
  values = {**env_defaults(algorithm, discrete, image), **overrides}
  if values.get('recurrent') and 'minibatches' not in overrides:
    values['minibatches'] = sequence_minibatches(values)
  config = PpoConfig(algorithm=algorithm, **values)
  check(config)
  return config


def check(config: PpoConfig) -> None:
  """Raises ValueError naming the first bad field."""
  if config.algorithm not in ALGORITHMS:
    raise ValueError(f'algorithm must be one of {", ".join(ALGORITHMS)}, '
                     f'got {config.algorithm!r}')
  for name in ('num_envs', 'rollout_steps', 'epochs', 'minibatches'):
    value = getattr(config, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f'{name} must be a positive integer, got {value!r}')
  if config.recurrent and config.num_envs % config.minibatches:
    raise ValueError(f'a recurrent policy learns from whole sequences: '
                     f'minibatches ({config.minibatches}) must divide '
                     f'num_envs ({config.num_envs})')
  if config.recurrent and config.activation != 'tanh':
    raise ValueError(f'the recurrent policy\'s layers are tanh; activation '
                     f'{config.activation!r} is for feed-forward ones')
  if config.algorithm == 'acktr' and config.recurrent:
    raise ValueError('acktr takes feed-forward policies: K-FAC here has '
                     'no factors for the GRU (recurrent)')
  if config.algorithm == 'acktr' and (config.epochs, config.minibatches) != (
      1, 1):
    raise ValueError(f'acktr takes one step per rollout: epochs and '
                     f'minibatches must be 1, got {config.epochs} and '
                     f'{config.minibatches}')
  if config.recurrent_size < 1:
    raise ValueError(f'recurrent_size must be >= 1, got '
                     f'{config.recurrent_size}')
  if config.rollout_size % config.minibatches:
    raise ValueError(f'minibatches ({config.minibatches}) must divide the '
                     f'rollout size num_envs x rollout_steps = '
                     f'{config.rollout_size}')
  for name in ('gamma', 'gae_lambda'):
    if not 0 <= getattr(config, name) <= 1:
      raise ValueError(f'{name} must be in [0, 1], got '
                       f'{getattr(config, name)}')
  for name in ('learning_rate', 'clip_ratio', 'max_grad_norm'):
    if not getattr(config, name) > 0:
      raise ValueError(f'{name} must be > 0, got {getattr(config, name)}')
  for name in ('value_coef', 'entropy_coef', 'observation_clip',
               'reward_clip'):
    if getattr(config, name) < 0:
      raise ValueError(f'{name} must be >= 0, got {getattr(config, name)}')
  if not config.hidden or any(int(h) < 1 for h in config.hidden):
    raise ValueError(f'hidden must list positive layer sizes, got '
                     f'{config.hidden!r}')


def make_optimizer(config: PpoConfig) -> Any:
  """Adam (PPO), RMSprop (A2C) or a `kfac.KfacOptimizer` (ACKTR)."""
  if config.algorithm == 'acktr':
    return kfac.KfacOptimizer(
        config.learning_rate, momentum=config.kfac_momentum,
        stat_decay=config.kfac_stat_decay, kl_clip=config.kfac_kl_clip,
        damping=config.kfac_damping,
        inverse_interval=config.kfac_inverse_interval)
  if config.algorithm == 'a2c' and config.rmsprop_epsilon_in_sqrt:
    return tf.keras.optimizers.RMSprop(
        config.learning_rate, rho=config.rmsprop_alpha,
        epsilon=config.optimizer_epsilon)
  if config.algorithm == 'a2c':
    return rmsprop.TorchRMSprop(config.learning_rate,
                                rho=config.rmsprop_alpha,
                                epsilon=config.optimizer_epsilon)
  return tf.keras.optimizers.Adam(config.learning_rate,
                                  epsilon=config.optimizer_epsilon)


class Updater:
  """Runs the update of one rollout in one `tf.function` call.

  `batch` fields are flattened over (T, N): observation, action, log_prob
  (of the acting policy), advantage, return, value (the critic's before the
  update). A recurrent model's batch keeps them [N, T, ...] (env copy,
  time), with episode_start [N, T] and initial_state [N, H]: a minibatch is
  a set of whole sequences, unrolled from their initial states.
  """

  def __init__(self, model: actor_critic.ActorCritic, config: PpoConfig):
    self.model, self.config = model, config
    self.optimizer = make_optimizer(config)
    self._update = tf.function(self._kfac_update_fn if config.algorithm ==
                               'acktr' else self._update_fn)

  def build(self) -> None:
    """Makes the optimizer's variables (before a checkpoint restores
    them)."""
    if self.config.algorithm != 'acktr':
      self.optimizer.build(self.model.trainable_weights)
      return
    shape = getattr(self.model, 'observation_shape', None)
    dummy = (tf.zeros((1,) + shape, tf.uint8) if shape is not None else
             tf.zeros([1, self.model.observation_size]))
    captures = kfac.forward(self.model, dummy)[3]
    kfac.check_covers(captures, self.model.trainable_weights)
    self.optimizer.build(captures)

  def __call__(self, batch: dict[str, np.ndarray], progress_left: float,
               seed: int) -> dict[str, float]:
    """One update; `progress_left` in (0, 1] scales the decaying learning
    rate and clip range. Returns the update's mean losses and statistics."""
    lr_scale = progress_left if self.config.lr_decay else 1.0
    clip_scale = progress_left if self.config.clip_decay else 1.0
    self.optimizer.learning_rate.assign(self.config.learning_rate * lr_scale)
    batch = dict(batch)
    if self.config.normalize_advantages:  # Over the whole rollout, once.
      advantage = np.asarray(batch['advantage'], np.float64)
      batch['advantage'] = ((advantage - advantage.mean()) /
                            (advantage.std() + 1e-5)).astype(np.float32)
    tensors = {key: tf.convert_to_tensor(value)
               for key, value in batch.items()}
    metrics = self._update(tensors,
                           tf.constant(self.config.clip_ratio * clip_scale,
                                       tf.float32),
                           tf.constant(seed, tf.int64))
    return {key: float(value) for key, value in metrics.items()}

  def _evaluate(self, batch):
    """log pi(a|s), entropy and V(s) of the batch's steps, flattened."""
    model = self.model
    if not model.recurrent:
      return model.evaluate(batch['observation'], batch['action'])
    states = model.unroll(batch['observation'], batch['episode_start'],
                          batch['initial_state'])
    features = tf.reshape(states, [-1, model.state_size])
    action = batch['action']
    action = tf.reshape(action, tf.concat([[-1], tf.shape(action)[2:]], 0))
    log_prob, entropy = model.log_prob_and_entropy_of(features, action)
    return log_prob, entropy, model.value_of(features)

  def _losses(self, batch, clip, evaluated=None):
    """The loss and its statistics; `evaluated` (log pi, entropy, V) when
    the caller ran the model itself."""
    config = self.config
    log_prob, entropy, value = evaluated or self._evaluate(batch)
    batch = {key: tf.reshape(batch[key], [-1])
             for key in ('advantage', 'log_prob', 'return', 'value')}
    advantage = batch['advantage']
    log_ratio = log_prob - batch['log_prob']
    ratio = tf.exp(log_ratio)
    if config.algorithm in ('a2c', 'acktr'):
      policy_loss = -tf.reduce_mean(log_prob * advantage)
    else:
      policy_loss = -tf.reduce_mean(tf.minimum(
          ratio * advantage,
          tf.clip_by_value(ratio, 1.0 - clip, 1.0 + clip) * advantage))
    value_error = tf.square(value - batch['return'])
    if config.clip_value and config.algorithm == 'ppo':
      clipped = batch['value'] + tf.clip_by_value(value - batch['value'],
                                                  -clip, clip)
      value_error = tf.maximum(value_error,
                               tf.square(clipped - batch['return']))
    # (V - R)^2 weighted by value_coef, as SB3 (the seed codebase halves
    # it first: its settings here say 0.25 for its 0.5).
    value_loss = tf.reduce_mean(value_error)
    entropy = tf.reduce_mean(entropy)
    loss = (policy_loss + config.value_coef * value_loss -
            config.entropy_coef * entropy)
    stats = {
        'loss': loss, 'policy_loss': policy_loss, 'value_loss': value_loss,
        'entropy': entropy,
        # http://joschu.net/blog/kl-approx.html
        'approx_kl': tf.reduce_mean((ratio - 1.0) - log_ratio),
        'clip_fraction': tf.reduce_mean(tf.cast(
            tf.abs(ratio - 1.0) > clip, tf.float32)),
    }
    return loss, stats

  def _update_fn(self, batch, clip, seed):
    """Epochs x minibatches of steps; returns the steps' mean statistics."""
    config, model = self.config, self.model
    # Autograph converts only these loops: the losses and Keras' update
    # need none of it, and converting them is most of the first call.
    losses = tf.autograph.experimental.do_not_convert(self._losses)
    apply_gradients = tf.autograph.experimental.do_not_convert(
        self.optimizer.apply_gradients)
    size = tf.shape(batch['advantage'])[0]
    minibatch = size // config.minibatches
    weights = model.trainable_weights
    totals = {key: tf.constant(0.0) for key in _STATS}
    for epoch in tf.range(config.epochs):
      order = tf.random.experimental.stateless_shuffle(
          tf.range(size), seed=tf.stack([seed, tf.cast(epoch, tf.int64)]))
      for m in tf.range(config.minibatches):
        rows = order[m * minibatch:(m + 1) * minibatch]
        part = {key: tf.gather(value, rows) for key, value in batch.items()}
        with tf.GradientTape() as tape:
          loss, stats = losses(part, clip)
        grads = tape.gradient(loss, weights)
        grads, norm = tf.clip_by_global_norm(grads, config.max_grad_norm)
        apply_gradients(zip(grads, weights))
        model.train_step_counter.assign_add(1)
        stats['grad_norm'] = norm
        totals = {key: totals[key] + stats[key] for key in _STATS}
    steps = float(config.epochs * config.minibatches)
    return {key: total / steps for key, total in totals.items()}

  def _kfac_update_fn(self, batch, clip, seed):
    """ACKTR's step: A2C's loss, K-FAC's factors from the sampled Fisher
    loss -log pi(a|s) - (V - stop(V + noise))^2 (the actions are the
    rollout's, drawn from this policy), the natural gradient in its
    trust region."""
    model = self.model
    losses = tf.autograph.experimental.do_not_convert(self._losses)
    size = tf.shape(batch['advantage'])[0]
    with tf.GradientTape(persistent=True) as tape:
      out, value, log_std, captures = kfac.forward(
          model, batch['observation'], tape)
      log_prob, entropy = actor_critic.policy_terms(out, batch['action'],
                                                    log_std)
      loss, stats = losses(batch, clip, (log_prob, entropy, value))
      noise = tf.random.stateless_normal(tf.shape(value),
                                         tf.stack([seed, seed]))
      fisher_loss = -tf.reduce_mean(log_prob) - tf.reduce_mean(
          tf.square(value - tf.stop_gradient(value + noise)))
    grads = tape.gradient(loss, kfac.variables_of(captures))
    output_grads = tape.gradient(fisher_loss, [c.output for c in captures])
    del tape
    step_stats = self.optimizer.apply(captures, kfac.group(grads, captures),
                                      output_grads, size)
    model.train_step_counter.assign_add(1)
    stats['grad_norm'] = tf.linalg.global_norm(grads)
    return {**{key: stats[key] for key in _STATS},
            'kfac_nu': step_stats['kfac_nu']}


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
  """1 - Var(R - V) / Var(R): how much of the returns the critic explains."""
  variance = np.var(returns)
  return float('nan') if variance == 0 else float(
      1.0 - np.var(returns - values) / variance)
