"""Checks the values of converted episodes before they are written.

The conversion (`convert.py`) checks an episode's structure (first, last
and terminal flags); this checks its numbers: every floating field of the
trajectories (observation, action, reward, policy_info, ...) must be finite,
and every discount must lie in [0, 1]. A NaN or inf that reaches a learner
surfaces thousands of steps later as a NaN loss or an error that names no
data; here it is named where it is:

    episode 3, step 17: observation[5] is nan
    episode 0, step 2: discount is 7.0, not in [0, 1]

Steps are those of the RLDS episode (trajectory t holds step t); the last
step's action, reward and discount are checked too, although they carry no
meaning: learners mask such transitions by multiplying, and NaN * 0 is NaN.

The check is vectorised: one `np.isfinite(...).all()` per floating field per
episode, and a search for the first bad element only when that fails.
"""

from typing import Any, Optional

import numpy as np
import tree

DISCOUNT_RANGE = (0.0, 1.0)


class InvalidDataError(ValueError):
  """A value a learner cannot train on: non-finite, or a discount not in
  [0, 1]. The message names the episode, the step and the field."""


def _where(path: tuple, index: tuple) -> str:
  """'observation[5]', "observation['goal'][1]", 'reward'."""
  name = str(path[0]) if path else 'value'
  for key in path[1:]:
    name += f'[{key!r}]' if isinstance(key, str) else f'[{key}]'
  return name + ''.join(f'[{i}]' for i in index)


def _first_bad(ok: np.ndarray) -> tuple[int, tuple]:
  """Step and element index of the first False in `ok` ([T, ...])."""
  flat = int(np.argmin(ok.reshape(-1)))
  position = np.unravel_index(flat, ok.shape)
  return int(position[0]), tuple(int(i) for i in position[1:])


def check_episode(trajectory: Any, episode: str, *,
                  discount_path: Optional[tuple] = ('discount',)) -> None:
  """Checks the values of one episode's trajectories (numpy, time first).

  Args:
    trajectory: A nest (a `Trajectory`, or a dict) of numpy arrays [T, ...].
    episode: How to name the episode in the error, e.g. 'episode 3'.
    discount_path: Path in the nest of the discount, checked to lie in
      [0, 1]; None if there is none.

  Raises:
    InvalidDataError: At the first non-finite element of a floating field
      (fields in nest order, steps in time order), or the first discount
      outside [0, 1]: 'episode 3, step 17: observation[5] is nan'.
  """
  leaves = tree.flatten_with_path(trajectory)
  for path, value in leaves:
    value = np.asarray(value)
    if value.dtype.kind not in 'fc' or value.ndim == 0:
      continue
    if path == discount_path:
      low, high = DISCOUNT_RANGE
      ok = (value >= low) & (value <= high)  # NaN fails both.
    else:
      ok = np.isfinite(value)
    if ok.all():
      continue
    step, index = _first_bad(ok)
    bad = value[(step, *index)]
    what = f'is {_number(bad)}'
    if path == discount_path and np.isfinite(bad):
      what += ', not in [0, 1]'
    raise InvalidDataError(f'{episode}, step {step}: {_where(path, index)} '
                           f'{what}')


def _number(x: Any) -> str:
  """'nan', 'inf', '-inf', '7.0' (no numpy type in the text)."""
  return repr(complex(x)) if np.iscomplexobj(x) else repr(float(x))

