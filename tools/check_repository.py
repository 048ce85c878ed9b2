"""Run outputs stay out of git: what the repository may track.

Refused anywhere: TensorBoard event files and Reverb checkpoint files
(chunk and table records). TensorFlow checkpoints are refused except in an
in-flight run directory (`runs/inflight/<name>/<run>/checkpoints/`), which
holds the latest checkpoint of a long run still under way, one, not a
history; nothing else under `runs/` outside it. Tracked files other than the
shipped behaviour policies and the in-flight checkpoints stay under
`MAX_TRACKED_BYTES` together.

  python -m tools.check_repository   # prints each problem, exits 1 if any
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys

INFLIGHT_DIR = 'runs/inflight/'
POLICIES_DIR = 'rlds_reverb/policies/'
MAX_TRACKED_BYTES = 15 * 2**20
_EVENTS = re.compile(r'(^|/)events\.out\.tfevents\.')
_REVERB = re.compile(r'(^|/)(chunks|tables)\.tfrecord$')
_CHECKPOINT = re.compile(
    r'(^|/)(?P<prefix>[^/]+)\.(index|data-\d{5}-of-\d{5})$|(^|/)checkpoint$')
_INFLIGHT_CHECKPOINT = re.compile(
    r'^runs/inflight/[^/]+/[^/]+/checkpoints/[^/]+$')


def problems(sizes: dict[str, int]) -> list[str]:
  """What is wrong with a tracked tree, given {path: bytes}; [] when fine."""
  found = []
  checkpoints = collections.defaultdict(set)
  for path in sorted(sizes):
    if _EVENTS.search(path):
      found.append(f'{path}: a TensorBoard event file (a run output)')
    elif _REVERB.search(path):
      found.append(f'{path}: a Reverb checkpoint file (a run output)')
    elif _CHECKPOINT.search(path):
      if not _INFLIGHT_CHECKPOINT.match(path):
        found.append(f'{path}: a checkpoint outside {INFLIGHT_DIR}<name>/'
                     '<run>/checkpoints/')
      match = _CHECKPOINT.search(path)
      if match.group('prefix'):
        checkpoints[os.path.dirname(path)].add(match.group('prefix'))
    elif path.startswith('runs/') and not path.startswith(INFLIGHT_DIR):
      found.append(f'{path}: run outputs outside {INFLIGHT_DIR} stay out of '
                   'git (the small files a figure is built from go to '
                   'docs/results/)')
  for directory, prefixes in sorted(checkpoints.items()):
    if len(prefixes) > 1:
      found.append(f'{directory}: {len(prefixes)} checkpoints '
                   f'({", ".join(sorted(prefixes))}); an in-flight run keeps '
                   'its latest only')
  counted = sum(size for path, size in sizes.items()
                if not path.startswith(POLICIES_DIR)
                and not _INFLIGHT_CHECKPOINT.match(path))
  if counted > MAX_TRACKED_BYTES:
    found.append(f'tracked files (besides {POLICIES_DIR} and in-flight '
                 f'checkpoints) hold {counted / 2**20:.1f} MiB, over '
                 f'{MAX_TRACKED_BYTES / 2**20:.0f} MiB')
  return found


def tracked_sizes(repository: str) -> dict[str, int]:
  """{path: bytes} of the files git tracks in the repository's work tree."""
  listed = subprocess.run(['git', 'ls-files', '-z'], cwd=repository,
                          capture_output=True, check=True).stdout
  sizes = {}
  for path in listed.decode().split('\0'):
    full = os.path.join(repository, path)
    if path and os.path.isfile(full):
      sizes[path] = os.path.getsize(full)
  return sizes


def main() -> None:
  repository = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  found = problems(tracked_sizes(repository))
  for line in found:
    print(line)
  sys.exit(1 if found else 0)


if __name__ == '__main__':
  main()
