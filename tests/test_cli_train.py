"""Short runs of `python -m pipelines.train`, as a user runs it.

Tiny budgets (a few hundred gradient steps, one evaluation episode) on a
tiny generated HalfCheetah dataset; each checks something the run must get
right: the JSON summary, the files of a run, resuming, and one-line errors.
Runs refused on their input run in a fork of a preloaded interpreter
(`_refused`, tests/preloaded_cli.py); runs that train start a fresh one.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from rlds_reverb.data import behaviour_policies
from rlds_reverb.data import recording
from pipeline_process import error_line  # pylint: disable=g-bad-import-order
import preloaded_cli  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
TIMEOUT_S = 600
EPISODES, LIMIT = 4, 50


def _train(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-m', 'pipelines.train', *args], cwd=REPO, env=ENV,
      capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def _refused(*args: str) -> subprocess.CompletedProcess:
  """A run that ends on its input, before any work: in a fork of the
  preloaded interpreter (tests/preloaded_cli.py), not a fresh one."""
  return preloaded_cli.run('train', *args, cwd=REPO, env=ENV,
                           timeout_s=TIMEOUT_S)


def _summary(proc: subprocess.CompletedProcess) -> dict:
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _tensorboard_tags(root: str) -> set[str]:
  """Every scalar tag a run wrote to its TensorBoard directory."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  board = os.path.join(root, 'tensorboard')
  return {value.tag for name in os.listdir(board)
          for event in tf.compat.v1.train.summary_iterator(
              os.path.join(board, name))
          for value in event.summary.value}


@pytest.fixture(scope='module')
def dataset(tmp_path_factory):
  out = tmp_path_factory.mktemp('data') / 'hc'
  recording.generate_dataset('HalfCheetah-v5', 'random', EPISODES, str(out),
                             seed=1, max_episode_steps=LIMIT,
                             show_progress=False)
  return str(out)


def test_offline_td3_bc_run_resume_and_files(dataset, tmp_path):
  root = str(tmp_path / 'run')
  common = ['--agent', 'td3_bc', '--dataset', dataset, '--root_dir', root,
            '--eval_interval', '100', '--checkpoint_interval', '100',
            '--eval_episodes', '1', '--batch_size', '32']
  first = _summary(_train(*common, '--steps', '200'))
  assert first['train_steps'] == 200
  # The whole dataset: one episode item each, every transition in memory.
  assert first['feed'] == 'memory'
  assert first['table_size'] == EPISODES
  assert first['transitions'] == EPISODES * LIMIT
  low, high = -280.178953, 12135.0
  assert first['offline_normalized_score'] == pytest.approx(
      100 * (first['offline_return'] - low) / (high - low))
  assert first['grad_steps_per_s'] > 0
  for name in ('learning_curve.png', 'eval.jsonl', 'policy_offline.npz',
               'observation_stats.npz', 'checkpoints', 'tensorboard'):
    assert os.path.exists(os.path.join(root, name)), name
  assert any(f.startswith('events') for f in os.listdir(
      os.path.join(root, 'tensorboard')))
  # Resume: the second run starts at 200 and only adds 100 steps.
  second = _summary(_train(*common, '--steps', '300'))
  assert second['train_steps'] == 300
  with open(os.path.join(root, 'eval.jsonl')) as f:
    steps = [json.loads(line)['train_step'] for line in f]
  assert steps == [100, 200, 300]
  # Another agent or seed in the same root_dir is refused before anything
  # there changes.
  before = {name: os.path.getmtime(os.path.join(root, name))
            for name in os.listdir(root)}
  other = ['bc' if arg == 'td3_bc' else arg for arg in common]
  line = error_line(_refused(*other, '--seed', '1', '--steps', '400'), 'train')
  assert "agent 'bc' (recorded 'td3_bc')" in line, line
  assert 'seed 1 (recorded 0)' in line and 'another root_dir' in line, line
  assert {name: os.path.getmtime(os.path.join(root, name))
          for name in os.listdir(root)} == before


def test_offline_to_online_reports_both_scores(dataset, tmp_path):
  summary = _summary(_train(
      '--agent', 'td3_bc', '--dataset', dataset, '--root_dir',
      str(tmp_path / 'ft'), '--steps', '100', '--eval_interval', '100',
      '--eval_episodes', '1', '--batch_size', '32',
      '--online_finetune_steps', '1000', '--train_every', '1000'))
  assert summary['finetune_env_steps'] == 1000
  assert 'offline_normalized_score' in summary
  assert 'finetuned_normalized_score' in summary
  assert summary['train_steps'] == 100
  # The dataset's copy and the online episodes are checkpointed apart.
  for name in ('reverb', 'reverb_online'):
    assert os.listdir(tmp_path / 'ft' / name), name


def test_online_sac_short_run(tmp_path, monkeypatch):
  root = str(tmp_path / 'sac')
  summary = _summary(_train(
      '--agent', 'sac', '--env', 'HalfCheetah-v5', '--root_dir', root,
      '--steps', '2000', '--initial_collect_steps', '1000',
      '--train_every', '1000', '--eval_interval', '2000',
      '--eval_episodes', '1', '--batch_size', '32', '--snapshot_interval',
      '1000'))
  assert summary['env_steps'] == 2000
  # Learning starts once the 1000 random steps are in: then 1000 gradient
  # steps after each of the two collection phases.
  assert summary['train_step'] == 2000
  assert sorted(os.listdir(os.path.join(root, 'policies'))) == [
      'step_00001000.npz', 'step_00002000.npz']
  # Its snapshots become shipped behaviour policies and a replay schedule.
  monkeypatch.setattr(behaviour_policies, 'POLICY_DIR', tmp_path / 'ship')
  shipped = behaviour_policies.ship_from_run(root, 'HalfCheetah-v5',
                                             initial_collect_steps=1000)
  assert shipped['final_step'] == 2000
  assert shipped['medium_step'] == 2000  # The only evaluated snapshot.
  assert behaviour_policies.shipped_names('HalfCheetah-v5') == [
      'final', 'medium']
  assert behaviour_policies.replay_schedule('HalfCheetah-v5') == [
      {'policy': 'random', 'env_steps': 1000},
      {'policy': 'step_00001000', 'env_steps': 1000}]
  replay = recording.generate_dataset(
      'HalfCheetah-v5', 'random', None, str(tmp_path / 'replay'), seed=0,
      max_episode_steps=500, dataset_kind='medium-replay',
      show_progress=False)
  assert (replay.num_episodes, replay.num_env_steps) == (4, 2000)
  out = tmp_path / 'gen'
  # A snapshot is a behaviour policy for pipelines.generate.
  generated = recording.generate_dataset(
      'HalfCheetah-v5', os.path.join(root, 'policy.npz'), 1, str(out),
      seed=0, max_episode_steps=10, show_progress=False)
  assert generated.num_env_steps == 10
  assert np.isfinite(generated.mean_return)


def test_dqn_per_double_dueling_run_and_resume(tmp_path):
  root = str(tmp_path / 'dqn')
  common = ['--agent', 'dqn', '--env', 'CartPole-v1', '--replay',
            'prioritized', '--double', '--dueling', '--root_dir', root,
            '--eval_interval', '512', '--eval_episodes', '2',
            '--checkpoint_interval', '512']
  first = _summary(_train(*common, '--steps', '1024'))
  # dqn defaults: 1000 random steps, then 128 gradient steps per 256.
  assert first['env_steps'] == 1024 and first['train_step'] == 128
  assert first['average_return'] > 0
  for name in ('eval.jsonl', 'learning_curve.png', 'policy.npz',
               'policy/greedy/saved_model.pb',
               'policy/collect/saved_model.pb', 'checkpoints', 'tensorboard',
               'reverb'):
    assert os.path.exists(os.path.join(root, name)), name
  # pipelines.evaluate reads the SavedModels and the npz alike.
  scores = [json.loads(preloaded_cli.run(
      'evaluate', '--policy', os.path.join(root, policy), '--env',
      'CartPole-v1', '--episodes', '3', cwd=REPO, env=ENV,
      timeout_s=TIMEOUT_S).stdout) for policy in ('policy', 'policy.npz')]
  assert scores[0]['returns'] == scores[1]['returns']
  assert scores[0]['episodes'] == 3 and scores[0]['normalized_score'] is None
  # Sticky actions are an Atari setting: refused for CartPole.
  sticky = preloaded_cli.run(
      'evaluate', '--policy', os.path.join(root, 'policy.npz'), '--env',
      'CartPole-v1', '--repeat_action_probability', '0', cwd=REPO, env=ENV,
      timeout_s=TIMEOUT_S)
  assert sticky.returncode == 2
  assert sticky.stderr.strip().splitlines()[-1] == (
      "evaluate: error: --repeat_action_probability is for Atari envs "
      "(ALE/..., ...NoFrameskip-v4), not 'CartPole-v1'")
  # Rerunning with a larger budget resumes: 2 more phases, not 6.
  second = _summary(_train(*common, '--steps', '1536'))
  assert second['env_steps'] == 1536 and second['train_step'] == 384
  evals = [json.loads(line) for line in open(os.path.join(root,
                                                          'eval.jsonl'))]
  assert [e['env_steps'] for e in evals] == [512, 1024, 1536]
  # Moved without its replay, it is refused rather than run on empty.
  moved = str(tmp_path / 'moved')
  shutil.copytree(root, moved, ignore=shutil.ignore_patterns('reverb'))
  line = error_line(_refused(*[moved if arg == root else arg for arg in common],
                           '--steps', '2048'), 'train')
  assert ('1536 env steps into training, but its episodes were not '
          f'restored from {moved}/reverb') in line, line
  tags = _tensorboard_tags(root)
  assert {'per/beta', 'per/max_priority', 'eval/average_return'} <= tags


@pytest.mark.parametrize('args, message', [
    (['--agent', 'nope'], 'flag --agent=nope'),
    (['--agent', 'dqn'], 'agent dqn needs discrete actions; env '
     'HalfCheetah-v5 has continuous ones'),
    (['--agent', 'sac', '--env', 'CartPole-v1', '--steps', '10'],
     'env CartPole-v1 has discrete actions'),
    (['--agent', 'bc', '--dataset', 'x', '--replay', 'prioritized'],
     'bc has no TD error to prioritize by'),
    (['--agent', 'dqn', '--env', 'CartPole-v1', '--per_beta0', '2'],
     'flag --per_beta0=2'),
    (['--agent', 'bc'], '--agent bc needs offline data'),
    # Offline agents go online only to fine-tune after the offline phase.
    (['--agent', 'td3_bc'], '--agent td3_bc needs offline data'),
    (['--agent', 'cql_sac', '--env', 'Hopper-v5'],
     'cql_sac trains online only as fine-tuning after the offline phase: '
     '--online_finetune_steps'),
    (['--agent', 'sac', '--dataset', 'x'], '--agent sac trains online'),
    (['--agent', 'bc', '--dataset', '/no/such/dir'],
     'dataset path /no/such/dir does not exist'),
    (['--agent', 'bc', '--dataset', 'd4rl_mujoco_halfcheetah/v2-medium',
      '--nodownload', '--data_dir', '/tmp/rlds_reverb_no_data'],
     "TFDS dataset 'd4rl_mujoco_halfcheetah/v2-medium' is not prepared"),
    (['--agent', 'bc', '--reverb_address', 'localhost:1'],
     'cannot reach Reverb server at localhost:1'),
    (['--agent', 'sac', '--reconnect'],
     '--reconnect and --reconnect_timeout_s are for a remote table'),
    (['--agent', 'td3_bc', '--dataset', 'x', '--reverb_address', 'y:1'],
     'not both'),
    (['--agent', 'sac', '--batch_size', '0'], 'flag --batch_size=0'),
    (['--agent', 'cql_sac', '--cql_bc_steps', '-1'],
     'flag --cql_bc_steps=-1'),
])
def test_bad_input_gives_one_error_line(args, message, tmp_path):
  root = tmp_path / 'r'
  line = error_line(_refused(*args, '--root_dir', str(root)), 'train')
  assert message in line, line
  # A run refused on its input leaves no run directory behind.
  assert not root.exists(), sorted(os.listdir(root))


def test_dataset_for_another_env_is_refused(dataset, tmp_path):
  line = error_line(_refused('--agent', 'bc', '--dataset', dataset,
                            '--env', 'Hopper-v5', '--root_dir',
                            str(tmp_path / 'r')), 'train')
  assert "'observation' has shape [17] but env Hopper-v5 needs [11]" in line


def test_her_online_fetchreach_run_resume_and_success_rate(tmp_path):
  root = str(tmp_path / 'her')
  common = ['--agent', 'td3', '--env', 'FetchReach-v4', '--her', 'future',
            '--root_dir', root, '--initial_collect_steps', '100',
            '--train_every', '100', '--eval_interval', '200',
            '--eval_episodes', '2', '--checkpoint_interval', '100']
  first = _summary(_train(*common, '--steps', '200'))
  assert first['env_steps'] == 200 and first['train_step'] == 200
  assert first['episodes'] == 2 and 0.0 <= first['success_rate'] <= 1.0
  second = _summary(_train(*common, '--steps', '400'))
  assert second['env_steps'] == 400 and second['train_step'] == 400
  with open(os.path.join(root, 'eval.jsonl')) as f:
    records = [json.loads(line) for line in f]
  assert [r['env_steps'] for r in records] == [200, 400]
  assert all('success_rate' in r for r in records)
  tags = _tensorboard_tags(root)
  assert {'eval/success_rate', 'collect/success_rate'} <= tags
  assert os.path.exists(os.path.join(root, 'learning_curve.png'))


def test_her_offline_from_generated_goal_data(tmp_path):
  data = str(tmp_path / 'reach')
  recording.generate_dataset('FetchReach-v4', 'random', 6, data, seed=0,
                             max_episode_steps=20, show_progress=False)
  summary = _summary(_train(
      '--agent', 'td3_bc', '--env', 'FetchReach-v4', '--dataset', data,
      '--her', 'final', '--k', '1', '--steps', '100', '--eval_interval',
      '100', '--eval_episodes', '2', '--batch_size', '32',
      '--root_dir', str(tmp_path / 'run')))
  # Six 20-step episodes, read once into the memory, relabelled there.
  assert summary['feed'] == 'memory' and summary['table_size'] == 6
  assert summary['transitions'] == 6 * 20 and summary['train_steps'] == 100
  assert summary['her'] == 'final' and summary['k'] == 1.0
  assert 0.0 <= summary['success_rate'] <= 1.0


@pytest.mark.parametrize('args, message', [
    (['--agent', 'td3', '--her', 'future', '--steps', '10'],
     'HER needs a goal env'),
    (['--agent', 'td3', '--env', 'FetchReach-v4', '--steps', '10'],
     'train it with her (--her future)'),
    (['--agent', 'bc', '--dataset', 'x', '--her', 'future'],
     '--agent bc does not train offline with --her'),
    (['--agent', 'td3', '--her', 'nearest'], 'flag --her=nearest'),
])
def test_her_bad_input_gives_one_error_line(args, message, tmp_path):
  line = error_line(_refused(*args, '--root_dir', str(tmp_path / 'r')), 'train')
  assert message in line, line


def test_her_offline_refuses_flat_data(dataset, tmp_path):
  line = error_line(_refused('--agent', 'td3', '--env', 'FetchReach-v4',
                            '--dataset', dataset, '--her', 'future',
                            '--root_dir', str(tmp_path / 'r')), 'train')
  assert 'needs goal-conditioned data with dict observations' in line, line


def test_gin_bindings_set_what_flags_leave_unset(dataset, tmp_path):
  root = tmp_path / 'gin'
  summary = _summary(_train(
      '--agent', 'bc', '--dataset', dataset, '--root_dir', str(root),
      '--steps', '20', '--eval_interval', '20', '--eval_episodes', '1',
      '--gin_bindings', 'AgentConfig.actor_layers = (32,)',
      '--gin_bindings', 'OfflineConfig.batch_size = 16',
      '--batch_size', '8'))  # A flag on the command line beats gin.
  assert summary['batch_size'] == 8
  with open(root / 'config.json') as f:
    config = json.load(f)
  assert config['agent_config']['actor_layers'] == [32]
  assert config['batch_size'] == 8 and config['train_steps'] == 20
  # The network trained is the one bound.
  assert np.load(root / 'policy_offline.npz')['kernel_0'].shape == (17, 32)


def test_gin_binding_beats_the_pipelines_dqn_defaults(tmp_path):
  root = tmp_path / 'dqn'
  _summary(_train(
      '--agent', 'dqn', '--env', 'CartPole-v1', '--root_dir', str(root),
      '--gin_bindings', 'OnlineConfig.batch_size = 32',
      '--gin_bindings', 'OnlineConfig.train_every = 100',
      '--gin_bindings', 'OnlineConfig.initial_collect_steps = 100',
      '--train_every', '50', '--steps', '100', '--eval_episodes', '1'))
  with open(root / 'config.json') as f:
    config = json.load(f)
  assert config['batch_size'] == 32  # gin, over dqn's 64.
  assert config['train_every'] == 50  # The flag, over gin.
  assert config['initial_collect_steps'] == 100
  assert config['eval_interval'] == 1000  # dqn's own default.


@pytest.mark.parametrize('args, message', [
    (['--gin_bindings', 'AgentConfig.actor_layerz = (32,)'],
     "train: error: gin: Configurable 'AgentConfig' doesn't have a "
     "parameter named 'actor_layerz'. In bindings string line 1 "
     'AgentConfig.actor_layerz = (32,)'),
    (['--gin_bindings', 'NoConfig.x = 1'],
     "train: error: gin: No configurable matching 'NoConfig'."),
    (['--gin_file', '/no/such.gin'],
     'train: error: --gin_file /no/such.gin: no such file'),
])
def test_bad_gin_is_a_usage_error(args, message, tmp_path):
  proc = _refused('--agent', 'bc', '--dataset', 'x', '--root_dir',
                str(tmp_path / 'r'), *args)
  assert proc.returncode == 2
  assert error_line(proc, 'train').startswith(message)


def test_ppo_cartpole_run_resume_and_files(tmp_path):
  root = str(tmp_path / 'ppo')
  common = ['--agent', 'ppo', '--env', 'CartPole-v1', '--root_dir', root,
            '--eval_interval', '1024', '--eval_episodes', '2',
            '--checkpoint_interval', '1024']
  first = _summary(_train(*common, '--steps', '1024'))
  # ppo on discrete actions: 8 envs x 32 steps a rollout, 20 epochs of 1.
  assert first['env_steps'] == 1024 and first['train_step'] == 4 * 20
  for name in ('eval.jsonl', 'learning_curve.png', 'policy.npz',
               'checkpoints', 'tensorboard', 'config.json'):
    assert os.path.exists(os.path.join(root, name)), name
  second = _summary(_train(*common, '--steps', '2048'))
  assert second['env_steps'] == 2048 and second['train_step'] == 8 * 20
  evals = [json.loads(line) for line in open(os.path.join(root,
                                                          'eval.jsonl'))]
  assert [e['env_steps'] for e in evals] == [1024, 2048]
  # Rerun at its end: nothing to train or evaluate, the summary still
  # holds the run's last evaluation.
  third = _summary(_train(*common, '--steps', '2048'))
  assert third['env_steps'] == 2048
  assert third['average_return'] == evals[-1]['average_return']
  tags = _tensorboard_tags(root)
  assert {'train/approx_kl', 'train/clip_fraction', 'train/value_loss',
          'collect/return', 'eval/average_return'} <= tags
  # Another setting in the same root_dir is refused, naming it.
  line = error_line(
      _refused(*common, '--steps', '2048', '--epochs', '3'), 'train')
  assert 'ppo_config.epochs 3 (recorded 20)' in line, line


def test_a2c_pendulum_short_run_with_flags(tmp_path):
  root = str(tmp_path / 'a2c')
  summary = _summary(_train(
      '--agent', 'a2c', '--env', 'Pendulum-v1', '--root_dir', root,
      '--steps', '400', '--eval_interval', '400', '--eval_episodes', '1',
      '--num_envs', '2', '--rollout_steps', '10', '--noproper_time_limits'))
  assert summary['env_steps'] == 400 and summary['train_step'] == 20
  with open(os.path.join(root, 'config.json')) as f:
    recorded = json.load(f)['ppo_config']
  assert recorded['algorithm'] == 'a2c'
  assert recorded['proper_time_limits'] is False
  assert recorded['num_envs'] == 2 and recorded['rollout_steps'] == 10


def test_recurrent_ppo_on_cartpole_without_velocities(tmp_path):
  root = str(tmp_path / 'rec')
  summary = _summary(_train(
      '--agent', 'ppo', '--env', 'CartPoleNoVelocity-v1', '--recurrent',
      '--root_dir', root, '--steps', '512', '--eval_interval', '512',
      '--eval_episodes', '2'))
  assert summary['env_steps'] == 512 and summary['average_return'] > 0
  with open(os.path.join(root, 'config.json')) as f:
    assert json.load(f)['ppo_config']['recurrent'] is True
  from rlds_reverb.acting import recurrent_policy  # pylint: disable=g-import-not-at-top
  assert recurrent_policy.is_recurrent_file(os.path.join(root, 'policy.npz'))


def test_ppo_gail_short_run_from_recorded_demonstrations(tmp_path):
  expert = str(tmp_path / 'expert')
  recording.generate_dataset('HalfCheetah-v5', 'final', 2, expert, seed=1,
                             max_episode_steps=60, show_progress=False)
  root = str(tmp_path / 'gail')
  summary = _summary(_train(
      '--agent', 'ppo', '--env', 'HalfCheetah-v5', '--root_dir', root,
      '--steps', '512', '--eval_interval', '512', '--eval_episodes', '1',
      '--rollout_steps', '256', '--minibatches', '4', '--epochs', '1',
      '--gail_dataset', expert, '--gail_trajectories', '2',
      '--gail_subsample', '3', '--gail_epochs', '1'))
  assert summary['env_steps'] == 512
  with open(os.path.join(root, 'config.json')) as f:
    recorded = json.load(f)
  assert recorded['gail_dataset'] == expert
  assert recorded['gail_subsample'] == 3
  tags = _tensorboard_tags(root)
  assert {'gail/expert_loss', 'gail/gradient_penalty', 'gail/policy_reward',
          'train/loss'} <= tags


@pytest.mark.parametrize('args, message', [
    (['--agent', 'ppo', '--gail_trajectories', '2'],
     'GAIL needs its demonstrations: pass --gail_dataset'),
    (['--agent', 'sac', '--gail_dataset', 'x'],
     '--gail_dataset: for the on-policy agents (ppo, a2c, acktr) only'),
    (['--agent', 'ppo', '--env', 'CartPole-v1', '--gail_dataset', 'x'],
     'GAIL here takes continuous actions'),
    (['--agent', 'ppo', '--env', 'CartPoleNoVelocity-v1', '--recurrent',
      '--num_envs', '6', '--minibatches', '4'],
     'minibatches (4) must divide num_envs (6)'),
    (['--agent', 'dqn', '--env', 'CartPole-v1', '--recurrent'],
     '--recurrent: for the on-policy agents (ppo, a2c, acktr) only'),
    (['--agent', 'ppo', '--env', 'CartPole-v1', '--batch_size', '64'],
     '--batch_size are for the off-policy agents'),
    (['--agent', 'a2c', '--env', 'CartPole-v1', '--epochs', '4'],
     '--epochs: for --agent ppo only'),
    (['--agent', 'a2c', '--env', 'CartPole-v1', '--kfac_damping', '0.1'],
     '--kfac_damping: for --agent acktr only'),
    (['--agent', 'acktr', '--env', 'CartPole-v1', '--recurrent'],
     'acktr takes feed-forward policies'),
    (['--agent', 'ppo', '--gail_dataset', '/no/such/dir'],
     'dataset path /no/such/dir does not exist'),
    (['--agent', 'ppo', '--dataset', 'x'],
     '--agent ppo learns from its own rollouts in --env'),
    (['--agent', 'a2c', '--env', 'CartPole-v1', '--replay', 'prioritized'],
     '--agent a2c is on-policy'),
    (['--agent', 'sac', '--epochs', '3'], '--epochs: for the on-policy agents'),
    (['--agent', 'ppo', '--env', 'CartPole-v1', '--minibatches', '7'],
     'minibatches (7) must divide the rollout size'),
    (['--agent', 'ppo', '--env', 'FetchReach-v4'],
     'on-policy agents take flat observations'),
    (['--agent', 'ppo', '--gae_lambda', '2'], 'flag --gae_lambda=2'),
])
def test_onpolicy_bad_input_gives_one_error_line(args, message, tmp_path):
  root = tmp_path / 'r'
  line = error_line(_refused(*args, '--root_dir', str(root)), 'train')
  assert message in line, line
  assert not root.exists(), sorted(os.listdir(root))
