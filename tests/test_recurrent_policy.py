"""rlds_reverb.acting.recurrent_policy: the numpy GRU actor acts like the
Keras GRUCell + Dense MLP it replays, resets, sampling, stateful greedy,
policy files.
"""

import numpy as np
import pytest
import tensorflow as tf

from rlds_reverb.acting import numpy_policy
from rlds_reverb.acting import recurrent_policy

OBS, UNITS, HIDDEN, ACT = 5, 8, 6, 3


def _keras_actor(rng, out, obs_size=OBS, units=UNITS, hidden=(HIDDEN,)):
  """A Keras GRUCell and tanh MLP with random weights (biases included)."""
  cell = tf.keras.layers.GRUCell(units)
  cell(tf.zeros([1, obs_size]), [tf.zeros([1, units])])
  cell.set_weights([rng.normal(0, 0.5, w.shape).astype(np.float32)
                    for w in cell.get_weights()])
  layers = [tf.keras.layers.Dense(h, activation='tanh') for h in hidden]
  layers.append(tf.keras.layers.Dense(out))
  mlp = tf.keras.Sequential(layers)
  mlp(tf.zeros([1, units]))
  mlp.set_weights([rng.normal(0, 0.5, w.shape).astype(np.float32)
                   for w in mlp.get_weights()])
  return cell, mlp


def _from_keras(cell, mlp, head, **kwargs):
  if head == 'gaussian':
    kwargs = {'action_low': -np.ones(ACT, np.float32),
              'action_high': np.ones(ACT, np.float32),
              'log_std': np.full(ACT, -0.5, np.float32), **kwargs}
  else:
    kwargs = {'action_low': np.asarray(-1, np.int64),
              'action_high': np.asarray(1, np.int64), 'log_std': None,
              **kwargs}
  return recurrent_policy.RecurrentPolicy(
      head=head, gru_kernel=cell.kernel.numpy(),
      gru_recurrent_kernel=cell.recurrent_kernel.numpy(),
      gru_bias=cell.bias.numpy(),
      kernels=[layer.kernel.numpy() for layer in mlp.layers],
      biases=[layer.bias.numpy() for layer in mlp.layers], **kwargs)


def _policy(kind='gaussian', seed=0, **kwargs):
  """A random-weight policy without TF (3 actions either head)."""
  rng = np.random.default_rng(seed)
  normal = lambda *shape: rng.normal(0, 0.5, shape).astype(np.float32)
  fields = dict(
      head=kind, gru_kernel=normal(OBS, 3 * UNITS),
      gru_recurrent_kernel=normal(UNITS, 3 * UNITS),
      gru_bias=normal(2, 3 * UNITS),
      kernels=[normal(UNITS, HIDDEN), normal(HIDDEN, ACT)],
      biases=[normal(HIDDEN), normal(ACT)])
  if kind == 'gaussian':
    fields.update(action_low=-np.ones(ACT, np.float32),
                  action_high=np.ones(ACT, np.float32),
                  log_std=np.full(ACT, -0.5, np.float32))
  else:
    fields.update(action_low=np.asarray(-1, np.int64),
                  action_high=np.asarray(1, np.int64), log_std=None)
  fields.update(kwargs)
  return recurrent_policy.RecurrentPolicy(**fields)


def test_steps_equal_a_keras_gru_cell_and_dense_mlp():
  rng = np.random.default_rng(0)
  cell, mlp = _keras_actor(rng, ACT)
  # The layout the module relies on: Keras' default reset_after=True GRU.
  assert cell.reset_after and cell.bias.shape == (2, 3 * UNITS)
  mean = rng.normal(size=OBS).astype(np.float32)
  std = rng.uniform(0.5, 2.0, OBS).astype(np.float32)
  policy = _from_keras(cell, mlp, 'gaussian', obs_mean=mean, obs_std=std,
                       obs_clip=2.0)
  batch, steps = 4, 6
  starts = np.zeros((steps, batch), bool)
  starts[0] = True
  starts[3, 1] = starts[4, 2] = True
  state = policy.initial_state(batch)
  keras_state = tf.zeros([batch, UNITS])
  for t in range(steps):
    obs = rng.normal(0, 3, (batch, OBS)).astype(np.float32)
    out, state = policy.step(obs, state, starts[t])
    x = np.clip((obs - mean) / std, -2.0, 2.0)
    keras_state = tf.where(starts[t][:, None], 0.0, keras_state)
    features, [keras_state] = cell(tf.constant(x), [keras_state])
    np.testing.assert_allclose(state, keras_state.numpy(), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(features.numpy(), keras_state.numpy())
    np.testing.assert_allclose(out, mlp(features).numpy(), rtol=1e-5,
                               atol=1e-5)
    assert out.dtype == np.float32 and state.dtype == np.float32
  # The state carried information: a never-reset row differs from fresh.
  fresh, _ = policy.step(obs, policy.initial_state(batch), np.ones(batch, bool))
  assert not np.allclose(fresh[0], out[0], atol=1e-3)


def test_categorical_head_equals_keras_logits_over_two_hidden_layers():
  rng = np.random.default_rng(1)
  cell, mlp = _keras_actor(rng, 3, hidden=(7, 4))
  policy = _from_keras(cell, mlp, 'categorical')
  obs = rng.normal(size=(3, OBS)).astype(np.float32)
  state = rng.normal(0, 0.5, (3, UNITS)).astype(np.float32)
  out, new_state = policy.step(obs, state, np.zeros(3, bool))
  features, _ = cell(tf.constant(obs), [tf.constant(state)])
  np.testing.assert_allclose(new_state, features.numpy(), rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(out, mlp(features).numpy(), rtol=1e-5,
                             atol=1e-5)


def test_a_starting_row_acts_as_from_a_fresh_state():
  policy = _policy()
  rng = np.random.default_rng(2)
  obs = rng.normal(size=(2, OBS)).astype(np.float32)
  old = rng.normal(0, 0.8, (2, UNITS)).astype(np.float32)
  out, state = policy.step(obs, old, np.array([True, False]))
  fresh_out, fresh_state = policy.step(obs, policy.initial_state(2),
                                       np.array([False, False]))
  np.testing.assert_array_equal(out[0], fresh_out[0])
  np.testing.assert_array_equal(state[0], fresh_state[0])
  assert not np.allclose(out[1], fresh_out[1], atol=1e-4)


def test_gaussian_log_probs_are_the_density_of_the_actions():
  policy = _policy(log_std=np.array([-1.0, 0.0, 1.0], np.float32))
  rng = np.random.default_rng(3)
  obs = rng.normal(size=(500, OBS)).astype(np.float32)
  state = rng.normal(0, 0.5, (500, UNITS)).astype(np.float32)
  starts = rng.random(500) < 0.3
  actions, log_probs, new_state = policy.sample(obs, state, starts,
                                                np.random.default_rng(4))
  mean, expected_state = policy.step(obs, state, starts)
  np.testing.assert_array_equal(new_state, expected_state)
  std = np.exp(policy.log_std.astype(np.float64))
  z = (actions.astype(np.float64) - mean) / std
  density = np.sum(-0.5 * z**2 - np.log(std) - 0.5 * np.log(2 * np.pi), -1)
  assert log_probs.dtype == np.float64 and actions.dtype == np.float32
  np.testing.assert_allclose(log_probs, density, rtol=1e-5, atol=1e-4)
  # Unclipped: std e on the last dimension leaves [-1, 1] often.
  assert np.any(np.abs(actions) > 1.0)


def test_categorical_draws_follow_the_softmax():
  policy = _policy('categorical', seed=5)
  rng = np.random.default_rng(6)
  n = 20_000
  obs = np.repeat(rng.normal(size=(1, OBS)).astype(np.float32), n, 0)
  state = np.repeat(rng.normal(0, 0.5, (1, UNITS)).astype(np.float32), n, 0)
  actions, log_probs, _ = policy.sample(obs, state, np.zeros(n, bool),
                                        np.random.default_rng(7))
  logits, _ = policy.step(obs[:1], state[:1], np.zeros(1, bool))
  logits = logits[0].astype(np.float64)
  probs = np.exp(logits - np.logaddexp.reduce(logits))
  assert actions.dtype == np.int64
  assert set(np.unique(actions)) <= {-1, 0, 1}
  for i, p in enumerate(probs):
    share = np.mean(actions == i - 1)
    assert abs(share - p) < 5 * np.sqrt(p * (1 - p) / n), (i, share, p)
  np.testing.assert_allclose(log_probs, np.log(probs[actions + 1]),
                             rtol=1e-6)


def test_greedy_is_stateful_until_reset():
  policy = _policy(action_low=np.full(ACT, -100.0, np.float32),
                   action_high=np.full(ACT, 100.0, np.float32))
  obs = np.random.default_rng(8).normal(size=(3, OBS)).astype(np.float32)
  first = policy.greedy(obs)
  expected, _ = policy.step(obs, policy.initial_state(3), np.ones(3, bool))
  np.testing.assert_array_equal(first, expected)
  second = policy.greedy(obs)
  assert not np.allclose(first, second, atol=1e-4)
  policy.reset()
  np.testing.assert_array_equal(policy.greedy(obs), first)
  # A new batch size means new episodes: fresh state.
  np.testing.assert_array_equal(policy.greedy(obs[:2]), first[:2])


def test_greedy_clips_gaussian_and_offsets_categorical():
  policy = _policy(action_low=np.full(ACT, -0.01, np.float32),
                   action_high=np.full(ACT, 0.01, np.float32))
  obs = np.random.default_rng(9).normal(size=(4, OBS)).astype(np.float32)
  actions = policy.greedy(obs)
  assert actions.dtype == np.float32
  assert np.all(np.abs(actions) <= 0.01) and np.any(np.abs(actions) == 0.01)
  categorical = _policy('categorical', action_low=np.asarray(3, np.int64),
                        action_high=np.asarray(5, np.int64))
  logits, _ = categorical.step(obs, categorical.initial_state(4),
                               np.ones(4, bool))
  actions = categorical.greedy(obs)
  assert actions.dtype == np.int64
  np.testing.assert_array_equal(actions, np.argmax(logits, -1) + 3)


@pytest.mark.parametrize('head', ['gaussian', 'categorical'])
def test_save_load_round_trip(tmp_path, head):
  rng = np.random.default_rng(10)
  policy = _policy(head, obs_mean=rng.normal(size=OBS).astype(np.float32),
                   obs_std=rng.uniform(0.5, 2, OBS).astype(np.float32),
                   obs_clip=1.5, metadata={'step': 7, 'algo': 'ppo'})
  path = str(tmp_path / 'sub' / 'policy.npz')
  policy.save(path)
  loaded = recurrent_policy.load(path)
  assert loaded.head == head and loaded.metadata == {'step': 7, 'algo': 'ppo'}
  assert loaded.obs_clip == 1.5 and loaded.state_size == UNITS
  assert loaded.observation_size == OBS
  assert (loaded.log_std is None) == (head == 'categorical')
  obs = rng.normal(0, 2, (3, OBS)).astype(np.float32)
  for _ in range(3):
    np.testing.assert_array_equal(loaded.greedy(obs), policy.greedy(obs))
  assert recurrent_policy.is_recurrent_file(path)
  assert [p.name for p in (tmp_path / 'sub').iterdir()] == ['policy.npz']


def test_is_recurrent_file_tells_numpy_policies_apart(tmp_path):
  path = str(tmp_path / 'mlp.npz')
  numpy_policy.NumpyPolicy(
      head='deterministic', kernels=[np.ones((OBS, ACT), np.float32)],
      biases=[np.zeros(ACT, np.float32)],
      action_low=-np.ones(ACT, np.float32),
      action_high=np.ones(ACT, np.float32)).save(path)
  assert not recurrent_policy.is_recurrent_file(path)
  with pytest.raises(ValueError, match='recurrent'):
    recurrent_policy.load(path)
  text = tmp_path / 'notes.txt'
  text.write_text('not an npz')
  assert not recurrent_policy.is_recurrent_file(str(text))
  with pytest.raises(ValueError, match='not a policy file'):
    recurrent_policy.load(str(text))
  with pytest.raises(FileNotFoundError):
    recurrent_policy.load(str(tmp_path / 'missing.npz'))
  with pytest.raises(FileNotFoundError):
    recurrent_policy.is_recurrent_file(str(tmp_path / 'missing.npz'))


def test_step_rejects_mismatched_shapes():
  policy = _policy()
  obs = np.zeros((2, OBS), np.float32)
  with pytest.raises(ValueError, match=r'observations .*\(2, 4\)'):
    policy.step(np.zeros((2, 4)), policy.initial_state(2), np.ones(2, bool))
  with pytest.raises(ValueError, match=r'state .*\(3, 8\)'):
    policy.step(obs, policy.initial_state(3), np.ones(2, bool))
  with pytest.raises(ValueError, match=r'starts .*\(3,\)'):
    policy.step(obs, policy.initial_state(2), np.ones(3, bool))


_U3 = 3 * UNITS


@pytest.mark.parametrize('fields, match', [
    ({'head': 'tanh_normal'}, "'tanh_normal'"),
    ({'log_std': None}, 'log_std .*None'),
    ({'gru_kernel': np.zeros((OBS, _U3 + 1))}, r'gru_kernel .*\(5, 25\)'),
    ({'gru_kernel': np.zeros(_U3)}, r'gru_kernel .*\(24,\)'),
    ({'gru_recurrent_kernel': np.zeros((UNITS, 3 * UNITS + 3))},
     r'gru_recurrent_kernel .*\(8, 27\)'),
    ({'gru_bias': np.zeros(_U3)}, r'gru_bias .*\(24,\)'),
    ({'kernels': [np.zeros((UNITS + 1, HIDDEN)), np.zeros((HIDDEN, ACT))]},
     r'kernel_0 .*8 rows.*\(9, 6\)'),
    ({'kernels': [np.zeros((UNITS, HIDDEN)), np.zeros((HIDDEN + 1, ACT))]},
     r'kernel_1 .*6 rows.*\(7, 3\)'),
    ({'biases': [np.zeros(HIDDEN)]}, '2 kernels and 1 biases'),
    ({'kernels': [], 'biases': []}, '0 kernels'),
    ({'biases': [np.zeros(HIDDEN), np.zeros(ACT + 1)]},
     r'bias_1 .*\(4,\)'),
    ({'log_std': np.zeros(ACT + 1)}, r'log_std .*\(4,\)'),
    ({'obs_mean': np.zeros(OBS)}, 'obs_mean and obs_std'),
])
def test_gaussian_validation(fields, match):
  with pytest.raises(ValueError, match=match):
    _policy('gaussian', **fields)


@pytest.mark.parametrize('fields, match', [
    ({'log_std': np.zeros(ACT)}, "'categorical', log_std given"),
    ({'action_high': np.asarray(2, np.int64)}, '4 logits, the MLP gives 3'),
])
def test_categorical_validation(fields, match):
  with pytest.raises(ValueError, match=match):
    _policy('categorical', **fields)


def test_the_feed_forward_loader_refuses_a_recurrent_file(tmp_path):
  from rlds_reverb.acting import numpy_policy  # pylint: disable=g-import-not-at-top
  path = str(tmp_path / 'gru.npz')
  _policy("categorical").save(path)
  with pytest.raises(ValueError, match='recurrent'):
    numpy_policy.load(path)
