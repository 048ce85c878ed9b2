"""The one runner: every mode's run set-up goes through `run_experiment`.

The modes' own behaviour (offline, fine-tuning, online, distributed,
on-policy) is tested through their entry points elsewhere; here, what the
runner itself promises: it is the one place that starts a run's Reverb
servers and restores its learner, a builder that fails leaves nothing in
root_dir, and the servers stop and the builder is closed either way.
"""

import os
import re
import socket

import pytest

from rlds_reverb.experiments import configs
from rlds_reverb.experiments import runner
from rlds_reverb.replay import rollout_queue

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_servers_start_and_learners_restore_only_in_the_runner():
  found = {}
  pattern = re.compile(r'\bstart_server\(|\.restore\(\)')
  experiments = os.path.join(_REPO, 'rlds_reverb', 'experiments')
  for name in sorted(os.listdir(experiments)):
    if name.endswith('.py'):
      with open(os.path.join(experiments, name)) as f:
        hits = pattern.findall(f.read())
      if hits:
        found[name] = sorted(hits)
  assert found == {'runner.py': ['.restore()', 'start_server(']}


class _Builder:
  """A builder that fails where it is told to, after the runner has done
  what comes before that step."""

  def __init__(self, root_dir: str, fail_in: str):
    self.config = configs.OnPolicyConfig(agent='ppo', env='CartPole-v1',
                                         root_dir=root_dir)
    self.fail_in, self.closed, self.ports = fail_in, 0, []

  def check(self, specs):
    assert specs.discrete
    if self.fail_in == 'check':
      raise ValueError('bad data')
    return self.config

  def prepare(self):
    pass

  def servers(self):
    return [([rollout_queue.make_table('queue')], 'reverb')]

  def make_learner(self, servers):
    self.ports = [server.port for server in servers]
    # Something written in root_dir before the run starts.
    os.makedirs(os.path.join(self.config.root_dir, 'checkpoints'))
    raise ValueError('bad table')

  def train(self, learner, resumed, run_dir):
    raise AssertionError('not reached')

  def close(self):
    self.closed += 1


def _listening(port: int) -> bool:
  with socket.socket() as probe:
    probe.settimeout(2)
    return probe.connect_ex(('127.0.0.1', port)) == 0


@pytest.mark.parametrize('fail_in', ['check', 'make_learner'])
def test_a_failed_set_up_leaves_nothing_and_stops_what_it_started(
    fail_in, tmp_path):
  root = tmp_path / 'run'
  builder = _Builder(str(root), fail_in)
  with pytest.raises(ValueError, match='bad data|bad table'):
    runner.run_experiment(builder)
  assert not root.exists()
  assert builder.closed >= 1
  if fail_in == 'make_learner':
    (port,) = builder.ports
    assert not _listening(port), f'the server on port {port} still listens'
  else:
    assert builder.ports == []  # No server was started.
