"""A sum tree in TensorFlow ops, for prioritized replay inside a learner graph.

Reverb keeps its own sum tree on the server; this one lives in tf.Variables so
that a learner can draw and re-prioritise items inside its `tf.function`
(no round trip to a server, no Python per item).

The tree is K-ary (K = `branching`) and stored as one variable per level.
Node i of level d has children i*K .. i*K+K-1 on level d+1, and level d+1 is
kept as a [K**d, K] matrix whose row i holds exactly those children:

  level 0        [[ root ]]                          1 node
  level 1        [[ n0 .. nK-1 ]]                    1 row of K
  level 2        [[ n0 .. nK-1 ], [ nK .. n2K-1 ], ...]  K rows of K
  ...
  level depth    K**(depth-1) rows; the leaves, then zero padding

So the children of B nodes are B whole rows, one row gather per level
(TensorFlow gathers whole rows far faster than B*K single elements). A wide
node keeps the tree shallow, so `sample` and `set` cost a few ops per level.
Leaves past `capacity` stay 0 (`set` refuses them), so they are never drawn.

Parents are recomputed as the sum of their children after every `set`, never
updated by deltas, so float rounding cannot accumulate over a long run.
"""

import numbers
from typing import Any, Optional, Tuple

import tensorflow as tf

# Wider nodes mean fewer levels but a longer cumulative sum per level; a
# sample-and-set loop on a million leaves ran fastest at 16 (of 16, 32, 64).
# Keeps a point strictly below its node's sum (float rounding can reach it);
# moves at most this share of a node's mass onto its last positive child.
_BELOW_ONE = 1.0 - 2.0**-20
DEFAULT_BRANCHING = 16
# Node indices are int32 (what `sample` returns and what gathers like best).
_MAX_LEAVES = 2**31 - 1


def _check_int(arg: str, value: Any, minimum: int) -> None:
  if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
      or value < minimum):
    raise ValueError(
        f'{arg} must be an integer >= {minimum}, got {value!r}.')


class SumTree(tf.Module):
  """Leaf values in [0, inf) with their sums, for proportional sampling.

  Every method runs eagerly and inside `tf.function`. The variables are
  attributes of this module, so `tf.train.Checkpoint(tree=tree)` saves and
  restores them.
  """

  def __init__(self, capacity: int, *, branching: int = DEFAULT_BRANCHING,
               dtype: Any = tf.float32, name: str = 'sum_tree'):
    """Creates an all-zero tree.

    Args:
      capacity: number of leaves that can hold a value (indices
        0 .. capacity-1).
      branching: children per node (K).
      dtype: float32 or float64, the dtype of the values (half precision
        would lose small priorities in the sums).
      name: name of the module and prefix of its variables.

    Raises:
      ValueError: if capacity is not an integer >= 1, if branching is not an
        integer >= 2, if dtype is not float32/float64, or if the padded leaf
        level would not fit int32 indices.
    """
    _check_int('capacity', capacity, 1)
    _check_int('branching', branching, 2)
    try:
      dtype = tf.as_dtype(dtype)
    except TypeError as e:
      raise ValueError(
          f'dtype must be float32 or float64, got {dtype!r}.') from e
    if dtype not in (tf.float32, tf.float64):
      raise ValueError(f'dtype must be float32 or float64, got {dtype!r}.')
    capacity, branching = int(capacity), int(branching)
    depth = 1
    while branching**depth < capacity:
      depth += 1
    if branching**depth > _MAX_LEAVES:
      raise ValueError(
          f'capacity {capacity} at branching {branching} needs '
          f'{branching**depth} leaves, more than int32 indices address; '
          'use a smaller capacity or a branching whose power is closer to it.')
    super().__init__(name=name)
    self._capacity = capacity
    self._branching = branching
    self._depth = depth
    self._dtype = dtype
    with self.name_scope:
      self._levels = [tf.Variable(tf.zeros([1, 1], dtype), trainable=False,
                                  name='level_0')]
      self._levels += [
          tf.Variable(tf.zeros([branching**(d - 1), branching], dtype),
                      trainable=False, name=f'level_{d}')
          for d in range(1, depth + 1)]

  @property
  def capacity(self) -> int:
    return self._capacity

  @property
  def branching(self) -> int:
    return self._branching

  @property
  def depth(self) -> int:
    """Levels below the root; the leaves are level `depth`."""
    return self._depth

  @property
  def levels(self) -> Tuple[tf.Variable, ...]:
    """The variables, root level first; level d > 0 is [K**(d-1), K]."""
    return tuple(self._levels)

  def total(self) -> tf.Tensor:
    """The sum of all leaves (the root), a scalar."""
    return self._levels[0][0, 0]

  def values(self) -> tf.Tensor:
    """All `capacity` leaf values, e.g. to write priorities back elsewhere."""
    return tf.reshape(self._levels[-1], [-1])[:self._capacity]

  def get(self, indices: Any) -> tf.Tensor:
    """Leaf values at `indices`, in the shape of `indices`.

    Args:
      indices: int32/int64 leaf indices in [0, capacity), any shape.

    Raises:
      ValueError: if indices are not int32/int64.
      tf.errors.InvalidArgumentError: (when run) if an index is out of range.
    """
    indices = self._checked_indices(indices)
    return tf.gather_nd(self._levels[-1], self._coords(indices))

  def set(self, indices: Any, values: Any, *, validate: bool = True) -> None:
    """Sets leaves and recomputes their ancestors from their children.

    Duplicate indices are allowed: any one of their values wins, and every
    ancestor is recomputed from what the leaf level holds afterwards, so the
    tree stays consistent.

    Args:
      indices: int32/int64 leaf indices in [0, capacity), any shape.
      values: finite values >= 0, the same number as indices.
      validate: check the indices and values in-graph; a learner's own
        updates (rows it sampled, priorities it made finite and positive)
        skip the checks, which cost as much as a tree level.

    Raises:
      ValueError: if indices are not int32/int64.
      tf.errors.InvalidArgumentError: (when run) if an index is out of range,
        the sizes differ, or a value is negative or not finite.
    """
    if not validate:
      self._set(tf.reshape(tf.cast(indices, tf.int32), [-1]),
                tf.reshape(tf.cast(values, self._dtype), [-1]))
      return
    indices = self._checked_indices(indices)
    values = tf.cast(tf.convert_to_tensor(values), self._dtype)
    indices = tf.reshape(indices, [-1])
    values = tf.reshape(values, [-1])
    checks = [
        tf.debugging.assert_equal(
            tf.size(indices), tf.size(values),
            message='SumTree.set: indices and values differ in size'),
        tf.debugging.assert_all_finite(
            values, 'SumTree.set: values must be finite'),
        tf.debugging.assert_non_negative(
            values, message='SumTree.set: values must be >= 0'),
    ]
    with tf.control_dependencies(checks):
      values = tf.identity(values)
    self._set(indices, values)

  def _set(self, indices: tf.Tensor, values: tf.Tensor) -> None:
    self._levels[-1].scatter_nd_update(self._coords(indices), values)
    # Automatic control dependencies order each gather after the scatter into
    # the same variable, inside tf.function as eagerly.
    nodes = indices // self._branching
    for depth in reversed(range(self._depth)):
      sums = tf.reduce_sum(tf.gather(self._levels[depth + 1], nodes), axis=1)
      self._levels[depth].scatter_nd_update(self._coords(nodes), sums)
      nodes = nodes // self._branching

  def sample(self, batch_size: int, *, stratified: bool = True,
             seed: Optional[Any] = None) -> Tuple[tf.Tensor, tf.Tensor]:
    """Draws leaves with probability value / total.

    Stratified sampling (Schaul et al. 2015) splits [0, total) into
    `batch_size` equal segments and draws one point in each, so a batch
    covers the whole range and its indices come out in ascending order.

    Args:
      batch_size: number of leaves to draw (B).
      stratified: one point per segment if True, B independent points if not.
      seed: None to draw from TF's random state, or a stateless seed (an int,
        or an int tensor of shape [2]) making the draw a function of the tree
        and the seed.

    Returns:
      (indices, values): int32 [B] leaf indices and their [B] values.

    Raises:
      ValueError: if batch_size is not an integer >= 1.
      tf.errors.InvalidArgumentError: (when run) if the tree is empty.
    """
    _check_int('batch_size', batch_size, 1)
    batch_size = int(batch_size)
    total = self.total()
    check = tf.debugging.assert_positive(
        total, message='SumTree is empty (total is 0): nothing to sample')
    with tf.control_dependencies([check]):
      u = self._uniform(batch_size, seed)
    if stratified:
      segment = total / batch_size
      lo = tf.range(batch_size, dtype=self._dtype) * segment
      hi = tf.range(1, batch_size + 1, dtype=self._dtype) * segment
      # Rounding in lo + u * segment may reach hi, the next stratum.
      points = tf.minimum(lo + u * segment, tf.math.nextafter(hi, lo))
    else:
      points = u * total
    nodes = tf.zeros([batch_size], tf.int32)
    points = points[:, None]  # [B, 1]: searchsorted's shape.
    for level in self._levels[1:]:
      children = tf.gather(level, nodes)  # [B, K]
      cums = tf.cumsum(children, axis=1)
      # A point below its node's sum lands on a child with a value: equal
      # sums are skipped by searching on the right. Rounding may put it at
      # or past the sum; keep it just below.
      points = tf.minimum(points, cums[:, -1:] * _BELOW_ONE)
      child = tf.searchsorted(cums, points, side='right',
                              out_type=tf.int32)  # [B, 1]
      points = points - tf.gather(cums - children, child, batch_dims=1)
      nodes = nodes * self._branching + child[:, 0]
    return nodes, tf.gather(children, child, batch_dims=1)[:, 0]

  def _coords(self, nodes: tf.Tensor) -> tf.Tensor:
    """Node indices of one level -> their [row, column] in its matrix."""
    return tf.stack([nodes // self._branching, nodes % self._branching],
                    axis=-1)

  def _checked_indices(self, indices: Any) -> tf.Tensor:
    indices = tf.convert_to_tensor(indices)
    if indices.dtype not in (tf.int32, tf.int64):
      raise ValueError(
          f'indices must be int32 or int64, got {indices.dtype.name}.')
    checks = [
        tf.debugging.assert_non_negative(
            indices, message='SumTree: indices must be >= 0'),
        tf.debugging.assert_less(
            indices, tf.cast(self._capacity, indices.dtype),
            message=f'SumTree: indices must be < capacity {self._capacity}'),
    ]
    with tf.control_dependencies(checks):
      return tf.cast(indices, tf.int32)

  def _uniform(self, batch_size: int, seed: Optional[Any]) -> tf.Tensor:
    if seed is None:
      return tf.random.uniform([batch_size], dtype=self._dtype)
    if isinstance(seed, numbers.Integral) and not isinstance(seed, bool):
      seed = (int(seed), 0)
    return tf.random.stateless_uniform([batch_size], seed, dtype=self._dtype)
