"""Resuming a run: what a run directory holds must be the run asked for.

A run records its config in `root_dir/config.json` once it really starts
(after its data is loaded and checked and its learner built). Running again
with the same root_dir resumes it, and `check_resumable` compares the new
config with the recorded one first, before anything is restored or written:
another agent, env, dataset (or the same name with other data in it: its
fingerprint), table, replay, feed, HER setting, seed or hyper-parameter is
refused with one line that names each field, the recorded and the new
value. What may change on resume is the budget and the schedules (steps,
evaluation and checkpoint intervals, evaluation episodes) and where the
data is found.

`RunDirectory` keeps a run that fails before it starts from leaving
anything behind: what this call made in root_dir (the directory itself,
Reverb checkpoints of a pushed table, TensorBoard files) is removed again,
so that neither an empty run directory nor a table of the wrong data waits
there for the next run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from typing import Any

import tensorflow as tf

from rlds_reverb import settings
from rlds_reverb.data import datasets
from rlds_reverb.experiments import configs

CONFIG_FILE = 'config.json'
# Keys that the record adds to the config's own fields.
KIND_KEY = 'run_kind'
FINGERPRINT_KEY = 'dataset_fingerprint'
# What a resumed run may change: budgets, schedules, where data is found,
# how long to wait for a lost server (the fields' `may_change` metadata).
MAY_CHANGE = frozenset().union(*(
    settings.may_change_on_resume(cls) for cls in configs.MODES.values()))
# Fields that change from one resume to the next by themselves (ports,
# paths): not noted in the record's history of changes.
_UNNOTED = frozenset({'root_dir', 'reverb_address', 'data_dir', 'download'})
# config.json's list of what each resume changed: [{'from_step': the
# checkpoint it resumed, 'changes': {field: [recorded, new]}}, ...].
HISTORY_KEY = 'resumed_with_changes'
# Agent settings are recorded resolved (the published default filled in);
# runs recorded on 2026-11-24 before that hold None for "the default".
_RESOLVED_PREFIX = 'agent_config.'
# Recorded as None ("the defaults") by runs before 2026-11-29.
_RESOLVED_FIELDS = frozenset({'per_config'})
# What in a root_dir means a run has saved state there.
_STATE_DIRS = ('checkpoints', 'reverb', 'reverb_online')
_INFO_FILE = 'dataset_info.json'
_MAX_LISTED = 8


class ResumeMismatchError(ValueError):
  """root_dir holds a run with other settings than the one asked for."""

  def __init__(self, root_dir: str, differences: list[tuple[str, Any, Any]]):
    self.root_dir, self.differences = root_dir, differences
    listed = '; '.join(f'{field} {new!r} (recorded {old!r})'
                       for field, old, new in differences[:_MAX_LISTED])
    if len(differences) > _MAX_LISTED:
      listed += f'; {len(differences) - _MAX_LISTED} more'
    super().__init__(
        f'{root_dir} holds a run with other settings, so it cannot be '
        f'resumed: {listed}. Resume it with its recorded settings '
        f'({os.path.join(root_dir, CONFIG_FILE)}), or start a new run in '
        'another root_dir')


def has_saved_state(root_dir: str) -> bool:
  """Whether root_dir holds a learner or Reverb checkpoint to resume from."""
  for name in _STATE_DIRS:
    path = os.path.join(root_dir, name)
    if os.path.isdir(path) and os.listdir(path):
      return True
  return False


def dataset_fingerprint(config: Any) -> str | None:
  """A hash of the dataset's `dataset_info.json` (TFDS' record of its
  version, splits, shard lengths and bytes), or None when the run has no
  dataset (online, a remote table) or it cannot be found yet."""
  dataset = getattr(config, 'dataset', None)
  if not dataset or getattr(config, 'reverb_address', ''):
    return None
  try:
    if os.path.exists(os.path.expanduser(dataset)):
      info_dir = datasets.find_dataset_dir(dataset)
    else:
      info_dir = datasets.make_builder(
          dataset, data_dir=getattr(config, 'data_dir', None),
          download=False).data_dir
    with open(os.path.join(info_dir, _INFO_FILE), 'rb') as f:
      return hashlib.sha256(f.read()).hexdigest()[:16]
  except (ValueError, RuntimeError, OSError):
    return None  # Not there (yet): loading the data says why.


def run_record(config: Any) -> dict:
  """What config.json records: the config's fields (PER's resolved where it
  samples), its kind, the data's fingerprint."""
  if isinstance(config, configs.OffPolicyConfig) and config.prioritized:
    config = dataclasses.replace(config, per_config=config.per_settings)
  record = json.loads(json.dumps(dataclasses.asdict(config)))
  record[KIND_KEY] = type(config).__name__
  record[FINGERPRINT_KEY] = dataset_fingerprint(config)
  return record


def _changed(recorded: dict, current: dict, prefix: str = ''
             ) -> list[tuple[str, Any, Any]]:
  """(field, recorded value, new value) for each field both records hold
  that differs, nested configs field by field."""
  found = []
  # A field one record lacks comes from another version of the config.
  for key in sorted(set(recorded) & set(current)):
    old, new, field = recorded[key], current[key], f'{prefix}{key}'
    if key == FINGERPRINT_KEY and (old is None or new is None):
      continue
    if old is None and (field.startswith(_RESOLVED_PREFIX) or
                        field in _RESOLVED_FIELDS):
      continue  # Recorded before these were recorded resolved.
    if isinstance(old, dict) and isinstance(new, dict):
      found += _changed(old, new, f'{field}.')
    elif old != new:
      found.append((field, old, new))
  return found


def differences(recorded: dict, current: dict
                ) -> list[tuple[str, Any, Any]]:
  """(field, recorded value, new value) for each field outside `MAY_CHANGE`
  that both records hold and that differs (nested configs field by field);
  the fingerprint only where both runs have one. Another kind of run (online
  vs offline) is the one difference reported."""
  if recorded.get(KIND_KEY, current[KIND_KEY]) != current[KIND_KEY]:
    return [(KIND_KEY, recorded[KIND_KEY], current[KIND_KEY])]
  return [change for change in _changed(recorded, current)
          if change[0] not in MAY_CHANGE]


def _checkpoint_step(root_dir: str) -> int | None:
  """The step of the checkpoint a resume starts from (its file name)."""
  path = tf.train.latest_checkpoint(os.path.join(root_dir, _STATE_DIRS[0]))
  suffix = path.rsplit('-', 1)[-1] if path else ''
  return int(suffix) if suffix.isdigit() else None


def check_resumable(root_dir: str, config: Any) -> dict:
  """Refuses to resume a run of other settings; returns this run's record.

  Call before anything is restored from or written to `root_dir`; pass the
  record to `RunDirectory.start` once the run starts.

  Raises:
    ResumeMismatchError: root_dir holds saved state of a run whose recorded
      config differs in a field outside `MAY_CHANGE`, or whose dataset has
      another fingerprint.
    ValueError: root_dir's config.json cannot be read.
  """
  record = run_record(config)
  path = os.path.join(root_dir, CONFIG_FILE)
  if not (os.path.isfile(path) and has_saved_state(root_dir)):
    return record  # A new run (or one from before runs recorded configs).
  try:
    with open(path) as f:
      recorded = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f'cannot read {path} to check what the run there is: '
                     f'{e}') from e
  found = differences(recorded, record)
  if found:
    raise ResumeMismatchError(root_dir, found)
  noted = {field: [old, new] for field, old, new in _changed(recorded, record)
           if field in MAY_CHANGE and field not in _UNNOTED}
  record[HISTORY_KEY] = list(recorded.get(HISTORY_KEY, [])) + (
      [{'from_step': _checkpoint_step(root_dir), 'changes': noted}]
      if noted else [])
  return record


def write_record(root_dir: str, record: dict) -> None:
  """Writes config.json (atomically: a crash leaves the old one or the new)."""
  path = os.path.join(root_dir, CONFIG_FILE)
  tmp = f'{path}.tmp'
  with open(tmp, 'w') as f:
    json.dump(record, f, indent=2)
    f.write('\n')
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


class RunDirectory:
  """root_dir for one call of a training function.

  Use as a context manager around everything that may create files in
  root_dir; call `start()` when training starts (it writes `record` to
  config.json). If the block fails before that, what it created in root_dir
  is removed: the directory itself if it did not exist, else the entries
  that were not there before.
  """

  def __init__(self, root_dir: str, record: dict):
    self.root_dir, self._record = root_dir, record
    self._existed = os.path.isdir(root_dir)
    self._before = set(os.listdir(root_dir)) if self._existed else set()
    self.started = False

  def __enter__(self) -> 'RunDirectory':
    os.makedirs(self.root_dir, exist_ok=True)
    return self

  def start(self) -> None:
    """The run starts: config.json records it; nothing is removed after."""
    write_record(self.root_dir, self._record)
    self.started = True

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None or self.started:
      return
    if not self._existed:
      shutil.rmtree(self.root_dir, ignore_errors=True)
      return
    for name in set(os.listdir(self.root_dir)) - self._before:
      path = os.path.join(self.root_dir, name)
      if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
      else:
        try:
          os.remove(path)
        except OSError:
          pass
