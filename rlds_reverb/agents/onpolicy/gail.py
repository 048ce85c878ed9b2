"""GAIL's pieces for the on-policy learner: expert pairs, discriminator, reward.

Generative adversarial imitation learning as the seed codebase
(pytorch-a2c-ppo-acktr-gail) runs it on top of PPO: a discriminator D(s, a)
learns to tell the expert's (observation, action) pairs from the policy's,
and the policy is trained on the reward it gets for fooling it, in place of
the env's reward. Each update:

  1. the actor collects a rollout as usual (its env rewards are ignored);
  2. the discriminator takes `warmup_epochs(update)` passes over the rollout,
     each minibatch of policy pairs against one of expert pairs:
     binary cross-entropy (expert 1, policy 0) plus a WGAN-GP gradient
     penalty on points between the two, which keeps D smooth so the reward
     it hands the policy does not saturate;
  3. the rollout's rewards become log D - log(1 - D), scaled by the running
     std of their discounted return (`RewardNormalizer`), and PPO updates on
     them as on any rewards.

The expert pairs come from an RLDS dataset (`expert_pairs`): a few
trajectories, subsampled, because GAIL's point is imitation from little
data, and consecutive steps are nearly the same pair.

Only what does not depend on the run loop lives here; the seed normalises
the expert's observations with the policy's running observation statistics
before the discriminator sees them, which is the caller's job.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import rlds
import tensorflow as tf

from rlds_reverb.agents.onpolicy import normalization

# Inside the root of the gradient norm: the norm's gradient is NaN where the
# input gradient is exactly 0, and a NaN times a penalty weight of 0 is NaN.
_NORM_EPSILON = 1e-12
# Steps read from an episode per tf.data batch in `expert_pairs`.
_READ_BATCH = 4096


def expert_pairs(rlds_data: tf.data.Dataset, *, num_trajectories: int = 4,
                 subsample: int = 20, seed: int = 0
                 ) -> tuple[np.ndarray, np.ndarray]:
  """The expert (observation, action) pairs GAIL imitates.

  As the seed's ExpertDataset: a few trajectories, each thinned to every
  `subsample`-th transition from its own random start, so the few pairs kept
  are spread over the whole episode rather than bunched near its start. The
  trajectories are the dataset's first `num_trajectories` (the seed draws
  them at random; taking the first keeps a run's expert data the same
  whatever the dataset's size). An episode's `is_last` step holds only the
  final observation (its action is padding), so it is never a pair.

  Args:
    rlds_data: RLDS episodes with flat float observations and continuous
      (float vector) actions.
    num_trajectories: episodes used, from the start of the dataset.
    subsample: keep every `subsample`-th transition of each episode.
    seed: seed of the start offsets: `np.random.default_rng(seed).integers(
      0, subsample, size=num_trajectories)`, one per episode in order.

  Returns:
    (observations [M, obs], actions [M, act]) as float32, episode by episode
    in step order.

  Raises:
    ValueError: a bad argument; data that is not RLDS, has dict or non-flat
      observations, or integer actions; fewer than `num_trajectories`
      episodes; or no pair left after subsampling.
  """
  for name, value in (('num_trajectories', num_trajectories),
                      ('subsample', subsample)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f'{name} must be a positive integer, got {value!r}')
  spec = rlds_data.element_spec
  if not isinstance(spec, dict) or rlds.STEPS not in spec:
    raise ValueError(f'rlds_data must be RLDS episodes with a {rlds.STEPS!r} '
                     f'dataset, got elements {spec}')
  step_spec = spec[rlds.STEPS].element_spec
  for key in (rlds.OBSERVATION, rlds.ACTION, rlds.IS_LAST):
    if key not in step_spec:
      raise ValueError(f'dataset steps have no {key!r} field; they have '
                       f'{", ".join(sorted(step_spec))}')
  observation, action = step_spec[rlds.OBSERVATION], step_spec[rlds.ACTION]
  if isinstance(observation, dict):
    raise ValueError(f'dataset observations are dicts (keys '
                     f'{", ".join(sorted(observation))}); GAIL here takes flat '
                     f'vector observations')
  if observation.shape.rank != 1 or not observation.dtype.is_floating:
    raise ValueError(f'dataset observations must be flat float vectors, got '
                     f'{observation.dtype.name} {observation.shape.as_list()}')
  if isinstance(action, dict):
    raise ValueError(f'dataset actions are dicts (keys '
                     f'{", ".join(sorted(action))}); GAIL here takes '
                     f'continuous vector actions')
  if not action.dtype.is_floating:
    raise ValueError(f'dataset actions are {action.dtype.name} (discrete); '
                     f'GAIL here takes continuous actions')
  if action.shape.rank != 1:
    raise ValueError(f'dataset actions must be float vectors, got shape '
                     f'{action.shape.as_list()}')

  def pick(step):
    return (step[rlds.OBSERVATION], step[rlds.ACTION], step[rlds.IS_LAST])

  episodes = []
  for episode in rlds_data.take(num_trajectories):
    parts = list(episode[rlds.STEPS].map(pick).batch(_READ_BATCH)
                 .as_numpy_iterator())
    if parts:
      obs, act, last = (np.concatenate(column) for column in zip(*parts))
    else:
      obs = np.zeros([0] + observation.shape.as_list(), np.float32)
      act = np.zeros([0] + action.shape.as_list(), np.float32)
      last = np.zeros([0], bool)
    episodes.append((obs[~last], act[~last]))
  if len(episodes) < num_trajectories:
    raise ValueError(f'num_trajectories is {num_trajectories} but the dataset '
                     f'has only {len(episodes)} episodes')
  starts = np.random.default_rng(seed).integers(0, subsample,
                                                size=num_trajectories)
  observations = [obs[start::subsample]
                  for (obs, _), start in zip(episodes, starts)]
  actions = [act[start::subsample]
             for (_, act), start in zip(episodes, starts)]
  observations = np.concatenate(observations).astype(np.float32)
  actions = np.concatenate(actions).astype(np.float32)
  if not len(observations):
    raise ValueError(f'no expert pair is left: the first {num_trajectories} '
                     f'episodes are too short for subsample {subsample}')
  return observations, actions


class Discriminator(tf.Module):
  """D(s, a) = sigmoid(logit(s, a)): the probability that a pair is expert.

  The seed's network and loss: an MLP with tanh hidden layers on the
  concatenated (observation, action), trained with Adam on binary
  cross-entropy (expert 1, policy 0) plus a gradient penalty. The penalty
  pulls the norm of the logit's input gradient towards 1 on random points
  between expert and policy pairs (WGAN-GP), so D cannot become a step
  function whose reward is flat almost everywhere.

  Attributes:
    network: the MLP, one logit per pair.
    optimizer: its Adam.
    gradient_penalty_weight: lambda of the gradient penalty (0: none).
  """

  def __init__(self, observation_size: int, action_size: int, *,
               hidden: Sequence[int] = (100, 100),
               learning_rate: float = 3e-4,
               gradient_penalty_weight: float = 10.0, seed: int = 0,
               name: str = 'discriminator'):
    super().__init__(name=name)
    for arg, value in (('observation_size', observation_size),
                       ('action_size', action_size)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f'{arg} must be a positive integer, got {value!r}')
    if not hidden or any(int(h) < 1 for h in hidden):
      raise ValueError(f'hidden must list positive layer sizes, got '
                       f'{hidden!r}')
    if not learning_rate > 0:
      raise ValueError(f'learning_rate must be > 0, got {learning_rate}')
    if not gradient_penalty_weight >= 0:
      raise ValueError(f'gradient_penalty_weight must be >= 0, got '
                       f'{gradient_penalty_weight}')
    self.observation_size = observation_size
    self.action_size = action_size
    self.hidden = tuple(int(h) for h in hidden)
    self.gradient_penalty_weight = float(gradient_penalty_weight)
    with self.name_scope:
      layers = [tf.keras.layers.Dense(
          size, activation='tanh',
          kernel_initializer=tf.keras.initializers.GlorotUniform(seed + i))
                for i, size in enumerate(self.hidden)]
      layers.append(tf.keras.layers.Dense(
          1, kernel_initializer=tf.keras.initializers.GlorotUniform(
              seed + len(self.hidden))))
      self.network = tf.keras.Sequential(layers, name='network')
      self.network(tf.zeros([1, observation_size + action_size]))
      self.optimizer = tf.keras.optimizers.Adam(learning_rate)
      # Built now, so the compiled step creates no variables.
      self.optimizer.build(self.network.trainable_variables)
      # The penalty's interpolation weights, reproducible from `seed`.
      self._alpha_generator = tf.random.Generator.from_seed(seed)
    pairs = (tf.TensorSpec([None, observation_size], tf.float32),
             tf.TensorSpec([None, action_size], tf.float32))
    # No tensor-dependent Python control flow: autograph is start-up cost.
    self._compiled_logits = tf.function(self.logits, input_signature=pairs,
                                        autograph=False)
    self._train_step = tf.function(self._train_step_fn,
                                   input_signature=pairs + pairs,
                                   autograph=False)

  def logits(self, observations: tf.Tensor, actions: tf.Tensor) -> tf.Tensor:
    """logit(s, a) [B] of observations [B, obs] and actions [B, act]."""
    inputs = tf.concat([tf.cast(observations, tf.float32),
                        tf.cast(actions, tf.float32)], axis=-1)
    return self.network(inputs)[:, 0]

  def gradient_penalty(self, expert_observations: tf.Tensor,
                       expert_actions: tf.Tensor,
                       policy_observations: tf.Tensor,
                       policy_actions: tf.Tensor,
                       alpha: tf.Tensor | None = None) -> tf.Tensor:
    """lambda * mean((||d logit / d x||_2 - 1)^2) at x = alpha * expert +
    (1 - alpha) * policy, per row on the concatenated (s, a).

    Rows are paired in order, so both batches need the same size. `alpha`
    [B] (or [B, 1]) fixes the interpolation; None draws it from U[0, 1]
    with the module's generator. Differentiable in the network's weights.
    """
    expert = tf.concat([tf.cast(expert_observations, tf.float32),
                        tf.cast(expert_actions, tf.float32)], axis=-1)
    policy = tf.concat([tf.cast(policy_observations, tf.float32),
                        tf.cast(policy_actions, tf.float32)], axis=-1)
    if expert.shape[0] is not None and policy.shape[0] is not None and (
        expert.shape[0] != policy.shape[0]):
      raise ValueError(f'the expert batch has {expert.shape[0]} rows and the '
                       f'policy batch {policy.shape[0]}: the penalty pairs '
                       f'them row by row, so they must match')
    if alpha is None:
      alpha = self._alpha_generator.uniform([tf.shape(expert)[0], 1])
    else:
      alpha = tf.reshape(tf.cast(alpha, tf.float32), [-1, 1])
    mixed = alpha * expert + (1.0 - alpha) * policy
    with tf.GradientTape() as tape:
      tape.watch(mixed)
      logit = self.network(mixed)
    # Each logit depends on its own row only: the gradient of their sum is
    # the per-row input gradient.
    gradient = tape.gradient(logit, mixed)
    norm = tf.sqrt(tf.reduce_sum(tf.square(gradient), axis=-1) +
                   _NORM_EPSILON)
    return self.gradient_penalty_weight * tf.reduce_mean(
        tf.square(norm - 1.0))

  def loss(self, expert_observations: tf.Tensor, expert_actions: tf.Tensor,
           policy_observations: tf.Tensor, policy_actions: tf.Tensor,
           alpha: tf.Tensor | None = None
           ) -> tuple[tf.Tensor, dict[str, tf.Tensor]]:
    """The seed's loss: expert_loss + policy_loss + gradient_penalty.

    expert_loss is the mean cross-entropy of the expert pairs labelled 1,
    policy_loss that of the policy pairs labelled 0 (summed, not averaged,
    as the seed does). `alpha` goes to `gradient_penalty`.

    Returns:
      (total, {'expert_loss', 'policy_loss', 'gradient_penalty'}).
    """
    expert_logit = self.logits(expert_observations, expert_actions)
    policy_logit = self.logits(policy_observations, policy_actions)
    expert_loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.ones_like(expert_logit), logits=expert_logit))
    policy_loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.zeros_like(policy_logit), logits=policy_logit))
    penalty = self.gradient_penalty(expert_observations, expert_actions,
                                    policy_observations, policy_actions,
                                    alpha)
    parts = {'expert_loss': expert_loss, 'policy_loss': policy_loss,
             'gradient_penalty': penalty}
    return expert_loss + policy_loss + penalty, parts

  def train_step(self, expert_observations: np.ndarray,
                 expert_actions: np.ndarray, policy_observations: np.ndarray,
                 policy_actions: np.ndarray) -> dict[str, float]:
    """One Adam step on `loss` (alpha drawn afresh) of a minibatch of expert
    pairs against one of policy pairs, of the same size.

    Returns:
      The step's loss and its parts (before the step), as floats.
    """
    arrays = [np.asarray(x, np.float32) for x in
              (expert_observations, expert_actions, policy_observations,
               policy_actions)]
    if arrays[0].shape[0] != arrays[2].shape[0]:
      raise ValueError(f'the expert batch has {arrays[0].shape[0]} rows and '
                       f'the policy batch {arrays[2].shape[0]}: the penalty '
                       f'pairs them row by row, so they must match')
    parts = self._train_step(*arrays)
    return {key: float(value) for key, value in parts.items()}

  def _train_step_fn(self, expert_observations, expert_actions,
                     policy_observations, policy_actions):
    weights = self.network.trainable_variables
    with tf.GradientTape() as tape:
      total, parts = self.loss(expert_observations, expert_actions,
                               policy_observations, policy_actions)
    gradients = tape.gradient(total, weights)
    self.optimizer.apply_gradients(zip(gradients, weights))
    return {'loss': total, **parts}

  def reward(self, observations: np.ndarray, actions: np.ndarray
             ) -> np.ndarray:
    """The seed's GAIL reward log D - log(1 - D) [B], as float32.

    With D = sigmoid(z): log D - log(1 - D) = log(sigmoid(z) / sigmoid(-z))
    = log(e^z) = z, so the reward is exactly the logit. Computed the seed's
    way it overflows: sigmoid rounds to 1 for a large logit and log(1 - D)
    becomes -inf; the logit itself is finite wherever the network is.
    """
    return self._compiled_logits(
        np.asarray(observations, np.float32),
        np.asarray(actions, np.float32)).numpy()


class RewardNormalizer:
  """Scales GAIL rewards by the running std of their discounted return.

  The seed's `ret_rms`, the same scaling as `normalization.Normalization.
  reward` (without its clip): the discriminator's reward drifts in scale as
  D trains, and dividing by the std of the return (what the critic fits)
  keeps the value targets of similar size across updates. Each env copy
  carries its own discounted return, restarted after its episode ends and
  kept across rollouts.

  Attributes:
    returns: the running statistics of the discounted returns.
    running_return: [N] each copy's discounted return so far.
  """

  def __init__(self, num_envs: int):
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or (
        num_envs < 1):
      raise ValueError(f'num_envs must be a positive integer, got '
                       f'{num_envs!r}')
    self._scaler = normalization.ReturnScaler(num_envs, gamma=1.0)

  @property
  def returns(self) -> normalization.RunningMeanStd:
    return self._scaler.returns

  @property
  def running_return(self) -> np.ndarray:
    return self._scaler.running_return

  def __call__(self, rewards: np.ndarray, ended: np.ndarray,
               gamma: float) -> np.ndarray:
    """The scaled rewards [T, N] of one rollout, as float32.

    Step by step, as the seed predicts rewards during collection: step t
    adds r_t to each copy's return, the statistics take the N returns, r_t
    is divided by sqrt(var + eps) as it stands then, and copies whose
    episode ended at t restart their return.

    Args:
      rewards: [T, N] GAIL rewards.
      ended: [T, N] step t ended its copy's episode (terminated or
        truncated).
      gamma: discount of the return.
    """
    rewards = np.asarray(rewards, np.float64)
    ended = np.asarray(ended, bool)
    num_envs = self.running_return.shape[0]
    if rewards.ndim != 2 or rewards.shape[1] != num_envs:
      raise ValueError(f'rewards must be [T, N] with N = num_envs = '
                       f'{num_envs}, got shape {rewards.shape}')
    if ended.shape != rewards.shape:
      raise ValueError(f'ended has shape {ended.shape}, rewards '
                       f'{rewards.shape}: both must be [T, N]')
    if not 0 <= gamma <= 1:
      raise ValueError(f'gamma must be in [0, 1], got {gamma}')
    self._scaler.gamma = float(gamma)
    scaled = np.stack([self._scaler(rewards[t], ended[t])
                       for t in range(rewards.shape[0])])
    return scaled.astype(np.float32)


def warmup_epochs(update_index: int, *, warmup_updates: int = 10,
                  warmup_epochs: int = 100, epochs: int = 5) -> int:
  """Discriminator epochs for update `update_index` (from 0).

  The seed trains D far longer in its first updates: a fresh D is no
  signal at all, and the policy should not spend its first updates
  chasing one.
  """
  if isinstance(update_index, bool) or not isinstance(update_index, int) or (
      update_index < 0):
    raise ValueError(f'update_index must be an integer >= 0, got '
                     f'{update_index!r}')
  for name, value, least in (('warmup_updates', warmup_updates, 0),
                             ('warmup_epochs', warmup_epochs, 1),
                             ('epochs', epochs, 1)):
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
      raise ValueError(f'{name} must be an integer >= {least}, got '
                       f'{value!r}')
  return warmup_epochs if update_index < warmup_updates else epochs
