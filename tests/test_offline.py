"""rlds_reverb.experiments.offline: short offline runs on real tables (an
existing float64 table, prioritized replay streamed and from the memory)
and the config checks.
"""

import numpy as np
import pytest
import rlds
import tensorflow as tf

import rlds_reverb
from rlds_reverb.replay import per
from rlds_reverb.storage import tables
from rlds_reverb.acting import envs
from rlds_reverb.agents import factory
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from conftest import _rlds  # pylint: disable=g-bad-import-order


def test_offline_training_reads_an_existing_float64_table(tmp_path):
  """--reverb_address: a table someone else filled, cast when sampled."""
  from rlds_reverb.data import convert  # pylint: disable=g-import-not-at-top
  from rlds_reverb.storage import push  # pylint: disable=g-import-not-at-top
  from rlds_reverb.experiments import offline  # pylint: disable=g-import-not-at-top
  # D4RL v1 replay style: float64 steps (TF-Agents' spec keeps discount
  # float32, so that one stays).
  rlds_data = _rlds([40, 30]).map(lambda e: {rlds.STEPS: e[rlds.STEPS].map(
      lambda s: {**s, 'discount': tf.cast(s['discount'], tf.float32)})})
  spec = convert.create_trajectory_data_spec(rlds_data)
  assert spec.observation.dtype == tf.float64
  server = tables.start_server([tables.make_table('d4rl', spec,
                                                  max_size=1000)])
  try:
    push.push_rlds_to_table(rlds_data, server.localhost_client(), 'd4rl')
    address = f'localhost:{server.port}'
    summary = offline.train_offline(offline.OfflineConfig(
        agent='bc', dataset=address, reverb_address=address, table='d4rl',
        root_dir=str(tmp_path / 'run'), train_steps=40, batch_size=16,
        eval_interval=40, checkpoint_interval=40, eval_episodes=1,
        feed='stream'),
                                    show_progress=False)
    assert summary['table_size'] == 39 + 29
    assert summary['train_steps'] == 40
    assert np.isfinite(summary['offline_normalized_score'])
    # The run did not push: the table is as it was.
    assert tables.get_table_info(server.localhost_client(),
                                 'd4rl').current_size == 68
  finally:
    server.stop()


def test_prioritized_offline_training_moves_the_priorities(tmp_path):
  """Prioritized sampling over a pushed RLDS dataset (--reverb_address)."""
  from rlds_reverb.data import convert  # pylint: disable=g-import-not-at-top
  from rlds_reverb.storage import push  # pylint: disable=g-import-not-at-top
  from rlds_reverb.experiments import offline  # pylint: disable=g-import-not-at-top
  rlds_data = _rlds([40, 30], dtype=np.float32)
  spec = convert.create_trajectory_data_spec(rlds_data)
  server = tables.start_server([per.make_table('rlds', spec, max_size=100)])
  try:
    client = server.localhost_client()
    push.push_rlds_to_table(rlds_data, client, 'rlds', sequence_length=2)
    config = offline.OfflineConfig(
        agent='td3_bc', dataset='table', root_dir=str(tmp_path / 'run'),
        reverb_address=f'localhost:{server.port}', train_steps=40,
        batch_size=16, eval_interval=40, eval_episodes=1,
        checkpoint_interval=40, replay='prioritized', feed='stream',
        agent_config=factory.AgentConfig(actor_layers=(16,),
                                        critic_layers=(16,)))
    summary = offline.train_offline(config, show_progress=False)
    assert summary['replay'] == 'prioritized' and summary['train_steps'] == 40
    priorities = [item.info.priority for item in
                  client.sample('rlds', num_samples=200,
                                emit_timesteps=False)]
    assert len(set(priorities)) > 5  # No longer all the insert priority 1.0.
  finally:
    server.stop()
  uniform = tables.start_server([tables.make_table('rlds', spec,
                                                   max_size=100)])
  try:
    push.push_rlds_to_table(rlds_data, uniform.localhost_client(), 'rlds',
                            sequence_length=2)
    config.reverb_address = f'localhost:{uniform.port}'
    config.root_dir = str(tmp_path / 'run2')
    with pytest.raises(ValueError, match="samples uniform, not by priority"):
      offline.train_offline(config, show_progress=False)
  finally:
    uniform.stop()


def test_offline_prioritized_run_keeps_priorities_in_the_store(tmp_path):
  """A memory-fed prioritized offline run: priorities move, are written to
  the side table at each checkpoint, and a resumed run reads them back."""
  from rlds_reverb.experiments import offline  # pylint: disable=g-import-not-at-top
  rlds_data = _rlds([40, 30], dtype=np.float32)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  server = tables.start_server([
      episode_table.make_table('rlds', spec, max_episodes=100),
      feeds.make_priority_table('rlds')])
  try:
    client = server.localhost_client()
    rlds_reverb.push_rlds_to_table(rlds_data, client, 'rlds',
                                   sequence_length=None,
                                   priority=episode_table.UNREAD)
    config = offline.OfflineConfig(
        agent='td3_bc', dataset='table', root_dir=str(tmp_path / 'run'),
        reverb_address=f'localhost:{server.port}', train_steps=40,
        batch_size=16, eval_interval=40, eval_episodes=1,
        checkpoint_interval=20, replay='prioritized',
        agent_config=factory.AgentConfig(actor_layers=(16,),
                                        critic_layers=(16,)))
    summary = offline.train_offline(config, show_progress=False)
    assert summary['feed'] == 'memory' and summary['transitions'] == 68
    stored = next(client.sample('rlds.priorities', 1, emit_timesteps=False,
                                unpack_as_table_signature=True))
    stored = stored[0] if isinstance(stored, list) else stored
    values = np.asarray(stored.data['priorities'])
    assert sorted(np.asarray(stored.data['lengths']).tolist()) == [30, 40]
    moved = values[values > 0]
    assert len(set(np.round(moved, 6).tolist())) > 5  # Not all at 1.0.
  finally:
    server.stop()


def test_offline_config_errors():
  from rlds_reverb.experiments import offline  # pylint: disable=g-import-not-at-top
  base = dict(dataset='d', root_dir='/tmp/x', replay='prioritized')
  specs = envs.env_specs('HalfCheetah-v5')
  with pytest.raises(ValueError, match='bc has no TD error'):
    offline._check(offline.OfflineConfig(agent='bc', **base), specs)  # pylint: disable=protected-access
  with pytest.raises(ValueError, match='offline phase only'):
    offline._check(offline.OfflineConfig(  # pylint: disable=protected-access
        agent='td3_bc', online_finetune_steps=10, **base), specs)
  with pytest.raises(ValueError, match='replay must be one of'):
    offline._check(offline.OfflineConfig(agent='td3_bc', dataset='d',  # pylint: disable=protected-access
                                         root_dir='/tmp/x', replay='rank'),
                    specs)
