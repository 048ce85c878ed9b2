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
  """No actor wrote an episode for longer than the learner waits."""


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
               publish_every: int, actor_wait_s: float = 0.0,
               timeout_s: float = tables.DEFAULT_TIMEOUT_S,
               bar: Optional[tqdm.tqdm] = None):
    """`actor_wait_s`: seconds without a new episode, while the learner
    has nothing to train, before `ActorsSilentError`; 0 waits for ever."""
    self._run, self._replay, self._client = this_run, replay, client
    self._utd, self._train_every = utd, train_every
    self._learn_from, self._publish_every = learn_from, publish_every
    self._timeout_s, self._bar = timeout_s, bar
    self._actor_wait_s = actor_wait_s
    self._gradient_steps = max(1, int(train_every * utd))
    # Since when nothing new was read (None: something was), and since
    # the last notice on stderr.
    self._waiting_since: Optional[float] = None
    self._noticed_at: Optional[float] = None

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
      self._waiting_since = self._noticed_at = None
      self._train()
      return
    # Nothing unread: the actors are behind (or gone).
    now = time.monotonic()
    if self._waiting_since is None:
      self._waiting_since = self._noticed_at = now
    waited = now - self._waiting_since
    if self._actor_wait_s and waited > self._actor_wait_s:
      learner = self._run.learner
      raise ActorsSilentError(
          f'no new episode from the actors for {waited:.0f} s (at env step '
          f'{int(learner.env_steps.numpy())}, gradient step '
          f'{learner.train_step}): are the actor processes (pipelines.act) '
          f'running and writing to this server? The checkpoint resumes the '
          f'run; --actor_wait_s sets how long the learner waits (0: for '
          f'ever)')
    if now - self._noticed_at > _WAIT_NOTICE_S and self._bar is not None:
      self._bar.write(f'waiting for actors: no new episode for {waited:.0f} s',
                      file=sys.stderr)
      self._noticed_at = now
    time.sleep(_POLL_S)
