"""Collects tools/offline_suite.py's JSON lines into docs/results/offline.json.

One JSON line out: {"rows": [{agent, dataset, gradient_steps, seeds,
scores, mean, std, corl}, ...], "behaviour_returns": {dataset kind:
{"return", "normalized_score", "d4rl_return"}}}. Lines of the same
(agent, dataset kind, gradient steps) are one row: seeds run later (a
`--seeds 1,2` run beside an earlier seed 0) join it, and a later score of
the same seed replaces the earlier one; mean and std (population, as
tools/offline_suite.py) are over the row's seeds. Runs with bfloat16 critics (`critic_dtype`) are rows of
their own, marked with that field; a row whose last line was run with
per-dataset settings names them (`gin_files`).

`--runs DIR ...` adds the long runs still short of their step budget, read
from their run directories (config.json, eval.jsonl), so the JSON shows
where they stand instead of only their earlier short rows: one row per run
at its last evaluation, marked `"complete": false`, with its target steps,
best score, the mean of its last 10 evaluations and the settings changed
on a resume. A finished run keeps its bench line's row (the score of its
last evaluation, as CORL's "last" column), to which it adds its best score,
the mean of its last 10 evaluations and the settings changed on a resume:
the bench line knows only the settings of its final stretch.

`--markdown` prints the table docs/results/offline.md opens with instead:
one line per agent and dataset kind, the 30k row over its seeds beside the
longest run and CORL's figure.

  python -m tools.offline_table docs/results/offline_rl/*.jsonl \
      [--runs runs/offline_rl/NAME/AGENT_seed0 ...] [--markdown]
  # What `make offline-table` runs (the table: add --markdown):
  python -m tools.offline_table --published > docs/results/offline.json
"""

import argparse
import json
import os
import time

import numpy as np

# D4RL's *-medium-v2 behaviour returns (the levels the medium policies were
# chosen for; halfcheetah's rows are named by kind alone); the other files'
# figures were not at hand offline and are left out rather than guessed.
D4RL_BEHAVIOUR = {'medium': 4770.0, 'hopper-medium': 1422.0,
                  'walker2d-medium': 2852.0}
# Evaluations averaged for a run under way: one alone swings by tens of
# points where episodes turn the cheetah over.
RECENT_EVALUATIONS = 10

# What docs/results/offline.json is made of (`--published`), relative to the
# repository: the bench lines in the order they join or replace each other
# (later seeds join a row; each dataset's behaviour return is its last
# file's, the original data's), then the long runs read from their
# directories. Runs of test settings (EDAC's actor initialisation,
# temperature and eta 5.0, ReBRAC's halved actor BC weight) and peers' runs
# are left out: they are not rows of the table.
PUBLISHED_DIR = 'docs/results/offline_rl'
PUBLISHED_LINES = tuple(
    f'{PUBLISHED_DIR}/bench_offline_{name}.jsonl' for name in (
    'medium',
    'medium_cql_sac_seeds12',
    'calql_dtype',
    'medium_1m_rebrac',
    'medium_edac_seed1',
    'medium_edac_seed2',
    'medium_replay_rebrac',
    'medium_replay_rebrac_seeds12',
    'medium_replay_1m',
    'medium_replay_cql_sac',
    'medium_replay_cql_sac_seeds12',
    'medium_replay_edac_bf16',
    'medium_replay_edac_bf16_seeds12',
    'medium_expert_rebrac',
    'medium_expert_rebrac_seeds12',
    'medium_expert_cql_sac_alpha1',
    'medium_expert_cql_sac_alpha1_seed1',
    'medium_expert_cql_sac_alpha1_seed2',
    'medium_expert_edac_bf16',
    'medium_expert_edac_bf16_seed1',
    'medium_expert_edac_bf16_seed2',
    'medium_expert_1m_iql',
    'medium_3seeds',
    'medium_3seeds_slow',
    'medium_1m',
    'medium_replay',
    'medium_replay_3seeds',
    'medium_expert',
    'medium_expert_3seeds',
    'medium_expert_1m',
    'medium_expert_1m_rebrac',
    'medium_expert_1m_bc',
    'hopper_medium',
    'walker2d_medium',
    'hopper_medium_replay',
    'hopper_medium_expert',
    'walker2d_medium_expert',
    'walker2d_medium_replay',
    'hopper_medium_rebrac',
    'walker2d_medium_rebrac',
    'hopper_medium_terminations_100k',
    'walker2d_medium_100k',
    'hopper_medium_1m',
    'walker2d_medium_1m_td3_bc',
    'hopper_medium_1m_td3_bc',
    'hopper_medium_cql_sac',
    'walker2d_medium_1m_iql',
    'hopper_medium_replay_rebrac',
    'walker2d_medium_replay_rebrac',
    'hopper_medium_expert_rebrac',
    'walker2d_medium_cql_sac_corl',
))
PUBLISHED_RUNS = (
    'docs/results/runs/offline_rl/medium_expert_1m_rebrac_bf16/rebrac_seed0',
    'docs/results/runs/offline_rl/hopper_medium_1m/iql_seed0',
    'docs/results/runs/offline_rl/hopper_medium_1m_td3_bc/td3_bc_seed0',
    'docs/results/runs/offline_rl/walker2d_medium_1m/td3_bc_seed0',
    'docs/results/runs/offline_rl/walker2d_medium_1m_iql/iql_seed0',
    'runs/inflight/medium_expert_1m_cql_sac/cql_sac_seed0',
    'runs/inflight/medium_1m_edac_bf16/edac_seed0',
)
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def summarize(paths: list[str]) -> dict:
  rows, scores, behaviour = {}, {}, {}
  for path in paths:
    with open(path) as f:
      for line in f:
        if not line.startswith('{'):
          continue
        record = json.loads(line)
        if 'normalized_scores' not in record:
          continue
        if record.get('bootstrap_through_terminals'):
          continue  # A loader bug's cost measured, not the method's score.
        kind = record.get('dataset_kind', 'medium')
        dtype = record.get('critic_dtype', 'float32')
        key = (record['agent'], kind, record['steps'], dtype)
        rows[key] = {
            'agent': record['agent'], 'dataset': kind, 'critic_dtype': dtype,
            'path': record['dataset'], 'gradient_steps': record['steps'],
            'corl': record.get('corl'), 'date': record['date'],
            'gin_files': record.get('gin_files') or []}
        scores.setdefault(key, {}).update(
            zip(record['seeds'], record['normalized_scores']))
        behaviour[kind] = {
            'return': record['behaviour_return'],
            'normalized_score': record['behaviour_normalized_score'],
            'd4rl_return': D4RL_BEHAVIOUR.get(kind)}
  merged = []
  for key, row in rows.items():
    by_seed = dict(sorted(scores[key].items()))
    values = list(by_seed.values())
    merged.append({
        **{k: row[k] for k in ('agent', 'dataset', 'path', 'gradient_steps')},
        'seeds': list(by_seed), 'scores': values,
        'mean': round(float(np.mean(values)), 2),
        'std': round(float(np.std(values)), 2),
        'corl': row['corl'], 'date': row['date'],
        **({} if row['critic_dtype'] == 'float32'
           else {'critic_dtype': row['critic_dtype']}),
        **({'gin_files': row['gin_files']} if row['gin_files'] else {})})
  return {'rows': merged, 'behaviour_returns': behaviour}


def _read_run(run_dir: str) -> tuple[dict, list[dict]]:
  """A run directory's config and its offline evaluations, in order."""
  with open(os.path.join(run_dir, 'config.json')) as f:
    config = json.load(f)
  with open(os.path.join(run_dir, 'eval.jsonl')) as f:
    evaluations = [json.loads(line) for line in f if line.strip()]
  evaluations = [e for e in evaluations if e.get('phase') == 'offline']
  if not evaluations:
    raise ValueError(f'{run_dir}/eval.jsonl holds no offline evaluation.')
  return config, evaluations


def _run_details(config: dict, scores: list[float]) -> dict:
  """What one evaluation leaves out of a long run: its best, its recent
  level, and settings changed on a resume (a dtype that suits another CPU)."""
  return {
      'best': round(max(scores), 2),
      f'mean_last_{RECENT_EVALUATIONS}_evaluations': round(
          float(np.mean(scores[-RECENT_EVALUATIONS:])), 2),
      **({'resumed_with_changes': config['resumed_with_changes']}
         if config.get('resumed_with_changes') else {})}


def _dataset_name(path: str) -> str:
  return os.path.basename(os.path.normpath(path))


def add_finished_runs(run_dirs: list[str], rows: list[dict]) -> None:
  """Adds to each bench row of a run in `run_dirs` that reached its budget
  the details of that run; a finished run without its bench row is an
  error (pass its .jsonl), so that no run is left out unsaid."""
  for run_dir in run_dirs:
    config, evaluations = _read_run(run_dir)
    if evaluations[-1]['train_step'] < config['train_steps']:
      continue
    matches = [row for row in rows
               if row['agent'] == config['agent']
               and _dataset_name(row['path']) == _dataset_name(
                   config['dataset'])
               and row['gradient_steps'] == config['train_steps']
               and config['seed'] in row['seeds']]
    if not matches:
      raise ValueError(
          f"{run_dir}: finished ({config['train_steps']} steps), but no "
          f"bench line holds its {config['agent']} seed {config['seed']} "
          'run at that budget; pass its .jsonl before --runs.')
    for row in matches:
      if row['seeds'] != [config['seed']]:
        raise ValueError(
            f"{run_dir}: its bench row holds seeds {row['seeds']}; the "
            "details of one run belong to a row of that run's seed alone.")
      row.update(_run_details(
          config, [e['normalized_score'] for e in evaluations]))


def runs_under_way(run_dirs: list[str], rows: list[dict]) -> list[dict]:
  """Rows of the runs in `run_dirs` that stopped short of their budget.

  The dataset kind and CORL's figure come from `rows` (the bench lines) of
  the same dataset path and agent: a run's config knows its path, not the
  kind the bench was told.
  """
  kinds = {_dataset_name(row['path']): row['dataset'] for row in rows}
  corl = {(row['agent'], row['dataset']): row['corl'] for row in rows}
  under_way = []
  for run_dir in run_dirs:
    config, evaluations = _read_run(run_dir)
    last = evaluations[-1]
    if last['train_step'] >= config['train_steps']:
      continue
    path = _dataset_name(config['dataset'])
    if path not in kinds:
      raise ValueError(
          f'{run_dir}: no bench line trains on dataset {path!r}, so its '
          f'kind is unknown; pass a .jsonl of that dataset before --runs.')
    kind, agent = kinds[path], config['agent']
    scores = [e['normalized_score'] for e in evaluations]
    dtype = config['agent_config'].get('critic_dtype', 'float32')
    under_way.append({
        'agent': agent, 'dataset': kind, 'path': config['dataset'],
        'gradient_steps': last['train_step'], 'seeds': [config['seed']],
        'scores': [round(scores[-1], 2)], 'mean': round(scores[-1], 2),
        'std': 0.0, 'corl': corl.get((agent, kind)),
        'date': time.strftime('%Y-%m-%d', time.gmtime(last['time'])),
        'complete': False, 'target_steps': config['train_steps'],
        **({} if dtype == 'float32' else {'critic_dtype': dtype}),
        **_run_details(config, scores)})
  return under_way


AGENT_NAMES = {'bc': 'BC', 'td3_bc': 'TD3+BC', 'cql_sac': 'CQL-SAC',
               'iql': 'IQL', 'awac': 'AWAC', 'rebrac': 'ReBRAC',
               'edac': 'EDAC'}
# HalfCheetah's rows came first and name the kind alone; the table names
# the environment of every row.
DATASET_KINDS = ('medium', 'medium-replay', 'medium-expert') + tuple(
    f'{env}-{kind}' for env in ('hopper', 'walker2d')
    for kind in ('medium', 'medium-replay', 'medium-expert'))


def _dataset_label(kind: str) -> str:
  named = kind.split('-')[0] in ('hopper', 'walker2d')
  return kind if named else f'halfcheetah-{kind}'
SHORT_BUDGET = 30_000  # The gradient steps of the 3-seed rows.
WITHIN = 5.0  # The target: within 5 points of CORL.


def _steps(steps: int) -> str:
  return f'{steps // 1_000_000}M' if steps % 1_000_000 == 0 else (
      f'{steps // 1000}k')


def markdown_table(rows: list[dict]) -> str:
  """CORL's table, ours beside it: the short 3-seed row, the longest run
  (over its seeds where more than one reached that budget), and the gap to
  CORL's of the longest budget's score (of a run under way, the mean of its
  last evaluations)."""
  lines = [
      '| agent | dataset | 30k steps, mean +- std (seeds) | longest run '
      '(seed 0; mean +- std (seeds) where more) | CORL (1M; EDAC 3M) | '
      'gap to CORL (longest run) |',
      '|---|---|---:|---:|---:|---:|']
  for kind in DATASET_KINDS:
    for agent, name in AGENT_NAMES.items():
      mine = [r for r in rows if r['agent'] == agent and r['dataset'] == kind]
      if not mine:
        continue
      short = max((r for r in mine if r['gradient_steps'] == SHORT_BUDGET),
                  key=lambda r: len(r['seeds']), default=None)
      longest = max((r for r in mine if r['gradient_steps'] > SHORT_BUDGET),
                    key=lambda r: r['gradient_steps'], default=None)
      short_cell = '' if short is None else (
          f"{short['mean']:.1f} +- {short['std']:.1f} ({len(short['seeds'])})")
      long_cell, score = '', None if short is None else short['mean']
      if longest is not None:
        score = longest['mean']
        long_cell = f"{score:.1f}"
        if len(longest['seeds']) > 1:
          long_cell += (f" +- {longest['std']:.1f} "
                        f"({len(longest['seeds'])})")
        long_cell += f" at {_steps(longest['gradient_steps'])}"
        if longest.get('complete') is False:
          # One evaluation of a run under way can be its best or its worst.
          score = longest[f'mean_last_{RECENT_EVALUATIONS}_evaluations']
          long_cell += (f" (under way to {_steps(longest['target_steps'])};"
                        f" best {longest['best']:.1f}, last "
                        f"{RECENT_EVALUATIONS} evaluations {score:.1f})")
        elif 'best' in longest:  # A finished run read with --runs.
          long_cell += (
              f" (best {longest['best']:.1f}, last {RECENT_EVALUATIONS} "
              f"evaluations "
              f"{longest[f'mean_last_{RECENT_EVALUATIONS}_evaluations']:.1f})")
      corl = mine[0]['corl']
      gap = '' if corl is None or score is None else (
          f'{score - corl:+.1f}' + (' (within 5)' if abs(score - corl)
                                    <= WITHIN else ''))
      lines.append(f"| {name} | {_dataset_label(kind)} | {short_cell} | {long_cell} | "
                   f"{'' if corl is None else f'{corl:.1f}'} | {gap} |")
  return '\n'.join(lines)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('paths', nargs='*',
                      help="tools/offline_suite.py JSON lines (.jsonl), in order: "
                      "later lines join or replace earlier ones.")
  parser.add_argument('--runs', nargs='*', default=[],
                      help='Run directories of long runs: one still short '
                      'of its step budget is added as a row of its last '
                      'evaluation; a finished one adds its best score, '
                      'recent mean and resume changes to its bench row.')
  parser.add_argument('--markdown', action='store_true',
                      help='Print the markdown table of the rows instead of '
                      'the JSON line.')
  parser.add_argument('--published', action='store_true',
                      help='Read the bench lines and long runs behind '
                      'docs/results/offline.json (PUBLISHED_LINES, '
                      'PUBLISHED_RUNS), from any directory, in place of '
                      'PATHS and --runs.')
  args = parser.parse_args(argv)
  if args.published and (args.paths or args.runs):
    parser.error('--published reads its own inputs: give it no PATHS and no '
                 '--runs')
  print(published_summary(args.markdown) if args.published else
        render(args.paths, args.runs, args.markdown))


def render(paths: list[str], run_dirs: list[str], markdown: bool) -> str:
  summary = summarize(paths)
  add_finished_runs(run_dirs, summary['rows'])
  summary['rows'] += runs_under_way(run_dirs, summary['rows'])
  return markdown_table(summary['rows']) if markdown else json.dumps(summary)


def published_summary(markdown: bool = False) -> str:
  """docs/results/offline.json (or its table) made again from the
  committed bench lines and run directories."""
  def here(path):
    return os.path.join(REPOSITORY, path)
  return render([here(p) for p in PUBLISHED_LINES],
                [here(r) for r in PUBLISHED_RUNS], markdown)


if __name__ == '__main__':
  main()
