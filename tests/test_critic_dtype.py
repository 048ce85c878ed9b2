"""bfloat16 hidden layers of the ensemble critics (AgentConfig.critic_dtype):
the forward pass against float64 numpy, float32 weights and outputs, EDAC's
action gradients, losses that still fall, checkpoints, refusals."""

import warnings

import numpy as np
import pytest
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import time_step as ts

from rlds_reverb.agents import factory
from rlds_reverb.agents import registry
from rlds_reverb.agents.offline import ensemble
from conftest import _fixed_batch  # pylint: disable=g-bad-import-order
from test_sac_n import _numpy_q  # pylint: disable=g-bad-import-order

# pylint: disable=protected-access

OBS_SPEC = tensor_spec.TensorSpec([17], tf.float32, name='observation')
ACTION_SPEC = tensor_spec.BoundedTensorSpec([6], tf.float32, -1.0, 1.0,
                                            name='action')
TIME_STEP_SPEC = ts.time_step_spec(OBS_SPEC)
# CPUs with AMX or AVX512-BF16 compute bfloat16 matmuls natively; others
# (AVX2 only) emulate them, rounding more: the bounds below say which is
# which, with what each was seen at.
_CPUINFO = ensemble._cpuinfo()
NATIVE = _CPUINFO is None or ensemble.has_bfloat16_instructions(_CPUINFO)


def _pair(layer_norm):
  """A float32 and a bfloat16 ensemble with the same weights."""
  make = lambda dtype: ensemble.EnsembleMlp(
      (OBS_SPEC, ACTION_SPEC), 3, (64, 64, 64), layer_norm=layer_norm,
      hidden_bias=0.1, seed=3, hidden_dtype_name=dtype)
  full, half = make('float32'), make('bfloat16')
  for source, target in zip(full.variables, half.variables):
    target.assign(source)
  return full, half


def _inputs(batch_size=256, seed=0):
  rng = np.random.default_rng(seed)
  return (rng.normal(size=(batch_size, 17)).astype(np.float32),
          rng.uniform(-1, 1, (batch_size, 6)).astype(np.float32))


@pytest.mark.parametrize('layer_norm', [False, True])
def test_bfloat16_forward_pass_is_close_to_float64(layer_norm):
  full, half = _pair(layer_norm)
  states, actions = _inputs()
  exact = _numpy_q(full, states, actions).T  # [B, N]
  q_full, _ = full((states, actions))
  q_half, _ = half((states, actions))
  assert q_full.dtype == q_half.dtype == tf.float32
  assert half.hidden_dtype == tf.bfloat16
  assert {v.dtype for v in half.variables} == {tf.float32}
  scale = np.abs(exact).mean()
  error_full = np.abs(q_full.numpy() - exact).max() / scale
  error_half = np.abs(q_half.numpy() - exact).max() / scale
  # bfloat16 keeps 8 significant bits (relative rounding 2^-9 per value);
  # three rounded layers stay within a few percent of the output's size,
  # and well above float32's error, so the bfloat16 path really ran.
  # Emulated (an AVX2-only AMD EPYC, 2026-11-27): 1.6e-2 without
  # LayerNorm, 1.2e-1 with it, whose normalisation magnifies the rounding
  # of rows with a small spread.
  print(f'max error / mean |Q|: float32 {error_full:.1e}, '
        f'bfloat16 {error_half:.1e}')
  assert error_full < 1e-5
  assert 1e-4 < error_half < (0.05 if NATIVE else 0.25)


def test_bfloat16_action_gradients_point_where_float32_ones_do():
  """EDAC's diversity term reads dQ/da; in bfloat16 it keeps its direction."""
  full, half = _pair(layer_norm=False)
  states, actions = _inputs()
  actions = tf.constant(actions)

  def action_gradients(critic):
    with tf.GradientTape() as tape:
      tape.watch(actions)
      q = tf.reduce_sum(critic((states, actions))[0])
    return tape.gradient(q, actions).numpy()

  g_full, g_half = action_gradients(full), action_gradients(half)
  cosine = np.sum(g_full * g_half, -1) / (
      np.linalg.norm(g_full, axis=-1) * np.linalg.norm(g_half, axis=-1))
  # Seen natively: median 0.99998, lowest 0.95 of 256 (states where the
  # gradient is small and rounding turns it most); emulated: median
  # 0.9989, 5th percentile 0.978.
  assert np.median(cosine) > (0.999 if NATIVE else 0.995), np.median(cosine)
  assert np.percentile(cosine, 5) > (0.98 if NATIVE else 0.95), cosine
  assert cosine.min() > (0.9 if NATIVE else 0.8), cosine


def _critic_losses(kind, dtype, steps=150):
  """The critic loss over `steps` steps on one fixed batch, from the same
  initial weights for either dtype."""
  tf.keras.utils.set_random_seed(0)
  config = factory.AgentConfig(actor_layers=(32, 32), critic_layers=(64, 64),
                              seed=1, critic_dtype=dtype)
  agent = registry.make_agent(kind, TIME_STEP_SPEC, ACTION_SPEC, config)
  critics = [network for network in vars(agent).values()
             if isinstance(network, ensemble.EnsembleMlp)]
  assert critics and all(c.hidden_dtype == tf.as_dtype(dtype)
                         for c in critics)
  assert {v.dtype for c in critics for v in c.variables} == {tf.float32}
  batch = _fixed_batch(64)
  kwargs = {'mc_return': tf.zeros([64])} if kind == 'cal_ql' else {}
  train = tf.function(lambda: agent.train(batch, **kwargs),
                      autograph=False)
  if kind == 'cal_ql':
    loss = lambda extra: extra.td_loss + extra.cql_loss
  else:
    loss = lambda extra: extra.critic_loss
  return np.array([float(loss(train().extra)) for _ in range(steps)])


@pytest.mark.skipif(not NATIVE, reason=(
    'this CPU emulates bfloat16 (no amx_bf16 or avx512_bf16): training in '
    'it is 13-21x slower than float32 and warned against; the forward and '
    'gradient tests above still hold its rounding to bounds'))
@pytest.mark.parametrize('kind', ['rebrac', 'edac', 'cal_ql', 'iql'])
def test_bfloat16_critics_learn_as_float32_ones_do(kind):
  full = _critic_losses(kind, 'float32')
  half = _critic_losses(kind, 'bfloat16')
  assert np.all(np.isfinite(half))
  first, last = lambda x: x[:10].mean(), lambda x: x[-10:].mean()
  print(f'{kind} critic loss, first / last 10 steps: float32 '
        f'{first(full):.3f} / {last(full):.3f}, bfloat16 {first(half):.3f} '
        f'/ {last(half):.3f}')
  # Cal-QL's CQL term keeps its loss up on one batch (the float32 test in
  # test_rebrac_calql.py asks only for a fall); the others fall by 30%+.
  assert last(half) < (0.98 if kind == 'cal_ql' else 0.7) * first(half)
  # The same start, the same batch, the same action draws (the seeds fix
  # them all): bfloat16 ends near float32 over the last 30 steps, within
  # 5% of float32's level plus three standard errors of float32's own
  # step-to-step noise there (ReBRAC's loss ends near 0.001, where 5% is
  # below that noise). Seen natively: ReBRAC, IQL and Cal-QL agree to 3
  # digits, EDAC within 1%; emulated, ReBRAC's tail differs by 8% of its
  # level, within the noise.
  tail = lambda x: x[-30:].mean()
  noise = 3 * full[-30:].std() / np.sqrt(30)
  assert abs(tail(half) - tail(full)) < 0.05 * abs(tail(full)) + noise, (
      tail(half), tail(full), noise)


def test_a_bfloat16_checkpoint_restores_into_a_float32_agent(tmp_path):
  """The weights are float32 either way: a run may switch dtypes by
  restoring into another agent (the pipelines allow it on resume and note
  it in config.json)."""
  make = lambda dtype, seed: registry.make_agent(
      'rebrac', TIME_STEP_SPEC, ACTION_SPEC, factory.AgentConfig(
          actor_layers=(32, 32), critic_layers=(64, 64), seed=seed,
          critic_dtype=dtype))
  half = make('bfloat16', 1)
  tf.function(lambda: half.train(_fixed_batch(64)), autograph=False)()
  path = tf.train.Checkpoint(agent=half).save(str(tmp_path / 'ckpt'))
  full = make('float32', 2)
  tf.train.Checkpoint(agent=full).restore(path).assert_consumed()
  for a, b in zip(half._critic_network.variables,
                  full._critic_network.variables):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_critic_dtype_is_refused_where_it_does_not_apply():
  with pytest.raises(ValueError, match=r"critic_dtype='bfloat16' applies "
                     r'to the ensemble critics of iql, .*; td3_bc computes'):
    registry.make_agent('td3_bc', TIME_STEP_SPEC, ACTION_SPEC,
                      factory.AgentConfig(critic_dtype='bfloat16'))
  with pytest.raises(ValueError, match=r"one of float32, bfloat16, got "
                     r"'float16'"):
    registry.make_agent('rebrac', TIME_STEP_SPEC, ACTION_SPEC,
                      factory.AgentConfig(critic_dtype='float16'))


def test_bfloat16_without_hardware_for_it_is_warned_about(monkeypatch):
  """An AVX2-only CPU emulates bfloat16 (many times slower than float32):
  asking for it there warns; a CPU with AMX or AVX512-BF16 does not."""
  assert not tf.config.list_physical_devices('GPU')  # The CI machine.
  amd = 'flags\t\t: fpu sse2 avx avx2 fma\n'
  intel = 'flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16 amx_bf16\n'
  assert not ensemble.has_bfloat16_instructions(amd)
  assert ensemble.has_bfloat16_instructions(intel)
  make = lambda dtype: registry.make_agent(
      'rebrac', TIME_STEP_SPEC, ACTION_SPEC, factory.AgentConfig(
          actor_layers=(8,), critic_layers=(8,), critic_dtype=dtype))
  monkeypatch.setattr(ensemble, '_cpuinfo', lambda: amd)
  with pytest.warns(ensemble.SlowDtypeWarning,
                    match=r"without bfloat16 instructions .*amx_bf16, "
                    r"avx512_bf16.*use 'float32'"):
    make('bfloat16')
  monkeypatch.setattr(ensemble, '_cpuinfo', lambda: intel)
  with warnings.catch_warnings():
    warnings.simplefilter('error', ensemble.SlowDtypeWarning)
    make('bfloat16')
    monkeypatch.setattr(ensemble, '_cpuinfo', lambda: amd)
    make('float32')
