"""rlds_reverb.agents.registry: one record per agent, the only place that
looks agents up by name.

Each kind is refused, with one line naming it and the mode, by the entry
point of every mode its record does not name (before any data is read or
any file written). That each kind runs in the modes its record names is
shown by run tests parametrized over `registry.names(mode)`:
test_offline_rl_runs (every offline agent trains, exports and resumes;
every fine-tuning agent fine-tunes), and for online and on-policy
test_online_runs below.
"""

import os
import re

import pytest

from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.experiments import configs
from rlds_reverb.experiments import offline
from rlds_reverb.experiments import online
from rlds_reverb.experiments import onpolicy

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _entry(mode: str, agent: str, root_dir: str):
  """The call that starts a run of `agent` in `mode`."""
  if mode == registry.OFFLINE:
    return lambda: offline.train_offline(offline.OfflineConfig(
        agent=agent, dataset='unread', root_dir=root_dir), show_progress=False)
  if mode == registry.FINETUNE:
    return lambda: offline.train_offline(offline.OfflineConfig(
        agent=agent, dataset='unread', root_dir=root_dir,
        online_finetune_steps=100), show_progress=False)
  if mode == registry.ONLINE:
    return lambda: online.train_online(online.OnlineConfig(
        env='HalfCheetah-v5', agent=agent, root_dir=root_dir),
                                       show_progress=False)
  return lambda: onpolicy.train_onpolicy(onpolicy.OnPolicyConfig(
      env='HalfCheetah-v5', agent=agent, root_dir=root_dir),
                                         show_progress=False)


_REFUSED = [(agent, mode) for agent in registry.AGENTS
            for mode in registry.MODES
            if not registry.get(agent).trains(mode)]


@pytest.mark.parametrize('agent, mode', _REFUSED)
def test_each_kind_is_refused_in_the_modes_its_record_does_not_name(
    agent, mode, tmp_path):
  root_dir = str(tmp_path / 'run')
  with pytest.raises(ValueError) as refused:
    _entry(mode, agent, root_dir)()
  message = str(refused.value)
  assert '\n' not in message
  assert repr(agent) in message or f'{agent} ' in message
  assert not os.path.exists(root_dir)  # Refused before anything is written.


@pytest.mark.parametrize('agent', registry.AGENTS)
def test_check_mode_names_the_agent_its_modes_and_the_alternatives(agent):
  record = registry.get(agent)
  for mode in registry.MODES:
    if record.trains(mode):
      record.check_mode(mode)
      continue
    with pytest.raises(ValueError, match=(
        f"agent '{agent}' does not train .*; agents that do: ")) as refused:
      record.check_mode(mode)
    for other in registry.names(mode):
      assert other in str(refused.value)


def test_unknown_agents_and_modes_are_refused():
  with pytest.raises(ValueError, match="unknown agent 'nope'; one of: sac,"):
    registry.get('nope')
  with pytest.raises(ValueError, match="unknown mode 'later'"):
    registry.get('sac').check_mode('later')


def test_her_modes_and_names():
  assert registry.names(registry.OFFLINE, her=True) == ('sac', 'td3',
                                                         'td3_bc')
  assert registry.names(registry.ONLINE, discrete=True) == ('dqn',)
  assert registry.names(registry.ONLINE, discrete=False) == ('sac', 'td3')
  with pytest.raises(ValueError, match="'bc' does not train offline with "
                     'HER'):
    registry.get('bc').check_mode(registry.OFFLINE, her=True)


def test_resolve_fills_only_what_is_unset_from_the_published_settings():
  resolved = registry.resolve('rebrac', factory.AgentConfig(
      actor_learning_rate=5e-4))
  assert resolved.actor_learning_rate == 5e-4  # Given: kept.
  assert resolved.critic_learning_rate == 1e-3  # CORL's.
  assert resolved.critic_layers == (256, 256, 256)
  assert configs.default(configs.OfflineConfig, 'rebrac', 'batch_size') == 1024
  assert registry.resolve('sac', factory.AgentConfig()).reward_scale_factor \
      == 0.1


def test_every_record_has_what_its_modes_need():
  for agent in registry.AGENTS:
    record = registry.get(agent)
    assert record.modes and set(record.modes) <= set(registry.MODES)
    assert set(record.her_modes) <= set(record.modes) | {registry.OFFLINE}
    off_policy = set(record.modes) - {registry.ONPOLICY}
    assert (record.make is not None) == bool(off_policy), agent
    assert (record.head is not None) == bool(off_policy), agent
    assert record.published.source


def test_no_agent_name_is_compared_outside_the_registry():
  """Library code asks a record; `x == 'sac'` or `x in ('td3', ...)` only
  in registry.py (ppo.py's `algorithm` is PpoConfig's own switch)."""
  names = '|'.join(registry.AGENTS)
  compare = re.compile(
      rf"(==|!=)\s*'({names})'|\bin\s*\([^)]*'({names})'")
  found = []
  for base in ('rlds_reverb', 'pipelines'):
    for directory, _, files in os.walk(os.path.join(_REPO, base)):
      for name in files:
        path = os.path.join(directory, name)
        if not name.endswith('.py') or name == 'registry.py':
          continue
        with open(path) as f:
          for number, line in enumerate(f, 1):
            if compare.search(line) and 'algorithm' not in line:
              found.append(f'{os.path.relpath(path, _REPO)}:{number}: '
                           f'{line.strip()}')
  assert found == []


@pytest.mark.parametrize('agent', registry.names(registry.ONLINE) +
                         registry.names(registry.ONPOLICY))
def test_online_runs(agent, tmp_path):
  """Each agent whose record names online or on-policy training runs a
  short run in an env of its action kind and evaluates at its end."""
  record = registry.get(agent)
  env = ('CartPole-v1' if record.actions != registry.CONTINUOUS
         else 'HalfCheetah-v5')
  root_dir = str(tmp_path / agent)
  if record.trains(registry.ONLINE):
    summary = online.train_online(online.OnlineConfig(
        env=env, agent=agent, root_dir=root_dir, env_steps=300,
        initial_collect_steps=100, train_every=100, batch_size=16,
        eval_interval=300, eval_episodes=1, checkpoint_interval=300,
        agent_config=factory.AgentConfig(
            actor_layers=(16,), critic_layers=(16,), q_layers=(16,))),
                                  show_progress=False)
  else:
    summary = onpolicy.train_onpolicy(onpolicy.OnPolicyConfig(
        env=env, agent=agent, root_dir=root_dir, env_steps=512,
        eval_interval=512, eval_episodes=1, checkpoint_interval=512),
                                      show_progress=False)
  assert summary['env_steps'] >= 300
  assert os.path.exists(os.path.join(root_dir, 'eval.jsonl'))


def test_make_agent_refuses_a_method_config_of_another_kind():
  from rlds_reverb.acting import envs  # pylint: disable=g-import-not-at-top
  from rlds_reverb.agents.offline import iql  # pylint: disable=g-import-not-at-top
  specs = envs.env_specs('HalfCheetah-v5')
  with pytest.raises(ValueError, match="'awac' takes method_config "
                     'AwacConfig, got IqlConfig'):
    registry.make_agent('awac', specs.time_step_spec, specs.action_spec,
                        method_config=iql.IqlConfig())
  with pytest.raises(ValueError, match="'td3_bc' takes method_config none"):
    registry.make_agent('td3_bc', specs.time_step_spec, specs.action_spec,
                        method_config=iql.IqlConfig())
