"""RLDS episodes -> TF-Agents trajectories, one whole episode at a time.

TF-Agents' `rlds_to_reverb` flattens the dataset and pairs steps with a
window of 2, then converts each pair in its own `tf.data` map call. Here each
episode is batched into one tensor per field and all of its pairs are built,
validated and converted with a handful of vectorised ops; the per-step view
that TF-Agents' API promises is recovered with `unbatch()`.

The pairing still follows the flattened stream exactly: the last step of an
episode is paired with the first step of the next non-empty episode, and the
last step of the dataset with a padding step `{is_first: True}` (every other
field zero), so the element values match TF-Agents' for flat step fields.

One deliberate difference: TF-Agents passes nested dict fields (a dict
observation, say) through its pairing unsplit, so its trajectory gets both
steps of the pair stacked (shape [2, ...]), which its own data spec does not
describe. Here nested fields are split like flat ones.
"""

from typing import Any, Callable, Dict, List, NamedTuple, Optional

import rlds
import tensorflow as tf
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

PolicyInfoFn = Optional[
    Callable[[Dict[str, tf.Tensor], Dict[str, tf.Tensor]], Any]
]

# Messages of TF-Agents' `_validate_step`, word for word, in its check order.
TERMINAL_NOT_LAST = 'Terminal step must be the last step of an episode.'
MID_BEFORE_FIRST = 'Mid step should not be followed by a first step.'
LAST_NOT_BEFORE_FIRST = (
    'Last step of an episode must be followed by a first step.'
)
_VALIDATION_MESSAGES = (TERMINAL_NOT_LAST, MID_BEFORE_FIRST,
                        LAST_NOT_BEFORE_FIRST)

# Upper bound on steps per episode for batching an episode in one go (tf.data
# caps the buffer it reserves at this size, so it costs nothing).
_MAX_EPISODE_STEPS = (1 << 31) - 1


class EpisodeTrajectories(NamedTuple):
  """All trajectories of one RLDS episode, with a leading time dimension."""
  episode_index: Any  # int64 scalar: position of the episode in the dataset.
  trajectory: trajectory.Trajectory  # every field [num_steps, ...]
  is_terminal: Any  # bool [num_steps]: the RLDS `is_terminal` of each step.
  # Index of the episode whose first step follows this one; the number of
  # episodes for the last. The empty episodes skipped in between are
  # `next_episode_index - episode_index - 1`.
  next_episode_index: Any


def get_rlds_step_features() -> List[str]:
  """Returns the step fields that the conversion needs (TF-Agents' order)."""
  return [
      rlds.OBSERVATION,
      rlds.ACTION,
      rlds.REWARD,
      rlds.DISCOUNT,
      rlds.IS_FIRST,
      rlds.IS_LAST,
      rlds.IS_TERMINAL,
  ]


def _validate_rlds_episode_spec(rlds_data: tf.data.Dataset) -> None:
  if rlds.STEPS not in rlds_data.element_spec:
    raise ValueError(
        f'No dataset representing RLDS {rlds.STEPS} exist in the data.'
    )


def _validate_rlds_step_spec(rlds_step_spec: Dict[str, Any]) -> None:
  rlds_step_features = get_rlds_step_features()
  if not all(item in rlds_step_spec for item in rlds_step_features):
    raise ValueError(
        'Invalid RLDS step spec. Features expected '
        f'are {rlds_step_features}, but found {list(rlds_step_spec.keys())}'
    )


def _step_spec(rlds_data: tf.data.Dataset) -> Dict[str, tf.TensorSpec]:
  """Validated step spec; raises before any data is read."""
  _validate_rlds_episode_spec(rlds_data)
  step_spec = rlds_data.element_spec[rlds.STEPS].element_spec
  _validate_rlds_step_spec(step_spec)
  return step_spec


def create_trajectory_data_spec(
    rlds_data: tf.data.Dataset,
) -> trajectory.Trajectory:
  """Spec of the trajectories made from `rlds_data` (no outer dimension).

  This is what a Reverb table signature and TF-Agents' `ReverbReplayBuffer`
  are built from (add an outer time dimension for the table signature).

  Args:
    rlds_data: An RLDS dataset: a `tf.data.Dataset` of episodes, each with a
      `steps` dataset of dicts holding at least the fields of
      `get_rlds_step_features()`.

  Returns:
    A `Trajectory` of `TensorSpec`s, equal to TF-Agents'.

  Raises:
    ValueError: If no RLDS steps exist in rlds_data.
    ValueError: If step spec for rlds_data is not valid.
  """
  step_spec = _step_spec(rlds_data)
  time_step_spec = ts.time_step_spec(
      step_spec[rlds.OBSERVATION], step_spec[rlds.REWARD]
  )
  action_spec = policy_step.PolicyStep(step_spec[rlds.ACTION])
  return trajectory.from_transition(time_step_spec, action_spec, time_step_spec)


def _step_types(is_first: tf.Tensor, is_last: tf.Tensor) -> tf.Tensor:
  return tf.where(
      is_first,
      ts.StepType.FIRST,
      tf.where(is_last, ts.StepType.LAST, ts.StepType.MID),
  )


def _shift_in(steps: Any, next_step: Any) -> Any:
  """Steps t+1 for every t: drops the first step, appends `next_step`."""
  return tf.nest.map_structure(
      lambda seq, nxt: tf.concat([seq[1:], tf.expand_dims(nxt, 0)], axis=0),
      steps, next_step)


def _assert_valid(episode_index: tf.Tensor, cur: Dict[str, Any],
                  nxt: Dict[str, Any]) -> tf.Operation:
  """One assert per episode that names the first bad step, as TF-Agents would.

  TF-Agents checks pair by pair, so the first offending step wins and, on that
  step, its checks run in the order of `_VALIDATION_MESSAGES`.
  """
  is_first, is_last = cur[rlds.IS_FIRST], cur[rlds.IS_LAST]
  failures = tf.stack([
      cur[rlds.IS_TERMINAL] & ~is_last,
      ~is_last & ~is_first & nxt[rlds.IS_FIRST],
      is_last & ~nxt[rlds.IS_FIRST],
  ], axis=1)  # [num_steps, 3]
  bad_steps = tf.reduce_any(failures, axis=1)
  any_bad = tf.reduce_any(bad_steps)
  step = tf.argmax(tf.cast(bad_steps, tf.int32), output_type=tf.int32)
  check = tf.argmax(tf.cast(failures[step], tf.int32), output_type=tf.int32)
  message = tf.strings.join([
      tf.gather(tf.constant(_VALIDATION_MESSAGES), check),
      ' (episode ', tf.strings.as_string(episode_index),
      ', step ', tf.strings.as_string(step), ')',
  ])
  return tf.debugging.Assert(~any_bad, [message])


def _policy_info(policy_info_fn: PolicyInfoFn, cur: Any, nxt: Any) -> Any:
  """Calls a per-step `policy_info_fn` on a whole episode.

  `policy_info_fn` is written for one step at a time (TF-Agents calls it per
  pair); `vectorized_map` keeps those semantics while running it batched.
  """
  if policy_info_fn is None:
    return ()
  # Autograph, as TF-Agents' `dataset.map` gives it: a Python `if` on a
  # step's tensor keeps working.
  step_fn = tf.autograph.to_graph(policy_info_fn)
  return tf.vectorized_map(lambda pair: step_fn(*pair), (cur, nxt))


# Internal map functions hold no Python control flow on tensors: skipping
# autograph's source conversion cuts the pipeline's tracing time by half.
# (A user's `policy_info_fn` is still converted by `vectorized_map`.)
@tf.autograph.experimental.do_not_convert
def _episode_to_trajectories(
    episode_index: tf.Tensor,
    steps: Dict[str, Any],
    next_steps: Dict[str, Any],
    next_episode_index: tf.Tensor,
    policy_info_fn: PolicyInfoFn,
    zero_terminal_discount: bool,
) -> EpisodeTrajectories:
  """Pairs, validates and converts all steps of one episode at once.

  `next_steps` is the episode that follows (or the padding step); only its
  first step is used.
  """
  cur = steps
  # Every graph op costs tracing time: without a policy_info_fn only the
  # flags of the next steps are needed.
  needed = (list(steps) if policy_info_fn is not None else
            [rlds.IS_FIRST, rlds.IS_LAST, rlds.IS_TERMINAL])
  nxt = _shift_in({k: steps[k] for k in needed},
                  {k: tf.nest.map_structure(lambda x: x[0], next_steps[k])
                   for k in needed})
  with tf.control_dependencies([_assert_valid(episode_index, cur, nxt)]):
    step_type = tf.identity(_step_types(cur[rlds.IS_FIRST], cur[rlds.IS_LAST]))
  next_step_type = _step_types(nxt[rlds.IS_FIRST], nxt[rlds.IS_LAST])
  # A one-step episode (FIRST followed by FIRST) becomes LAST -> LAST.
  single = tf.equal(step_type, ts.StepType.FIRST) & tf.equal(
      next_step_type, ts.StepType.FIRST)
  step_type = tf.where(single, ts.StepType.LAST, step_type)
  next_step_type = tf.where(single, ts.StepType.LAST, next_step_type)

  discount = cur[rlds.DISCOUNT]
  zero = tf.zeros_like(discount)
  discount = tf.where(cur[rlds.IS_LAST] & cur[rlds.IS_TERMINAL], zero,
                      discount)
  if zero_terminal_discount:
    into_terminal = (~cur[rlds.IS_LAST] & nxt[rlds.IS_LAST]
                     & nxt[rlds.IS_TERMINAL])
    discount = tf.where(into_terminal, zero, discount)

  traj = trajectory.Trajectory(
      step_type=step_type,
      observation=cur[rlds.OBSERVATION],
      action=cur[rlds.ACTION],
      policy_info=_policy_info(policy_info_fn, cur, nxt),
      next_step_type=next_step_type,
      reward=cur[rlds.REWARD],
      discount=discount,
  )
  return EpisodeTrajectories(episode_index, traj, cur[rlds.IS_TERMINAL],
                             next_episode_index)


@tf.autograph.experimental.do_not_convert
def _batch_steps(episode: Dict[str, Any]) -> Dict[str, tf.Tensor]:
  """All steps of an episode as one tensor per field (empty -> length 0)."""
  steps = episode[rlds.STEPS]
  empty = tf.nest.map_structure(
      lambda s: tf.zeros([0] + [d or 0 for d in s.shape.as_list()], s.dtype),
      steps.element_spec)
  # batch() yields nothing for an empty episode; the empty batch stands in.
  return (steps.batch(_MAX_EPISODE_STEPS)
          .concatenate(tf.data.Dataset.from_tensors(empty))
          .take(1).get_single_element())


@tf.autograph.experimental.do_not_convert
def _has_steps(unused_index: tf.Tensor, steps: Dict[str, tf.Tensor]
               ) -> tf.Tensor:
  return tf.size(steps[rlds.IS_FIRST]) > 0


def convert_rlds_to_episodes(
    rlds_data: tf.data.Dataset,
    policy_info_fn: PolicyInfoFn = None,
    *,
    zero_terminal_discount: bool = False,
    num_parallel_calls: int = tf.data.AUTOTUNE,
) -> tf.data.Dataset:
  """Converts RLDS data to one `EpisodeTrajectories` element per episode.

  The trajectories are those of `convert_rlds_to_trajectories` grouped by the
  RLDS episode they come from; empty episodes are skipped (they hold no step;
  `next_episode_index` tells how many were skipped).
  Each episode is validated as a whole: iterating raises
  `tf.errors.InvalidArgumentError` at the first invalid episode, naming its
  index and the step, before any of its trajectories is returned.

  Args:
    rlds_data: An RLDS dataset (see `create_trajectory_data_spec`).
    policy_info_fn: Optional per-step function `(cur_step, next_step) ->
      policy_info`, as in TF-Agents.
    zero_terminal_discount: When True, the step whose next step is last and
      terminal gets discount 0, so TD targets do not bootstrap through a
      terminal state. Truncated endings (last, not terminal) keep theirs.
    num_parallel_calls: Parallelism of the per-episode conversion.

  Returns:
    A `tf.data.Dataset` of `EpisodeTrajectories`.

  Raises:
    ValueError: If no RLDS steps exist in rlds_data, or the step spec is not
      valid.
  """
  step_spec = _step_spec(rlds_data)
  # A one-step sentinel episode: TF-Agents' padding step {is_first: True}.
  # Enumerated after the real episodes, its index is their count.
  padding = rlds.transformations.zeros_from_spec(step_spec)
  padding[rlds.IS_FIRST] = tf.constant(True)
  sentinel = tf.nest.map_structure(lambda x: x[tf.newaxis], padding)
  episodes = (
      rlds_data.map(_batch_steps, num_parallel_calls=num_parallel_calls,
                    deterministic=True)
      .concatenate(tf.data.Dataset.from_tensors(sentinel))
      .enumerate()
      .filter(_has_steps)
  )

  # Each episode with the first step of the one after it: windows of two
  # (cheaper to build than a scan carrying the previous episode).
  @tf.autograph.experimental.do_not_convert
  def convert_window(indices, steps):
    both = tf.data.Dataset.zip((indices, steps))
    index, episode_steps = both.take(1).get_single_element()
    next_index, next_steps = both.skip(1).get_single_element()
    return _episode_to_trajectories(index, episode_steps, next_steps,
                                    next_index, policy_info_fn,
                                    zero_terminal_discount)

  return episodes.window(2, shift=1, drop_remainder=True).map(
      convert_window, num_parallel_calls=num_parallel_calls,
      deterministic=True).prefetch(tf.data.AUTOTUNE)


def convert_rlds_to_trajectories(
    rlds_data: tf.data.Dataset,
    policy_info_fn: PolicyInfoFn = None,
    *,
    zero_terminal_discount: bool = False,
) -> tf.data.Dataset:
  """Converts RLDS data to a dataset of single-step TF-Agents trajectories.

  Drop-in for `tf_agents.replay_buffers.rlds_to_reverb.
  convert_rlds_to_trajectories`: same elements, same errors. Each step is
  paired with the next one of the flattened dataset, and the last step of the
  dataset with a padding step `{is_first: True}`:

    RLDS data      flattened   overlapping pairs          trajectories
    episode 1      step 1      (step 1, step 2)           FIRST -> MID
      step 1..3    step 2      (step 2, step 3)           MID   -> LAST
    episode 2      step 3      (step 3, step 4)           LAST  -> FIRST
      step 4..6    step 4      (step 4, step 5)           FIRST -> MID
                   step 5      (step 5, step 6)           MID   -> LAST
                   step 6      (step 6, padding)          LAST  -> FIRST

  Args:
    rlds_data: An RLDS dataset (see `create_trajectory_data_spec`).
    policy_info_fn: Optional per-step function `(cur_step, next_step) ->
      policy_info`.
    zero_terminal_discount: Keyword-only. When True, the step whose next step
      is last and terminal gets discount 0; truncated endings keep theirs.

  Returns:
    A `tf.data.Dataset` of `Trajectory`, one per RLDS step.

  Raises:
    ValueError: If no RLDS steps exist in rlds_data.
    ValueError: If step spec for rlds_data is not valid.
    InvalidArgumentError: While iterating, if an episode has a terminal step
      that is not last, a mid step followed by a first step (it does not end
      in a last step), or a last step not followed by a first step. The
      message is TF-Agents' followed by `(episode E, step S)`, both 0-based.
  """
  return convert_rlds_to_episodes(
      rlds_data, policy_info_fn,
      zero_terminal_discount=zero_terminal_discount,
  ).map(lambda episode: episode.trajectory).unbatch()

