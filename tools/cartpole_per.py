r"""CartPole-v1 DQN: prioritized against uniform replay, steps to a return of 475.

Runs `pipelines.train --agent dqn --env CartPole-v1 --replay R --seed S` for
every replay kind and seed (as subprocesses, --parallel at a time; a run
already finished in its root dir is only read back), then prints one JSON
line: for each run the first env step whose evaluation (10 greedy episodes)
averaged at least --target, and draws all curves on one PNG.

  python -m tools.cartpole_per --seeds 0,1,2 --root runs/cartpole_per
"""

import json
import os
import subprocess
import sys
import time

from absl import app
from absl import flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rlds_reverb.experiments import curves  # pylint: disable=g-import-not-at-top
from rlds_reverb.experiments import loop

_SEEDS = flags.DEFINE_list('seeds', ['0', '1', '2'], 'Seeds of each replay.')
_REPLAYS = flags.DEFINE_list('replays', ['prioritized', 'uniform'],
                             'Replay kinds to compare.')
_STEPS = flags.DEFINE_integer('steps', 50_000, 'Env steps per run.')
_TARGET = flags.DEFINE_float('target', 475.0, 'Evaluation return to reach.')
_ROOT = flags.DEFINE_string('root', 'runs/cartpole_per', 'Runs go to '
                            'ROOT/<replay>_seed<seed>.')
_PARALLEL = flags.DEFINE_integer('parallel', 2, 'Runs at a time.')
_EXTRA = flags.DEFINE_list('extra_flags', [], 'More pipelines.train flags, '
                           'e.g. --double,--dueling.')
_PNG = flags.DEFINE_string('png', 'docs/results/cartpole_per.png',
                           'Where the combined learning curves go.')


def _command(replay: str, seed: str) -> list[str]:
  return [sys.executable, '-m', 'pipelines.train', '--agent', 'dqn', '--env',
          'CartPole-v1', '--replay', replay, '--seed', seed, '--steps',
          str(_STEPS.value), '--root_dir', _run_dir(replay, seed),
          *_EXTRA.value]


def _run_dir(replay: str, seed: str) -> str:
  return os.path.join(_ROOT.value, f'{replay}_seed{seed}')


def steps_to(records: list[dict], target: float) -> int | None:
  """First env step whose evaluation reached `target`; None if none did."""
  for record in records:
    if record['average_return'] >= target:
      return int(record['env_steps'])
  return None


def _finished(replay: str, seed: str) -> bool:
  records = loop.Learner.read_eval_log(_run_dir(replay, seed))
  return bool(records) and records[-1]['env_steps'] >= _STEPS.value


def main(argv):
  del argv
  runs = [(r, s) for r in _REPLAYS.value for s in _SEEDS.value
          if not _finished(r, s)]
  pending, running = list(runs), []
  started = time.time()
  while pending or running:
    while pending and len(running) < _PARALLEL.value:
      replay, seed = pending.pop(0)
      os.makedirs(_run_dir(replay, seed), exist_ok=True)
      log = open(os.path.join(_run_dir(replay, seed), 'train.log'), 'w')
      running.append((subprocess.Popen(_command(replay, seed), stdout=log,
                                       stderr=subprocess.STDOUT), log,
                      replay, seed))
    time.sleep(2)
    for entry in list(running):
      process, log, replay, seed = entry
      if process.poll() is not None:
        log.close()
        running.remove(entry)
        if process.returncode:
          raise SystemExit(f'{replay} seed {seed} failed, see '
                           f'{_run_dir(replay, seed)}/train.log')
  result = {'target': _TARGET.value, 'env_steps': _STEPS.value,
            'extra_flags': _EXTRA.value, 'wall_s': round(time.time() -
                                                          started)}
  curves_by_run, styles = {}, {}
  colors = dict(zip(_REPLAYS.value, ('tab:blue', 'tab:orange', 'tab:green',
                                     'tab:red')))
  for replay in _REPLAYS.value:
    reached = {}
    for seed in _SEEDS.value:
      records = loop.Learner.read_eval_log(_run_dir(replay, seed))
      reached[seed] = steps_to(records, _TARGET.value)
      curves_by_run[f'{replay} seed {seed}'] = records
      styles[f'{replay} seed {seed}'] = {
          'color': colors[replay], 'alpha': 0.3, 'linewidth': 1,
          'markersize': 0, 'label': None}
      result.setdefault('final_return', {})[f'{replay}_seed{seed}'] = (
          records[-1]['average_return'] if records else None)
    mean_name = f'{replay} replay, mean of {len(_SEEDS.value)} seeds'
    curves_by_run[mean_name] = curves.mean_curve(
        [curves_by_run[f'{replay} seed {s}'] for s in _SEEDS.value],
        x='env_steps')
    styles[mean_name] = {'color': colors[replay], 'linewidth': 2.2}
    result[f'{replay}_steps_to_target'] = reached
    result[f'{replay}_reached'] = sum(v is not None for v in reached.values())
  curves.plot_curves(curves_by_run, _PNG.value, x='env_steps',
                     title='DQN on CartPole-v1: '
                     f'{" vs ".join(_REPLAYS.value)} replay '
                     f'{" ".join(_EXTRA.value)}'.strip(),
                     x_label='env steps',
                     y_label='average return (10 greedy episodes)',
                     hlines={f'target {_TARGET.value:g}': _TARGET.value},
                     styles=styles)
  result['png'] = _PNG.value
  print(json.dumps(result), flush=True)


if __name__ == '__main__':
  app.run(main)
