"""SumTree (rlds_reverb.replay.sum_tree) on real TensorFlow ops.

Draws use fixed stateless seeds, so every statistical check is reproducible;
the bounds are still stated as if the draws were fresh (false alarm 1e-4).
"""

import math

import numpy as np
import pytest
import tensorflow as tf

from rlds_reverb.replay import sum_tree

# Leaves with a value in the frequency tests: distinct priorities 1..20,
# scattered over a capacity-33 tree at branching 4 (64 leaves, 31 zeros,
# some between the values and some past the capacity).
_CAPACITY = 33
_LIVE = np.array([0, 1, 3, 4, 6, 8, 9, 11, 13, 14, 16, 18, 19, 21, 22, 24,
                  26, 28, 30, 32])
_DRAWS = 200_000
_P_MIN = 1e-4


def _chi2_sf(x: float, dof: int) -> float:
  """P(chi2_dof >= x), from the series of the lower incomplete gamma."""
  a, z = dof / 2, x / 2
  term = total = 1 / a
  n = 0
  while term > 1e-17 * total:
    n += 1
    term *= z / (a + n)
    total += term
  lower = math.exp(a * math.log(z) - z - math.lgamma(a)) * total
  return max(0.0, 1.0 - lower)


def _frequency_tree() -> sum_tree.SumTree:
  tree = sum_tree.SumTree(_CAPACITY, branching=4)
  tree.set(_LIVE, np.arange(1, len(_LIVE) + 1, dtype=np.float32))
  return tree


def _check_levels(tree: sum_tree.SumTree, rtol: float) -> None:
  """Every node equals the sum of its children (summed in float64)."""
  k = tree.branching
  levels = [v.numpy().reshape(-1).astype(np.float64) for v in tree.levels]
  for parent, children in zip(levels[:-1], levels[1:]):
    np.testing.assert_allclose(parent, children.reshape(-1, k).sum(axis=1),
                               rtol=rtol, atol=0)


def test_chi2_sf_matches_tables():
  # Textbook quantiles: chi2(19) at 0.95 is 30.144, chi2(1) at 0.999 10.828.
  assert _chi2_sf(30.144, 19) == pytest.approx(0.05, abs=1e-4)
  assert _chi2_sf(10.828, 1) == pytest.approx(1e-3, abs=1e-5)


@pytest.mark.parametrize('branching', [2, 4, 32])
@pytest.mark.parametrize('capacity', [1, 5, 32, 33, 1000, 100_000])
def test_total_is_sum_of_values(capacity, branching):
  tree = sum_tree.SumTree(capacity, branching=branching)
  assert branching**tree.depth >= capacity
  assert tree.depth == 1 or branching**(tree.depth - 1) < capacity
  assert [v.shape.as_list() for v in tree.levels] == [[1, 1]] + [
      [branching**(d - 1), branching] for d in range(1, tree.depth + 1)]
  values = np.random.default_rng(capacity).uniform(
      0, 10, capacity).astype(np.float32)
  tree.set(np.arange(capacity), values)
  np.testing.assert_allclose(tree.total().numpy(), values.sum(dtype=np.float64),
                             rtol=1e-5)
  np.testing.assert_array_equal(tree.values().numpy(), values)
  assert not tree.levels[-1].numpy().reshape(-1)[capacity:].any()
  _check_levels(tree, rtol=1e-5)


@pytest.mark.parametrize('dtype,rtol',
                         [(tf.float32, 1e-5), (tf.float64, 1e-12)])
@pytest.mark.parametrize('branching', [2, 4, 32])
def test_ancestors_consistent_after_many_sets(dtype, rtol, branching):
  capacity = 1000
  rng = np.random.default_rng(branching)
  tree = sum_tree.SumTree(capacity, branching=branching, dtype=dtype)
  for _ in range(30):
    # 64 indices from 40 leaves: duplicates in almost every call.
    indices = rng.choice(40, 64) * 25 + rng.integers(0, 25)
    values = rng.exponential(3.0, 64) * (rng.uniform(size=64) < 0.8)
    tree.set(indices.astype(np.int64), values)
    _check_levels(tree, rtol)
  leaves = tree.values().numpy()
  np.testing.assert_allclose(tree.total().numpy(), leaves.sum(), rtol=rtol)
  assert not tree.levels[-1].numpy().reshape(-1)[capacity:].any()


def test_unstratified_frequencies_match_priorities():
  tree = _frequency_tree()
  indices, values = tree.sample(_DRAWS, stratified=False, seed=(3, 4))
  _check_frequencies(tree, indices.numpy(), values.numpy())


def test_stratified_frequencies_match_priorities():
  tree = _frequency_tree()
  batch, batches = 256, _DRAWS // 256

  @tf.function
  def draw():
    out = tf.TensorArray(tf.int32, size=batches)
    vals = tf.TensorArray(tf.float32, size=batches)
    for i in tf.range(batches):
      idx, val = tree.sample(batch, seed=tf.stack([i, 11]))
      out = out.write(i, idx)
      vals = vals.write(i, val)
    return out.concat(), vals.concat()

  indices, values = draw()
  _check_frequencies(tree, indices.numpy(), values.numpy())


def _check_frequencies(tree, indices, values):
  assert indices.min() >= 0 and indices.max() < _CAPACITY
  assert (values > 0).all()
  counts = np.bincount(indices, minlength=_CAPACITY)
  dead = np.setdiff1d(np.arange(_CAPACITY), _LIVE)
  assert not counts[dead].any(), 'a zero-valued leaf was drawn'
  priorities = np.arange(1, len(_LIVE) + 1)
  expected = len(indices) * priorities / priorities.sum()
  chi2 = ((counts[_LIVE] - expected)**2 / expected).sum()
  p_value = _chi2_sf(chi2, len(_LIVE) - 1)
  assert p_value > _P_MIN, f'chi2 {chi2:.1f}, p {p_value:.2e}'
  np.testing.assert_array_equal(values, tree.get(indices).numpy())


@pytest.mark.parametrize('capacity,branching,batch', [
    (1024, 32, 256), (1000, 4, 250), (777, 16, 777)])
def test_stratified_one_draw_per_stratum(capacity, branching, batch):
  tree = sum_tree.SumTree(capacity, branching=branching)
  tree.set(tf.range(capacity), tf.ones([capacity]))
  per_stratum = capacity // batch
  for seed in range(5):
    indices = tree.sample(batch, seed=seed)[0].numpy()
    np.testing.assert_array_equal(indices // per_stratum, np.arange(batch))
    assert (np.diff(indices) > 0).all()


def test_sample_values_equal_get():
  tree = sum_tree.SumTree(5000, branching=16)
  rng = np.random.default_rng(0)
  tree.set(np.arange(5000), rng.exponential(size=5000) * (rng.uniform(
      size=5000) < 0.5))
  for stratified in (True, False):
    indices, values = tree.sample(1024, stratified=stratified, seed=7)
    assert indices.dtype == tf.int32 and indices.shape == [1024]
    np.testing.assert_array_equal(values.numpy(), tree.get(indices).numpy())
    assert (values.numpy() > 0).all()


def test_seeded_sample_is_reproducible():
  tree = _frequency_tree()
  first = tree.sample(64, stratified=False, seed=(1, 2))[0].numpy()
  again = tf.function(lambda: tree.sample(64, stratified=False,
                                          seed=(1, 2)))()[0].numpy()
  np.testing.assert_array_equal(first, again)


def test_rounding_guard_never_returns_zero_leaf():
  # A root larger than the sum of its children stands in for rounding: points
  # past the children's last cumulative sum must fall back to the last child
  # with a value, never to a zero leaf.
  tree = sum_tree.SumTree(8, branching=2)
  tree.set([0, 2, 5], [1.0, 2.0, 0.5])
  tree.levels[0].assign([[100.0]])
  for stratified in (True, False):
    indices, values = tree.sample(400, stratified=stratified, seed=5)
    assert set(indices.numpy()) <= {0, 2, 5}
    assert (values.numpy() > 0).all()
    # Most points are past the real total 3.5: they land on the last leaf.
    assert (indices.numpy() == 5).mean() > 0.9


def test_wide_value_range_never_draws_zero_leaf():
  capacity = 4096
  rng = np.random.default_rng(1)
  values = np.exp(rng.uniform(-30, 30, capacity)) * (rng.uniform(
      size=capacity) < 0.3)
  tree = sum_tree.SumTree(capacity, branching=8)
  tree.set(np.arange(capacity), values.astype(np.float32))
  for stratified in (True, False):
    indices, drawn = tree.sample(20_000, stratified=stratified, seed=9)
    assert (drawn.numpy() > 0).all()
    assert (tree.get(indices).numpy() > 0).all()


def test_set_get_in_function_equals_eager():
  rng = np.random.default_rng(2)
  calls = [(rng.choice(3000, 100, replace=False),
            rng.exponential(size=100).astype(np.float32)) for _ in range(10)]
  eager = sum_tree.SumTree(3000, branching=8)
  graph = sum_tree.SumTree(3000, branching=8)

  @tf.function
  def set_fn(indices, values):
    graph.set(indices, values)
    return graph.get(indices)

  for indices, values in calls:
    eager.set(indices, values)
    got = set_fn(tf.constant(indices), tf.constant(values))
    np.testing.assert_array_equal(got.numpy(), eager.get(indices).numpy())
  assert set_fn.experimental_get_tracing_count() == 1
  for a, b in zip(eager.levels, graph.levels):
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_sample_and_set_loop_in_function():
  tree = sum_tree.SumTree(10_000, branching=32)
  tree.set(tf.range(10_000), tf.ones([10_000]))

  @tf.function
  def train(steps):
    for i in tf.range(steps):
      indices, _ = tree.sample(64, seed=tf.stack([i, 0]))
      tree.set(indices, tf.fill([64], 0.5))
    return tree.total()

  total = train(tf.constant(20)).numpy()
  # 20 batches of 64 distinct leaves at most, each lowered from 1 to 0.5.
  assert 10_000 - 20 * 64 * 0.5 <= total < 10_000
  _check_levels(tree, rtol=1e-6)


def test_checkpoint_round_trip(tmp_path):
  tree = sum_tree.SumTree(1000, branching=16)
  values = np.random.default_rng(3).uniform(size=1000).astype(np.float32)
  tree.set(np.arange(1000), values)
  path = tf.train.Checkpoint(tree=tree).save(str(tmp_path / 'ckpt'))
  restored = sum_tree.SumTree(1000, branching=16)
  tf.train.Checkpoint(tree=restored).restore(path).assert_consumed()
  assert restored.total().numpy() == tree.total().numpy()
  np.testing.assert_array_equal(restored.values().numpy(), values)


def test_empty_tree_sample_raises():
  tree = sum_tree.SumTree(10)
  with pytest.raises(tf.errors.InvalidArgumentError, match='empty'):
    tree.sample(4)
  tree.set([3], [1.0])
  tree.set([3], [0.0])
  with pytest.raises(tf.errors.InvalidArgumentError, match='empty'):
    tf.function(lambda: tree.sample(4, stratified=False))()


@pytest.mark.parametrize('indices,values,match', [
    ([10], [1.0], 'capacity'),
    ([-1], [1.0], '>= 0'),
    ([1], [-0.5], '>= 0'),
    ([1], [float('nan')], 'finite'),
    ([1], [float('inf')], 'finite'),
    ([1, 2], [1.0], 'size'),
])
def test_set_rejects_bad_data(indices, values, match):
  tree = sum_tree.SumTree(10)
  with pytest.raises(tf.errors.InvalidArgumentError, match=match):
    tree.set(tf.constant(indices), tf.constant(values))
  assert tree.total().numpy() == 0


def test_get_rejects_out_of_range():
  tree = sum_tree.SumTree(10, branching=4)  # 16 leaves, 10 usable.
  with pytest.raises(tf.errors.InvalidArgumentError, match='capacity'):
    tree.get(tf.constant([10], tf.int64))


@pytest.mark.parametrize('kwargs,arg', [
    (dict(capacity=0), 'capacity'),
    (dict(capacity=-3), 'capacity'),
    (dict(capacity=2.0), 'capacity'),
    (dict(capacity=True), 'capacity'),
    (dict(capacity=10, branching=1), 'branching'),
    (dict(capacity=10, branching=4.0), 'branching'),
    (dict(capacity=10, dtype=tf.int32), 'dtype'),
    (dict(capacity=10, dtype=tf.float16), 'dtype'),
    (dict(capacity=2**31 - 1, branching=32), 'int32'),
])
def test_constructor_rejects_bad_arguments(kwargs, arg):
  with pytest.raises(ValueError, match=arg):
    sum_tree.SumTree(**kwargs)


@pytest.mark.parametrize('batch_size', [0, -1, 2.5, None])
def test_sample_rejects_bad_batch_size(batch_size):
  tree = _frequency_tree()
  with pytest.raises(ValueError, match='batch_size'):
    tree.sample(batch_size)


def test_rejects_float_indices():
  tree = sum_tree.SumTree(10)
  with pytest.raises(ValueError, match='indices'):
    tree.get(tf.constant([1.0]))
  with pytest.raises(ValueError, match='indices'):
    tree.set(tf.constant([1.0]), [1.0])


def test_get_keeps_the_shape_of_indices():
  tree = sum_tree.SumTree(40, branching=4)
  tree.set(tf.range(40), tf.range(40, dtype=tf.float32))
  got = tree.get(tf.constant([[3, 39], [0, 17]], tf.int64))
  np.testing.assert_array_equal(got.numpy(), [[3.0, 39.0], [0.0, 17.0]])
