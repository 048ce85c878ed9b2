"""The gin files in configs/: each parses and binds real config fields.

Each file is parsed as `pipelines.train --gin_file` parses it (unknown
classes or fields fail), then every config class it binds is built, and
each bound field must come out of the dataclass with the bound value.
"""

import pathlib
import re

import gin
import pytest

from rlds_reverb.replay import her
from rlds_reverb.replay import per
from rlds_reverb.agents import factory
from rlds_reverb.agents.offline import awac
from rlds_reverb.agents.offline import cal_ql
from rlds_reverb.agents.offline import iql
from rlds_reverb.experiments import offline
from rlds_reverb.experiments import online
from rlds_reverb.agents.offline import rebrac
from rlds_reverb.agents.offline import sac_n
from rlds_reverb.agents.onpolicy import ppo

CONFIGS = sorted((pathlib.Path(__file__).resolve().parents[1] / 'configs')
                 .glob('*.gin'))

# How to build each bindable config class (required fields filled in).
_BUILD = {
    'AgentConfig': factory.AgentConfig,
    'PerConfig': per.PerConfig,
    'HerConfig': her.HerConfig,
    'OfflineConfig': lambda: offline.OfflineConfig(
        agent='td3_bc', dataset='data', root_dir='run'),
    'OnlineConfig': lambda: online.OnlineConfig(env='env', root_dir='run'),
    'IqlConfig': iql.IqlConfig,
    'AwacConfig': awac.AwacConfig,
    'RebracConfig': rebrac.RebracConfig,
    'SacNConfig': sac_n.SacNConfig,
    'CalQlConfig': cal_ql.CalQlConfig,
    'PpoConfig': ppo.PpoConfig,
}


@pytest.fixture(autouse=True)
def _clear_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def test_there_are_configs():
  assert len(CONFIGS) >= 4, CONFIGS


@pytest.mark.parametrize('path', CONFIGS, ids=[p.stem for p in CONFIGS])
def test_config_file_binds_real_fields(path):
  gin.parse_config_files_and_bindings([str(path)], [], skip_unknown=False)
  bindings = re.findall(r'^(\w+)\.(\w+)\s*=', path.read_text(), re.MULTILINE)
  assert bindings, f'{path.name} binds nothing'
  built = {name: _BUILD[name]() for name in {name for name, _ in bindings}}
  for name, field in bindings:
    assert getattr(built[name], field) == gin.query_parameter(
        f'{name}.{field}'), f'{path.name}: {name}.{field}'


def test_an_unknown_field_fails_to_parse():
  with pytest.raises(ValueError, match="doesn't have a parameter named"):
    gin.parse_config_files_and_bindings(
        [], ['AgentConfig.actor_layerz = (32,)'], skip_unknown=False)
