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
from rlds_reverb import recording
from rlds_reverb import tables
from rlds_reverb.acting import envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.learners import agents
from rlds_reverb.learners import loop
from rlds_reverb.learners import offline
from rlds_reverb.learners import offline_data
from rlds_reverb.learners import run
from rlds_reverb.learners import sac_n  # pylint: disable=unused-import (gin)
from rlds_reverb.replay import episode_table
from conftest import _rlds, bench_module  # pylint: disable=g-bad-import-order

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
      seed=1, agent_config=agents.AgentConfig(
          actor_layers=(16,), critic_layers=(16,), seed=1), **overrides)


@pytest.mark.parametrize('agent', agents.OFFLINE_RL_AGENTS)
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
    assert policy.head == agents.HEAD[agent]
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
  agent = agents.make_agent('iql', *_specs(), config.agent_config)
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
  from rlds_reverb.learners import resume  # pylint: disable=g-import-not-at-top
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


def test_edac_diversity_probe_reads_what_training_wrote(served, tmp_path):
  """bench/edac_diversity.py reads the tags and settings an EDAC run
  writes; a mean cosine of N unit vectors lies in [-1 / (N - 1), 1]."""
  gin.clear_config()
  gin.parse_config('SacNConfig.num_critics = 3')
  try:
    offline.train_offline(_config(served, tmp_path / 'edac', 'edac'),
                          show_progress=False)
  finally:
    gin.clear_config()
  offline.train_offline(_config(served, tmp_path / 'td3_bc', 'td3_bc',
                                steps=2), show_progress=False)
  probe = bench_module('edac_diversity').probe
  result = probe(str(tmp_path / 'edac'))
  assert (result['eta'], result['num_critics']) == (1.0, 3)
  [row] = result['evaluations']
  assert row['train_step'] == 30 and row['summaries'] == 1
  assert -0.5 <= row['mean_gradient_cosine'] <= 1.0
  assert row['alpha'] > 0
  with pytest.raises(ValueError, match='not an EDAC run'):
    probe(str(tmp_path / 'td3_bc'))


def test_episode_outcomes_figures():
  """bench/episode_outcomes.py: nearest-state distances against a brute
  force, the first turned-over step, and a real episode of the shipped
  medium policy (upright all the way, above a random policy's score)."""
  probe = bench_module('episode_outcomes')
  rng = np.random.default_rng(0)
  states, data = rng.normal(size=(300, 17)), rng.normal(size=(700, 17))
  scale = rng.uniform(0.5, 2.0, 17)
  brute = np.sqrt((((states[:, None] - data[None]) / scale)**2).sum(-1)
                  ).min(axis=1)
  np.testing.assert_allclose(probe.nearest_distance(states, data, scale),
                             brute, rtol=1e-4, atol=1e-4)
  # Left for good where a run of 3 beyond 1.0 starts, not at an outlier.
  distance = np.array([0.2, 1.5, 0.3, 1.2, 1.1, 0.9, 1.3, 1.4, 2.0, 0.1])
  assert probe.departure(distance, 1.0, 3) == 6
  assert probe.departure(distance, 1.0, 4) is None
  assert probe.departure(np.full(5, 2.0), 1.0, 5) == 0
  observations = np.zeros((10, 17))
  observations[4:7, probe.PITCH] = [1.6, -3.0, 1.5]  # Over at 4 and 5.
  observations[:, probe.SPEED] = 2.0
  row = probe.episode_figures(observations, 0.0, 'HalfCheetah-v5')
  assert row['turned_over_from'] == 4 and row['turned_over_share'] == 0.2
  assert row['speed'] == 2.0 and row['speed_after_turning_over'] == 2.0
  assert row['score'] == pytest.approx(envs.normalized_score(
      'HalfCheetah-v5', 0.0), abs=0.05)
  policy = numpy_policy.load(os.path.join(
      os.path.dirname(rlds_reverb.__file__), 'policies', 'halfcheetah_v5',
      'medium.npz'))
  [episode] = probe.run_episodes(policy, 'HalfCheetah-v5', 1, seed=0)
  assert len(episode['observations']) == 1001  # Reset + 1000 steps.
  row = probe.episode_figures(episode['observations'], episode['return'],
                              'HalfCheetah-v5')
  # A random policy scores about -0.3; the medium policy about 39
  # (docs/datasets.md), greedy no lower.
  assert row['turned_over_from'] is None and row['score'] > 25
  assert row['speed_after_turning_over'] is None
  assert row['speed'] > 2.0


class _ConstantPolicy:
  def __init__(self, value: float):
    self.value = value

  def greedy(self, states: np.ndarray) -> np.ndarray:
    return np.full((len(states), 6), self.value, np.float32)


def test_episode_outcomes_picks_disjoint_episodes_and_their_starts():
  probe = bench_module('episode_outcomes')
  episodes = [np.full((30, 2), i, np.float32) for i in range(10)]
  for episode in episodes:
    episode[:, 1] = np.arange(30)  # The step within its episode.
  picked, held_out, starts = probe.pick_episodes(episodes, 4, 0, 5)
  assert picked.shape == held_out.shape == (120, 2)
  assert not set(picked[:, 0]) & set(held_out[:, 0])
  assert starts.shape == (20, 2) and set(starts[:, 1]) == set(range(5))
  assert set(starts[:, 0]) == set(picked[:, 0])


def test_episode_outcomes_hands_over_after_the_lead_steps():
  """The lead acts for exactly its steps, then the policy; the handoff's
  speed and turn-overs are of the policy's own steps."""
  probe = bench_module('episode_outcomes')
  lead, policy = _ConstantPolicy(0.5), _ConstantPolicy(-0.25)
  [episode] = probe.run_episodes(policy, 'HalfCheetah-v5', 1, 0, lead, 7)
  assert len(episode['actions']) == 1000
  np.testing.assert_array_equal(episode['actions'][:7], 0.5)
  np.testing.assert_array_equal(episode['actions'][7:], -0.25)
  args = argparse.Namespace(env='HalfCheetah-v5', episodes=2, seed=0)
  figures = probe.handoff_figures(policy, lead, 7, args)
  episodes = probe.run_episodes(policy, 'HalfCheetah-v5', 2, 0, lead, 7)
  assert figures['lead_steps'] == 7
  assert figures['speed'] == pytest.approx(np.mean(
      [e['observations'][7:, probe.SPEED].mean() for e in episodes]),
      abs=0.01)
  over = [probe.episode_figures(e['observations'][7:], 0.0,
                                'HalfCheetah-v5')['turned_over_from']
          for e in episodes]
  over = [step for step in over if step is not None]
  assert figures['turned_over_episodes'] == len(over)
  assert figures['turned_over_after_median'] == (
      np.median(over) if over else None)
  assert figures['score_mean'] == pytest.approx(np.mean(
      [envs.normalized_score('HalfCheetah-v5', e['return'])
       for e in episodes]), abs=0.06)
  assert 'critic_min_q' not in figures
  assert probe.discounted_return(np.array([1.0, 2.0, 4.0]), 0.5) == 3.0
  # Two critics peaking at action 0.5: the lead's 0.5 rates 0 (the
  # minimum), the policy's -0.25 rates -6 * 0.75^2.

  def critic(inputs):
    peak = -tf.reduce_sum((inputs[1] - 0.5)**2, axis=1)
    return (tf.stack([peak, peak + 1.0], axis=1),)

  args = argparse.Namespace(env='HalfCheetah-v5', episodes=2, seed=0,
                            gamma=0.9, reward_scale=2.0)
  figures = probe.handoff_figures(policy, lead, 7, args, critic)
  assert figures['critic_min_q'] == pytest.approx(-3.4, abs=0.05)
  assert figures['lead_critic_min_q'] == pytest.approx(0.0)
  assert figures['discounted_return'] == pytest.approx(np.mean(
      [probe.discounted_return(2.0 * e['rewards'][7:], 0.9)
       for e in episodes]), abs=0.05)
  alone = probe.run_episodes(lead, 'HalfCheetah-v5', 2, 0)
  assert figures['lead_discounted_return'] == pytest.approx(np.mean(
      [probe.discounted_return(2.0 * e['rewards'][7:], 0.9)
       for e in alone]), abs=0.05)
  # The lead's episodes, run once and passed in, give the same figures.
  assert probe.handoff_figures(policy, lead, 7, args, critic,
                               alone) == figures
  still = [dict(e, rewards=np.zeros_like(e['rewards'])) for e in alone]
  assert probe.handoff_figures(policy, lead, 7, args, critic, still)[
      'lead_discounted_return'] == 0.0


def test_episode_outcomes_rates_a_reference_policys_actions():
  """The critics' minimum at the actor's and a reference's actions, and
  the share of states where the reference's is higher (two critics that
  peak at action 0.5, one a unit above the other)."""
  probe = bench_module('episode_outcomes')

  def critic(inputs):
    peak = -tf.reduce_sum((inputs[1] - 0.5)**2, axis=1)
    return (tf.stack([peak, peak + 1.0], axis=1),)

  states = np.zeros((8, 17), np.float32)
  own, near_the_peak = _ConstantPolicy(0.0), _ConstantPolicy(0.4)
  figures = probe.critic_figures(critic, own, states, near_the_peak)
  assert figures['min_q'] == pytest.approx(-1.5)
  assert figures['q_std'] == pytest.approx(0.5)
  assert figures['reference_min_q'] == pytest.approx(-0.1, abs=0.05)
  assert figures['reference_preferred_share'] == 1.0
  assert figures['reference_action_distance'] == pytest.approx(0.4)
  figures = probe.critic_figures(critic, near_the_peak, states, own)
  assert figures['reference_preferred_share'] == 0.0
  assert 'reference_min_q' not in probe.critic_figures(critic, own, states)
  # Values -1.5 (min) everywhere: a step that earns reward 1 gives the gap
  # -1.5 - (1 + 0.5 * -1.5) = -1.75.
  gap = probe.bellman_gap(critic, own, np.zeros((4, 17), np.float32),
                          np.ones(3, np.float32), gamma=0.5)
  np.testing.assert_allclose(gap, [-1.75] * 3, rtol=1e-6)


def test_offline_bench_ends_ctrl_c_with_one_line(monkeypatch, capsys):
  """bench/offline.py under Ctrl-C: exit 130 and one line saying how to
  resume, not a traceback (the long runs are stopped this way)."""
  bench = bench_module('offline')

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
  """bench/offline.py, the long runs' driver: a bar with the rate (unless
  --no-progress) and a line per evaluation on stderr, the one JSON line
  alone on stdout."""
  data = str(tmp_path / 'data')
  recording.generate_dataset('HalfCheetah-v5', 'random', 2, data, seed=0,
                             max_episode_steps=20, show_progress=False)
  result = subprocess.run(
      [sys.executable, os.path.join('bench', 'offline.py'), '--dataset', data,
       '--agents', 'bc', '--seeds', '0', '--steps', '40',
       '--eval_interval', '20', '--eval_episodes', '1',
       '--root', str(tmp_path / 'runs'), '--curve', str(tmp_path / 'c.png'),
       '--progress' if progress else '--no-progress'],
      cwd=_REPO, capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  [line] = result.stdout.splitlines()
  assert json.loads(line)['agent'] == 'bc'
  assert ('grad step/s' in result.stderr) == progress
  assert 'eval at 40 train step' in result.stderr
