"""examples/: TF-Agents-style train_eval scripts, run end to end on a small
budget as a user runs them (a subprocess each)."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2')
TIMEOUT_S = 900


def _run(script: str, root: str, *bindings: str) -> dict:
  proc = subprocess.run(
      [sys.executable, str(REPO / 'examples' / script), '--root_dir', root,
       *[f'--gin_bindings={b}' for b in bindings]],
      capture_output=True, text=True, cwd=REPO, env=ENV, timeout=TIMEOUT_S,
      check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  # Its Reverb server says that it listens on every interface.
  assert 'listens on all interfaces' in proc.stderr
  return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cql_sac_offline_trains_saves_and_resumes(cheetah, tmp_path):
  summary, _ = cheetah
  root = str(tmp_path / 'cql')
  small = ['train_eval.dataset="%s"' % summary.out_dir,
           'train_eval.actor_fc_layers=(16,)',
           'train_eval.critic_joint_fc_layers=(16,)',
           'train_eval.bc_steps=5', 'train_eval.eval_episodes=1',
           'train_eval.learner_iterations_per_call=10',
           'train_eval.eval_interval=20', 'train_eval.policy_save_interval=20']
  first = _run('cql_sac_offline.py', root, *small,
               'train_eval.num_gradient_updates=20')
  assert first['train_step'] == 20
  assert np.isfinite(first['AverageReturn'])
  assert first['AverageEpisodeLength'] == 1000
  assert os.path.isfile(os.path.join(root, 'policies', 'greedy_policy',
                                     'saved_model.pb'))
  # A larger budget resumes from the checkpoint at 20.
  second = _run('cql_sac_offline.py', root, *small,
                'train_eval.num_gradient_updates=30')
  assert second['train_step'] == 30


def test_sac_online_collects_polls_and_trains(tmp_path):
  root = str(tmp_path / 'sac')
  result = _run('sac_online.py', root, 'train_eval.env_name="Pendulum-v1"',
                'train_eval.num_iterations=320',
                'train_eval.initial_collect_steps=400',
                'train_eval.batch_size=32',
                'train_eval.actor_fc_layers=(16,)',
                'train_eval.critic_joint_fc_layers=(16,)',
                'train_eval.eval_interval=320', 'train_eval.eval_episodes=1',
                'train_eval.policy_save_interval=320')
  assert result['train_step'] == 320 and result['env_steps'] == 720
  # Pendulum's episodes are 200 steps. The first is written in the random
  # steps; the second is cut by the collect actor's reset (written at its
  # first step); the third ends at env step 600 and is read by the
  # buffer's poll at batch 201 (polls every 100 batches).
  assert result['episodes_in_memory'] == 3
  assert result['AverageEpisodeLength'] == 200
  assert np.isfinite(result['AverageReturn'])
  assert os.path.isfile(os.path.join(root, 'policies', 'collect_policy',
                                     'saved_model.pb'))


def test_dqn_per_weights_updates_and_evaluates(tmp_path):
  root = str(tmp_path / 'dqn')
  result = _run('dqn_per.py', root, 'train_eval.num_iterations=200',
                'train_eval.initial_collect_steps=300',
                'train_eval.batch_size=32', 'train_eval.fc_layer_params=(16,)',
                'train_eval.eval_interval=200', 'train_eval.eval_episodes=2',
                'train_eval.checkpoint_interval=100')
  assert result['train_step'] == 200 and result['env_steps'] == 500
  # The drawn transitions got their own |td_error| + eps priorities.
  assert result['distinct_priorities'] > 32
  assert np.isfinite(result['AverageReturn'])
  assert os.path.isfile(os.path.join(root, 'policies', 'greedy_policy',
                                     'saved_model.pb'))


def test_td3_her_on_fetch_reach_relabels_and_evaluates(tmp_path):
  root = str(tmp_path / 'td3_her')
  result = _run('td3_her.py', root, 'train_eval.num_iterations=150',
                'train_eval.initial_collect_steps=100',
                'train_eval.batch_size=32',
                'train_eval.fc_layer_params=(16,)',
                'train_eval.eval_interval=150', 'train_eval.eval_episodes=2',
                'train_eval.checkpoint_interval=150')
  assert result['train_step'] == 150
  # FetchReach's episodes are 50 steps: 2 random ones (the second cut by
  # the collect actor's reset), then 2 collected by the poll at batch 101.
  assert result['episodes_in_memory'] == 4
  assert result['AverageEpisodeLength'] == 50
  assert -50 <= result['AverageReturn'] <= 0
