"""Halfcheetah-shaped RLDS episodes in memory: the benchmarks' shared data.

Held in memory so the read side is as fast as tf.data gets, and the
figures measure what the benchmark names, not disk reads.
"""

import numpy as np
import rlds
import tensorflow as tf

OBS_DIM, ACTION_DIM = 17, 6


def make_rlds(num_episodes: int, num_steps: int, seed: int = 0
              ) -> tf.data.Dataset:
  """Truncated halfcheetah-shaped episodes, in memory."""
  rng = np.random.default_rng(seed)
  index = np.arange(num_steps)
  steps = {
      rlds.OBSERVATION: rng.standard_normal(
          (num_episodes, num_steps, OBS_DIM), dtype=np.float32),
      rlds.ACTION: rng.uniform(-1, 1, (num_episodes, num_steps, ACTION_DIM)
                               ).astype(np.float32),
      rlds.REWARD: rng.standard_normal((num_episodes, num_steps),
                                       dtype=np.float32),
      rlds.DISCOUNT: np.ones((num_episodes, num_steps), np.float32),
      rlds.IS_FIRST: np.tile(index == 0, (num_episodes, 1)),
      rlds.IS_LAST: np.tile(index == num_steps - 1, (num_episodes, 1)),
      rlds.IS_TERMINAL: np.zeros((num_episodes, num_steps), bool),
  }
  return tf.data.Dataset.from_tensor_slices(steps).map(
      lambda episode: {rlds.STEPS: tf.data.Dataset.from_tensor_slices(episode)})
