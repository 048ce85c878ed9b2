"""Each setting is stated once: flags, gin and resume come from the fields.

The command-line flags of pipelines.train are generated from the run
configs' fields (`pipelines.config_flags`); these tests check that what the
flags say (names, defaults, help, bounds) is what the fields say, that gin
binds the same fields, that the one order of precedence holds (flag > gin >
the agent's default > the field's), and that what may change on resume is
the fields' metadata.
"""

import dataclasses

from absl import flags
import gin
import pytest

from conftest import tools_module  # pylint: disable=g-bad-import-order

from pipelines import config_flags
from rlds_reverb import settings
from rlds_reverb.acting import remote
from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.experiments import configs
from rlds_reverb.experiments import resume

MODES = tuple(configs.MODES.values())


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


@pytest.fixture(name='flag_values')
def _flag_values():
  values = flags.FlagValues()
  config_flags.define(MODES, flag_values=values)
  values(['train'])  # Parsed, with nothing given.
  return values


def _settings():
  return [(cls, s) for cls in MODES for s in settings.fields(cls)]


def _as_flag_default(setting):
  if setting.default is dataclasses.MISSING:
    return None
  if setting.type is bool and setting.optional:
    return {None: 'auto', True: 'true', False: 'false'}[setting.default]
  if isinstance(setting.default, tuple):
    return [str(v) for v in setting.default]
  return setting.default


def test_every_setting_has_help_and_every_flag_a_field(flag_values):
  flagged = {s.flag for _, s in _settings() if s.flag}
  for cls, setting in _settings():
    assert setting.help, f'{cls.__name__}.{setting.path} has no docstring'
  # Every generated flag sets a field, and every field with a flag has one.
  assert flagged == set(flag_values), set(flag_values) ^ flagged


def test_generated_flags_say_what_the_fields_say(flag_values):
  by_flag = {}
  for cls, setting in _settings():
    if setting.flag:
      by_flag.setdefault(setting.flag, []).append(setting)
  for name, fields in by_flag.items():
    flag = flag_values[name]
    for setting in fields:
      assert setting.help in flag.help, (name, setting.path)
    defaults = {repr(s.default) for s in fields}
    if len(defaults) == 1 and not fields[0].switch:
      assert flag.default == _as_flag_default(fields[0]), name
    else:  # Several modes' defaults (or a switch): each said in the help.
      assert flag.default is None, name
  assert flag_values['batch_size'].default == 256
  assert ("rebrac 1024; discrete_bc on Atari 32; discrete_cql on Atari 32; "
          "dqn 64; dqn on Atari 32") in flag_values['batch_size'].help
  assert 'Default: offline 300000, online 300000, on-policy 1000000' in (
      flag_values['steps'].help)


def test_bounds_and_choices_come_from_the_fields(flag_values):
  with pytest.raises(flags.IllegalFlagValueError):
    flag_values['batch_size'].parse('0')
  with pytest.raises(flags.IllegalFlagValueError):
    flag_values['per_beta0'].parse('2')
  with pytest.raises(flags.IllegalFlagValueError):
    flag_values['replay'].parse('greedy')
  with pytest.raises(ValueError, match='batch_size must be >= 1, got 0'):
    settings.check_bounds(configs.OfflineConfig(
        agent='bc', dataset='d', root_dir='r', batch_size=0))


def test_given_flags_become_field_values():
  values = flags.FlagValues()
  config_flags.define(MODES, flag_values=values)
  values(['train', '--per_alpha', '0.7', '--normalize_observations', 'true',
          '--actor_layers', '64,64', '--steps', '50', '--her', 'final'])
  given = config_flags.given(configs.OfflineConfig, values)
  assert given == {'per_config.alpha': 0.7, 'normalize_observations': True,
                   'agent_config.actor_layers': (64, 64),
                   'train_steps': 50, 'her_config.strategy': 'final'}
  assert config_flags.given(configs.OnPolicyConfig, values) == {
      'env_steps': 50}
  config = configs.make(configs.OfflineConfig, 'td3_bc',
                        {**given, 'dataset': 'd', 'root_dir': 'r'})
  assert config.per_config.alpha == 0.7 and config.normalize_observations
  assert config.agent_config.actor_layers == (64, 64)
  assert config.her_config.strategy == 'final'
  # Filled in from other settings: the seed, the schedules' length, PER's
  # annealing over the run's gradient steps.
  assert config.agent_config.seed == 0 and config.agent_config.train_steps == 50
  assert config.per_config.beta_steps == 50


def test_precedence_flag_over_gin_over_agent_default_over_field():
  make = lambda **given: configs.make(
      configs.OnlineConfig, 'dqn', {'root_dir': 'r', **given})
  assert make().batch_size == 64  # dqn's own (registry).
  assert configs.make(configs.OnlineConfig, 'sac',
                      {'root_dir': 'r'}).batch_size == 256  # The field's.
  gin.parse_config(['OnlineConfig.batch_size = 32',
                    'AgentConfig.gamma = 0.9'])
  assert make().batch_size == 32  # gin over dqn's own.
  assert make().agent_config.gamma == 0.9
  assert make(batch_size=8).batch_size == 8  # Given over gin.
  assert make(**{'agent_config.gamma': 0.5}).agent_config.gamma == 0.5


def test_offline_discrete_learners_on_atari_take_the_cnn_defaults():
  make = lambda agent, env, **given: configs.make(
      configs.OfflineConfig, agent,
      {'root_dir': 'r', 'dataset': 'd', 'env': env, **given})
  for agent in ('discrete_bc', 'discrete_cql'):
    atari = make(agent, 'ALE/Pong-v5')
    assert atari.batch_size == 32
    assert atari.agent_config.dqn_learning_rate == 1e-4
    assert atari.agent_config.target_update_period == (
        2000 if agent == 'discrete_cql' else 128)  # BC has no target.
    vectors = make(agent, 'CartPole-v1')  # The fields' own.
    assert vectors.batch_size == 256
    assert vectors.agent_config.dqn_learning_rate == 2.3e-3
    assert vectors.agent_config.target_update_period == 128
  # Given settings and gin still come first; other learners are untouched.
  assert make('discrete_cql', 'ALE/Pong-v5', batch_size=64).batch_size == 64
  gin.parse_config(['AgentConfig.dqn_learning_rate = 5e-5'])
  assert make('discrete_cql', 'ALE/Pong-v5').agent_config.dqn_learning_rate \
      == 5e-5
  assert make('td3_bc', 'ALE/Pong-v5').batch_size == 256
  help_ = config_flags.help_text([(configs.OfflineConfig, next(
      s for s in settings.fields(configs.OfflineConfig)
      if s.path == 'batch_size'))])
  assert 'discrete_cql on Atari 32' in help_


def test_online_dqn_on_atari_takes_rl_zoos_atari_schedule():
  make = lambda env, **given: configs.make(
      configs.OnlineConfig, 'dqn', {'root_dir': 'r', 'env': env, **given})
  atari = make('ALE/Pong-v5')
  assert (atari.env_steps, atari.initial_collect_steps) == (10_000_000,
                                                            100_000)
  assert (atari.batch_size, atari.replay_size) == (32, 100_000)
  assert (atari.epsilon_final, atari.exploration_fraction) == (0.01, 0.1)
  assert atari.train_every * atari.utd == 250  # One update per 4 steps.
  assert atari.agent_config.dqn_learning_rate == 1e-4
  assert atari.agent_config.target_update_period == 250  # 1,000 steps.
  cartpole = make('CartPole-v1')  # RL Zoo's CartPole schedule stays.
  assert (cartpole.env_steps, cartpole.batch_size) == (50_000, 64)
  assert cartpole.agent_config.dqn_learning_rate == 2.3e-3
  assert cartpole.epsilon_final == 0.04
  assert make('ALE/Pong-v5', env_steps=2000).env_steps == 2000
  help_ = config_flags.help_text([(configs.OnlineConfig, next(
      s for s in settings.fields(configs.OnlineConfig)
      if s.path == 'initial_collect_steps'))])
  assert 'dqn on Atari 100000' in help_


def test_each_setting_is_declared_in_one_class():
  declared = {}
  for cls in (configs.RunConfig, configs.OffPolicyConfig,
              configs.ActorsConfig, *MODES):
    for name in cls.__dict__.get('__annotations__', {}):
      declared.setdefault(name, []).append(cls.__name__)
  # The agent kind is required everywhere; two modes name their default.
  twice = {name: owners for name, owners in declared.items()
           if len(owners) > 1 and name != 'agent'}
  # table and env_steps are settings of their own per mode (other tables,
  # other units), not one setting stated twice.
  assert set(twice) <= {'table', 'env_steps'}, twice
  for name in ('batch_size', 'checkpoint_interval', 'eval_interval',
               'eval_episodes', 'seed'):
    assert len(declared[name]) == 1, (name, declared[name])


def test_defaults_of_batch_size_and_checkpoint_interval_come_from_one_field():
  for agent in registry.AGENTS:
    mode = next(m for m in configs.MODES if registry.get(agent).trains(m))
    cls = configs.MODES[mode]
    expected_interval = 50_000 if mode == registry.ONPOLICY else 10_000
    assert configs.default(cls, agent, 'checkpoint_interval') == (
        expected_interval)
    if issubclass(cls, configs.OffPolicyConfig):
      assert configs.default(cls, agent, 'batch_size') == {
          'rebrac': 1024, 'dqn': 64}.get(agent, 256)


def test_gin_binds_every_top_level_field_by_its_name():
  for cls in MODES:
    for field in dataclasses.fields(cls):
      gin.parse_config([f'{cls.__name__}.{field.name} = None'])
      assert settings.gin_bound(cls, field.name)
      gin.clear_config()


def test_what_may_change_on_resume_is_field_metadata():
  may_change = resume.MAY_CHANGE
  assert {'train_steps', 'env_steps', 'eval_interval', 'checkpoint_interval',
          'per_config.beta_steps', 'agent_config.critic_dtype',
          'agent_config.train_steps', 'reverb_address'} <= may_change
  assert not {'seed', 'batch_size', 'agent', 'dataset', 'replay'} & may_change
  assert may_change == frozenset().union(*(
      {s.path for s in settings.fields(cls) if s.may_change}
      for cls in MODES))
  assert factory.AgentConfig.__dataclass_fields__[
      'critic_dtype'].metadata['may_change']


def test_settings_page_is_generated_from_the_fields():
  settings_doc = tools_module('settings_doc')
  assert settings_doc.PATH.read_text() == settings_doc.render(), (
      'docs/settings.md is out of date: python -m tools.settings_doc')


def test_the_actor_process_flags_are_its_config_fields():
  values = flags.FlagValues()
  config_flags.define([remote.ActorConfig], flag_values=values)
  values(['act', '--policy_refresh_steps', '20'])
  fields = list(settings.fields(remote.ActorConfig))
  assert set(values) == {s.flag for s in fields}
  for setting in fields:
    assert values[setting.flag].default == setting.default, setting.name
    assert setting.help and setting.help in values[setting.flag].help
  assert config_flags.given(remote.ActorConfig, values) == {
      'policy_refresh_steps': 20}
  with pytest.raises(flags.IllegalFlagValueError):
    values['epsilon'].parse('2')
  with pytest.raises(ValueError, match='max_unread_episodes must be >= 1'):
    remote.ActorConfig(max_unread_episodes=0).check()
