"""The one run loop: phases of work, and what happens on intervals.

Offline training advances the gradient-step clock, online training and
fine-tuning the env-step clock; both stop at the end of each phase to run
the triggers whose interval was crossed (evaluation, checkpoint, policy
snapshot), and the evaluation and checkpoint also run once at the end.
Checkpoints (the learner, the replay's write-back, the Reverb tables),
evaluation records, curves and exported policies are written here and
nowhere else, so offline, online and fine-tuning runs resume and report the
same way.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np
import reverb
import tensorflow as tf
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory
import tqdm

from rlds_reverb.replay import her
from rlds_reverb.storage import tables
from rlds_reverb.acting import collect
from rlds_reverb.acting import envs
from rlds_reverb.acting import evaluation
from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import actor_critic
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.agents import dqn
from rlds_reverb.agents import export
from rlds_reverb.agents import saved_policy
from rlds_reverb.experiments import loop

REVERB_CHECKPOINTS = 'reverb'
# Fine-tuning's online episodes, apart from the dataset's copy in
# REVERB_CHECKPOINTS: a copy can be pushed again, what was collected cannot,
# so this one is small enough to keep or move on its own.
ONLINE_REVERB_CHECKPOINTS = 'reverb_online'
POLICY_SNAPSHOTS = 'policies'


def check_episodes_restored(root_dir: str, store_dir: str, env_steps: int,
                            episode_steps: Optional[int], restored: bool,
                            what: str) -> None:
  """Refuses to go on when a resumed run's collected episodes did not come
  back (its Reverb checkpoint left behind on another machine), rather than
  train on as if it had collected nothing.

  Episodes are stored whole, so a run short of one episode may have none;
  without a time limit (`episode_steps` None) that cannot be told apart, and
  nothing is checked.

  Raises:
    RuntimeError: `env_steps` reaches a whole episode and nothing was
      `restored` from root_dir/store_dir.
  """
  if episode_steps and env_steps >= episode_steps and not restored:
    path = os.path.join(root_dir, store_dir)
    raise RuntimeError(
        f'{root_dir}: this run is {env_steps} env steps into {what}, but its '
        f'episodes were not restored from {path} (missing or empty): copy '
        'that directory back from where the run was, or start over in a new '
        'root_dir')


def seed_everything(seed: int) -> None:
  """Seeds Python's, numpy's and TF's generators for one run.

  `tf.random.set_seed` alone is not enough: Keras' unseeded initialisers
  (the output layers of TF-Agents' actors, TD3+BC's critics) draw from
  Python's `random`, so two runs with one seed would start from different
  weights.
  """
  tf.keras.utils.set_random_seed(seed)


def crossed(before: int, after: int, interval: int) -> bool:
  """Whether a multiple of `interval` lies in (before, after]."""
  return after // interval > before // interval


def next_stop(position: int, total: int, intervals: Sequence[int]) -> int:
  """Work from `position` to the next multiple of any interval (or to
  `total`), so that a phase ends exactly where a trigger is due."""
  return min([i - position % i for i in intervals if i > 0] +
             [total - position])


@dataclasses.dataclass
class Every:
  """`action(position)` each time a multiple of `interval` (> 0) is
  crossed, and at the end of the run if `at_end`."""
  interval: int
  action: Callable[[int], Any]
  at_end: bool = True


class TrainingError(RuntimeError):
  """Training stopped: an op failed or the loss stopped being finite.

  One line: '<what> stopped at <unit> <position>: <cause>', the cause the
  op's own message (`op_error_summary`); the original is `__cause__`.
  """


def op_error_summary(error: BaseException, limit: int = 300) -> str:
  """The op's own message of a TensorFlow error, on one line.

  A `tf.function`'s error message starts with 'Graph execution error:' and
  the Python stack where the failing op was made ('Detected at node ...
  defined at (most recent call last): File ...'), and ends with the node and
  function names; what is left is what the op said, e.g. 'assertion failed:
  ...' or 'Input to reshape is a tensor with 4 values, but the requested
  shape has 15'. Cut to `limit` characters.
  """
  message = (error.message if isinstance(error, tf.errors.OpError)
             else str(error))
  kept, in_stack = [], False
  for line in message.splitlines():
    text = line.strip()
    if not text or text.startswith('Graph execution error'):
      continue
    if text.startswith('Detected at node') or text.startswith(
        'Detected unsupported operations'):
      in_stack = True
      continue
    if in_stack and line[:1] in (' ', '\t'):  # File lines, code lines.
      continue
    in_stack = False
    if text.startswith(('[[', 'Node:')):
      continue
    kept.append(text)
  text = ' '.join(' '.join(kept).split())
  text = re.sub(r'\s*\[Op:[^\]]*\]', '', text)
  text = re.sub(r'\{\{function_node [^}]*\}\}\s*', '', text)
  text = re.sub(r'\s*\[\[\{\{node [^}]*\}\}\]\]', '', text).strip()
  text = text or type(error).__name__
  return text if len(text) <= limit else text[:limit - 3].rstrip() + '...'


def run_phases(clock: Callable[[], int], total: int,
               phase: Callable[[int], None], triggers: Sequence[Every],
               bar: Optional[tqdm.tqdm] = None, *,
               what: str = 'training', unit: str = 'step') -> None:
  """Calls `phase(position)` until `clock()` reaches `total`, running the
  triggers that each phase crossed.

  Raises:
    TrainingError: a phase or trigger failed in an op, or the loss became
      non-finite; the message names `what`, the `unit` and the position.
  """
  while clock() < total:
    before = clock()
    try:
      phase(before)
      after = clock()
      if bar is not None:
        bar.update(after - before)
      for trigger in triggers:
        if trigger.interval and crossed(before, after, trigger.interval):
          trigger.action(after)
        elif trigger.at_end and after >= total:
          trigger.action(after)
    except (tf.errors.OpError, loop.NonFiniteLossError) as e:
      raise TrainingError(f'{what} stopped at {unit} {clock()}: '
                          f'{op_error_summary(e)}') from e


def progress(total: int, initial: int, unit: str, desc: str,
             show: bool) -> tqdm.tqdm:
  return tqdm.tqdm(total=total, initial=min(initial, total), unit=unit,
                   desc=desc, smoothing=0.05, disable=not show)


# ------------------------------------------------------------ the policy

def trajectory_spec(specs: envs.EnvSpecs) -> trajectory.Trajectory:
  """The per-step spec of what actors write for an env (float32 steps;
  image observations as uint8 frames, one per step)."""
  if specs.goal_conditioned:
    return her.goal_data_spec(*specs.goal_sizes, specs.action_spec)
  obs = tf.TensorSpec(specs.observation_shape,
                      tf.uint8 if specs.image else tf.float32)
  step_spec = ts.time_step_spec(obs, tf.TensorSpec((), tf.float32))
  action = policy_step.PolicyStep(
      tf.TensorSpec(specs.action_spec.shape, specs.action_spec.dtype))
  return trajectory.from_transition(step_spec, action, step_spec)


def export_policy(agent: Any, kind: str, specs: envs.EnvSpecs,
                  **metadata: Any) -> numpy_policy.NumpyPolicy:
  """The agent's greedy actor as a numpy policy (no TensorFlow to act)."""
  metadata = {'env': specs.env_id, 'agent': kind, **metadata}
  if isinstance(agent, actor_critic.MODELS):  # ppo, a2c, acktr
    return actor_critic.export(agent, specs.action_low, specs.action_high,
                               metadata)
  head = registry.get(kind).head
  if head == 'q_argmax':
    return dqn.export_q_policy(agent, specs.action_spec, metadata)
  network = factory.actor_network(agent)
  return export.from_network(network, export.network_head(network, head),
                             specs.action_spec, metadata=metadata)


def sync_policy(policy: numpy_policy.NumpyPolicy, agent: Any,
                kind: str) -> None:
  """Copies the learner's current weights into the actor's numpy policy."""
  if isinstance(agent, actor_critic.MODELS):
    actor_critic.update_weights(policy, agent)
  elif registry.get(kind).head == 'q_argmax':
    dqn.update_q_policy(policy, agent)
  else:
    export.update_weights(policy, factory.actor_network(agent))


class Run:
  """One run's learner, actor policy and store, and what the triggers do.

  `view` maps env observations to the policy's input (goal envs: the
  replay's flattener; on-policy agents: their normalisation); `normalizer`,
  if any, goes into exported policies, and so do the (obs_mean, obs_std,
  obs_clip) that `export_statistics` returns.
  """

  def __init__(self, learner: loop.Learner, kind: str, specs: envs.EnvSpecs,
               root_dir: str, *, clients: Sequence[reverb.Client] = (),
               write_back: Callable[[], None] = lambda: None,
               view: Optional[Callable[[Any], np.ndarray]] = None,
               refresh_view: Callable[[], None] = lambda: None,
               normalizer: Optional[her.GoalNormalizer] = None,
               export_statistics: Optional[Callable[[], Any]] = None,
               **metadata: Any):
    self.learner, self.kind, self.specs = learner, kind, specs
    self.root_dir, self.clients = root_dir, tuple(clients)
    self._write_back, self.view = write_back, view
    self._refresh_view = refresh_view
    self.normalizer, self.metadata = normalizer, metadata
    self._export_statistics = export_statistics
    self.policy = export_policy(learner.agent, kind, specs)
    self.last_record: dict = {}

  @property
  def agent(self) -> Any:
    return self.learner.agent

  def final_record(self) -> dict:
    """This stretch's last evaluation, else the run's last logged one (a
    run resumed past its last evaluation, or at its end); {} if none."""
    if self.last_record:
      return self.last_record
    records = self.learner.eval_records()
    return records[-1] if records else {}

  def sync(self) -> None:
    """The actor acts with the learner's weights of now."""
    sync_policy(self.policy, self.agent, self.kind)
    self._refresh_view()

  def act_input(self, observation: Any) -> Any:
    return observation if self.view is None else self.view(observation)

  def greedy(self, observation: Any) -> np.ndarray:
    return self.policy.greedy(self.act_input(observation))

  def evaluate(self, episodes: int, seed: int, *, x: str, title: str,
               metric: str, bar: Optional[tqdm.tqdm] = None,
               on_eval: Optional[Callable[[dict], None]] = None,
               **fields: Any) -> dict:
    """Greedy episodes in the env; logged to eval.jsonl, TensorBoard, PNG."""
    self.sync()
    result = evaluation.evaluate(self.greedy, self.specs.env_id, episodes,
                                 seed=10_000 + seed,
                                 frame_stack=self.specs.frame_stack)
    record = self.learner.log_eval({**result.to_dict(), **fields}, x=x,
                                   title=title, y=metric)
    self.last_record = record
    if bar is not None:
      success = ('' if result.success_rate is None else
                 f', success rate {result.success_rate:.2f}')
      score = ('' if record.get('normalized_score') is None else
               f', normalised {record["normalized_score"]:.1f}')
      bar.write(f'eval at {record[x]} {x.replace("_", " ")}: return '
                f'{result.average_return:.1f} +- {result.std_return:.1f}'
                f'{score}{success}', file=sys.stderr)
    if on_eval is not None:
      on_eval(record)
    return record

  def checkpoint(self, _: int = 0) -> None:
    """What the replay keeps in the store, the tables, then the learner.

    The learner's save comes last: a crash before it resumes at the older
    step count over a store that holds at least as much (episodes collected
    twice, none lost).
    """
    self._write_back()
    for client in self.clients:
      tables.checkpoint(client)
    self.learner.save()

  def export(self, filename: str, *, saved_model: bool = True,
             **metadata: Any) -> str:
    """Writes the greedy policy of now (with the goal normaliser) as an
    npz, and (`saved_model`) as TF-Agents SavedModels beside it."""
    policy = export_policy(self.agent, self.kind, self.specs,
                           **{**self.metadata, **metadata})
    # Offline data statistics the actor normalises with (TD3+BC).
    policy.obs_mean = getattr(self.policy, 'obs_mean', None)
    policy.obs_std = getattr(self.policy, 'obs_std', None)
    policy = her.with_normalizer(policy, self.normalizer)
    statistics = (None if self._export_statistics is None
                  else self._export_statistics())
    if statistics is not None:
      policy.obs_mean, policy.obs_std, policy.obs_clip = statistics
    path = os.path.join(self.root_dir, filename)
    policy.save(path)
    # The same policy for TF-Agents tools: <stem>/greedy, <stem>/collect
    # (MLP policies; a recurrent one stays an npz).
    if saved_model and isinstance(policy, numpy_policy.NumpyPolicy):
      saved_policy.save(policy, os.path.splitext(path)[0],
                        goal_sizes=self.specs.goal_sizes,
                        train_step=int(self.learner.train_step))
    return path


class OnlinePhase:
  """One phase of online work: collect `train_every` env steps, move the
  new episodes into the memory, then take the phase's gradient steps.

  `act(env_steps)` gives the exploration of the moment; learning starts
  once `learn_from` env steps are in and the memory holds a transition.
  Returns and success rates of finished episodes go to TensorBoard
  (collect/...).
  """

  def __init__(self, run: Run, collector: collect.Collector,
               poll: Callable[[], Any], ready: Callable[[], bool],
               source: Callable[[], Any], *,
               act: Callable[[int], collect.ActFn], train_every: int,
               gradient_steps: int, learn_from: int = 0,
               bar: Optional[tqdm.tqdm] = None):
    self._run, self._collector = run, collector
    self._poll, self._ready, self._source = poll, ready, source
    self._act, self._train_every = act, train_every
    self._gradient_steps, self._learn_from = gradient_steps, learn_from
    self._bar = bar

  def __call__(self, env_steps: int) -> None:
    learner = self._run.learner
    returns = self._collector.collect(
        self._train_every, self._act(env_steps))
    learner.env_steps.assign_add(self._train_every)
    self._poll()
    after = int(learner.env_steps.numpy())
    if after >= self._learn_from and self._ready():
      learner.train(self._source(), self._gradient_steps)
      self._run.sync()
    if returns:
      successes = self._collector.stats.last_successes
      learner.write_scalars(
          {'return': float(np.mean(returns)),
           'success_rate': (float(np.mean(successes)) if successes
                            else None)}, after, 'collect')
      if self._bar is not None:
        # Shown with the next update, within the bar's mininterval.
        self._bar.set_postfix(ret=f'{np.mean(returns):.0f}',
                              grad_steps=learner.train_step, refresh=False)


# Gradient steps per graph call at most. Python gets control back between
# calls, so the progress bar moves and Ctrl-C (KeyboardInterrupt) stops a
# run between them, not at the next evaluation.
MAX_STEPS_PER_CALL = 1000
# Wall-clock seconds a graph call aims at: a slow learner (large critic
# ensembles on a CPU) still answers Ctrl-C and moves its bar within about
# this long, while a fast one stays at the cap, where the per-call cost is
# lost in the steps.
SECONDS_PER_CALL = 5.0
# Steps of the calls before a rate is known (the first one traces).
FIRST_STEPS_PER_CALL = 10


class OfflinePhase:
  """One phase of gradient steps, up to the next trigger, sized to take
  about `seconds_per_call` at the rate measured so far (at most
  `max_steps_per_call`; `None` runs the cap each time); times itself
  (leaving out a process's first phase, which traces the graph)."""

  def __init__(self, learner: loop.Learner, source: Any, total: int,
               intervals: Sequence[int], bar: Optional[tqdm.tqdm] = None,
               max_steps_per_call: int = MAX_STEPS_PER_CALL,
               seconds_per_call: Optional[float] = SECONDS_PER_CALL):
    if max_steps_per_call < 1:
      raise ValueError(f'max_steps_per_call must be >= 1, got '
                       f'{max_steps_per_call}')
    if seconds_per_call is not None and seconds_per_call <= 0:
      raise ValueError(f'seconds_per_call must be > 0 or None, got '
                       f'{seconds_per_call}')
    self._learner, self._source = learner, source
    self._total, self._intervals = total, intervals
    self._bar = bar
    self._max_steps, self._budget = max_steps_per_call, seconds_per_call
    self._seconds, self._timed, self._phases = 0.0, 0, 0

  def _steps_this_call(self) -> int:
    if self._budget is None:
      return self._max_steps
    if not self._seconds:  # Tracing, or not timed yet.
      return min(FIRST_STEPS_PER_CALL, self._max_steps)
    rate = self._timed / self._seconds
    return max(1, min(int(rate * self._budget), self._max_steps))

  def __call__(self, position: int) -> None:
    steps = min(next_stop(position, self._total, self._intervals),
                self._steps_this_call())
    start = time.perf_counter()
    loss = self._learner.train(self._source, steps)
    if self._phases:
      self._seconds += time.perf_counter() - start
      self._timed += steps
    self._phases += 1
    if self._bar is not None:
      # Not a refresh of its own: calls of a few seconds would print a line
      # each into a log, whatever TQDM_MININTERVAL asks.
      self._bar.set_postfix(loss=f'{loss:.3g}', refresh=False)

  @property
  def steps_per_second(self) -> float | None:
    return round(self._timed / self._seconds, 1) if self._seconds else None
