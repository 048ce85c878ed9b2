"""Image observations through the layers: RLDS episodes whose observation
is a uint8 frame (or a dict of frames and vectors) convert, validate, push
and load into the in-memory feed byte for byte, and the feed assembles
frame stacks at sample time that equal stacks built by hand, at episode
starts, ends and across an eviction, for uniform, n-step and prioritized
draws. A real Reverb server throughout."""

import os
import tempfile

import gymnasium as gym
import numpy as np
import pytest
import reverb
import tensorflow as tf
import tree

import rlds_reverb
from rlds_reverb.acting import rollout
from rlds_reverb.data import validate
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import feeds
from rlds_reverb.replay import memory as memory_lib
from rlds_reverb.replay import per
from rlds_reverb.replay import variants
import rlds_fixtures as fx  # pylint: disable=g-bad-import-order
from conftest import converted_episodes  # pylint: disable=g-bad-import-order

K = 4  # Frames per stack.


def _image_episodes(lengths, shape=(6, 5), terminal=None, seed=0,
                    with_state=False):
  """RLDS episodes whose frames are random uint8 images; frame t of episode
  i also carries (i, t) in its first two pixels, so a frame taken from the
  wrong step or episode is named by the failure."""
  rng = np.random.default_rng(seed)
  episodes = fx.episodes_with_lengths(lengths, terminal=terminal, seed=seed)
  out = []
  for i, episode in enumerate(episodes):
    n = len(episode['reward'])
    frames = rng.integers(0, 256, (n,) + shape, dtype=np.uint8)
    flat = frames.reshape(n, -1)
    flat[:, 0], flat[:, 1] = i, np.arange(n)
    observation = frames
    if with_state:
      observation = {'pixels': frames,
                     'state': rng.standard_normal((n, 2)).astype(np.float32)}
    out.append(fx.with_fields(episode, observation=observation))
  return out


def _pixels(observation):
  return observation['pixels'] if isinstance(observation, dict) \
      else observation


def _hand_stack(frames: np.ndarray, t: int) -> np.ndarray:
  """Frames max(t - K + 1, 0) .. t of one episode, repeated first frame
  before the start, stacked on a new first axis ([K, H, W(, C)])."""
  return np.stack([frames[max(t - j, 0)] for j in range(K - 1, -1, -1)])


def _server(spec, directory=None):
  checkpointer = (reverb.checkpointers.DefaultCheckpointer(directory)
                  if directory else None)
  server = reverb.Server(
      [episode_table.make_table('episodes', spec, max_episodes=1000)],
      checkpointer=checkpointer)
  return server, reverb.Client(f'localhost:{server.port}')


def _push(client, rlds_data):
  """Whole-episode items, unread: what the in-memory feed reads."""
  rlds_reverb.push_rlds_to_table(rlds_data, client, 'episodes',
                                 sequence_length=None,
                                 priority=episode_table.UNREAD)


def _replay(spec, frame_stack=1, capacity=1, **kwargs):
  return variants.UniformReplay(variants.Settings(
      table='episodes', data_spec=spec, batch_size=8, capacity=capacity,
      max_episodes=1000, grow=True, frame_stack=frame_stack, **kwargs))


def _by_episode(memory):
  """episode number -> (first row, length), from the frames' own tags."""
  out = {}
  for _, first, length in memory.episode_rows():
    stack = _pixels(memory.read(tf.constant(first)).observation).numpy()
    # The row's own frame is the last of its stack.
    out[int(stack[-1].reshape(-1)[0])] = (first, length)
  return out


def test_image_episodes_round_trip_convert_push_load_byte_for_byte():
  episodes = _image_episodes([5, 1, 9], shape=(12, 10, 3), with_state=True,
                             terminal=[True, True, False])
  rlds_data = fx.make_rlds(episodes)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  assert spec.observation['pixels'] == tf.TensorSpec([12, 10, 3], tf.uint8)
  converted = [tree.map_structure(lambda x: x.numpy(), e.trajectory)
               for e in rlds_reverb.convert_rlds_to_episodes(rlds_data)]
  for number, trajectory in enumerate(converted):
    validate.check_episode(trajectory, f'episode {number}')  # No error.
    np.testing.assert_array_equal(trajectory.observation['pixels'],
                                  episodes[number]['observation']['pixels'])
  server, client = _server(spec)
  try:
    _push(client, rlds_data)
    replay = _replay(spec)
    assert replay.start(client) == 3
    rows = _by_episode(replay.memory)
    for number, trajectory in enumerate(converted):
      first, length = rows[number]
      assert length == len(trajectory.step_type)
      stored = replay.memory.read(tf.range(first, first + length))
      for path, want in tree.flatten_with_path(trajectory):
        got = tree.flatten_with_path(stored)
        got = dict(got)[path].numpy()
        if path == ('observation', 'pixels'):  # A frame alone: a stack of 1.
          want = want[:, None]
        assert got.dtype == want.dtype, path
        np.testing.assert_array_equal(got, want, err_msg=str(path))
  finally:
    server.stop()


def test_a_bad_state_beside_images_is_still_named():
  episodes = _image_episodes([4], with_state=True)
  episodes[0]['observation']['state'][2, 1] = np.nan
  trajectory = tree.map_structure(
      lambda x: x.numpy(), next(iter(rlds_reverb.convert_rlds_to_episodes(
          fx.make_rlds(episodes)))).trajectory)
  with pytest.raises(validate.InvalidDataError,
                     match=r"episode 0, step 2: observation\['state'\]\[1\] "
                     'is nan'):
    validate.check_episode(trajectory, 'episode 0')


def test_reverb_compresses_image_episodes():
  # Frames that repeat within an episode: a compressed chunk is a fraction
  # of the raw frames; an uncompressed one could not be.
  rng = np.random.default_rng(1)
  episodes = fx.episodes_with_lengths([200, 200])
  for episode in episodes:
    episode['observation'] = np.repeat(
        rng.integers(0, 256, (1, 84, 84), dtype=np.uint8), 200, axis=0)
  rlds_data = fx.make_rlds(episodes)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  directory = tempfile.mkdtemp()
  server, client = _server(spec, directory)
  try:
    _push(client, rlds_data)
    client.checkpoint()
  finally:
    server.stop()
  stored = sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(directory) for name in names)
  raw = 400 * 84 * 84
  assert stored < raw / 10, (stored, raw)


@pytest.mark.parametrize('shape', [(6, 5), (4, 3, 2)])
def test_stacks_equal_hand_built_stacks_at_starts_ends_and_evictions(shape):
  lengths = [7, 1, 2, 3, 6, 2]
  episodes = _image_episodes(lengths, shape=shape)
  spec, converted = converted_episodes(fx.make_rlds(episodes))
  # 14 rows: episode 4 wraps to row 0 and evicts episode 0, episode 5
  # follows it and evicts episode 1.
  memory = memory_lib.TransitionMemory(spec, 14, frame_stack=K)
  memory.add(converted)
  stacked = memory_lib.stacked_shape(shape, K)
  assert memory.transition_spec().observation.shape.as_list() == stacked
  assert memory_lib.stacked_spec(spec, K).observation.shape.as_list() == \
      stacked
  live = _by_episode(memory)
  assert sorted(live) == [2, 3, 4, 5]
  rows = memory.transition_rows()
  batch = memory.transitions(tf.constant(rows))
  pixels = batch.observation.numpy()
  checked = 0
  for number, (first, length) in live.items():
    frames = episodes[number]['observation']
    for t in range(length - 1):
      at = int(np.flatnonzero(rows == first + t)[0])
      np.testing.assert_array_equal(pixels[at, 0], _hand_stack(frames, t))
      np.testing.assert_array_equal(pixels[at, 1],
                                    _hand_stack(frames, t + 1))
      checked += 1
  assert checked == len(rows) == 1 + 2 + 5 + 1


def test_n_step_and_prioritized_draws_assemble_the_same_stacks():
  lengths = [6, 3, 8]
  episodes = _image_episodes(lengths, terminal=[True, False, True])
  spec, converted = converted_episodes(fx.make_rlds(episodes))
  memory = memory_lib.TransitionMemory(spec, sum(lengths), frame_stack=K)
  memory.add(converted)
  live = _by_episode(memory)
  where = {}  # row -> (episode, t)
  for number, (first, length) in live.items():
    for t in range(length):
      where[first + t] = (number, t)

  # n-step: the item spans t -> t + m, m = 3 or fewer at the episode's end.
  rows = memory.transition_rows()
  batch = memory.transitions(tf.constant(rows), n_step=3, gamma=0.9)
  for i, row in enumerate(rows):
    number, t = where[int(row)]
    m = min(3, lengths[number] - 1 - t)
    frames = episodes[number]['observation']
    np.testing.assert_array_equal(batch.observation[i, 0].numpy(),
                                  _hand_stack(frames, t))
    np.testing.assert_array_equal(batch.observation[i, 1].numpy(),
                                  _hand_stack(frames, t + m))

  # Prioritized: every drawn row's stacks are that row's.
  feed = feeds.PrioritizedFeed(memory, 64, per.PerConfig(alpha=1.0))
  priorities = np.zeros(len(rows), np.float32)
  priorities[[0, 5, len(rows) - 1]] = [1.0, 2.0, 3.0]
  feed.set_priorities(rows, np.maximum(priorities, 1e-8))
  drawn, info = feed()
  drawn_rows = info.rows.numpy()
  assert set(drawn_rows) <= {int(rows[0]), int(rows[5]), int(rows[-1])}
  for i, row in enumerate(drawn_rows):
    number, t = where[int(row)]
    frames = episodes[number]['observation']
    np.testing.assert_array_equal(drawn.observation[i, 0].numpy(),
                                  _hand_stack(frames, t))
    np.testing.assert_array_equal(drawn.observation[i, 1].numpy(),
                                  _hand_stack(frames, t + 1))


def test_frames_are_kept_once_per_step():
  episodes = _image_episodes([50, 50], shape=(84, 84))
  spec, converted = converted_episodes(fx.make_rlds(episodes))
  memory = memory_lib.TransitionMemory(spec, 100, frame_stack=K)
  memory.add(converted)
  # One 84x84 frame per row plus the scalars, the index and the episode
  # bounds: never the stack of 4.
  per_row = memory.bytes / memory.capacity
  assert 84 * 84 < per_row < 1.1 * 84 * 84, per_row


def test_frame_stack_setting_reaches_the_feed_of_a_replay():
  episodes = _image_episodes([5, 4])
  rlds_data = fx.make_rlds(episodes)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  server, client = _server(spec)
  try:
    _push(client, rlds_data)
    replay = _replay(spec, frame_stack=K, n_step=2)
    replay.start(client)
    batch = replay.feed()()
    assert batch.observation.shape.as_list() == [8, 2, K, 6, 5]
    assert batch.observation.dtype == tf.uint8
  finally:
    server.stop()


def test_bad_frame_stack_is_refused():
  spec = rlds_reverb.create_trajectory_data_spec(
      fx.make_rlds(_image_episodes([3])))
  with pytest.raises(ValueError, match='frame_stack must be a positive'):
    memory_lib.TransitionMemory(spec, 10, frame_stack=0)


class _CountingFrames(gym.Env):
  """Frames that say where they are: pixel (0, 0) is the episode's number
  (counted per env), pixel (0, 1) the step; episodes end after 2 + number
  steps (terminated on odd numbers, truncated on even ones)."""

  def __init__(self):
    self.observation_space = gym.spaces.Box(0, 255, (4, 3), np.uint8)
    self.action_space = gym.spaces.Discrete(2)
    self._episode, self._t = -1, 0

  def _frame(self):
    frame = np.zeros((4, 3), np.uint8)
    frame[0, 0], frame[0, 1] = self._episode, self._t
    return frame

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self._episode, self._t = self._episode + 1, 0
    return self._frame(), {}

  def step(self, action):
    self._t += 1
    end = self._t >= 2 + self._episode
    odd = self._episode % 2 == 1
    return self._frame(), 1.0, end and odd, end and not odd, {}


def test_acting_stacks_equal_the_memorys_stacks():
  envs = gym.vector.SyncVectorEnv(
      [_CountingFrames] * 2,
      autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP)
  seen = []

  def act(stacks):
    seen.append(stacks.copy())
    return np.zeros(len(stacks), np.int64), None

  episodes = []
  loop = rollout.Rollout(envs, rollout.layout_of(envs), max_episodes=6,
                         frame_stack=K)
  loop.run(act, episodes.append, num_episodes=6)
  envs.close()
  assert all(s.shape == (2, K, 4, 3) for s in seen)

  def hand(episode, t):  # The stack of step t: steps t-3..t, clipped at 0.
    return [(episode, max(t - j, 0)) for j in range(K - 1, -1, -1)]

  acted = 0
  for stacks in seen:
    for stack in stacks:
      episode, t = stack[-1, 0, 0], stack[-1, 0, 1]
      tags = list(zip(stack[:, 0, 0], stack[:, 0, 1]))
      if t <= 1 + episode:  # Not the ignored action of a reset step.
        assert tags == hand(episode, t)
        acted += 1
  assert acted == sum(e.num_steps for e in episodes)
  # The stored episodes keep frames; the memory's stacks are the same.
  rlds_data = fx.make_rlds([e.steps for e in episodes])
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  assert spec.observation.shape.as_list() == [4, 3]
  converted = [tree.map_structure(lambda x: x.numpy(), e.trajectory)
               for e in rlds_reverb.convert_rlds_to_episodes(rlds_data)]
  memory = memory_lib.from_episodes(spec, converted, frame_stack=K)
  for _, first, length in memory.episode_rows():
    stacks = memory.read(tf.range(first, first + length)).observation.numpy()
    for t, stack in enumerate(stacks):
      assert list(zip(stack[:, 0, 0], stack[:, 0, 1])) == hand(
          stack[-1, 0, 0], t)


def test_frame_stacker_refuses_vectors():
  with pytest.raises(ValueError, match='needs image observations'):
    rollout.FrameStacker(4, np.zeros((2, 17), np.float32))
