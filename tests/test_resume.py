"""rlds_reverb.experiments.resume: a run directory resumes only the run it holds,
and a run that fails before it starts leaves nothing behind."""

import dataclasses
import json
import os

import pytest

from rlds_reverb.agents import factory
from rlds_reverb.experiments import offline
from rlds_reverb.experiments import online
from rlds_reverb.experiments import resume


def _dataset(path, info='{"version": "1.0.0"}'):
  """A directory that looks like a TFDS dataset (its dataset_info.json)."""
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, 'dataset_info.json'), 'w') as f:
    f.write(info)
  return str(path)


def _saved_run(root, config):
  """root_dir as a started run leaves it: config.json and a checkpoint."""
  with resume.RunDirectory(str(root), resume.run_record(config)) as run_dir:
    run_dir.start()
  os.makedirs(root / 'checkpoints')
  (root / 'checkpoints' / 'checkpoint').write_text('x')


def _offline(root, data, **fields):
  fields = {'agent': 'td3_bc', **fields}
  return offline.OfflineConfig(dataset=data, root_dir=str(root), **fields)


def test_new_run_and_allowed_changes_pass(tmp_path):
  root, data = tmp_path / 'run', _dataset(tmp_path / 'data')
  record = resume.check_resumable(str(root), _offline(root, data))
  assert record['agent'] == 'td3_bc' and record['dataset_fingerprint']
  _saved_run(root, _offline(root, data))
  # Budgets, schedules and where the data is found may change.
  resume.check_resumable(str(root), _offline(
      root, data, train_steps=5, eval_interval=7, eval_episodes=1,
      checkpoint_interval=3, online_finetune_steps=100, data_dir='/x'))


def test_compute_dtype_may_change_and_each_change_is_kept(tmp_path):
  """A bfloat16 run moves to a CPU without bfloat16 instructions: the
  float32 weights resume under float32, and config.json keeps what each
  resume changed and from which checkpoint."""
  root, data = tmp_path / 'run', _dataset(tmp_path / 'data')
  bf16 = lambda **fields: _offline(
      root, data, agent='rebrac', agent_config=factory.AgentConfig(
          critic_dtype='bfloat16'), **fields)
  _saved_run(root, bf16())
  (root / 'checkpoints' / 'checkpoint').write_text(
      'model_checkpoint_path: "ckpt-500"\n')
  (root / 'checkpoints' / 'ckpt-500.index').write_text('')
  as_float32 = dataclasses.replace(bf16(train_steps=9), agent_config=(
      factory.AgentConfig(critic_dtype='float32')))
  record = resume.check_resumable(str(root), as_float32)
  assert record[resume.HISTORY_KEY] == [{'from_step': 500, 'changes': {
      'agent_config.critic_dtype': ['bfloat16', 'float32'],
      'train_steps': [300_000, 9]}}]
  resume.write_record(str(root), record)
  # The next resume keeps the history; one that changes nothing adds none.
  again = resume.check_resumable(str(root), as_float32)
  assert again[resume.HISTORY_KEY] == record[resume.HISTORY_KEY]
  # Another seed is still another run.
  with pytest.raises(resume.ResumeMismatchError, match='seed 1'):
    resume.check_resumable(str(root), dataclasses.replace(as_float32, seed=1))


def test_other_settings_are_refused_naming_each_field(tmp_path):
  root, data = tmp_path / 'run', _dataset(tmp_path / 'data')
  _saved_run(root, _offline(root, data))
  other = _dataset(tmp_path / 'other')
  with pytest.raises(resume.ResumeMismatchError) as raised:
    resume.check_resumable(str(root), _offline(
        root, other, agent='bc', seed=3, feed='stream'))
  message = str(raised.value)
  assert "agent 'bc' (recorded 'td3_bc')" in message
  assert f"dataset {other!r} (recorded {data!r})" in message
  assert 'seed 3 (recorded 0)' in message
  assert "feed 'stream' (recorded 'memory')" in message
  assert 'another root_dir' in message and '\n' not in message
  fields = [field for field, _, _ in raised.value.differences]
  assert 'train_steps' not in fields


def test_same_dataset_path_with_other_data_is_refused(tmp_path):
  root, data = tmp_path / 'run', _dataset(tmp_path / 'data')
  _saved_run(root, _offline(root, data))
  _dataset(data, info='{"version": "1.0.0", "splits": [{"shardLengths": 9}]}')
  with pytest.raises(resume.ResumeMismatchError, match='dataset_fingerprint'):
    resume.check_resumable(str(root), _offline(root, data))


def test_nested_and_kind_differences(tmp_path):
  root = tmp_path / 'run'
  config = online.OnlineConfig(env='CartPole-v1', root_dir=str(root),
                               agent='dqn')
  _saved_run(root, config)
  bigger = dataclasses.replace(config, agent_config=dataclasses.replace(
      config.agent_config, q_layers=(64,)))
  with pytest.raises(resume.ResumeMismatchError,
                     match=r'agent_config.q_layers \[64\]'):
    resume.check_resumable(str(root), bigger)
  with pytest.raises(resume.ResumeMismatchError,
                     match="run_kind 'OfflineConfig' .recorded 'OnlineConfig'"):
    resume.check_resumable(str(root), _offline(
        root, _dataset(tmp_path / 'data')))


def test_config_without_saved_state_is_not_a_resume(tmp_path):
  root, data = tmp_path / 'run', _dataset(tmp_path / 'data')
  with resume.RunDirectory(str(root), resume.run_record(
      _offline(root, data))) as run_dir:
    run_dir.start()
  resume.check_resumable(str(root), _offline(root, data, agent='bc'))


def test_run_that_fails_before_it_starts_leaves_nothing(tmp_path):
  root = tmp_path / 'new'
  with pytest.raises(RuntimeError):
    with resume.RunDirectory(str(root), {}):
      (root / 'reverb').mkdir()
      raise RuntimeError('bad data')
  assert not root.exists()
  # In a directory that was there: only what this call made goes.
  existing = tmp_path / 'existing'
  existing.mkdir()
  (existing / 'notes.txt').write_text('mine')
  with pytest.raises(KeyboardInterrupt):
    with resume.RunDirectory(str(existing), {}):
      (existing / 'reverb').mkdir()
      (existing / 'tensorboard.x').write_text('')
      raise KeyboardInterrupt
  assert sorted(os.listdir(existing)) == ['notes.txt']


def test_started_run_keeps_its_files_and_records_config(tmp_path):
  root = tmp_path / 'run'
  with pytest.raises(RuntimeError):
    with resume.RunDirectory(str(root), {'agent': 'bc'}) as run_dir:
      run_dir.start()
      (root / 'checkpoints').mkdir()
      raise RuntimeError('crash in training')
  assert sorted(os.listdir(root)) == ['checkpoints', 'config.json']
  with open(root / 'config.json') as f:
    assert json.load(f) == {'agent': 'bc'}


def test_train_offline_refuses_before_touching_the_run(tmp_path):
  root, data = tmp_path / 'run', _dataset(tmp_path / 'data')
  _saved_run(root, _offline(root, data))
  (root / 'eval.jsonl').write_text('{"train_step": 100}\n')
  before = sorted(os.listdir(root))
  with pytest.raises(resume.ResumeMismatchError, match="agent 'bc'"):
    offline.train_offline(_offline(root, data, agent='bc'),
                          show_progress=False)
  assert sorted(os.listdir(root)) == before
  assert (root / 'eval.jsonl').read_text() == '{"train_step": 100}\n'
