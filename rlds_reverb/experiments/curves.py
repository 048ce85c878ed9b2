"""Learning curves as PNG files (matplotlib, no display needed)."""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import matplotlib
matplotlib.use('Agg')
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top


def plot_curves(curves: Mapping[str, Sequence[dict]], path: str, *,
                x: str, y: str = 'average_return', title: str = '',
                x_label: str | None = None, y_label: str | None = None,
                hlines: Mapping[str, float] | None = None,
                styles: Mapping[str, dict] | None = None) -> str:
  """Draws one line per named run of eval records; returns `path`.

  Args:
    curves: run name -> eval records (dicts holding `x` and `y`).
    path: PNG to write (its directory is created).
    x, y: record keys for the axes.
    title: figure title.
    x_label, y_label: axis labels (default: the keys).
    hlines: label -> y value of reference lines (e.g. the behaviour policy).
    styles: run name -> matplotlib line keywords (color, linewidth, alpha,
      label=None to keep a run out of the legend).
  """
  figure, axes = plt.subplots(figsize=(7, 4.5))
  for name, records in curves.items():
    points = [(r[x], r[y]) for r in records
              if r.get(x) is not None and r.get(y) is not None]
    if points:
      xs, ys = zip(*points)
      style = {'marker': 'o', 'markersize': 3, 'label': name,
               **(styles or {}).get(name, {})}
      axes.plot(xs, ys, **style)
  for label, value in (hlines or {}).items():
    axes.axhline(value, linestyle='--', color='gray', linewidth=1)
    axes.annotate(label, (0, value), xycoords=('axes fraction', 'data'),
                  fontsize=8, color='gray', va='bottom')
  axes.set_xlabel(x_label or x)
  axes.set_ylabel(y_label or y)
  axes.set_title(title)
  axes.grid(alpha=0.3)
  if len(curves) > 1:
    axes.legend(fontsize=8)
  figure.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  figure.savefig(path, dpi=110)
  plt.close(figure)
  return path


def mean_curve(runs: Sequence[Sequence[dict]], *, x: str,
               y: str = 'average_return') -> list[dict]:
  """The mean of several runs' records at the x values all of them have."""
  by_run = [{r[x]: r[y] for r in records if r.get(y) is not None}
            for records in runs]
  if not by_run:
    return []
  shared = sorted(set.intersection(*(set(points) for points in by_run)))
  return [{x: value, y: sum(points[value] for points in by_run) / len(by_run)}
          for value in shared]
