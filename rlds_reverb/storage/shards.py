"""A push sharded over processes: ranges, the barrier protocol, messages.

`pipelines.push --num_workers N` splits the episodes [0, n) of a split into
N contiguous ranges and pushes each in a child process (`split[a:b]`, TFDS
absolute slicing). Children write concurrently, so a child cannot check the
table's size on its own; the parent holds global barriers instead:

  child -> parent (stdout, one JSON line): {"shard_barrier": reason,
      "shard": i, "position": p, "items": k, ...}: everything of episodes
      [start, p) of its range was confirmed by the server, k items in this
      run; reason 'every' (it then waits for a line on stdin), 'end' or
      'stopped' (it then exits).
  parent -> child (stdin): 'go' once every live child reported, the table
      holds its start size plus the sum of the confirmed items, the server
      wrote a checkpoint and the combined state was recorded.

`PushLedger` records the combined points (`PushPoint.shards`).
"""

import dataclasses
import json
from typing import Any, Dict, List, Optional

from rlds_reverb.storage import push

BARRIER_KEY = 'shard_barrier'
ERROR_KEY = 'shard_error'
GO = 'go'


def split_ranges(episodes: int, num_shards: int) -> List[tuple]:
  """[start, stop) of `num_shards` contiguous ranges covering [0, episodes);
  the first ones take one more when it does not divide (some may be empty).
  """
  if num_shards < 1:
    raise ValueError(f'num_shards must be >= 1, got {num_shards}')
  base, extra = divmod(episodes, num_shards)
  ranges, start = [], 0
  for i in range(num_shards):
    stop = start + base + (1 if i < extra else 0)
    ranges.append((start, stop))
    start = stop
  return ranges


@dataclasses.dataclass
class Shard:
  """One shard of a sharded push, as the parent follows it.

  `position`/`items` are what earlier runs recorded (where this run starts);
  `confirmed`/`confirmed_items` what this run confirmed so far (position in
  the dataset, items of this run).
  """
  index: int
  start: int
  stop: int
  position: int = 0
  items: int = 0
  confirmed: int = 0
  confirmed_items: int = 0
  waiting: bool = False  # Reported an 'every' barrier, waits for 'go'.
  finished: bool = False  # Its process ended (or it never ran).
  report: Optional[Dict[str, Any]] = None  # Its final JSON summary.
  error: Optional[str] = None
  returncode: Optional[int] = None

  def __post_init__(self):
    self.position = max(self.position, self.start)
    self.confirmed = self.position

  @property
  def complete(self) -> bool:
    return self.confirmed >= self.stop

  @property
  def name(self) -> str:
    return (f'shard {self.index} '
            f'({push.episode_range(self.start, self.stop)})')

  def record(self) -> Dict[str, int]:
    """What a `PushPoint` records of it: everything confirmed so far."""
    return dict(start=self.start, stop=self.stop, position=self.confirmed,
                items=self.items + self.confirmed_items)

  def figures(self) -> Dict[str, Any]:
    """Per-shard figures of the parent's summary."""
    report = self.report or {}
    return dict(shard=self.index, start=self.start, stop=self.stop,
                first_episode=self.position, confirmed_episodes=self.confirmed,
                episodes=report.get('episodes', 0),
                steps=report.get('steps', 0),
                items=report.get('items', self.confirmed_items),
                error=self.error)


def shards_from_point(point: push.PushPoint,
                      ranges: List[tuple]) -> List[Shard]:
  """The shards of `ranges`, starting where `point` recorded them.

  Raises:
    push.ResumeError: The point records other ranges.
  """
  if point.shards is None:  # The start of a push: nothing confirmed.
    if point.episodes:
      raise push.ResumeError('the state file records an unsharded push; '
                             'resume it without --num_workers')
    return [Shard(i, a, b) for i, (a, b) in enumerate(ranges)]
  recorded = [(s['start'], s['stop']) for s in point.shards]
  if recorded != [tuple(r) for r in ranges]:
    raise push.ResumeError(f'the state file records shards {recorded}, this '
                           f'push makes {ranges}')
  return [Shard(i, s['start'], s['stop'], s['position'], s['items'])
          for i, s in enumerate(point.shards)]


def barrier_line(index: int, stats: push.PushStats, reason: str) -> str:
  return json.dumps({BARRIER_KEY: reason, 'shard': index,
                     'position': stats.confirmed_position,
                     'items': stats.confirmed_items})


def parse_line(line: str) -> Optional[Dict[str, Any]]:
  """A child's JSON line (barrier, error or summary), else None."""
  line = line.strip()
  if not line.startswith('{'):
    return None
  try:
    data = json.loads(line)
  except ValueError:
    return None
  return data if isinstance(data, dict) else None


def combined_stats(shards: List[Shard]) -> push.PushStats:
  """What `PushLedger.on_barrier` needs of all shards together."""
  return push.PushStats(
      confirmed_position=sum(s.confirmed - s.start for s in shards),
      confirmed_items=sum(s.confirmed_items for s in shards),
      items=sum(s.confirmed_items for s in shards))


def not_durable(shards: List[Shard], point: push.PushPoint) -> str:
  """'shard 0: episodes 5-9; shard 1: episode 57': the episodes of each
  shard that the checkpointed `point` does not hold."""
  held = {s['start']: s['position'] for s in (point.shards or [])}
  parts = []
  for shard in shards:
    durable = held.get(shard.start, shard.start)
    if shard.stop > durable:
      parts.append(f'shard {shard.index}: '
                   f'{push.episode_range(durable, shard.stop)}')
  return '; '.join(parts) or 'none'
