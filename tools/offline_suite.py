"""Offline RL targets: every offline learner on a locally generated dataset.

The dataset is pushed once (fast push, terminal-discount fix on; whole
episodes for the default in-memory feed, 2-step items with --feed stream)
into a table of an in-process Reverb server; then, for each agent and
seed, `rlds_reverb.experiments.offline.train_offline` trains from that table
(the code behind `python -m pipelines.train --agent A --reverb_address ...`;
pushing 1M transitions again for each of 9 runs would cost ~10 minutes of a
2-core machine). Then it
prints ONE JSON line per agent with the mean and spread over seeds of the
final D4RL normalised score, against the reference it names: the behaviour
policy's own average return in the dataset (computed here, same run), and
CORL's published score of the same method on D4RL's dataset of the same
kind (`--dataset_kind`: medium, medium-replay or medium-expert; the
'corl' field, its v2 "last" scores).
  bc        target: within 10% of the behaviour return
  others    target: at or above the behaviour return
Each agent trains at its published batch size (rebrac 1024, else 256);
`--gin_file` applies per-dataset settings (configs/rebrac_halfcheetah_*.gin,
configs/edac_halfcheetah_*.gin) to the agents they name.
With --finetune_steps N, one more line: TD3+BC offline-to-online, the score
before and after N env steps of symmetric (half offline, half online)
sampling; target: after > before.
Also reported: gradient steps/s of each learner (over the runs that trained
in this process; a run resumed at its end adds none) and the sampled
transitions/s that fed it (steps/s x batch size).

  python -m tools.offline_suite --dataset data/halfcheetah_v5_medium \
      [--agents bc,td3_bc,cql_sac,iql,awac,rebrac,edac] [--seeds 0,1,2] \
      [--steps 300000] [--eval_interval 10000] [--finetune_steps 50000] \
      [--dataset_kind medium] [--gin_file configs/rebrac_halfcheetah_medium.gin]

Learning curves (all agents and seeds) go to --curve.
Each run shows a progress bar with its rate on stderr, beside a line per
evaluation (--no-progress: the lines only). Ctrl-C (kill -INT) ends it
with exit 130 and one line; the same command resumes every run from its
last checkpoint.
"""

import argparse
import json
import os
import platform
import signal
import sys
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import gin  # pylint: disable=g-import-not-at-top
import numpy as np
import tensorflow as tf

from rlds_reverb.data import convert
from rlds_reverb.data import datasets
from rlds_reverb.storage import tables
from rlds_reverb.acting import envs
from rlds_reverb.agents import registry
from rlds_reverb.experiments import configs
from rlds_reverb.experiments import curves
from rlds_reverb.agents.offline import ensemble
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import offline
from rlds_reverb.experiments import offline_data
from rlds_reverb.replay import episode_table

# CORL's halfcheetah-*-v2 "last" normalised scores (mean over seeds at the
# end of 1M gradient steps; CORL README, "Offline / Last Scores").
CORL = {
    'medium': {'bc': 42.40, 'td3_bc': 48.10, 'cql_sac': 47.04, 'iql': 48.31,
               'awac': 49.46, 'rebrac': 64.04, 'sac_n': 68.20,
               'edac': 67.70},
    'medium-replay': {'bc': 35.66, 'td3_bc': 44.84, 'cql_sac': 45.04,
                      'iql': 44.46, 'awac': 44.70, 'rebrac': 51.18,
                      'sac_n': 60.70, 'edac': 62.06},
    'medium-expert': {'bc': 55.95, 'td3_bc': 90.78, 'cql_sac': 95.63,
                      'iql': 94.74, 'awac': 93.62, 'rebrac': 103.80,
                      'sac_n': 98.96, 'edac': 104.76},
}
# The same for hopper and walker2d (CORL README, as issue #45 quotes it),
# keyed by D4RL's dataset name; HalfCheetah's keep their bare kinds.
_CORL_AGENTS = ('bc', 'td3_bc', 'awac', 'cql_sac', 'iql', 'rebrac', 'sac_n',
                'edac')
CORL.update({name: dict(zip(_CORL_AGENTS, scores)) for name, scores in {
    'hopper-medium': (53.5, 60.4, 63.0, 59.1, 67.5, 102.3, 40.8, 101.7),
    'hopper-medium-replay': (29.8, 64.4, 98.9, 95.1, 97.4, 95.0, 100.3,
                             99.7),
    'hopper-medium-expert': (52.3, 101.2, 101.9, 99.3, 107.4, 109.5, 101.3,
                             105.2),
    'walker2d-medium': (63.2, 82.7, 68.5, 80.8, 80.9, 85.8, 87.5, 93.4),
    'walker2d-medium-replay': (21.8, 85.6, 80.6, 73.1, 82.2, 84.3, 79.0,
                               87.1),
    'walker2d-medium-expert': (99.0, 110.0, 111.4, 109.6, 111.7, 111.9,
                               114.9, 114.8),
}.items()})


def behaviour_return(dataset: str) -> tuple[float, int, int]:
  """Mean episode return, episodes and env steps of the dataset."""
  # Reduced over batches of steps: a reduce per step takes minutes on 1M.
  sums = datasets.load(dataset).map(
      lambda e: e['steps'].batch(1000).reduce(
          (tf.constant(0.0, tf.float64), tf.constant(0, tf.int64)),
          lambda acc, s: (
              acc[0] + tf.reduce_sum(tf.cast(s['reward'], tf.float64)),
              acc[1] + tf.size(s['reward'], out_type=tf.int64))))
  returns, lengths = zip(*[(float(r), int(n)) for r, n in sums])
  return float(np.mean(returns)), len(returns), int(sum(lengths) - len(
      lengths))


def mean_rate(summaries: list[dict], key: str, digits: int
              ) -> float | None:
  """Mean of a rate over the runs that trained in this process (a run
  resumed at its end trained nothing here and has None); None if none did."""
  rates = [s[key] for s in summaries if s.get(key) is not None]
  return round(float(np.mean(rates)), digits) if rates else None


def plot_finetune(root: str, path: str, behaviour: float) -> str:
  """Return against fine-tuning env steps, from the run's offline end."""
  records = loop.Learner.read_eval_log(root)
  offline_end = [r for r in records if r.get('phase') == 'offline'][-1]
  points = [{**offline_end, 'env_steps': 0}] + [
      r for r in records if r.get('phase') == 'online']
  return curves.plot_curves(
      {'td3_bc fine-tuning': points}, path, x='env_steps',
      title='offline-to-online, half offline / half online batches',
      x_label='fine-tuning env steps', y_label='average return',
      hlines={'behaviour': behaviour,
              'offline end': offline_end['average_return']})


def curve_style(agent_index: int, seed_index: int) -> dict:
  """One colour per agent, one line style per seed: 12+ curves stay legible."""
  return {'color': f'C{agent_index % 10}',
          'linestyle': ('-', '--', ':', '-.')[seed_index % 4]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--dataset', default='data/halfcheetah_v5_medium',
                      help='RLDS dataset: a directory written by '
                      'pipelines.generate, a TFDS name or minari:ID, as '
                      'rlds_reverb.data.datasets.load reads them.')
  parser.add_argument('--env', default='HalfCheetah-v5',
                      help='Gymnasium env the policies are evaluated in and '
                      'whose D4RL reference returns normalise the scores.')
  parser.add_argument('--agents', default='bc,td3_bc,cql_sac',
                      help='Comma-separated learners, as pipelines.train '
                      '--agent names them.')
  parser.add_argument('--seeds', default='0,1,2',
                      help='Comma-separated seeds; one run per agent and seed.')
  parser.add_argument('--steps', type=int, default=300_000,
                      help='Gradient steps per run (CORL: 1M).')
  parser.add_argument('--eval_interval', type=int, default=10_000,
                      help='Gradient steps between evaluations; each run '
                      'also checkpoints at this interval and resumes from '
                      'its last checkpoint when rerun.')
  parser.add_argument('--eval_episodes', type=int, default=10,
                      help='Greedy episodes per evaluation.')
  parser.add_argument('--finetune_steps', type=int, default=0,
                      help='Env steps of TD3+BC offline-to-online fine-tuning '
                      'after its offline run (0: none).')
  parser.add_argument('--cql_bc_steps', type=int, default=10_000,
                      help='CQL-SAC behaviour-cloning warm-up steps')
  parser.add_argument('--feed', default='memory', choices=['memory', 'stream'],
                      help='memory: episodes read once into the learner; '
                      'stream: 2-step items sampled from Reverb per batch.')
  parser.add_argument('--dataset_kind', default='medium',
                      choices=sorted(CORL), help='Which CORL row to compare '
                      'with: a HalfCheetah kind (medium, ...) or a D4RL '
                      'name (hopper-medium, walker2d-medium-expert, ...).')
  parser.add_argument('--bootstrap_through_terminals',
                      action=argparse.BooleanOptionalAction, default=False,
                      help='Measurement only: bootstrap TD targets through '
                      'terminations, as a loader bug would '
                      '(OfflineConfig.bootstrap_through_terminals).')
  parser.add_argument('--gin_file', action='append', default=[],
                      help='Gin file of per-dataset settings (repeatable).')
  parser.add_argument('--critic_dtype', default='float32',
                      choices=list(ensemble.COMPUTE_DTYPES),
                      help='AgentConfig.critic_dtype of the learners with '
                      'ensemble critics (iql, awac, rebrac, sac_n, edac, '
                      'cal_ql): bfloat16 matmuls in their hidden layers.')
  parser.add_argument('--root', default='runs/bench_offline',
                      help='Run directories go to ROOT/AGENT_seedSEED; '
                      'existing ones are resumed.')
  parser.add_argument('--progress', action=argparse.BooleanOptionalAction,
                      default=True,
                      help='A progress bar per run on stderr, with its '
                      'gradient steps/s (--no-progress: only the line each '
                      'evaluation writes there). Into a log file, '
                      'TQDM_MININTERVAL=60 (seconds) keeps it short.')
  parser.add_argument('--curve', default=None,
                      help='PNG of every run\'s evaluation curve (default: '
                      'ROOT/curves.png).')
  parser.add_argument('--finetune_curve', default=None,
                      help='PNG of the fine-tuning curve (--finetune_steps; '
                      'default: ROOT/finetune_curve.png).')
  args = parser.parse_args()
  # Run outputs stay beside the runs: a figure for docs/ is asked for.
  args.curve = args.curve or os.path.join(args.root, 'curves.png')
  args.finetune_curve = args.finetune_curve or os.path.join(
      args.root, 'finetune_curve.png')
  # A job started in the background inherits SIGINT ignored; Ctrl-C (or
  # kill -INT) must still stop it, at worst losing the steps since the last
  # checkpoint.
  signal.signal(signal.SIGINT, signal.default_int_handler)
  gin.parse_config_files_and_bindings(args.gin_file, [])
  seeds = [int(s) for s in args.seeds.split(',')]
  behaviour, episodes, transitions = behaviour_return(args.dataset)
  behaviour_score = envs.normalized_score(args.env, behaviour)
  common = {'dataset': args.dataset, 'episodes': episodes,
            'transitions': transitions, 'behaviour_return': round(behaviour, 1),
            'behaviour_normalized_score': round(behaviour_score, 2),
            'steps': args.steps, 'seeds': seeds,
            'cql_bc_steps': args.cql_bc_steps,
            'dataset_kind': args.dataset_kind, 'gin_files': args.gin_file,
            'critic_dtype': args.critic_dtype,
            'bootstrap_through_terminals': args.bootstrap_through_terminals,
            'machine': f'{os.cpu_count()} cores, {platform.machine()}, no GPU',
            'date': time.strftime('%Y-%m-%d')}
  specs = envs.env_specs(args.env)
  rlds_data = offline_data.check_and_cast(datasets.load(args.dataset), specs)
  if args.bootstrap_through_terminals:  # The runs read this push, not files.
    rlds_data = offline_data.without_terminations(rlds_data)
  data_spec = convert.create_trajectory_data_spec(rlds_data)
  common['feed'] = args.feed
  if args.feed == 'memory':  # Whole episodes, read into each run's memory.
    table = episode_table.make_table(
        offline.OFFLINE_TABLE, data_spec,
        max_episodes=offline_data.UNBOUNDED_TABLE_SIZE)
  else:  # 2-step items, sampled from Reverb for every batch.
    table = tables.make_table(
        offline.OFFLINE_TABLE, data_spec,
        max_size=offline_data.UNBOUNDED_TABLE_SIZE, min_size_to_sample=1)
  server = tables.start_server([table])
  address = f'localhost:{server.port}'
  t0 = time.perf_counter()
  if args.feed == 'memory':
    stats = offline_data.push_episodes(rlds_data, server.localhost_client(),
                                       offline.OFFLINE_TABLE)
    common['table_size'] = stats.items
  else:
    pushed = offline_data.push_to_new_table(
        rlds_data, server.localhost_client(), address, offline.OFFLINE_TABLE)
    common['table_size'], stats = pushed.table_size, pushed.pushed
  common['push_steps_per_s'] = round(stats.steps / (time.perf_counter() - t0))

  def run(agent: str, seed: int, **config) -> dict:
    return offline.train_offline(configs.make(configs.OfflineConfig, agent, {
        'dataset': args.dataset, 'env': args.env, 'reverb_address': address,
        'feed': args.feed, 'seed': seed,
        'root_dir': os.path.join(args.root, f'{agent}_seed{seed}'),
        'train_steps': args.steps, 'eval_interval': args.eval_interval,
        'checkpoint_interval': args.eval_interval,
        'eval_episodes': args.eval_episodes,
        'bootstrap_through_terminals': args.bootstrap_through_terminals,
        'agent_config.cql_bc_steps': args.cql_bc_steps,
        'agent_config.critic_dtype': (
            args.critic_dtype if registry.get(agent).ensemble_critics
            else 'float32'), **config}), show_progress=args.progress)

  all_curves, styles = {}, {}
  for agent_index, agent in enumerate(args.agents.split(',')):
    summaries = []
    for seed_index, seed in enumerate(seeds):
      summaries.append(run(agent, seed))
      styles[f'{agent} seed {seed}'] = curve_style(agent_index, seed_index)
      all_curves[f'{agent} seed {seed}'] = [
          r for r in loop.Learner.read_eval_log(
              os.path.join(args.root, f'{agent}_seed{seed}'))
          if r.get('phase') == 'offline']
    scores = [s['offline_normalized_score'] for s in summaries]
    returns = [s['offline_return'] for s in summaries]
    mean_return = float(np.mean(returns))
    if agent == 'bc':
      target = 'within 10% of the behaviour return'
      met = abs(mean_return - behaviour) <= 0.1 * abs(behaviour)
    else:
      target = 'at or above the behaviour return'
      met = mean_return >= behaviour
    print(json.dumps({
        'agent': agent, **common,
        'normalized_score_mean': round(float(np.mean(scores)), 2),
        'normalized_score_std': round(float(np.std(scores)), 2),
        'normalized_scores': [round(s, 2) for s in scores],
        'corl': CORL[args.dataset_kind].get(agent),
        'batch_size': configs.default(configs.OfflineConfig, agent,
                                      'batch_size'),
        'return_mean': round(mean_return, 1),
        'grad_steps_per_s': mean_rate(summaries, 'grad_steps_per_s', 1),
        'sampled_transitions_per_s': mean_rate(
            summaries, 'sampled_transitions_per_s', 0),
        'target': target, 'target_met': bool(met)}), flush=True)
  curves.plot_curves(all_curves, args.curve, x='train_step',
                     title=f'offline on {os.path.basename(args.dataset)}',
                     x_label='gradient steps', y_label='average return',
                     hlines={'behaviour': behaviour}, styles=styles)
  if args.finetune_steps:
    seed = seeds[0]
    summary = run('td3_bc', seed, online_finetune_steps=args.finetune_steps)
    print(json.dumps({
        'agent': 'td3_bc_finetune', **common, 'seed': seed,
        'finetune_env_steps': summary['finetune_env_steps'],
        'score_before': round(summary['offline_normalized_score'], 2),
        'score_after': round(summary['finetuned_normalized_score'], 2),
        'target': 'score after fine-tuning above the offline score',
        'target_met': bool(summary['finetuned_normalized_score'] >
                           summary['offline_normalized_score'])}),
          flush=True)
    plot_finetune(os.path.join(args.root, f'td3_bc_seed{seed}'),
                  args.finetune_curve, behaviour)
  server.stop()


def run_main() -> None:
  """main, with Ctrl-C as one line and exit 130: each run keeps its last
  checkpoint, and the same command resumes it."""
  try:
    main()
  except KeyboardInterrupt:
    sys.stdout.flush()
    print('offline: interrupted; the same command resumes each run from its '
          'last checkpoint under --root', file=sys.stderr, flush=True)
    sys.exit(130)


if __name__ == '__main__':
  run_main()
