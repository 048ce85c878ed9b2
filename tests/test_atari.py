"""Atari recorded as RLDS (`pipelines.generate --env ALE/Pong-v5`): one
84x84 grey uint8 frame per step, the env's own frames and actions, time
limits as truncation, and the data through push and the frame-stacking
memory. Real ale-py Pong, a few hundred steps."""

import dataclasses

import numpy as np
import pytest
import reverb
import tensorflow as tf
import tree

import rlds_reverb
from rlds_reverb.acting import atari
from rlds_reverb.acting import envs as acting_envs
from rlds_reverb.acting import numpy_policy
from rlds_reverb.data import datasets
from rlds_reverb.data import recording
from rlds_reverb.experiments import configs
from rlds_reverb.experiments import online
from rlds_reverb.replay import episode_table
from rlds_reverb.replay import variants

LIMIT = 60  # Agent steps per episode: a time limit, so truncated endings.


@pytest.fixture(scope='module')
def pong(tmp_path_factory):
  out = tmp_path_factory.mktemp('pong')
  summary = recording.generate_dataset(
      'ALE/Pong-v5', 'random', 2, str(out), seed=3, max_episode_steps=LIMIT,
      show_progress=False)
  episodes = [tree.map_structure(
      lambda x: x.numpy(), e['steps'].batch(10**6).get_single_element())
              for e in datasets.load(str(out))]
  return summary, episodes, str(out)


def test_specs_keep_frames_uint8_and_actions_discrete():
  specs = acting_envs.env_specs('ALE/Pong-v5')
  # The agent sees 4-frame stacks; the data holds one frame per step.
  assert specs.time_step_spec.observation == tf.TensorSpec(
      [4, 84, 84], tf.uint8, name='observation')
  assert specs.observation_shape == (84, 84) and specs.frame_stack == 4
  assert acting_envs.env_specs('ALE/Pong-v5', frame_stack=2
                               ).time_step_spec.observation.shape == [2, 84, 84]
  with pytest.raises(ValueError, match='frame_stack 4 needs image'):
    acting_envs.env_specs('CartPole-v1', frame_stack=4)
  assert specs.discrete and int(specs.action_spec.maximum) == 5
  assert specs.max_episode_steps == atari.MAX_EPISODE_STEPS == 27_000


def _frames(env_id: str, **env_kwargs) -> tuple[np.ndarray, float]:
  """300 steps of fixed random actions from seed 1: the frames, and the
  emulator's sticky-action probability."""
  env = acting_envs.make_env(env_id, **env_kwargs)
  frames = [env.reset(seed=1)[0]]
  for action in np.random.default_rng(0).integers(0, 6, 300):
    frames.append(env.step(int(action))[0])
  return (np.stack(frames),
          env.unwrapped.ale.getFloat('repeat_action_probability'))


def test_no_frameskip_v4_is_v5_without_sticky_actions():
  """The seed codebase's PongNoFrameskip-v4: the same preprocessing and
  time limit as ALE/Pong-v5, the same frames as v5 with sticky actions off."""
  assert atari.is_atari('PongNoFrameskip-v4')
  assert atari.is_atari('ALE/Pong-v5')
  assert not atari.is_atari('Pong-v4')  # random frame skip: not ours
  specs = acting_envs.env_specs('PongNoFrameskip-v4')
  assert specs.observation_shape == (84, 84) and specs.frame_stack == 4
  assert specs.discrete and int(specs.action_spec.maximum) == 5
  assert specs.max_episode_steps == atari.MAX_EPISODE_STEPS
  v4, v4_sticky = _frames('PongNoFrameskip-v4')
  v5_off, _ = _frames('ALE/Pong-v5', repeat_action_probability=0.0)
  v5, v5_sticky = _frames('ALE/Pong-v5')
  assert (v4_sticky, v5_sticky) == (0.0, 0.25)
  assert v4.shape == (301, 84, 84) and v4.dtype == np.uint8
  np.testing.assert_array_equal(v4, v5_off)
  assert not np.array_equal(v4, v5)


def test_one_frame_per_step_truncated_at_the_time_limit(pong):
  summary, episodes, _ = pong
  assert summary.num_episodes == 2 and summary.num_env_steps == 2 * LIMIT
  for steps in episodes:
    assert steps['observation'].shape == (LIMIT + 1, 84, 84)
    assert steps['observation'].dtype == np.uint8
    assert steps['action'].dtype == np.int64
    assert set(np.unique(steps['action'][:-1])) <= set(range(6))
    assert steps['is_last'][-1] and not steps['is_terminal'][-1]
    assert not steps['is_last'][:-1].any()
  # Two sub-envs, two seeds: not the same game.
  assert not np.array_equal(episodes[0]['observation'],
                            episodes[1]['observation'])


def test_recorded_frames_are_the_envs_frames(pong):
  # Replaying the recorded actions in an env reset with the recording's
  # seed gives back every recorded frame (sticky actions included: the
  # env's own generator is seeded by the reset).
  _, episodes, _ = pong
  matched = 0
  for i in range(2):
    env = atari.make_atari('ALE/Pong-v5', max_episode_steps=LIMIT)
    frame, _ = env.reset(seed=3 + i)
    steps = next(s for s in episodes
                 if np.array_equal(s['observation'][0], frame))
    for t in range(LIMIT):
      frame, reward, terminated, truncated, _ = env.step(
          int(steps['action'][t]))
      np.testing.assert_array_equal(steps['observation'][t + 1], frame)
      assert steps['reward'][t] == reward
      matched += 1
    assert truncated and not terminated
    env.close()
  assert matched == 2 * LIMIT


def test_pushed_pong_is_read_back_in_stacks(pong):
  _, episodes, out = pong
  rlds_data = datasets.load(out)
  spec = rlds_reverb.create_trajectory_data_spec(rlds_data)
  server = reverb.Server(
      [episode_table.make_table('episodes', spec, max_episodes=10)])
  client = reverb.Client(f'localhost:{server.port}')
  try:
    rlds_reverb.push_rlds_to_table(rlds_data, client, 'episodes',
                                   sequence_length=None,
                                   priority=episode_table.UNREAD)
    replay = variants.UniformReplay(variants.Settings(
        table='episodes', data_spec=spec, batch_size=32, capacity=1,
        max_episodes=10, grow=True, frame_stack=4))
    assert replay.start(client) == 2
    memory = replay.memory
    for _, first, length in memory.episode_rows():
      stacks = memory.read(tf.range(first, first + length)).observation
      frames = stacks.numpy()[:, -1]
      steps = next(s for s in episodes
                   if np.array_equal(s['observation'], frames))
      # Row t's stack: frames t-3..t, the first frame repeated before t=0.
      np.testing.assert_array_equal(
          stacks[2].numpy(), np.stack([steps['observation'][i]
                                       for i in (0, 0, 1, 2)]))
    batch = replay.feed()()
    assert batch.observation.shape.as_list() == [32, 2, 4, 84, 84]
  finally:
    server.stop()


def test_online_dqn_on_pong_trains_checkpoints_and_resumes(tmp_path):
  # One env copy, about 800 agent steps per random Pong episode: the
  # learner trains once the first episode is in its memory.
  config = configs.OnlineConfig(
      agent='dqn', env='ALE/Pong-v5', root_dir=str(tmp_path), env_steps=1000,
      initial_collect_steps=300, train_every=100, utd=0.5, batch_size=32,
      eval_interval=1000, checkpoint_interval=1000, eval_episodes=1,
      replay_size=3000)
  first = online.train_online(config, show_progress=False)
  assert first['env_steps'] == 1000 and first['train_step'] > 0
  assert -21 <= first['average_return'] <= 21
  policy = numpy_policy.load(str(tmp_path / 'policy.npz'))
  assert policy.input_shape == [4, 84, 84] and policy.head == 'q_argmax'
  second = online.train_online(
      dataclasses.replace(config, env_steps=1100, eval_interval=1100),
      show_progress=False)
  assert second['env_steps'] == 1100
  assert second['train_step'] == first['train_step'] + 50


def _stacks_of(frames: np.ndarray, steps: int) -> np.ndarray:
  """The 4-frame stacks of steps 0 .. steps-1, the first frame repeated
  before the start, built by hand from the stored frames."""
  return np.stack([frames[np.maximum(np.arange(t - 3, t + 1), 0)]
                   for t in range(steps)])


def test_recording_with_an_image_policy_acts_on_stacks_keeps_frames(
    tmp_path):
  """A categorical CNN policy (PPO's export) records Pong: the data keeps
  one frame per step, and each step's stored log-probability is the
  policy's for the stored action on the stack of that step's last 4
  frames (the first repeated), so the policy saw the stacks the learner's
  memory builds."""
  from rlds_reverb.agents import actor_critic  # pylint: disable=g-import-not-at-top
  tf.random.set_seed(1)
  model = actor_critic.CnnActorCritic((4, 84, 84), num_actions=6)
  for weight in model.actor.trainable_weights:  # Init gain 0.01: make the
    weight.assign(weight * 300.0)  # log-probs depend on the stack.
  policy = actor_critic.export(model, np.int64(0), np.int64(5))
  path = str(tmp_path / 'cnn.npz')
  policy.save(path)
  recording.generate_dataset(
      'ALE/Pong-v5', path, 1, str(tmp_path / 'data'), seed=5,
      max_episode_steps=12, show_progress=False)
  steps = next(iter(datasets.load(str(tmp_path / 'data'))))['steps']
  steps = tree.map_structure(lambda x: x.numpy(),
                             steps.batch(10**6).get_single_element())
  frames = steps['observation']
  assert frames.shape == (13, 84, 84)
  stacks = _stacks_of(frames, 12)
  logits = policy._last_layer(stacks)  # pylint: disable=protected-access
  log_probs = logits - np.logaddexp.reduce(logits, axis=-1, keepdims=True)
  want = log_probs[np.arange(12), steps['action'][:12]]
  assert np.ptp(log_probs[:, 0]) > 0.01  # The stacks matter.
  np.testing.assert_allclose(steps['infos']['action_log_probs'][:12], want,
                             atol=1e-5)
  # Exploration noise: with epsilon 0.5 each stored log-probability is the
  # mixture's, log(0.5 pi(a|s) + 0.5 / 6).
  recording.generate_dataset(
      'ALE/Pong-v5', path, 1, str(tmp_path / 'noisy'), seed=5,
      max_episode_steps=12, show_progress=False, epsilon=0.5)
  noisy = next(iter(datasets.load(str(tmp_path / 'noisy'))))['steps']
  noisy = tree.map_structure(lambda x: x.numpy(),
                             noisy.batch(10**6).get_single_element())
  frames = noisy['observation']
  stacks = _stacks_of(frames, 12)
  mixed = np.log(0.5 * np.exp(policy.action_log_probs(stacks)) + 0.5 / 6)
  np.testing.assert_allclose(noisy['infos']['action_log_probs'][:12],
                             mixed[np.arange(12), noisy['action'][:12]],
                             atol=1e-5)
  with pytest.raises(ValueError, match='exploration noise of a policy'):
    recording.generate_dataset(
        'ALE/Pong-v5', 'random', 1, str(tmp_path / 'r'), epsilon=0.1,
        max_episode_steps=12, show_progress=False)
  # A Q-network's argmax cannot sample: refused before recording.
  q_path = str(tmp_path / 'q.npz')
  dataclasses.replace(policy, head='q_argmax').save(q_path)
  with pytest.raises(ValueError, match="recording takes a 'categorical'"):
    recording.generate_dataset(
        'ALE/Pong-v5', q_path, 1, str(tmp_path / 'q'), seed=5,
        max_episode_steps=12, show_progress=False)


def test_the_shipped_pong_medium_policy_records_and_plays_above_random(
    tmp_path):
  """`--policy medium` for ALE/Pong-v5 is PPO's 2M-step snapshot (the
  behaviour policy of docs/datasets.md's Pong data): a categorical CNN on
  4-frame stacks whose sampled episode, seeded, scores far above random
  play (-20.x; the recorded data's mean is -7.3)."""
  from rlds_reverb.data import behaviour_policies  # pylint: disable=g-import-not-at-top
  assert behaviour_policies.shipped_names('ALE/Pong-v5') == [
      'expert', 'medium']
  policy = behaviour_policies.load_policy('medium', 'ALE/Pong-v5')
  assert policy.head == 'categorical' and policy.input_shape == [4, 84, 84]
  assert policy.metadata['agent'] == 'ppo'
  assert policy.metadata['env_steps'] == 2000896
  summary = recording.generate_dataset(
      'ALE/Pong-v5', 'medium', 1, str(tmp_path / 'medium'), seed=0,
      show_progress=False)
  assert summary.mean_return > -15, summary


def test_pong_medium_expert_records_each_shipped_policy_with_noise(
    tmp_path):
  """--dataset_kind medium-expert on Pong (the CQL-against-BC data of
  docs/offline_rl.md): one episode of the shipped medium policy (PPO at
  2M), then one of the expert (PPO at 5M), each step's stored
  log-probability the epsilon mixture of the policy that acted."""
  from rlds_reverb.data import behaviour_policies  # pylint: disable=g-import-not-at-top
  expert = behaviour_policies.load_policy('expert', 'ALE/Pong-v5')
  assert expert.metadata['agent'] == 'ppo'
  assert expert.metadata['env_steps'] == 5000000
  recording.generate_dataset(
      'ALE/Pong-v5', 'medium', 1, str(tmp_path / 'me'), seed=2,
      max_episode_steps=12, dataset_kind='medium-expert', epsilon=0.25,
      show_progress=False)
  episodes = [tree.map_structure(lambda x: x.numpy(),
                                 e['steps'].batch(10**6).get_single_element())
              for e in datasets.load(str(tmp_path / 'me'))]
  assert len(episodes) == 2
  matched = []
  for episode in episodes:
    stacks = _stacks_of(episode['observation'], 12)
    stored = episode['infos']['action_log_probs'][:12]
    found = []
    for name in ('medium', 'expert'):
      policy = behaviour_policies.load_policy(name, 'ALE/Pong-v5')
      mixed = np.log(0.75 * np.exp(policy.action_log_probs(stacks)) +
                     0.25 / 6)[np.arange(12), episode['action'][:12]]
      if np.allclose(stored, mixed, atol=1e-5):
        found.append(name)
    matched += found
  # Each episode is one policy's, and the two policies' differ.
  assert sorted(matched) == ['expert', 'medium'], matched


def test_evaluate_acts_on_the_stacks_the_saved_policy_takes(tmp_path):
  """`pipelines.evaluate` reads k from the saved image policy (npz or
  SavedModel) and builds k-frame stacks: here 2, not the default 4."""
  import json  # pylint: disable=g-import-not-at-top
  import os  # pylint: disable=g-import-not-at-top
  import pathlib  # pylint: disable=g-import-not-at-top
  import preloaded_cli  # pylint: disable=g-import-not-at-top
  from rlds_reverb.agents import dqn  # pylint: disable=g-import-not-at-top
  from rlds_reverb.agents import factory  # pylint: disable=g-import-not-at-top
  from rlds_reverb.agents import registry  # pylint: disable=g-import-not-at-top
  from rlds_reverb.agents import saved_policy  # pylint: disable=g-import-not-at-top
  specs = acting_envs.env_specs('ALE/Pong-v5', frame_stack=2)
  agent = registry.make_agent('dqn', specs.time_step_spec, specs.action_spec,
                              factory.AgentConfig(seed=0))
  policy = dqn.export_q_policy(agent, specs.action_spec)
  assert policy.input_shape == [2, 84, 84]
  path = str(tmp_path / 'policy.npz')
  policy.save(path)
  saved_policy.save(policy, str(tmp_path / 'policy'))
  assert saved_policy.frame_stack(path) == 2
  assert saved_policy.frame_stack(str(tmp_path / 'policy')) == 2
  assert saved_policy.frame_stack(str(tmp_path / 'policy' / 'greedy')) == 2
  run = preloaded_cli.run(
      'evaluate', '--policy', path, '--env', 'ALE/Pong-v5', '--episodes', '1',
      '--repeat_action_probability', '0',
      cwd=pathlib.Path(__file__).resolve().parents[1],
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL='2'), timeout_s=300)
  assert run.returncode == 0, run.stderr[-2000:]
  score = json.loads(run.stdout)
  assert score['episodes'] == 1 and -21 <= score['average_return'] <= 21
  assert score['repeat_action_probability'] == 0.0
