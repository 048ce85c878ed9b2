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
