"""Prioritized experience replay on Reverb (Schaul et al. 2015, proportional).

Reverb's `Prioritized(alpha)` selector does the sampling (P(i) is
p_i^alpha / sum_k p_k^alpha, kept in a sum tree on the server). What Reverb
leaves to its user, this module does:

  * new items go in at the largest priority seen so far (`MaxPriority`,
    starting at 1.0), so every transition is replayed at least once soon;
  * after each learner step the priorities of the sampled items become
    min(|td_error| + eps, priority_cap), in one `update_priorities` call per
    batch, from inside the learner's graph; keys evicted meanwhile are
    skipped by Reverb without error;
  * importance-sampling weights w_i = (N * P(i))^-beta / max_j w_j, from the
    `SampleInfo` each sample carries (N is the table size when it was drawn),
    normalised by the batch maximum, with beta annealed linearly from beta0
    to 1 over `beta_steps` gradient steps; they scale the learner's loss.

`PrioritizedTrainStep` ties these together around any TF-Agents agent whose
`LossInfo.extra` has a `td_error` field: `DqnAgent` has one, and the critic
learners of `rlds_reverb.agents.factory` report theirs the same way.

Priorities are updated on samples the dataset drew a little ahead (its
prefetch and Reverb's in-flight samples), as in Acme and other Reverb-based
PER: a handful of batches may be drawn before the previous update lands.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import gin
import numpy as np
import reverb
import tensorflow as tf

from rlds_reverb import settings
from rlds_reverb.replay import sampling
from rlds_reverb.storage import tables

DEFAULT_ALPHA = 0.6
DEFAULT_BETA0 = 0.4
DEFAULT_EPS = 1e-6
DEFAULT_PRIORITY_CAP = 100.0
INITIAL_MAX_PRIORITY = 1.0
REPLAYS = ('uniform', 'prioritized')


@gin.configurable
@dataclasses.dataclass(frozen=True)
class PerConfig:
  """The knobs of prioritized replay (Schaul et al. 2015, Table 3 defaults).

  Bind any field from a gin file or `--gin_bindings` as `PerConfig.<field>`.
  """
  alpha: float = settings.setting(DEFAULT_ALPHA, lower=0)
  """Priority exponent of the sampler: items are drawn in proportion to
  priority**alpha; 0 is uniform."""
  beta0: float = settings.setting(DEFAULT_BETA0, lower=0, upper=1)
  """Importance-sampling exponent at the first gradient step; it rises
  linearly to 1, where the weights undo the sampler's bias fully."""
  beta_steps: Optional[int] = settings.setting(None, lower=1,
                                               may_change=True)
  """Gradient steps over which beta rises linearly to 1; None: all gradient
  steps of the run (the run config resolves it)."""
  eps: float = settings.setting(DEFAULT_EPS, lower=0)
  """Added to |td_error| so that no item gets priority 0 and is never drawn
  again."""
  priority_cap: float = settings.setting(DEFAULT_PRIORITY_CAP, lower=0)
  """Largest priority an item can get, so that one outlier TD error does not
  take over the sampler."""

  def __post_init__(self):
    if not self.alpha >= 0:
      raise ValueError(f'per alpha must be >= 0, got {self.alpha!r}')
    if not 0 <= self.beta0 <= 1:
      raise ValueError(f'per beta0 must be in [0, 1], got {self.beta0!r}')
    if self.beta_steps is not None and self.beta_steps < 1:
      raise ValueError(f'per beta_steps must be >= 1, got {self.beta_steps}')
    if not self.eps > 0:
      raise ValueError(f'per eps must be > 0, got {self.eps!r}')
    if not self.priority_cap >= self.eps:
      raise ValueError(f'per priority_cap must be >= eps ({self.eps}), got '
                       f'{self.priority_cap!r}')


def make_table(name: str, data_spec: Any, *, max_size: int,
               alpha: float = DEFAULT_ALPHA, sequence_length: Optional[int] = 2,
               min_size_to_sample: int = 1) -> reverb.Table:
  """A table of TF-Agents trajectories sampled in proportion to p^alpha."""
  return tables.make_table(name, data_spec, max_size=max_size,
                           sequence_length=sequence_length,
                           sampler='prioritized', remover='fifo', alpha=alpha,
                           min_size_to_sample=min_size_to_sample)


def sampler_alpha(client: reverb.Client, table: str) -> Optional[float]:
  """The priority exponent of `table`'s sampler; None if not prioritized."""
  options = tables.get_table_info(client, table).sampler_options
  if options.WhichOneof('distribution') != 'prioritized':
    return None
  return float(options.prioritized.priority_exponent)


def check_prioritized(client: reverb.Client, table: str) -> float:
  """Fails unless `table` samples by priority; returns its alpha.

  Raises:
    ValueError: the table's sampler is not `Prioritized`.
  """
  alpha = sampler_alpha(client, table)
  if alpha is None:
    kind = tables.get_table_info(client, table).sampler_options.WhichOneof(
        'distribution')
    raise ValueError(
        f'table {table!r} samples {kind}, not by priority: prioritized replay '
        'needs a table made with sampler="prioritized" (pipelines.push '
        '--sampler prioritized)')
  return alpha


class MaxPriority(tf.Module):
  """The largest priority given to any item so far: where new items start.

  Reverb does not expose it, so the toolkit keeps it: a variable raised in
  the learner's graph by every update, read by the writers before they
  insert, checkpointed with the learner.
  """

  def __init__(self, initial: float = INITIAL_MAX_PRIORITY):
    super().__init__(name='max_priority')
    self.variable = tf.Variable(float(initial), dtype=tf.float64,
                                trainable=False, name='max_priority')

  def observe(self, priorities: tf.Tensor) -> None:
    """Raises the maximum to the largest of `priorities`."""
    self.variable.assign(tf.maximum(
        self.variable, tf.reduce_max(tf.cast(priorities, tf.float64))))

  def __call__(self) -> float:
    """The current maximum, as the priority for the next insert."""
    return float(self.variable.numpy())


def beta(step: Any, beta0: float, beta_steps: int) -> tf.Tensor:
  """beta0 at step 0, rising linearly to 1.0 at `beta_steps`, then 1.0."""
  fraction = tf.minimum(tf.cast(step, tf.float64) / float(beta_steps), 1.0)
  return beta0 + (1.0 - beta0) * fraction


def importance_weights(probability: tf.Tensor, table_size: tf.Tensor,
                       beta_value: Any) -> tf.Tensor:
  """w_i = (N_i * P(i))^-beta / max_j w_j, float32 of the batch's shape.

  The division by the batch maximum keeps every weight in (0, 1], so the
  weights only ever scale updates down (Schaul et al., section 3.4).
  """
  n_p = tf.cast(table_size, tf.float64) * tf.cast(probability, tf.float64)
  log_w = -tf.cast(beta_value, tf.float64) * tf.math.log(n_p)
  return tf.cast(tf.exp(log_w - tf.reduce_max(log_w)), tf.float32)


def priorities_from_td_errors(td_error: tf.Tensor, eps: float,
                              priority_cap: float) -> tf.Tensor:
  """min(|td_error| + eps, cap) in float64, Reverb's priority dtype."""
  return tf.minimum(tf.abs(tf.cast(td_error, tf.float64)) + eps,
                    priority_cap)


def td_errors(loss_info: Any) -> tf.Tensor:
  """The per-item TD errors an agent's train step reports.

  Raises:
    ValueError: the agent's `LossInfo.extra` has no `td_error`.
  """
  td_error = getattr(loss_info.extra, 'td_error', None)
  if td_error is None:
    raise ValueError(
        f'{type(loss_info.extra).__name__} has no td_error: prioritized '
        'replay needs an agent that reports its TD errors (DqnAgent, or '
        'rlds_reverb.agents.registry.make_agent)')
  if td_error.shape.rank == 2:  # [B, T] of a sequence learner: per item.
    td_error = tf.reduce_max(tf.abs(td_error), axis=1)
  return td_error


class PriorityUpdater:
  """Sends new priorities for sampled keys to a table, in graph or eagerly."""

  def __init__(self, server_address: str, table: str):
    self.server_address, self.table = server_address, table
    self._tf_client = reverb.TFClient(server_address)

  def update(self, keys: tf.Tensor, priorities: tf.Tensor) -> None:
    """One `update_priorities` call for the whole batch (evicted keys skip)."""
    self._tf_client.update_priorities(
        self.table, tf.cast(keys, tf.uint64), tf.cast(priorities, tf.float64))


class PrioritizedTrainStep:
  """One learner step with PER, whichever sampler drew the batch: weights
  in, priorities and max priority out.

  Called with a batch `(experience, info)` inside the learner's
  `tf.function`; returns the total loss. `update(info, priorities)` sends
  the new priorities where the sampler keeps them, and raises the running
  maximum (a Reverb table: `for_reverb`; the in-memory sum tree:
  `feeds.PrioritizedFeed.train_step`), and `table_size(info)` is the N of
  (N * P(i))^-beta. Writes beta, the
  maximum and mean priority and the mean weight as TensorBoard scalars
  (`per/...`) when a summary writer is active.
  """

  def __init__(self, agent: Any, config: PerConfig, max_priority: MaxPriority,
               update: Callable[[Any, tf.Tensor], None],
               table_size: Callable[[Any], tf.Tensor]):
    self.agent, self.config, self.max_priority = agent, config, max_priority
    self._update, self._table_size = update, table_size

  @classmethod
  def for_reverb(cls, agent: Any, updater: PriorityUpdater,
                 config: PerConfig,
                 max_priority: MaxPriority) -> 'PrioritizedTrainStep':
    """For batches `(experience, reverb.SampleInfo)` of `dataset`: the
    priorities go to the sampled keys of the table `updater` names."""
    def update(info, priorities):
      updater.update(info.key, priorities)
      max_priority.observe(priorities)

    return cls(agent, config, max_priority, update,
               lambda info: info.table_size)

  def __call__(self, batch: tuple[Any, Any]) -> tf.Tensor:
    experience, info = batch
    return weighted_train_step(
        self.agent, experience, info.probability, self._table_size(info),
        self.config, lambda priorities: self._update(info, priorities),
        self.max_priority.variable)


def weighted_train_step(agent: Any, experience: Any, probability: tf.Tensor,
                        size: tf.Tensor, config: PerConfig,
                        update: Callable[[tf.Tensor], None],
                        max_priority: tf.Variable) -> tf.Tensor:
  """One PER step of any sampler: importance weights from the draw
  probabilities, the weighted loss, `update(new priorities)`; writes the
  per/ TensorBoard scalars. Returns the total loss."""
  if config.beta_steps is None:
    raise ValueError('PerConfig.beta_steps is unset: give the gradient '
                     'steps to anneal beta over (a run config resolves it '
                     'to its own, per_settings)')
  beta_now = beta(agent.train_step_counter, config.beta0, config.beta_steps)
  weights = importance_weights(probability, size, beta_now)
  loss_info = agent.train(experience, weights=weights)
  priorities = priorities_from_td_errors(td_errors(loss_info), config.eps,
                                         config.priority_cap)
  update(priorities)
  step = agent.train_step_counter
  with tf.name_scope('per/'):  # Absolute: not under the learner's loop.
    tf.summary.scalar('beta', beta_now, step=step)
    tf.summary.scalar('max_priority', max_priority, step=step)
    tf.summary.scalar('mean_priority', tf.reduce_mean(priorities), step=step)
    tf.summary.scalar('mean_importance_weight', tf.reduce_mean(weights),
                      step=step)
  return loss_info.loss


def dataset(server_address: str, table: str, data_spec: Any,
            batch_size: int, **kwargs: Any) -> tf.data.Dataset:
  """Batches of `(experience, SampleInfo)` for
  `PrioritizedTrainStep.for_reverb`.

  Keyword arguments are those of `sampling.transition_dataset`.
  """
  return sampling.transition_dataset(server_address, table, data_spec,
                                     batch_size, with_info=True, **kwargs)


def expected_probabilities(priorities: np.ndarray, alpha: float) -> np.ndarray:
  """P(i) = p_i^alpha / sum_k p_k^alpha: what the sampler should draw."""
  scaled = np.asarray(priorities, np.float64) ** alpha
  return scaled / scaled.sum()
