"""The learner of a distributed online run: actors are other processes.

Actors (`pipelines.act`) write whole episodes into a remote episode table;
the learner reads them into its memory, trains, and publishes its actor's
weights into the weights table (`replay.variables`). The env-step clock is
the transitions read from the table, so evaluation, checkpoints and the
learning-rate of updates follow the same schedule as a single-process run:
`utd` gradient steps per env step once `learn_from` env steps are in, in
phases of `train_every * utd` steps.

Balance: the learner reads new episodes only when its budget cannot fill a
phase, and actors write only while few episodes are unread
(`acting.sender`), so collection runs at most a few episodes ahead of
training, and the learner waits (saying so) when the actors are behind,
up to `actor_wait_s`: actors that are all gone end the run with an error,
not a learner that waits for ever.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Optional

import reverb
import tqdm

from rlds_reverb.storage import tables
from rlds_reverb.experiments import run
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import variables

# How long the learner sleeps between polls of an empty table.
_POLL_S = 0.1
# A line on stderr when the learner has waited this long for actors.
_WAIT_NOTICE_S = 60.0


class ActorsSilentError(TimeoutError):
  """No actor wrote for longer than the learner waits."""


class ActorWait:
  """A learner's wait for its actors: a line on the bar each minute, and
  after `limit_s` (0: never) an error that says the actors are gone."""

  def __init__(self, limit_s: float, bar: Optional[tqdm.tqdm], what: str,
               poll_s: float = _POLL_S):
    self._limit_s, self._bar, self._what = limit_s, bar, what
    self._poll_s = poll_s
    self._since: Optional[float] = None
    self._noticed_at = 0.0

  def arrived(self) -> None:
    """Something new came in: the next wait starts from zero."""
    self._since = None

  def wait(self, env_steps: int, train_step: int) -> None:
    """One poll found nothing new: say so, fail, or sleep a poll.

    Raises:
      ActorsSilentError: nothing new for longer than `limit_s`.
    """
    now = time.monotonic()
    if self._since is None:
      self._since = self._noticed_at = now
    waited = now - self._since
    if self._limit_s and waited > self._limit_s:
      raise ActorsSilentError(
          f'no new {self._what} from the actors for {waited:.0f} s (at env '
          f'step {env_steps}, gradient step {train_step}): are the actor '
          f'processes (pipelines.act) running and writing to this server? '
          f'The checkpoint resumes the run; --actor_wait_s sets how long the '
          f'learner waits (0: for ever)')
    if now - self._noticed_at > _WAIT_NOTICE_S and self._bar is not None:
      self._bar.write(f'waiting for actors: no new {self._what} for '
                      f'{waited:.0f} s', file=sys.stderr)
      self._noticed_at = now
    time.sleep(self._poll_s)


def check_remote_tables(client: reverb.Client, table: str,
                        data_spec: Any) -> None:
  """The server must hold the episode table for `data_spec` and a weights
  table (`pipelines.serve --env` makes both).

  Raises:
    tables.TableNotFoundError: a table is missing.
    ValueError: the episode table is of another kind or signature.
  """
  episode_table.check_episode_table(client, table)
  tables.check_signature(client, table, data_spec)
  variables.check_table(client)


class RemotePhase:
  """One phase of a learner whose actors run elsewhere: train if the
  budget allows a full phase, else read what the actors wrote."""

  def __init__(self, this_run: run.Run, replay: Any, client: reverb.Client,
               *, utd: float, train_every: int, learn_from: int,
               publish_every: int, actor_wait_s: float,
               timeout_s: float = tables.DEFAULT_TIMEOUT_S,
               bar: Optional[tqdm.tqdm] = None):
    """`actor_wait_s`: seconds without a new episode, while the learner
    has nothing to train, before `ActorsSilentError`; 0 waits for ever."""
    self._run, self._replay, self._client = this_run, replay, client
    self._utd, self._train_every = utd, train_every
    self._learn_from, self._publish_every = learn_from, publish_every
    self._timeout_s = timeout_s
    self._wait = ActorWait(actor_wait_s, bar, 'episode')
    self._gradient_steps = max(1, int(train_every * utd))

  def budget(self) -> int:
    """Gradient steps the learner may take now: the single-process
    schedule, `utd` per env step read from `learn_from` on."""
    learner = self._run.learner
    read = int(learner.env_steps.numpy())
    if read < self._learn_from:
      return 0
    allowed = int(self._utd * (read - self._learn_from + self._train_every))
    return allowed - learner.train_step

  def publish(self) -> None:
    """The actors' next fetch gets the learner's weights of now."""
    learner = self._run.learner
    policy = self._run.policy
    # What paced actors collect up to: the single-process schedule's env
    # steps at this gradient step (`utd` per env step from `learn_from`).
    collect_target = self._learn_from + int(learner.train_step / self._utd)
    variables.publish(self._client, policy, learner.train_step,
                      info={'env_steps': int(learner.env_steps.numpy()),
                            'collect_target': collect_target},
                      timeout_s=self._timeout_s)

  def _train(self) -> None:
    """Takes the whole phases the budget allows, publishing at each
    multiple of `publish_every` on the way: actors that collect while the
    learner trains act with weights at most `publish_every` steps old,
    not a phase old."""
    learner = self._run.learner
    steps = self.budget() // self._gradient_steps * self._gradient_steps
    if steps <= 0 or not self._replay.ready:
      return
    end = learner.train_step + steps
    while learner.train_step < end:
      before = learner.train_step
      to_publish = self._publish_every - before % self._publish_every
      learner.train(self._replay.feed(), min(to_publish, end - before))
      if run.crossed(before, learner.train_step, self._publish_every):
        self._run.sync()
        self.publish()
    self._run.sync()

  def __call__(self, env_steps: int) -> None:
    """Trains what is due, reads what the actors wrote since, and trains
    on that too, so the triggers after the phase see both."""
    del env_steps
    self._train()
    read = self._replay.transitions_read
    self._replay.poll()
    new = self._replay.transitions_read - read
    if new:
      self._run.learner.env_steps.assign_add(new)
      self._wait.arrived()
      self._train()
      return
    # Nothing unread: the actors are behind (or gone).
    learner = self._run.learner
    self._wait.wait(int(learner.env_steps.numpy()), learner.train_step)
