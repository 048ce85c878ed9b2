"""One runner for every mode: builders say what, `run_experiment` does it.

Acme's layout: an experiment is a builder (what tables, which learner, which
phases) and one runner assembles it. `run_experiment` seeds, lets the
builder check its config, refuses a root_dir of other settings, has it
load its data, starts the builder's local Reverb servers (each checkpointed where the
builder says), has it build its learner, restores the learner once, and
hands over to the builder's phases; on the way out it closes what the
builder opened and stops the servers. A run that fails before it starts
leaves nothing in root_dir (`resume.RunDirectory`).

Builders: `offline.OfflineBuilder` (offline, fine-tuning), `online.
OnlineBuilder` (online, the distributed learner of actor processes) and
`onpolicy.OnPolicyBuilder`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Optional, Protocol, Sequence

from rlds_reverb.acting import envs
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import resume
from rlds_reverb.experiments import run
from rlds_reverb.storage import tables


class Builder(Protocol):
  """What the runner asks of an experiment."""
  config: Any

  def check(self, specs: envs.EnvSpecs) -> Any:
    """Checks the config; returns the config to record in root_dir
    (settings resolved)."""

  def prepare(self) -> None:
    """Loads and checks the data, connects to remote tables: what the
    servers and the learner need (a failure here leaves nothing behind)."""

  def servers(self) -> Sequence[tuple[Sequence[Any], Optional[str]]]:
    """(tables, checkpoint subdirectory of root_dir or None) per local
    Reverb server to start."""

  def make_learner(self, servers: Sequence[Any]) -> loop.Learner:
    """Fills the tables, builds the agent and its learner (not restored);
    `servers` are the started local servers in `servers()` order."""

  def train(self, learner: loop.Learner, resumed: bool,
            run_dir: resume.RunDirectory) -> dict:
    """Runs the phases from where the restored learner stands (calls
    `run_dir.start()` once training starts), exports; returns the
    summary."""

  def close(self) -> None:
    """Closes what the builder opened (envs, collectors, watches); called
    again after it has, it does nothing."""


def run_experiment(builder: Builder) -> dict:
  """Runs the builder's experiment; resumes it from root_dir if its recorded
  config allows.

  Raises:
    resume.ResumeMismatchError: root_dir holds a run of other settings.
    ValueError, RuntimeError, OSError: bad config, data or table.
    run.TrainingError: training failed (an op error, a non-finite loss).
  """
  config = builder.config
  with contextlib.ExitStack() as stack:
    stack.callback(builder.close)  # If it fails before the servers start.
    run.seed_everything(config.seed)
    recorded = builder.check(envs.env_specs(
        config.env, frame_stack=config.frame_stack))
    record = resume.check_resumable(config.root_dir, recorded)
    run_dir = stack.enter_context(resume.RunDirectory(config.root_dir,
                                                      record))
    builder.prepare()
    servers = []
    for server_tables, checkpoints in builder.servers():
      server = tables.start_server(
          server_tables, checkpoint_dir=(
              os.path.join(config.root_dir, checkpoints) if checkpoints
              else None))
      stack.callback(server.stop)
      servers.append(server)
    stack.callback(builder.close)  # Before the servers stop.
    learner = builder.make_learner(servers)
    resumed = learner.restore()
    return builder.train(learner, resumed, run_dir)
