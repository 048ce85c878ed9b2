"""Smoke tests of `python -m pipelines.push` and `pipelines.serve`.

Each runs the command line in a subprocess, as a user would, on a tiny
dataset that `pipelines.generate` writes once per module: 3 truncated
HalfCheetah episodes of 20 env steps, so 21 RLDS steps each (63 in all) and
20 two-step windows each (60 items). Runs refused on their input, and
--help, run in a fork of a preloaded interpreter (`_refused`,
tests/preloaded_cli.py); the others start a fresh one.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
from typing import List

import numpy as np
import pytest

import rlds_fixtures as fx  # pylint: disable=g-bad-import-order
from pipeline_process import error_line  # pylint: disable=g-bad-import-order
from pipeline_process import PipelineProcess  # pylint: disable=g-bad-import-order
from pipeline_process import unused_port  # pylint: disable=g-bad-import-order
import preloaded_cli  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]
# The pipelines run in a scratch directory (pushes into a served table write
# their state file under ./push_state), importable from the repository.
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2',
           PYTHONPATH=os.pathsep.join(
               [str(REPO), *filter(None, [os.environ.get('PYTHONPATH')])]))
TIMEOUT_S = 180
_WORKDIR: List[pathlib.Path] = []


@pytest.fixture(scope='module', autouse=True)
def _workdir(tmp_path_factory):
  _WORKDIR[:] = [tmp_path_factory.mktemp('cwd')]
  yield


def _cwd() -> pathlib.Path:
  return _WORKDIR[0] if _WORKDIR else REPO

EPISODES, EPISODE_STEPS = 3, 20


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run(
      [sys.executable, '-m', f'pipelines.{module}', *args], cwd=_cwd(),
      env=ENV, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def _refused(module: str, *args: str) -> subprocess.CompletedProcess:
  """A run that ends on its input (or --help), before any work: in a fork of
  the preloaded interpreter (tests/preloaded_cli.py), not a fresh one."""
  return preloaded_cli.run(module, *args, cwd=_cwd(), env=ENV,
                           timeout_s=TIMEOUT_S)


def _summary(stdout: str) -> dict:
  """The one JSON line of a push."""
  lines = [line for line in stdout.splitlines() if line.startswith('{')]
  assert len(lines) == 1, stdout
  return json.loads(lines[0])


def _background(module: str, *args: str,
                stderr_path: pathlib.Path) -> PipelineProcess:
  return PipelineProcess(module, *args, stderr_path=stderr_path, cwd=_cwd(),
                         env=ENV)


@pytest.fixture(scope='module')
def dataset(tmp_path_factory) -> str:
  out = tmp_path_factory.mktemp('data') / 'halfcheetah'
  proc = _run('generate', '--env', 'HalfCheetah-v5', '--policy', 'random',
              '--episodes', str(EPISODES), '--out', str(out),
              '--max_episode_steps', str(EPISODE_STEPS))
  assert proc.returncode == 0, proc.stderr
  return str(out)


@pytest.fixture(scope='module')
def broken_dataset(tmp_path_factory) -> str:
  """Valid TFDS data, invalid RLDS: episode 1 never ends (no is_last).

  Its observations are (3,), not HalfCheetah's (17,), so it also serves as
  data that does not fit the table made for `dataset`.
  """
  return fx.write_tfds(
      tmp_path_factory.mktemp('broken'),
      [fx.counting_steps(4), fx.counting_steps(5, ends=False),  # Step 4
       fx.counting_steps(3)],  # (mid) is followed by a first step.
      name='broken_rlds')


@pytest.fixture(scope='module')
def served(dataset, tmp_path_factory):
  """`pipelines.serve` for `dataset`; yields its address."""
  server = _background(
      'serve', '--dataset', dataset,
      stderr_path=tmp_path_factory.mktemp('serve') / 'stderr')
  address = server.wait_for(r'^serving table rlds on (localhost:\d+)$')[1]
  yield address
  assert server.stop(timeout_s=TIMEOUT_S) == 0, server.stderr()
  assert 'Traceback' not in server.stderr()


def test_push_summary(dataset):
  proc = _run('push', '--dataset', dataset)
  assert proc.returncode == 0, proc.stderr
  assert 'Traceback' not in proc.stderr
  summary = _summary(proc.stdout)
  assert {k: summary[k] for k in ('episodes', 'steps', 'items', 'terminated',
                                  'truncated', 'table_size', 'evicted')} == {
      'episodes': 3, 'steps': 63, 'items': 60, 'terminated': 0,
      'truncated': 3, 'table_size': 60, 'evicted': 0}
  assert summary['seconds'] > 0 and summary['steps_per_second'] > 0
  assert summary['error'] is None and summary['checkpoint'] is None
  assert re.search(
      r"^push: 3 episodes \(0 terminated, 3 truncated\), 63 steps -> 60 items "
      r"in [\d.]+ s \(\d+ steps/s\); table 'rlds' at localhost:\d+ holds 60 "
      r'items$', proc.stdout, re.MULTILINE), proc.stdout
  assert 'step/s' in proc.stderr  # The progress bar.


def test_episodes_as_items_checkpoint_serve_and_restore(dataset, tmp_path):
  checkpoint_dir = tmp_path / 'ckpt'
  push = _background('push', '--dataset', dataset, '--sequence_length', '0',
                     '--checkpoint_dir', str(checkpoint_dir), '--serve',
                     stderr_path=tmp_path / 'push.stderr')
  address = push.wait_for(
      r'^serving table rlds on (localhost:\d+) \(Ctrl-C to stop\)$')[1]
  summary = _summary('\n'.join(push.lines))
  assert (summary['episodes'], summary['steps'], summary['items'],
          summary['table_size']) == (3, 63, 3, 3)
  assert summary['address'] == address
  assert summary['checkpoint'].startswith(str(checkpoint_dir))
  assert f'push: wrote checkpoint {summary["checkpoint"]}' in push.lines
  assert push.stop(timeout_s=TIMEOUT_S) == 0, push.stderr()
  assert 'Traceback' not in push.stderr()
  # --serve checkpoints again on the way out.
  assert push.lines[-1].startswith(f'push: wrote checkpoint {checkpoint_dir}')

  serve = _background('serve', '--dataset', dataset, '--checkpoint_dir',
                      str(checkpoint_dir), stderr_path=tmp_path / 'serve.err')
  serve.wait_for(r'^serving table rlds on localhost:\d+$')
  assert serve.lines[0] == (
      f"serve: table 'rlds' holds 3 items (restored from {checkpoint_dir})")
  assert serve.stop(timeout_s=TIMEOUT_S) == 0, serve.stderr()
  assert 'Traceback' not in serve.stderr()
  assert re.match(
      rf'^serve: wrote checkpoint {checkpoint_dir}/\S+ \(3 items\)$',
      serve.lines[-1]), serve.lines


def test_push_into_served_table(dataset, served):
  proc = _run('push', '--dataset', dataset, '--reverb_address', served,
              '--max_episodes', '2')
  assert proc.returncode == 0, proc.stderr
  summary = _summary(proc.stdout)
  assert (summary['episodes'], summary['steps'], summary['items'],
          summary['truncated']) == (2, 42, 40, 2)
  assert summary['address'] == served
  assert summary['table_size'] == 40


def test_missing_table(dataset, served):
  proc = _refused('push', '--dataset', dataset, '--reverb_address', served,
              '--table', 'nope')
  assert error_line(proc, 'push') == (
      f"push: error: no table 'nope' on the Reverb server at {served}; its "
      "tables: 'rlds'")


def test_signature_mismatch(broken_dataset, served):
  proc = _refused('push', '--dataset', broken_dataset, '--reverb_address', served)
  assert error_line(proc, 'push') == (
      'push: error: Replay buffer table signature spec should match RLDS data '
      "spec. Table 'rlds' vs data: observation: table float32[None,17] vs "
      'data float32[None,3]; action: table float32[None,6] vs data '
      'float32[None,2].')


def test_invalid_episode(broken_dataset):
  proc = _refused('push', '--dataset', broken_dataset)
  error = error_line(proc, 'push')
  assert error.startswith(
      'push: error: Mid step should not be followed by a first step.')
  assert 'episode 1' in error and 'step 4' in error, error
  assert '3 items were already written' in error, error
  # What was written before the bad episode is still reported.
  summary = _summary(proc.stdout)
  assert (summary['episodes'], summary['items']) == (1, 3)
  assert summary['error'] == error[len('push: error: '):]


def test_unreachable_address(dataset):
  # No wall-clock bound here: interpreter and TensorFlow start-up dominate it
  # on a loaded machine. That the refusal is quick is tested in-process
  # (test_tables); a hang would hit _refused's timeout.
  address = f'localhost:{unused_port()}'
  proc = _refused('push', '--dataset', dataset, '--reverb_address', address)
  assert error_line(proc, 'push') == (
      f'push: error: cannot reach Reverb server at {address}: connection '
      'refused (is a server running there?)')


@pytest.mark.parametrize('dataset_arg, expected', [
    ('no_such_dataset_xyz',
     "push: error: 'no_such_dataset_xyz' is not a known TFDS dataset"),
    ('/no/such/dir', 'push: error: dataset path /no/such/dir does not exist'),
])
def test_unknown_dataset(dataset_arg, expected):
  proc = _refused('push', '--dataset', dataset_arg)
  assert error_line(proc, 'push').startswith(expected)


def test_dataset_not_available_offline(tmp_path):
  proc = _refused('push', '--dataset', 'd4rl_mujoco_halfcheetah/v2-medium',
              '--data_dir', str(tmp_path), '--nodownload')
  assert error_line(proc, 'push').startswith(
      "push: error: TFDS dataset 'd4rl_mujoco_halfcheetah/v2-medium' is not "
      f'prepared in {tmp_path}')


def test_bad_flag_value(dataset):
  proc = _refused('push', '--dataset', dataset, '--sequence_length', '-1')
  assert error_line(proc, 'push') == (
      'push: error: flag --sequence_length=-1: must be a positive integer, or '
      '0 or none for whole episodes')


# Flags that pipelines/common_flags.py defines for them.
_SHARED_FLAGS = {
    'push': ['dataset', 'split', 'data_dir', 'download', 'table',
             'reverb_address', 'max_episodes'],
    'serve': ['dataset', 'split', 'data_dir', 'download', 'table'],
    'train': ['dataset', 'split', 'data_dir', 'download', 'table',
              'reverb_address', 'max_episodes'],
    'plot': [],
}


@pytest.mark.parametrize('module', ['push', 'serve', 'train', 'plot'])
def test_help_lists_every_flag(module):
  # train's own flags live in train_flags.py, beside the shell.
  source = ''.join((REPO / 'pipelines' / name).read_text() for name in (
      f'{module}.py', *(['train_flags.py'] if module == 'train' else [])))
  names = re.findall(r"flags\.DEFINE_\w+\(\s*'(\w+)'", source)
  assert len(names) >= 5
  proc = _refused(module, '--help')
  assert proc.returncode == 0, proc.stderr
  for name in names + _SHARED_FLAGS[module]:
    # Each flag with some help text after it.
    assert re.search(rf'--(\[no\])?{name}:\s+\S', proc.stdout), (name,
                                                              proc.stdout)
  if module == 'serve':  # It is the server: nothing to push.
    assert not re.search(r'--(reverb_address|max_episodes):', proc.stdout)


def test_prioritized_table_for_per(dataset, tmp_path):
  """--sampler prioritized: a PER table, every item at the starting maximum."""
  from rlds_reverb.replay import per  # pylint: disable=g-import-not-at-top
  from rlds_reverb.storage import tables  # pylint: disable=g-import-not-at-top
  push = _background('push', '--dataset', dataset, '--sampler', 'prioritized',
                     '--alpha', '0.5', '--serve',
                     stderr_path=tmp_path / 'push.stderr')
  address = push.wait_for(
      r'^serving table rlds on (localhost:\d+) \(Ctrl-C to stop\)$')[1]
  try:
    client = tables.connect(address)
    assert per.sampler_alpha(client, 'rlds') == 0.5
    priorities = {float(s.info.priority) for s in client.sample(
        'rlds', num_samples=20, emit_timesteps=False)}
    assert priorities == {per.INITIAL_MAX_PRIORITY}
  finally:
    assert push.stop(timeout_s=TIMEOUT_S) == 0, push.stderr()
  proc = _run('push', '--dataset', dataset, '--reverb_address',
              'localhost:1', '--sampler', 'prioritized')
  assert 'applies to the embedded server only' in error_line(proc, 'push')


def test_feed_table_serve_push_and_train_from_memory(dataset, tmp_path):
  """An episode table made and filled from the CLI feeds a learner's memory."""
  serve = _background('serve', '--dataset', dataset, '--feed_table',
                      stderr_path=tmp_path / 'serve.err')
  address = serve.wait_for(r'^serving table rlds on (localhost:\d+)$')[1]
  try:
    # Two-step items do not go into an episode table.
    assert 'is an episode table' in error_line(
        _run('push', '--dataset', dataset, '--reverb_address', address),
        'push')
    proc = _run('push', '--dataset', dataset, '--reverb_address', address,
                '--feed_table')
    assert proc.returncode == 0, proc.stderr
    summary = _summary(proc.stdout)
    assert (summary['episodes'], summary['items'],
            summary['table_size']) == (3, 3, 3)
    train = subprocess.run(
        [sys.executable, '-m', 'pipelines.train', '--agent', 'bc',
         '--reverb_address', address, '--steps', '20', '--eval_interval',
         '20', '--eval_episodes', '1', '--batch_size', '8', '--root_dir',
         str(tmp_path / 'run')], cwd=_cwd(), env=ENV, capture_output=True,
        text=True, timeout=TIMEOUT_S, check=False)
    assert train.returncode == 0, train.stderr[-3000:]
    result = json.loads(train.stdout.strip().splitlines()[-1])
    assert result['feed'] == 'memory'
    assert result['transitions'] == EPISODES * EPISODE_STEPS
    assert result['train_steps'] == 20
  finally:
    assert serve.stop(timeout_s=TIMEOUT_S) == 0, serve.stderr()


def test_feed_table_embedded_and_into_a_table_of_items(dataset, served):
  proc = _run('push', '--dataset', dataset, '--feed_table')
  assert proc.returncode == 0, proc.stderr
  summary = _summary(proc.stdout)
  assert (summary['items'], summary['table_size']) == (3, 3)
  proc = _run('push', '--dataset', dataset, '--reverb_address', served,
              '--feed_table')
  assert error_line(proc, 'push') == (
      "push: error: table 'rlds' samples uniform: it is not an episode "
      'table, which takes whole episodes for the in-memory feed (make one '
      'with pipelines.serve --feed_table or replay.episode_table.make_table)')


@pytest.mark.parametrize('module, flag', [
    ('push', ['--sampler', 'prioritized']),
    ('push', ['--sequence_length', '2']),
    ('push', ['--priority', '1']),
    ('serve', ['--alpha', '0.5']),
])
def test_feed_table_refuses_item_flags(dataset, module, flag):
  proc = _refused(module, '--dataset', dataset, '--feed_table', *flag)
  assert proc.returncode == 2
  assert error_line(proc, module) == (
      f'{module}: error: {flag[0]} does not apply to --feed_table (its table '
      'holds whole episodes, sampled by a min-heap' +
      (', written unread)' if module == 'push' else ')'))
