"""The offline RL learners (iql, awac, rebrac, sac_n, edac, cal_ql) through
the offline run loop: Reverb episode table, in-memory feed, evaluation,
checkpoint, export, resume; reward scaling; the refusals."""

import argparse
import json
import os
import shutil
import subprocess
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

import rlds_reverb
from rlds_reverb.data import recording
from rlds_reverb.storage import tables
from rlds_reverb.acting import envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import offline
from rlds_reverb.experiments import offline_data
from rlds_reverb.experiments import run
from rlds_reverb.agents.offline import sac_n  # pylint: disable=unused-import (gin)
from rlds_reverb.replay import episode_table
from conftest import _rlds, tools_module  # pylint: disable=g-bad-import-order

_LENGTHS = [40, 30, 25]
_REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..')


@pytest.fixture(name='served')
def _served():
  """A server with an episode table holding three random episodes."""
  rlds_data = _rlds(_LENGTHS, dtype=np.float32)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  server = tables.start_server([episode_table.make_table('rlds', spec,
                                                         max_episodes=10)])
  rlds_reverb.push_rlds_to_table(rlds_data, server.localhost_client(), 'rlds',
                                 sequence_length=None,
                                 priority=episode_table.UNREAD)
  yield f'localhost:{server.port}'
  server.stop()


def _config(address, root, agent, steps=30, **overrides):
  return offline.OfflineConfig(
      agent=agent, dataset='table', root_dir=str(root),
      reverb_address=address, train_steps=steps, batch_size=16,
      eval_interval=steps, eval_episodes=1, checkpoint_interval=steps,
      seed=1, agent_config=factory.AgentConfig(
          actor_layers=(16,), critic_layers=(16,), seed=1), **overrides)


# The HalfCheetah data needs continuous actions; the discrete learners'
# runs are in test_discrete_offline.py.
@pytest.mark.parametrize('agent', registry.names(registry.OFFLINE,
                                                 discrete=False))
def test_each_learner_trains_exports_and_resumes(served, tmp_path, agent):
  gin.clear_config()
  gin.parse_config('SacNConfig.num_critics = 3')
  try:
    root = tmp_path / agent
    summary = offline.train_offline(_config(served, root, agent),
                                    show_progress=False)
    assert summary['train_steps'] == 30
    assert summary['transitions'] == sum(n - 1 for n in _LENGTHS)
    assert np.isfinite(summary['offline_normalized_score'])
    policy = numpy_policy.load(str(root / 'policy_offline.npz'))
    assert policy.head == registry.get(agent).head
    assert policy.metadata['agent'] == agent
    records = loop.Learner.read_eval_log(str(root))
    assert [r['train_step'] for r in records] == [30]
    # Resumed with a larger budget: it goes on from step 30.
    summary = offline.train_offline(_config(served, root, agent, steps=45),
                                    show_progress=False)
    assert summary['train_steps'] == 45
    assert [r['train_step'] for r in loop.Learner.read_eval_log(
        str(root))] == [30, 45]
  finally:
    gin.clear_config()


# td3_bc and cal_ql fine-tune in the tests below, with more to check.
@pytest.mark.parametrize('agent', [
    a for a in registry.names(registry.FINETUNE) if a not in ('td3_bc',
                                                               'cal_ql')])
def test_each_fine_tuning_agent_fine_tunes(served, tmp_path, agent):
  """Every agent whose record names fine-tuning goes online after its
  offline phase: one HalfCheetah episode, its gradient steps, the
  fine-tuned policy exported."""
  gin.clear_config()
  gin.parse_config('SacNConfig.num_critics = 3')
  try:
    root = tmp_path / agent
    summary = offline.train_offline(_config(
        served, root, agent, steps=4, online_finetune_steps=1000,
        train_every=50), show_progress=False)
  finally:
    gin.clear_config()
  assert summary['finetune_env_steps'] == 1000
  assert np.isfinite(summary['finetuned_normalized_score'])
  assert (root / 'policy_finetuned.npz').exists()
  records = loop.Learner.read_eval_log(str(root))
  assert records[-1]['phase'] == 'online'
  assert records[-1]['train_step'] > 4  # It learnt online.


def test_iql_scales_rewards_by_the_data_returns(served, tmp_path):
  """IQL's default: rewards x 1000 / (max - min episode return)."""
  config = _config(served, tmp_path / 'iql', 'iql', steps=2)
  assert config.scales_rewards and config.normalizes
  offline.train_offline(config, show_progress=False)
  rewards = []
  for n in _LENGTHS:  # The draws of conftest._rlds, in its order.
    rng = np.random.default_rng(n)
    rng.normal(size=(n, 17)), rng.uniform(-1, 1, (n, 6))
    # The last step holds no transition.
    rewards.append(rng.normal(size=n).astype(np.float32)[:-1].sum())
  expected = 1000.0 / np.ptp(rewards)
  agent = registry.make_agent('iql', *_specs(), config.agent_config)
  checkpoint = tf.train.Checkpoint(agent=agent)
  checkpoint.restore(tf.train.latest_checkpoint(
      str(tmp_path / 'iql' / loop.CHECKPOINT_DIR))).expect_partial()
  assert float(agent.reward_scale) == pytest.approx(expected, rel=1e-4)
  assert not _config(served, tmp_path / 'x', 'rebrac').scales_rewards


def _specs():
  from rlds_reverb.acting import envs  # pylint: disable=g-import-not-at-top
  specs = envs.env_specs('HalfCheetah-v5')
  return specs.time_step_spec, specs.action_spec


def test_reward_scale_needs_different_returns():
  assert offline_data.reward_scale(np.array([0.0, 500.0])) == 2.0
  with pytest.raises(ValueError, match='episodes of different returns'):
    offline_data.reward_scale(np.array([3.0, 3.0]))


@pytest.mark.parametrize('agent,overrides,message', [
    ('rebrac', dict(n_step=3), 'rebrac takes one-step transitions'),
    ('cal_ql', dict(n_step=2), 'cal_ql takes one-step transitions'),
    ('cal_ql', dict(feed='stream'), "return-to-go from the memory feed"),
    ('cal_ql', dict(replay='prioritized'), 'return-to-go from the memory'),
    ('td3_bc', dict(normalize_rewards=True), 'reward scaling'),
])
def test_refusals(tmp_path, agent, overrides, message):
  config = _config('', tmp_path / 'r', agent, **overrides)
  config.reverb_address = ''
  with pytest.raises(ValueError, match=message):
    offline.train_offline(config, show_progress=False)
  assert not os.path.exists(tmp_path / 'r' / 'config.json')


def test_cal_ql_fine_tunes_on_half_offline_half_online_batches(served,
                                                                tmp_path):
  """Offline, then online: both halves carry returns-to-go; the online
  episodes are collected, evaluated and the fine-tuned policy exported."""
  root = tmp_path / 'cal_ql'
  summary = offline.train_offline(_config(
      served, root, 'cal_ql', steps=20, online_finetune_steps=2000,
      train_every=500), show_progress=False)
  assert summary['finetune_env_steps'] == 2000
  assert np.isfinite(summary['finetuned_normalized_score'])
  assert (root / 'policy_finetuned.npz').exists()
  records = loop.Learner.read_eval_log(str(root))
  assert records[0]['phase'] == 'offline' and records[-1]['phase'] == 'online'
  # The memory takes whole episodes (1,000 steps): learning starts once
  # the first is in, then 500 gradient steps per 500 env steps (at 1,000,
  # 1,500 and 2,000).
  assert records[-1]['train_step'] == 20 + 1500
  # The interval's evaluation at 2,000 env steps is the final one, logged
  # once.
  online = [r['env_steps'] for r in records if r['phase'] == 'online']
  assert online == sorted(set(online)) and online[-1] == 2000, online


def _online_episodes(root) -> int:
  """Episodes in a fine-tuning run's online checkpoint (Reverb restores the
  table's own configuration whatever the one given here)."""
  specs = envs.env_specs('HalfCheetah-v5')
  server = tables.start_server(
      [episode_table.make_table(offline.FINETUNE_TABLE,
                                run.trajectory_spec(specs), max_episodes=8)],
      checkpoint_dir=str(root / run.ONLINE_REVERB_CHECKPOINTS))
  try:
    return tables.get_table_info(server.localhost_client(),
                                 offline.FINETUNE_TABLE).current_size
  finally:
    server.stop()


def test_fine_tuning_resumes_with_its_online_episodes(served, tmp_path):
  """The online episodes have a checkpoint of their own, which a resumed
  run restores; a resume without it is refused, not run on empty."""
  root = tmp_path / 'td3_bc'
  first = offline.train_offline(_config(
      served, root, 'td3_bc', steps=10, online_finetune_steps=1000,
      train_every=500), show_progress=False)
  assert first['finetune_env_steps'] == 1000
  assert _online_episodes(root) == 1  # HalfCheetah: 1,000 steps each.
  # Moved without its online checkpoint: refused, naming what is missing.
  moved = tmp_path / 'moved'
  shutil.copytree(root, moved)
  shutil.rmtree(moved / run.ONLINE_REVERB_CHECKPOINTS)
  with pytest.raises(RuntimeError, match=(
      r'1000 env steps into fine-tuning, but its episodes were not '
      r'restored from .*moved/reverb_online')):
    offline.train_offline(_config(
        served, moved, 'td3_bc', steps=10, online_finetune_steps=2000,
        train_every=500), show_progress=False)
  second = offline.train_offline(_config(
      served, root, 'td3_bc', steps=10, online_finetune_steps=2000,
      train_every=500), show_progress=False)
  assert second['finetune_env_steps'] == 2000
  assert _online_episodes(root) == 2  # The first came back, one was added.


@pytest.mark.parametrize('env_steps,episode_steps,restored,refused', [
    (999, 1000, False, False),  # Short of one whole episode: may hold none.
    (1000, 1000, False, True),
    (5000, 1000, True, False),
    (5000, None, False, False),  # No time limit: cannot be told apart.
])
def test_lost_episodes_are_refused_from_one_whole_episode_on(
    env_steps, episode_steps, restored, refused):
  check = lambda: run.check_episodes_restored(
      'runs/x', 'reverb_online', env_steps, episode_steps, restored,
      'fine-tuning')
  if refused:
    with pytest.raises(RuntimeError, match=(
        r'runs/x: this run is 1000 env steps into fine-tuning, but its '
        r'episodes were not restored from runs/x/reverb_online')):
      check()
  else:
    check()


def test_a_resume_under_other_method_settings_is_refused(served, tmp_path):
  """The gin-bound method settings are part of the recorded run."""
  from rlds_reverb.experiments import resume  # pylint: disable=g-import-not-at-top
  root = tmp_path / 'rebrac'
  gin.clear_config()
  try:
    summary = offline.train_offline(_config(served, root, 'rebrac', steps=4),
                                    show_progress=False)
    assert summary['train_steps'] == 4
    gin.parse_config('RebracConfig.actor_bc_coef = 0.01')
    with pytest.raises(resume.ResumeMismatchError,
                       match='method_settings.actor_bc_coef'):
      offline.train_offline(_config(served, root, 'rebrac', steps=8),
                            show_progress=False)
  finally:
    gin.clear_config()


def test_progress_messages_go_to_stderr_not_stdout(served, tmp_path, capsys):
  """Benches print JSON lines on stdout; the run's per-evaluation lines
  belong beside its progress bar, on stderr."""
  root = tmp_path / 'awac'
  offline.train_offline(_config(served, root, 'awac', steps=4))
  offline.train_offline(_config(served, root, 'awac', steps=8))
  out, err = capsys.readouterr()
  assert out == ''
  assert err.count('eval at') == 2


def _unseeded_dense_kernel(seed: int) -> np.ndarray:
  run.seed_everything(seed)
  layer = tf.keras.layers.Dense(4)  # no initializer seed, as TF-Agents' own
  layer.build((None, 3))
  return layer.kernel.numpy()


def test_seed_everything_fixes_keras_unseeded_initialisers():
  """tf.random.set_seed alone leaves these to Python's `random`."""
  np.testing.assert_array_equal(_unseeded_dense_kernel(7),
                                _unseeded_dense_kernel(7))
  assert not np.array_equal(_unseeded_dense_kernel(7),
                            _unseeded_dense_kernel(8))


@pytest.mark.parametrize('agent', ['rebrac', 'iql'])
def test_one_seed_gives_one_run(served, tmp_path, agent):
  """The seed fixes every initial weight, the TF-Agents actors' output
  layers included (Keras draws their unseeded initialisers from Python's
  `random`), and the batches: two runs with one config export one policy."""
  policies = []
  for name in ('a', 'b'):
    offline.train_offline(_config(served, tmp_path / name, agent, steps=3),
                          show_progress=False)
    policies.append(numpy_policy.load(
        str(tmp_path / name / 'policy_offline.npz')))
  first, second = policies
  assert len(first.kernels) == len(second.kernels)
  for a, b in zip(first.kernels + first.biases,
                  second.kernels + second.biases):
    np.testing.assert_array_equal(a, b)


def test_offline_bench_ends_ctrl_c_with_one_line(monkeypatch, capsys):
  """tools/offline_suite.py under Ctrl-C: exit 130 and one line saying how to
  resume, not a traceback (the long runs are stopped this way)."""
  bench = tools_module('offline_suite')

  def interrupted(dataset):
    raise KeyboardInterrupt(dataset)

  monkeypatch.setattr(bench, 'behaviour_return', interrupted)
  monkeypatch.setattr(sys, 'argv', ['offline.py', '--dataset', 'x'])
  with pytest.raises(SystemExit) as stop:
    bench.run_main()
  assert stop.value.code == 130
  assert capsys.readouterr().err.splitlines()[-1] == (
      'offline: interrupted; the same command resumes each run from its '
      'last checkpoint under --root')


@pytest.mark.parametrize('progress', [True, False])
def test_offline_bench_shows_each_runs_progress_on_stderr(tmp_path, progress):
  """tools/offline_suite.py, the long runs' driver: a bar with the rate (unless
  --no-progress) and a line per evaluation on stderr, the one JSON line
  alone on stdout; the curve where --curve says, else beside the runs
  (never into docs/ unasked)."""
  data = str(tmp_path / 'data')
  recording.generate_dataset('HalfCheetah-v5', 'random', 2, data, seed=0,
                             max_episode_steps=20, show_progress=False)
  asked = tmp_path / 'c.png'
  result = subprocess.run(
      [sys.executable, '-m', 'tools.offline_suite', '--dataset', data,
       '--agents', 'bc', '--seeds', '0', '--steps', '40',
       '--eval_interval', '20', '--eval_episodes', '1',
       '--root', str(tmp_path / 'runs'),
       *(['--curve', str(asked)] if progress else []),
       '--progress' if progress else '--no-progress'],
      cwd=_REPO, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  curve = asked if progress else tmp_path / 'runs' / 'curves.png'
  assert curve.is_file() and curve.stat().st_size > 0
  [line] = result.stdout.splitlines()
  assert json.loads(line)['agent'] == 'bc'
  assert ('grad step/s' in result.stderr) == progress
  assert 'eval at 40 train step' in result.stderr
