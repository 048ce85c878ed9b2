"""Tests of `python -m pipelines.act`: actor processes against a server process.

One scenario, run once for the module: a Reverb server process with the
tables of InvertedPendulum-v5 (episode table + weights table), weights
published from this process, two actor processes. Actor A is stopped with
SIGTERM; then the server is killed with SIGKILL while actor B runs.
"""

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import reverb

from rlds_reverb import settings
from rlds_reverb.acting import envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.acting import remote
from rlds_reverb.acting import rollout_actor
from rlds_reverb.replay import variables
from pipeline_process import unused_port  # pylint: disable=g-bad-import-order
import preloaded_cli  # pylint: disable=g-bad-import-order

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = dict(os.environ, TF_CPP_MIN_LOG_LEVEL='3',
           PYTHONPATH=os.pathsep.join(
               [str(REPO), *filter(None, [os.environ.get('PYTHONPATH')])]))
GYM_ENV = 'InvertedPendulum-v5'
# A server process with the actors' tables (what pipelines.serve will make).
SERVER = """
import sys, time, warnings
warnings.simplefilter('ignore')
from rlds_reverb.storage import tables
from rlds_reverb.acting import envs, remote
from rlds_reverb.experiments import run
spec = run.trajectory_spec(envs.env_specs(sys.argv[1]))
server = tables.start_server(remote.make_tables(spec, max_episodes=100_000),
                             port=int(sys.argv[2]))
print('serving', flush=True)
time.sleep(600)
"""
START_TIMEOUT_S = 120


def _wait(condition, timeout_s: float, what: str) -> None:
  deadline = time.monotonic() + timeout_s
  while not condition():
    if time.monotonic() > deadline:
      pytest.fail(f'{what} not within {timeout_s}s')
    time.sleep(0.2)


def _policy(value: float) -> numpy_policy.NumpyPolicy:
  specs = envs.env_specs(GYM_ENV)
  return numpy_policy.NumpyPolicy(
      'deterministic', [np.zeros((4, 1), np.float32)],
      [np.full(1, np.arctanh(value / 3.0), np.float32)],
      specs.action_low, specs.action_high)


def _actor(port: int, run_dir: pathlib.Path, seed: int) -> subprocess.Popen:
  return subprocess.Popen(
      [sys.executable, '-m', 'pipelines.act', '--reverb_address',
       f'localhost:{port}', '--env', GYM_ENV, '--run_dir', str(run_dir),
       '--agent', 'td3', '--exploration_noise', '0', '--seed', str(seed),
       '--initial_random_steps', '0', '--policy_refresh_steps', '10',
       '--max_unread_episodes', '100000', '--timeout_s', '1',
       '--noprogress'],
      cwd=run_dir, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
      text=True)


@pytest.fixture(scope='module')
def scenario(tmp_path_factory):
  run_dir = tmp_path_factory.mktemp('run')
  port = unused_port()
  procs = []
  try:
    server = subprocess.Popen([sys.executable, '-c', SERVER, GYM_ENV,
                               str(port)], cwd=run_dir, env=ENV,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    procs.append(server)
    assert server.stdout.readline().strip() == 'serving'
    client = reverb.Client(f'localhost:{port}')
    variables.publish(client, _policy(2.0), 1)
    actor_a, actor_b = _actor(port, run_dir, 1), _actor(port, run_dir, 2)
    procs += [actor_a, actor_b]

    def episodes():
      return client.server_info(timeout=5)['online'].current_size

    _wait(lambda: episodes() >= 10, START_TIMEOUT_S, 'episodes from actors')
    variables.publish(client, _policy(-2.0), 2)
    written = episodes()
    _wait(lambda: episodes() >= written + 20, 60, 'episodes under version 2')

    actor_a.send_signal(signal.SIGTERM)
    start = time.monotonic()
    out_a, err_a = actor_a.communicate(timeout=60)
    a_seconds = time.monotonic() - start

    server.kill()  # SIGKILL: no goodbye to the clients.
    server.wait()
    start = time.monotonic()
    out_b, err_b = actor_b.communicate(timeout=60)
    b_seconds = time.monotonic() - start
    yield {'run_dir': run_dir, 'port': port,
           'a': (actor_a.returncode, out_a, err_a, a_seconds),
           'b': (actor_b.returncode, out_b, err_b, b_seconds)}
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()


def test_sigterm_ends_with_a_summary(scenario):
  code, out, err, seconds = scenario['a']
  assert code == 0, err
  assert seconds < 20
  summary = json.loads(out.strip().splitlines()[-1])
  assert summary['stopped'] == 'SIGTERM'
  assert summary['policy_version'] == 2 and summary['policy_updates'] == 2
  assert summary['episodes_written'] >= 1
  assert (summary['episodes_written'] + summary['episodes_unconfirmed'] ==
          summary['episodes'])
  log = pathlib.Path(summary['log_dir'])
  assert log == scenario['run_dir'] / 'actor_1'
  records = [json.loads(line) for line in
             (log / 'episodes.jsonl').read_text().splitlines()]
  assert len(records) == summary['episodes']
  versions = [r['policy_version'] for r in records]
  assert versions[0] == 1 and versions[-1] == 2
  assert any(name.startswith('events.out.tfevents')
             for name in os.listdir(log))


def test_killed_server_is_one_error_line_within_seconds(scenario):
  code, _, err, seconds = scenario['b']
  assert code == 1, err
  assert seconds < 10
  assert 'Traceback' not in err
  last = err.strip().splitlines()[-1]
  assert re.match(rf'act: error: Reverb server at localhost:'
                  rf'{scenario["port"]} ', last), err


def test_help_explains_every_flag():
  source = (REPO / 'pipelines' / 'act.py').read_text()
  names = re.findall(r"flags\.DEFINE_\w+\(\s*'(\w+)'", source)
  # The actors' settings: made from the fields of remote.ActorConfig and
  # rollout_actor.RolloutActorConfig.
  names += sorted({s.flag for cls in (remote.ActorConfig,
                                      rollout_actor.RolloutActorConfig)
                   for s in settings.fields(cls)})
  assert len(names) >= 15
  proc = preloaded_cli.run('act', '--help', cwd=REPO, env=ENV, timeout_s=120)
  assert proc.returncode == 0, proc.stderr
  for name in names:
    assert re.search(rf'--(\[no\])?{name}:\s+\S', proc.stdout), name


