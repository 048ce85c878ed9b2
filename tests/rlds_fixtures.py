"""Small in-memory RLDS datasets for the tests (a plain helper module).

An episode here is a dict of numpy arrays with a leading time dimension, one
entry per RLDS step field (nested dicts allowed, e.g. a dict observation or an
`infos` dict). `make_rlds` turns a list of them into an RLDS dataset: a
`tf.data.Dataset` of `{'steps': tf.data.Dataset}`, the shape TFDS gives.

Values are random (seeded), so a step paired with the wrong neighbour, a
field taken from the wrong step or a lost step shows up as a value mismatch.

`write_tfds` writes small episodes to disk instead, in the TFDS format the
pipelines read (`counting_steps` makes their steps), for the tests that run
a pipeline on a dataset directory.
"""

import copy
import os
from typing import Any, Dict, Iterable, List, Optional, Sequence

import numpy as np
import rlds
import tensorflow as tf

Episode = Dict[str, Any]

OBS_DIM = 3
ACTION_DIM = 2


def episode(
    length: int,
    *,
    terminal: bool = True,
    seed: int = 0,
    obs_dim: int = OBS_DIM,
    action_dim: int = ACTION_DIM,
    dict_observation: bool = False,
    infos: bool = False,
    extra_field: bool = False,
    log_prob: bool = False,
    discrete: bool = False,
) -> Episode:
  """A valid RLDS episode of `length` steps.

  Args:
    length: Number of steps (0 gives an empty episode).
    terminal: Whether the last step is terminal (else the episode is
      truncated: `is_last` without `is_terminal`).
    seed: Seed of the random values; use a different one per episode.
    obs_dim: Size of the (flat) observation.
    action_dim: Size of the action (ignored when `discrete`).
    dict_observation: Observation as a nested dict `{'pixels': uint8 [2, 2, 1],
      'state': {'position': float32 [obs_dim], 'time': int64 []}}`.
    infos: Add an `infos` dict step field `{'log_prob': float32,
      'counter': int32}`.
    extra_field: Add a scalar step field `extra` (float64).
    log_prob: Add a flat scalar step field `log_prob` (float32).
    discrete: Action as an int64 scalar instead of a float32 vector.

  Returns:
    The episode as a dict of numpy arrays with a leading time dimension.
  """
  rng = np.random.default_rng(seed)
  t = np.arange(length)
  if dict_observation:
    observation = {
        'pixels': rng.integers(0, 256, size=[length, 2, 2, 1], dtype=np.uint8),
        'state': {
            'position': rng.standard_normal([length, obs_dim]).astype(
                np.float32),
            'time': (t + 1000 * seed).astype(np.int64),
        },
    }
  else:
    observation = rng.standard_normal([length, obs_dim]).astype(np.float32)
  if discrete:
    action = rng.integers(0, 10, size=[length]).astype(np.int64)
  else:
    action = rng.standard_normal([length, action_dim]).astype(np.float32)
  steps = {
      rlds.OBSERVATION: observation,
      rlds.ACTION: action,
      rlds.REWARD: rng.standard_normal([length]).astype(np.float32),
      # Not all 1: a discount taken from the wrong step must show.
      rlds.DISCOUNT: rng.uniform(0.5, 1.0, size=[length]).astype(np.float32),
      rlds.IS_FIRST: t == 0,
      rlds.IS_LAST: t == length - 1,
      rlds.IS_TERMINAL: (t == length - 1) & terminal,
  }
  if infos:
    steps['infos'] = {
        'log_prob': rng.standard_normal([length]).astype(np.float32),
        'counter': (t + 100 * seed).astype(np.int32),
    }
  if extra_field:
    steps['extra'] = rng.standard_normal([length]).astype(np.float64)
  if log_prob:
    steps['log_prob'] = rng.standard_normal([length]).astype(np.float32)
  return steps


def complete_episode(length: int, **kwargs) -> Episode:
  """An episode that ends in a terminal last step."""
  return episode(length, terminal=True, **kwargs)


def truncated_episode(length: int, **kwargs) -> Episode:
  """An episode cut off: its last step is last but not terminal."""
  return episode(length, terminal=False, **kwargs)


def single_step_episode(terminal: bool = True, **kwargs) -> Episode:
  """One step that is both first and last (becomes LAST -> LAST)."""
  return episode(1, terminal=terminal, **kwargs)


def empty_episode(like: Optional[Episode] = None, **kwargs) -> Episode:
  """An episode with no steps, with the fields (and shapes) of `like`."""
  if like is None:
    return episode(0, **kwargs)
  return _map(lambda x: x[:0], like)


def _map(fn, steps: Episode) -> Episode:
  return tf.nest.map_structure(fn, steps)


def with_fields(steps: Episode, **changes: Any) -> Episode:
  """A copy of `steps` with some top-level fields replaced."""
  out = copy.deepcopy(steps)
  out.update(changes)
  return out


def without_last(steps: Episode) -> Episode:
  """Invalid: the episode never ends (no `is_last`, no `is_terminal`)."""
  n = len(steps[rlds.IS_FIRST])
  return with_fields(steps, is_last=np.zeros(n, bool),
                     is_terminal=np.zeros(n, bool))


def without_first(steps: Episode) -> Episode:
  """The episode's first step lacks `is_first`."""
  n = len(steps[rlds.IS_FIRST])
  return with_fields(steps, is_first=np.zeros(n, bool))


def terminal_at(steps: Episode, t: int) -> Episode:
  """Marks step `t` terminal as well (invalid unless `t` is the last step)."""
  is_terminal = steps[rlds.IS_TERMINAL].copy()
  is_terminal[t] = True
  return with_fields(steps, is_terminal=is_terminal)


def without_field(steps: Episode, name: str) -> Episode:
  out = copy.deepcopy(steps)
  del out[name]
  return out


def make_rlds(
    episodes: Sequence[Episode],
    episode_fields: Optional[Sequence[Dict[str, Any]]] = None,
) -> tf.data.Dataset:
  """An RLDS dataset: one `{'steps': Dataset, **episode_fields}` per episode.

  Args:
    episodes: The episodes (all with the same fields, dtypes and per-step
      shapes). Must not be empty; use `empty_rlds` for zero episodes.
    episode_fields: Optional per-episode metadata (e.g. `{'episode_id': 3}`),
      added next to `steps`, as TFDS datasets have.

  Returns:
    A re-iterable `tf.data.Dataset` of episodes.
  """
  if not episodes:
    raise ValueError('make_rlds needs at least one episode; use empty_rlds.')
  dataset = None
  for i, steps in enumerate(episodes):
    element = {rlds.STEPS: tf.data.Dataset.from_tensor_slices(steps)}
    if episode_fields is not None:
      element.update(episode_fields[i])
    one = tf.data.Dataset.from_tensors(element)
    dataset = one if dataset is None else dataset.concatenate(one)
  return dataset


def empty_rlds(like: Optional[Episode] = None) -> tf.data.Dataset:
  """An RLDS dataset with zero episodes (with the step spec of `like`)."""
  return make_rlds([like if like is not None else episode(2)]).take(0)


def episodes_with_lengths(lengths: Sequence[int],
                          terminal: Optional[Sequence[bool]] = None,
                          seed: int = 0,
                          **kwargs) -> List[Episode]:
  """Episodes of the given lengths, each with its own seed."""
  if terminal is None:
    terminal = [True] * len(lengths)
  return [episode(n, terminal=term, seed=seed + i, **kwargs)
          for i, (n, term) in enumerate(zip(lengths, terminal))]


def counting_steps(length: int, first: float = 0.0, ends: bool = True
                   ) -> List[Dict[str, Any]]:
  """The steps of one episode for `write_tfds`: observation t is
  `first + t` in each of its OBS_DIM entries, so a test can tell which step
  of which episode landed where. It is truncated (no terminal step), and
  with `ends=False` its last step is not marked last (invalid RLDS)."""
  return [dict(observation=np.full(OBS_DIM, first + t, np.float32),
               action=np.zeros(ACTION_DIM, np.float32),
               reward=np.float32(1.0), discount=np.float32(1.0),
               is_first=t == 0, is_last=ends and t == length - 1,
               is_terminal=False)
          for t in range(length)]


def write_tfds(out: os.PathLike, episodes: Iterable[List[Dict[str, Any]]],
               name: str = 'tiny_rlds') -> str:
  """Writes `episodes` (lists of steps, as `counting_steps` makes them) as
  an RLDS dataset directory in TFDS format, the way a recorded dataset lies
  on disk; returns its path."""
  # pylint: disable=g-import-not-at-top (TFDS' builders are slow to import)
  import tensorflow_datasets as tfds
  from rlds.tfds import episode_writer
  # pylint: enable=g-import-not-at-top
  os.makedirs(out, exist_ok=True)
  config = tfds.rlds.rlds_base.DatasetConfig(
      name=name,
      observation_info=tfds.features.Tensor(shape=(OBS_DIM,),
                                            dtype=np.float32),
      action_info=tfds.features.Tensor(shape=(ACTION_DIM,), dtype=np.float32),
      reward_info=np.float32, discount_info=np.float32)
  writer = episode_writer.EpisodeWriter(str(out), config)
  for steps in episodes:
    writer.add_episode({'steps': steps})
  writer.close()
  return str(out)


class SwappableRLDS:
  """An RLDS dataset whose episodes are read from `self.episodes` each time.

  Building a conversion pipeline traces its functions (about half a second
  each for TF-Agents' and ours); iterating it is cheap. Property tests build
  the pipelines once on `self.dataset`, then set `self.episodes` per example
  and iterate again. All episodes must have the fields, dtypes and per-step
  shapes of `like`.
  """

  def __init__(self, like: Episode):
    self.episodes: List[Episode] = []
    signature = tf.nest.map_structure(
        lambda x: tf.TensorSpec((None,) + np.asarray(x).shape[1:],
                                tf.as_dtype(np.asarray(x).dtype)), like)

    def generate():
      yield from list(self.episodes)

    self.dataset = tf.data.Dataset.from_generator(
        generate, output_signature=signature).map(
            lambda steps: {rlds.STEPS: tf.data.Dataset.from_tensor_slices(
                steps)})
