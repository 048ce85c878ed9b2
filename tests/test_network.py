"""Tests for rlds_reverb.storage.network: addresses, deadlines, listening sockets.

Servers started and killed are in test_tables.py (start, connect, the
all-interfaces warning, restart on a port in TIME_WAIT) and
test_server_faults.py (a `pipelines.serve` killed under its clients).
"""

import socket
import threading
import time

from absl.testing import absltest
from absl.testing import parameterized
import tensorflow as tf

from rlds_reverb.storage import network


class AddressTest(parameterized.TestCase):

  @parameterized.parameters(
      ('localhost:8000', ('localhost', 8000)),
      ('10.0.0.5:1', ('10.0.0.5', 1)),
      ('[::1]:65535', ('::1', 65535)),
      ('reverb-0.learners.internal:8000', ('reverb-0.learners.internal', 8000)),
  )
  def test_parse_address(self, address, expected):
    self.assertEqual(network.parse_address(address), expected)

  @parameterized.parameters('localhost:8000x', 'local host:1', 'x', '[::1]')
  def test_parse_address_rejects(self, address):
    with self.assertRaisesRegex(ValueError, '^address must be "host:port"'):
      network.parse_address(address)

  @parameterized.parameters('localhost', '10.0.0.5', '::1', '[::1]',
                            'reverb-0.learners.internal', '0.0.0.0')
  def test_check_host_accepts(self, host):
    network.check_host(host)


class DeadlineTest(parameterized.TestCase):
  """call_with_deadline on plain blocking calls (a killed server is in
  test_server_faults.py)."""

  def test_returns_the_value(self):
    self.assertEqual(network.call_with_deadline(
        lambda: 7, timeout_s=1, what='x', address='a:1'), 7)

  def test_times_out_with_one_line(self):
    release = threading.Event()
    self.addCleanup(release.set)
    start = time.monotonic()
    with self.assertRaises(network.ServerUnavailableError) as raised:
      network.call_with_deadline(release.wait, timeout_s=0.5,
                                what="checkpointing table 'rlds'",
                                address='localhost:1234')
    self.assertBetween(time.monotonic() - start, 0.5, 3.0)
    self.assertEqual(
        str(raised.exception),
        'Reverb server at localhost:1234 did not answer within 0.5s while '
        "checkpointing table 'rlds' (server down?)")
    self.assertIsInstance(raised.exception, ConnectionError)

  @parameterized.parameters(
      RuntimeError('Socket closed'),
      RuntimeError('failed to connect to all addresses; last error: ...'),
      RuntimeError('Connection reset by peer'),
      tf.errors.UnavailableError(None, None, 'Socket closed'),
  )
  def test_unavailable_becomes_server_unavailable(self, error):
    self.assertTrue(network.is_unavailable(error))

    def fail():
      raise error

    with self.assertRaisesRegex(
        network.ServerUnavailableError,
        r'^Reverb server at h:1 is unavailable while writing: .+ '
        r'\(server down\?\)$') as raised:
      network.call_with_deadline(fail, timeout_s=1, what='writing',
                                address='h:1')
    self.assertIs(raised.exception.__cause__, error)

  @parameterized.parameters(
      RuntimeError('Table rlds not found'), ValueError('Socket closed'),
      KeyError('x'))
  def test_other_errors_pass_through(self, error):
    self.assertFalse(network.is_unavailable(error))

    def fail():
      raise error

    with self.assertRaises(type(error)) as raised:
      network.call_with_deadline(fail, timeout_s=1, what='x', address='h:1')
    self.assertIs(raised.exception, error)

  @parameterized.parameters(0, -1.0)
  def test_bad_timeout(self, timeout_s):
    with self.assertRaisesRegex(ValueError, 'timeout_s must be > 0 or None'):
      network.call_with_deadline(lambda: 1, timeout_s=timeout_s, what='x',
                                address='h:1')


class ListeningTest(absltest.TestCase):

  def test_listening_addresses(self):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
      listener.bind(('127.0.0.1', 0))
      port = listener.getsockname()[1]
      self.assertEqual(network.listening_addresses(port), [])  # Not yet.
      listener.listen()
      self.assertEqual(network.listening_addresses(port),
                       [f'127.0.0.1:{port}'])
    self.assertTrue(network.is_loopback_address('127.0.0.1:80'))
    self.assertTrue(network.is_loopback_address('[::1]:80'))
    self.assertTrue(network.is_loopback_address('[::ffff:127.0.0.1]:80'))
    self.assertFalse(network.is_loopback_address('[::]:80'))
    self.assertFalse(network.is_loopback_address('10.0.0.5:80'))


if __name__ == '__main__':
  absltest.main()
