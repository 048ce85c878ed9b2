"""rlds_reverb.experiments.loop: the learner's checkpoint restores every weight,
optimizer slot and step counter; eval.jsonl holds no record of a dead run
beyond the checkpoint a run resumes from.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.experiments import loop
from rlds_reverb.experiments import online
from conftest import _dqn, _fixed_batch  # pylint: disable=g-bad-import-order


def _optimized_variables(agent):
  """optimizer attribute -> the variables it trains."""
  # pylint: disable=protected-access
  actor = factory.actor_network(agent).trainable_variables
  found = {'_optimizer': actor} if hasattr(agent, '_optimizer') else {
      '_actor_optimizer': actor,
      '_critic_optimizer': (agent._critic_network_1.trainable_variables +
                            agent._critic_network_2.trainable_variables)}
  if hasattr(agent, '_alpha_optimizer'):
    found['_alpha_optimizer'] = [agent._log_alpha]
  return {name: (getattr(agent, name), variables)
          for name, variables in found.items()}


def _state(agent):
  """Agent variables by position; Adam slots and step count per variable."""
  state = {f'agent/{i}': v.numpy() for i, v in enumerate(agent.variables)}
  for name, (optimizer, variables) in _optimized_variables(agent).items():
    state[f'{name}/iterations'] = optimizer.iterations.numpy()
    for i, variable in enumerate(variables):
      for slot in ('m', 'v'):
        state[f'{name}/{slot}/{i}'] = optimizer.get_slot(variable,
                                                         slot).numpy()
  return state


@pytest.mark.parametrize('kind', ['bc', 'td3_bc', 'cql_sac'])
def test_checkpoint_restores_weights_and_optimizer_state(kind, specs,
                                                        tmp_path):
  make = lambda: registry.make_agent(kind, specs.time_step_spec,
                                   specs.action_spec)
  batch = _fixed_batch(32)
  agent = make()
  learner = loop.Learner(agent, str(tmp_path))
  iterator = iter(tf.data.Dataset.from_tensors(batch).repeat())
  learner.train(iterator, 7)
  learner.env_steps.assign(123)
  learner.save()
  saved = _state(agent)
  assert sum('/m/' in k for k in saved) > 4

  fresh = make()
  restored = loop.Learner(fresh, str(tmp_path))
  assert restored.restore()
  # Slots appear on first use; restoring fills them as they are made.
  for optimizer, variables in _optimized_variables(fresh).values():
    optimizer._create_all_weights(variables)  # pylint: disable=protected-access
  assert restored.train_step == 7
  assert int(restored.env_steps.numpy()) == 123
  got = _state(fresh)
  assert got.keys() == saved.keys()
  for name, value in saved.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)
  if kind == 'bc':  # Deterministic: the next step is identical too.
    learner.train(iterator, 1)
    restored.train(iter(tf.data.Dataset.from_tensors(batch).repeat()), 1)
    for name, value in _state(agent).items():
      np.testing.assert_allclose(_state(fresh)[name], value, rtol=1e-6,
                                 err_msg=name)


def _write_log(root, lines):
  with open(os.path.join(root, loop.EVAL_LOG), 'w') as f:
    f.write(''.join(lines))


def test_restore_drops_records_beyond_the_checkpoint_and_a_cut_line(
    cartpole, tmp_path, capsys):
  root = str(tmp_path)
  learner = loop.Learner(_dqn(cartpole), root)
  learner.env_steps.assign(300)
  learner.save()
  rows = [json.dumps({'train_step': 0, 'env_steps': s,
                      'average_return': float(s)}) + '\n'
          for s in (100, 200, 300, 400, 500)]
  _write_log(root, rows + ['{"train_step": 0, "env_st'])  # Cut by a crash.
  assert len(loop.Learner.read_eval_log(root)) == 5
  assert 'skipping its last line, cut short' in capsys.readouterr().err
  with open(os.path.join(root, loop.CURVE_PNG), 'w') as f:
    f.write('stale')

  resumed = loop.Learner(_dqn(cartpole), root)
  resumed.set_curve(x='env_steps', title='t')
  assert resumed.restore()
  assert 'dropped 2 evaluation record(s)' in capsys.readouterr().err
  with open(os.path.join(root, loop.EVAL_LOG)) as f:
    assert f.read() == ''.join(rows[:3])
  with open(os.path.join(root, loop.CURVE_PNG), 'rb') as f:
    assert f.read(4) == b'\x89PNG'  # Redrawn from the records kept.
  # Nothing restored: none of a dead run's records stay.
  fresh = loop.Learner(_dqn(cartpole), str(tmp_path / 'other'))
  _write_log(fresh.root_dir, rows[:1])
  assert not fresh.restore()
  assert loop.Learner.read_eval_log(fresh.root_dir) == []


def test_damaged_line_before_the_last_is_an_error(tmp_path):
  _write_log(str(tmp_path), ['{"train_step": 1}\n', 'garbage\n',
                             '{"train_step": 2}\n'])
  with pytest.raises(ValueError, match='line 2 is not a JSON record'):
    loop.Learner.read_eval_log(str(tmp_path))


def test_crash_after_evals_past_the_checkpoint_then_resume(tmp_path):
  """eval.jsonl after a crash and a resume: each step once, increasing."""
  config = online.OnlineConfig(
      env='CartPole-v1', root_dir=str(tmp_path / 'dqn'), agent='dqn',
      env_steps=600, initial_collect_steps=100, batch_size=16,
      train_every=100, utd=0.25, eval_interval=100, eval_episodes=1,
      checkpoint_interval=300, replay_size=10_000,
      agent_config=factory.AgentConfig(q_layers=(16,)))

  class Crash(Exception):
    pass

  def crash_at_500(record):
    if record['env_steps'] == 500:
      raise Crash

  with pytest.raises(Crash):
    online.train_online(config, show_progress=False, on_eval=crash_at_500)
  steps = [r['env_steps'] for r in loop.Learner.read_eval_log(
      config.root_dir)]
  assert steps == [100, 200, 300, 400, 500]  # 400 and 500: no checkpoint.
  online.train_online(config, show_progress=False)
  steps = [r['env_steps'] for r in loop.Learner.read_eval_log(
      config.root_dir)]
  assert steps == [100, 200, 300, 400, 500, 600]


def test_the_step_is_traced_unconverted_unless_it_converts_itself(
    specs, tmp_path):
  """The learner's loop runs the step as plain Python: a step that branches
  on a tensor fails by name; wrapped in tf.function it converts itself."""
  agent = registry.make_agent('bc', specs.time_step_spec, specs.action_spec)

  def branching_step(batch):
    loss = agent.train(batch).loss
    if loss > 1e9:  # A Python branch on a tensor: needs autograph.
      loss = loss * 0.0
    return loss

  batches = iter(tf.data.Dataset.from_tensors(_fixed_batch(32)).repeat())
  plain = loop.Learner(agent, str(tmp_path / 'plain'),
                       train_step_fn=branching_step)
  with pytest.raises(tf.errors.OperatorNotAllowedInGraphError,
                     match='as a Python `bool`'):
    plain.train(batches, 2)
  converting = loop.Learner(agent, str(tmp_path / 'converting'),
                            train_step_fn=tf.function(branching_step))
  before = int(agent.train_step_counter)
  assert np.isfinite(converting.train(batches, 3))
  assert int(agent.train_step_counter) == before + 3
