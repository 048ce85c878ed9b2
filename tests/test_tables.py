"""Tests for rlds_reverb.storage.tables, against real Reverb servers."""

import os
import re
import shutil
import socket
import tempfile
import time
import warnings

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np
import pytest
import reverb
import tensorflow as tf
from tf_agents.replay_buffers import reverb_replay_buffer
from tf_agents.replay_buffers import reverb_utils
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import policy_step
from tf_agents.trajectories import time_step as ts
from tf_agents.trajectories import trajectory

from rlds_reverb.storage import tables
from pipeline_process import unused_port  # pylint: disable=g-bad-import-order

_OBS_DIM = 3
_ACTION_DIM = 2


def _data_spec(obs_dim: int = _OBS_DIM) -> trajectory.Trajectory:
  """A trajectory spec as `create_trajectory_data_spec` builds it."""
  time_step_spec = ts.time_step_spec(
      tf.TensorSpec([obs_dim], tf.float32), tf.TensorSpec([], tf.float32))
  action_spec = policy_step.PolicyStep(tf.TensorSpec([_ACTION_DIM], tf.float32))
  return trajectory.from_transition(time_step_spec, action_spec, time_step_spec)


def _trajectories(num_steps: int):
  """One episode of `num_steps` trajectories with distinct observations."""
  for t in range(num_steps):
    if t == 0:
      step_type, next_type = ts.StepType.FIRST, ts.StepType.MID
    elif t == num_steps - 1:
      step_type, next_type = ts.StepType.LAST, ts.StepType.FIRST
    else:
      step_type, next_type = ts.StepType.MID, ts.StepType.MID
    if t == num_steps - 2:
      next_type = ts.StepType.LAST
    yield trajectory.Trajectory(
        step_type=np.int32(step_type),
        observation=np.full([_OBS_DIM], t, np.float32),
        action=np.full([_ACTION_DIM], -t, np.float32),
        policy_info=(),
        next_step_type=np.int32(next_type),
        reward=np.float32(t / 10),
        discount=np.float32(1.0),
    )


def _write(client: reverb.Client, table: str, num_steps: int,
           sequence_length: int = 2) -> None:
  """Writes one episode with TF-Agents' own observer, flushed."""
  observer = reverb_utils.ReverbAddTrajectoryObserver(
      client, table, sequence_length=sequence_length, stride_length=1)
  for traj in _trajectories(num_steps):
    observer(traj)
  observer.flush()
  observer.close()


def _contents(client: reverb.Client, table: str, size: int) -> dict:
  """Maps item key -> its data, sampling until every item has been seen."""
  seen = {}
  for _ in range(50):
    for sample in client.sample(table, num_samples=20 * size):
      key = int(sample[0].info.key)
      seen[key] = [tuple(np.asarray(x).tolist() for x in step.data)
                   for step in sample]
    if len(seen) == size:
      break
  return seen


def _tempdir(test: absltest.TestCase) -> str:
  # absltest's create_tempdir needs parsed absl flags, which pytest skips.
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


class MakeTableTest(parameterized.TestCase):

  def test_signature_is_data_spec_with_outer_time_dim(self):
    table = tables.make_table('t', _data_spec(), max_size=10)
    self.assertEqual(table.info.signature,
                     tensor_spec.add_outer_dim(_data_spec()))
    self.assertEqual(table.info.signature.observation.shape.as_list(),
                     [None, _OBS_DIM])

  @parameterized.named_parameters(
      ('uniform', 'uniform', 'uniform'),
      ('fifo', 'fifo', 'fifo'),
      ('lifo', 'lifo', 'lifo'),
      ('prioritized', 'prioritized', 'prioritized'),
  )
  def test_sampler(self, sampler, option):
    table = tables.make_table('t', _data_spec(), max_size=10, sampler=sampler,
                              alpha=0.7)
    self.assertTrue(table.info.sampler_options.HasField(option))
    if sampler == 'prioritized':
      self.assertAlmostEqual(
          table.info.sampler_options.prioritized.priority_exponent, 0.7)

  def test_remover_and_rate_limiter(self):
    table = tables.make_table('t', _data_spec(), max_size=10, remover='lifo',
                              min_size_to_sample=4)
    self.assertTrue(table.info.remover_options.HasField('lifo'))
    self.assertEqual(table.info.rate_limiter_info.min_size_to_sample, 4)
    self.assertEqual(table.info.max_size, 10)

  @parameterized.named_parameters(
      dict(testcase_name='empty_name', kwargs=dict(name=''), match='name'),
      dict(testcase_name='empty_spec', kwargs=dict(data_spec=()),
           match='data_spec'),
      dict(testcase_name='zero_max_size', kwargs=dict(max_size=0),
           match='max_size must be a positive integer, got 0'),
      dict(testcase_name='float_max_size', kwargs=dict(max_size=1.5),
           match='max_size'),
      dict(testcase_name='zero_sequence_length',
           kwargs=dict(sequence_length=0),
           match='sequence_length must be a positive integer or None'),
      dict(testcase_name='bad_sampler', kwargs=dict(sampler='random'),
           match="sampler must be one of 'uniform', 'fifo'.*got 'random'"),
      dict(testcase_name='bad_remover', kwargs=dict(remover='prioritized'),
           match="remover must be one of .*got 'prioritized'"),
      dict(testcase_name='negative_alpha', kwargs=dict(alpha=-1.0),
           match='alpha must be >= 0'),
      dict(testcase_name='zero_min_size', kwargs=dict(min_size_to_sample=0),
           match=(r'min_size_to_sample must be an integer in '
                  r'\[1, max_size=10\]')),
      dict(testcase_name='min_size_above_max_size',
           kwargs=dict(min_size_to_sample=11),
           match='never be sampled'),
  )
  def test_bad_arguments(self, kwargs, match):
    args = dict(name='t', data_spec=_data_spec(), max_size=10)
    args.update(kwargs)
    with self.assertRaisesRegex(ValueError, match):
      tables.make_table(args.pop('name'), args.pop('data_spec'), **args)

  def test_whole_episode_sequence_length_is_allowed(self):
    table = tables.make_table('t', _data_spec(), max_size=10,
                              sequence_length=None)
    self.assertEqual(table.name, 't')


# Every server warns that it listens on all interfaces; the warning itself is
# tested in SecurityTest, which records it.
pytestmark = pytest.mark.filterwarnings(
    'ignore::rlds_reverb.storage.tables.InsecureServerWarning')


class ServerTest(parameterized.TestCase):
  """Table lookups and the TF-Agents read path on one class-scoped server."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls._server = tables.start_server([
        tables.make_table('a', _data_spec(), max_size=100),
        tables.make_table('b', _data_spec(obs_dim=5), max_size=100),
    ])
    cls._client = tables.connect(f'localhost:{cls._server.port}')

  @classmethod
  def tearDownClass(cls):
    cls._server.stop()
    super().tearDownClass()

  def tearDown(self):
    self._client.reset('a')
    self._client.reset('b')
    super().tearDown()

  def test_tf_agents_replay_buffer_reads_the_table(self):
    _write(self._client, 'a', num_steps=6)
    self.assertEqual(tables.get_table_info(self._client, 'a').current_size, 5)
    replay = reverb_replay_buffer.ReverbReplayBuffer(
        _data_spec(), 'a', sequence_length=2, local_server=self._server)
    dataset = replay.as_dataset(sample_batch_size=4, num_steps=2)
    experience, _ = next(iter(dataset))
    self.assertEqual(experience.observation.shape, [4, 2, _OBS_DIM])
    self.assertEqual(experience.action.shape, [4, 2, _ACTION_DIM])
    # Each item is two consecutive steps of the episode.
    obs = experience.observation.numpy()[:, :, 0]
    np.testing.assert_array_equal(obs[:, 1] - obs[:, 0], np.ones(4))

  def test_get_table_signature(self):
    self.assertEqual(tables.get_table_signature(self._client, 'b'),
                     tensor_spec.add_outer_dim(_data_spec(obs_dim=5)))

  def test_missing_table_names_it_and_lists_existing(self):
    with self.assertRaisesRegex(
        tables.TableNotFoundError,
        "no table 'nope' on the Reverb server at localhost:\\d+; "
        "its tables: 'a', 'b'") as raised:
      tables.get_table_signature(self._client, 'nope')
    self.assertIsInstance(raised.exception, KeyError)
    self.assertIsInstance(raised.exception, ValueError)

  def test_check_signature_accepts_matching_spec(self):
    tables.check_signature(self._client, 'a', _data_spec())

  def test_check_signature_mismatch(self):
    with self.assertRaisesRegex(
        ValueError,
        r"^Replay buffer table signature spec should match RLDS data spec\. "
        r"Table 'b' vs data: observation: table float32\[None,5\] vs data "
        r"float32\[None,3\]\.$"):
      tables.check_signature(self._client, 'b', _data_spec())

  def test_check_signature_missing_table(self):
    with self.assertRaises(tables.TableNotFoundError):
      tables.check_signature(self._client, 'nope', _data_spec())

  def test_check_signature_ignores_names_and_bounds(self):
    renamed = tf.nest.map_structure(
        lambda s: tf.TensorSpec(s.shape, s.dtype, name='other'), _data_spec())
    tables.check_signature(self._client, 'a', renamed)

  def test_check_signature_on_table_without_signature(self):
    server = reverb.Server([reverb.Table.queue('plain', 10)])
    try:
      client = tables.connect(f'localhost:{server.port}')
      tables.check_signature(client, 'plain', _data_spec())  # Takes anything.
    finally:
      server.stop()

  def test_spec_differences(self):
    data = {'x': tf.TensorSpec([3], tf.float32, name='x'),
            'y': tf.TensorSpec([], tf.int32),
            'v': tf.TensorSpec([2], tf.int32)}
    table = {'x': tf.TensorSpec([3], tf.float64, name='z'),
             'v': tf.TensorSpec([4], tf.int32),
             'w': tf.TensorSpec([1], tf.bool)}
    self.assertEqual(
        tables.spec_differences(table, data),
        ['v: table int32[4] vs data int32[2]',
         'x: table float64[3] vs data float32[3]',
         'y: only in data (int32[])', 'w: only in table (bool[1])'])
    self.assertEqual(tables.spec_differences(data, data), [])
    bounded = dict(data, v=tensor_spec.BoundedTensorSpec([2], tf.int32, 0, 9,
                                                         name='renamed'))
    self.assertEqual(tables.spec_differences(bounded, data), [])

  def test_spec_differences_of_nest_types(self):
    data = _data_spec()
    as_dict = data._asdict()
    self.assertEqual(tables.spec_differences(as_dict, data),
                     ['nest types differ: table dict vs data Trajectory'])

  def test_spec_differences_are_capped(self):
    data = {f'f{i}': tf.TensorSpec([i], tf.float32) for i in range(10)}
    table = {f'f{i}': tf.TensorSpec([i + 1], tf.float32) for i in range(10)}
    differences = tables.spec_differences(table, data)
    self.assertLen(differences, 7)
    self.assertEqual(differences[-1], '4 more')


class StartServerAndConnectTest(parameterized.TestCase):

  def test_checkpoint_round_trip(self):
    checkpoint_dir = os.path.join(_tempdir(self), 'ckpt')
    server = tables.start_server(
        [tables.make_table('t', _data_spec(), max_size=100)],
        checkpoint_dir=checkpoint_dir)
    client = tables.connect(f'localhost:{server.port}')
    _write(client, 't', num_steps=5)
    _write(client, 't', num_steps=4, sequence_length=3)
    size = tables.get_table_info(client, 't').current_size
    self.assertEqual(size, 4 + 2)
    before = _contents(client, 't', size)
    self.assertLen(before, size)
    path = tables.checkpoint(client)
    self.assertTrue(path.startswith(checkpoint_dir), path)
    self.assertTrue(os.path.isdir(path))
    server.stop()

    # A fresh, empty table of the same name: the checkpoint fills it.
    restored = tables.start_server(
        [tables.make_table('t', _data_spec(), max_size=100)],
        checkpoint_dir=checkpoint_dir)
    try:
      client = tables.connect(f'localhost:{restored.port}')
      self.assertEqual(tables.get_table_info(client, 't').current_size, size)
      self.assertEqual(_contents(client, 't', size), before)
      tables.check_signature(client, 't', _data_spec())
    finally:
      restored.stop()

  def test_checkpoint_with_unknown_table_fails_naming_dir(self):
    checkpoint_dir = _tempdir(self)
    server = tables.start_server(
        [tables.make_table('t', _data_spec(), max_size=10)],
        checkpoint_dir=checkpoint_dir)
    tables.checkpoint(tables.connect(f'localhost:{server.port}'))
    server.stop()
    with self.assertRaisesRegex(
        ValueError, f'cannot restore the checkpoint in {checkpoint_dir}: '
        ".*'t'.*not found"):
      tables.start_server(
          [tables.make_table('other', _data_spec(), max_size=10)],
          checkpoint_dir=checkpoint_dir)

  def test_start_table_server_restores_and_checks_signature(self):
    checkpoint_dir = _tempdir(self)
    server = tables.start_table_server('t', _data_spec(), max_size=10,
                                       checkpoint_dir=checkpoint_dir)
    client = tables.connect(f'localhost:{server.port}')
    _write(client, 't', num_steps=3)
    tables.checkpoint(client)
    server.stop()

    restored = tables.start_table_server('t', _data_spec(), max_size=10,
                                         checkpoint_dir=checkpoint_dir)
    try:
      client = tables.connect(f'localhost:{restored.port}')
      self.assertEqual(tables.get_table_info(client, 't').current_size, 2)
    finally:
      restored.stop()
    with self.assertRaisesRegex(
        ValueError, f"^the checkpoint in {checkpoint_dir} holds another table "
        "'t' than the data needs: Replay buffer table signature spec should "
        r'match RLDS data spec\. .*observation: table float32\[None,3\] vs '
        r'data float32\[None,5\]'):
      tables.start_table_server('t', _data_spec(obs_dim=5), max_size=10,
                                checkpoint_dir=checkpoint_dir)

  def test_start_table_server_serves_a_given_table(self):
    table = tables.make_table('t', _data_spec(), max_size=7, sampler='lifo')
    server = tables.start_table_server('t', _data_spec(), table=table)
    try:
      info = tables.get_table_info(server.localhost_client(), 't')
      self.assertEqual(info.max_size, 7)
      self.assertEqual(info.sampler_options.WhichOneof('distribution'),
                       'lifo')
    finally:
      server.stop()
    with self.assertRaisesRegex(ValueError, "must be called 'u'"):
      tables.start_table_server('u', _data_spec(), table=table)
    with self.assertRaisesRegex(ValueError, r"\['max_size'\]"):
      tables.start_table_server('t', _data_spec(), table=table, max_size=3)

  def test_checkpoint_dir_that_is_a_file(self):
    path = os.path.join(_tempdir(self), 'file')
    with open(path, 'w') as f:
      f.write('not a directory')
    with self.assertRaisesRegex(ValueError, 'is not a directory'):
      tables.start_server([tables.make_table('t', _data_spec(), max_size=10)],
                          checkpoint_dir=path)

  def test_no_tables(self):
    with self.assertRaisesRegex(ValueError, 'at least one'):
      tables.start_server([])

  @parameterized.parameters(0, 70000, -1, 1.5)
  def test_bad_port(self, port):
    with self.assertRaisesRegex(ValueError, r'port must be an integer in'):
      tables.start_server([tables.make_table('t', _data_spec(), max_size=10)],
                          port=port)

  def test_port_in_use(self):
    server = tables.start_server(
        [tables.make_table('t', _data_spec(), max_size=10)])
    try:
      with self.assertRaisesRegex(OSError, f'port {server.port}.*in use'):
        tables.start_server(
            [tables.make_table('t', _data_spec(), max_size=10)],
            port=server.port)
    finally:
      server.stop()

  def test_start_on_given_port(self):
    port = unused_port()
    server = tables.start_server(
        [tables.make_table('t', _data_spec(), max_size=10)], port=port)
    try:
      self.assertEqual(server.port, port)
      tables.connect(f'localhost:{port}')
    finally:
      server.stop()

  def test_connect_to_unused_port_fails_fast(self):
    address = f'localhost:{unused_port()}'
    start = time.monotonic()
    with self.assertRaisesRegex(
        ConnectionError,
        f'cannot reach Reverb server at {address}: connection refused'):
      tables.connect(address, timeout_s=5.0)
    # Well under the 5 s deadline: refused at once, not timed out.
    self.assertLess(time.monotonic() - start, 3.0)

  def test_connect_to_silent_listener_times_out(self):
    # Accepts TCP connections but never speaks gRPC: only the deadline helps.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
      listener.bind(('127.0.0.1', 0))
      listener.listen()
      address = f'127.0.0.1:{listener.getsockname()[1]}'
      start = time.monotonic()
      with self.assertRaisesRegex(
          ConnectionError,
          f'cannot reach Reverb server at {address}: no answer within 1s'):
        tables.connect(address, timeout_s=1.0)
      self.assertLess(time.monotonic() - start, 4.0)

  @parameterized.named_parameters(
      dict(testcase_name='empty_address', address='', timeout_s=1.0,
           match='address must be'),
      dict(testcase_name='zero_timeout', address='localhost:1', timeout_s=0,
           match='timeout_s must be > 0'),
  )
  def test_connect_bad_arguments(self, address, timeout_s, match):
    with self.assertRaisesRegex(ValueError, match):
      tables.connect(address, timeout_s=timeout_s)


  def test_restart_on_the_port_of_a_server_stopped_with_a_client(self):
    server = tables.start_server(
        [tables.make_table('t', _data_spec(), max_size=10)])
    port = server.port
    client = tables.connect(f'localhost:{port}')
    _write(client, 't', num_steps=3)
    server.stop()  # The connection it closes stays in TIME_WAIT for ~60 s.
    restarted = tables.start_server(
        [tables.make_table('t', _data_spec(), max_size=10)], port=port)
    try:
      # The first call on the old channel meets the dropped connection and
      # reconnects.
      self.assertEqual(tables.get_table_info(client, 't').current_size, 0)
      self.assertEqual(restarted.port, port)
    finally:
      restarted.stop()

  @parameterized.named_parameters(
      dict(testcase_name='words', address='not an address',
           reason='it contains spaces'),
      dict(testcase_name='no_port', address='localhost', reason='no port'),
      dict(testcase_name='port_zero', address='localhost:0',
           reason=r"the port must be an integer in \[1, 65535\], not '0'"),
      dict(testcase_name='port_too_big', address='localhost:65536',
           reason='the port must be an integer'),
      dict(testcase_name='port_not_a_number', address='localhost:http',
           reason="the port must be an integer in .*, not 'http'"),
      dict(testcase_name='no_host', address=':8000', reason='no host'),
      dict(testcase_name='bare_ipv6', address='::1:8000',
           reason=r'an IPv6 host goes in brackets, e\.g\. \[::1\]:8000'),
      dict(testcase_name='bracketed_name', address='[localhost]:8000',
           reason=r'\[localhost\] is not an IPv6 address'),
      dict(testcase_name='bad_name', address='local$host:8000',
           reason='not a host name or IP address'),
  )
  def test_connect_to_not_an_address_fails_at_once(self, address, reason):
    start = time.monotonic()
    with self.assertRaisesRegex(
        ValueError, '^address must be "host:port" '
        r'\(e\.g\. localhost:8000\), '
        f'got {re.escape(repr(address))}: {reason}'):
      tables.connect(address, timeout_s=5)
    self.assertLess(time.monotonic() - start, 1.0)

class SecurityTest(parameterized.TestCase):
  """Reverb 0.14 binds every interface: each start says so."""

  def _start(self, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter('always', tables.InsecureServerWarning)
      server = tables.start_server(
          [tables.make_table('t', _data_spec(), max_size=10)], **kwargs)
    self.addCleanup(server.stop)
    return server, [w for w in caught
                    if issubclass(w.category, tables.InsecureServerWarning)]

  def test_warns_with_the_real_listening_address(self):
    server, caught = self._start()
    port = server.port
    self.assertEqual(tables.listening_addresses(port), [f'[::]:{port}'])
    self.assertLen(caught, 1)
    self.assertEqual(
        str(caught[0].message),
        f'the Reverb server listens on all interfaces ([::]:{port}), not only '
        'on localhost: Reverb cannot bind a single interface and has no '
        f'authentication, so anyone who can reach port {port} can read, '
        'insert or reset its tables; see docs/security.md to restrict access')
    self.assertEqual(caught[0].filename, __file__)  # Blames the caller.
    # Why: a non-loopback address of this machine reaches it.
    ip = _non_loopback_ip()
    if ip is None:
      self.skipTest('no non-loopback address on this machine')
    client = tables.connect(f'{ip}:{port}')
    self.assertIn('t', client.server_info(timeout=5))

  def test_all_interfaces_host_is_accepted_and_still_warned(self):
    server, caught = self._start(host='0.0.0.0')
    self.assertLen(caught, 1)
    self.assertStartsWith(
        str(caught[0].message),
        f'the Reverb server listens on all interfaces ([::]:{server.port}): ')

  @parameterized.parameters('', 'bad host', 'a$b', 7)
  def test_bad_host(self, host):
    with self.assertRaisesRegex(ValueError, '^host must be a host name or IP'):
      tables.start_server([tables.make_table('t', _data_spec(), max_size=10)],
                          host=host)

class CheckpointsTest(parameterized.TestCase):

  def test_latest_checkpoint_and_differences_of_a_restored_table(self):
    checkpoint_dir = _tempdir(self)
    self.assertIsNone(tables.latest_checkpoint(checkpoint_dir))
    self.assertIsNone(tables.latest_checkpoint(
        os.path.join(checkpoint_dir, 'missing')))
    server = tables.start_server(
        [tables.make_table('t', _data_spec(), max_size=10)],
        checkpoint_dir=checkpoint_dir)
    client = tables.connect(f'localhost:{server.port}')
    _write(client, 't', num_steps=3)
    path = tables.checkpoint(client)
    server.stop()
    self.assertEqual(tables.latest_checkpoint(checkpoint_dir), path)
    self.assertLess(abs(tables.checkpoint_time(path) - time.time()), 60)

    wanted = tables.make_table('t', _data_spec(), max_size=99,
                               sampler='prioritized', alpha=0.5,
                               min_size_to_sample=2)
    wanted_info = wanted.info
    restored = tables.start_server([wanted], checkpoint_dir=checkpoint_dir)
    try:
      info = tables.get_table_info(restored.localhost_client(), 't')
      self.assertEqual(info.current_size, 2)
      self.assertEqual(tables.table_differences(info, wanted_info), [
          'max_size 10 (asked 99)',
          'sampler uniform (asked prioritized(alpha=0.5))',
          'rate limiter min_size_to_sample=1, samples_per_insert=1, '
          'error_buffer=[-1.79769e+308, 1.79769e+308] (asked '
          'min_size_to_sample=2, samples_per_insert=1, '
          'error_buffer=[-1.79769e+308, 1.79769e+308])'])
      self.assertEqual(tables.table_differences(info, info), [])
    finally:
      restored.stop()

  def test_periodic_checkpointer(self):
    checkpoint_dir = _tempdir(self)
    server = tables.start_server(
        [tables.make_table('t', _data_spec(), max_size=10)],
        checkpoint_dir=checkpoint_dir)
    self.addCleanup(server.stop)
    client = tables.connect(f'localhost:{server.port}')
    _write(client, 't', num_steps=4)
    paths = []
    periodic = tables.PeriodicCheckpointer(client, 0.2,
                                           on_checkpoint=paths.append)
    deadline = time.monotonic() + 30
    while periodic.count < 2 and time.monotonic() < deadline:
      time.sleep(0.05)
    periodic.stop()
    count = periodic.count
    self.assertGreaterEqual(count, 2)
    self.assertLen(paths, count)
    self.assertEqual(periodic.last_path, paths[-1])
    self.assertEqual(tables.latest_checkpoint(checkpoint_dir), paths[-1])
    self.assertIsNone(periodic.last_error)
    time.sleep(0.5)
    self.assertEqual(periodic.count, count)  # Stopped means stopped.

  def test_periodic_checkpointer_bad_interval(self):
    with self.assertRaisesRegex(ValueError, 'interval_s must be > 0'):
      tables.PeriodicCheckpointer(None, 0)


def _non_loopback_ip():
  """An IPv4 address of this machine that is not loopback, or None."""
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    try:
      s.connect(('10.255.255.255', 1))  # Sends nothing: picks a route.
      ip = s.getsockname()[0]
    except OSError:
      return None
  return None if ip.startswith('127.') or ip == '0.0.0.0' else ip


if __name__ == '__main__':
  absltest.main()
