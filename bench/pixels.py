"""Pixels in the replay feed: memory per transition and stacked draws,
against Stable-Baselines3's ReplayBuffer in the same run.

Data: `--transitions` steps of Atari-shaped episodes (84x84 uint8 grey
frames, int64 actions, `--episode_steps` steps each, random frames).

  bytes_per_transition           our memory (`replay.memory`): bytes of
                                 all its tensors (frames once per step,
                                 scalars, index, episode bounds) per
                                 stored transition
  stacked_transitions_per_s      our uniform draws of `--batch_size`
                                 transitions with 4-frame stacks (observation
                                 and next observation; frame-major [4, 84,
                                 84], as the networks take them), drawn as
                                 our learners draw: `--draws_per_call`
                                 draws in one graph call (the offline loop
                                 runs up to 1,000 steps per call), each
                                 read by the graph
  stacked_transitions_per_s_one_per_call
                                 the same, one draw per tf.function call
                                 (the call's own cost included)
  sb3_bytes_per_transition       SB3 ReplayBuffer(optimize_memory_usage=True)
                                 holding the stacks SB3's VecFrameStack
                                 and VecTransposeImage give its CnnPolicy
                                 ([4, 84, 84] per step, frame-major as
                                 ours)
  sb3_stacked_transitions_per_s  its sample(batch_size), as torch tensors
  ppo_env_steps_per_s            PPO on ALE/Pong-v5 (`pipelines.train
                                 --agent ppo`'s Atari settings: 8 env
                                 copies x 128 steps, 4 epochs x 4
                                 minibatches, Nature CNN): env steps per
                                 second of collecting and updating,
                                 rollouts after the first (tracing)
  sb3_ppo_env_steps_per_s        SB3's PPO('CnnPolicy') with the same
                                 settings on make_atari_env (frame skip 4
                                 by its wrapper, the env's own off) +
                                 VecFrameStack(4)

Goals (issue 46): bytes_per_transition <= 1.1 x (one frame + the scalars);
stacked_transitions_per_s >= 100k and >= 1x SB3's; ppo_env_steps_per_s
>= 1x SB3's (each side has the whole machine in turn). Each rate is the median
of --rounds timed runs of --seconds; ours and SB3's alternate round by
round (SB3 in its own interpreter, `--sb3_python`, see
../shared/peers.md), so load from the rest of the machine falls on both.
Prints one JSON line.

  python bench/pixels.py [--transitions 50000] [--batch_size 32]
                         [--ppo_rollouts 4] [--sb3_python PEER/bin/python]
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import tempfile
import textwrap
import time

os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '2')

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf
from tf_agents.specs import tensor_spec
from tf_agents.trajectories import trajectory

from rlds_reverb.replay import memory as memory_lib

FRAME = (84, 84)
STACK = 4
ACTIONS = 6

# Runs in the peer interpreter: fills SB3's buffer, then times `rounds`
# runs of sample(batch), one per line of stdin, printing each rate.
_SB3 = textwrap.dedent('''
    import sys, time, json
    import numpy as np, gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer
    n, batch, seconds, steps = (int(sys.argv[1]), int(sys.argv[2]),
                                float(sys.argv[3]), int(sys.argv[4]))
    space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    buffer = ReplayBuffer(n + 1, space, gym.spaces.Discrete(6), device='cpu',
                          optimize_memory_usage=True,
                          handle_timeout_termination=False)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (steps + 4, 84, 84), np.uint8)
    for t in range(n):
        i = t % steps
        stack = frames[i:i + 4][None]
        following = frames[i + 1:i + 5][None]
        buffer.add(stack, following, np.array([[t % 6]]), np.array([1.0]),
                   np.array([i == steps - 1]), [{}])
    held = (buffer.observations.nbytes + buffer.actions.nbytes +
            buffer.rewards.nbytes + buffer.dones.nbytes)
    print(json.dumps({'bytes_per_transition': held / n}), flush=True)
    for _ in sys.stdin:
        for _ in range(10):
            buffer.sample(batch)
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            buffer.sample(batch)
            count += 1
        print(count * batch / (time.perf_counter() - start), flush=True)
''')


# Runs in the peer interpreter: SB3's PPO on Pong with the settings of
# ours; prints the perf_counter time at the end of each rollout's
# collection (one rollout's update and the next's collection apart).
_SB3_PPO = textwrap.dedent('''
    import sys, time, json
    import ale_py, gymnasium as gym
    gym.register_envs(ale_py)
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack
    rollouts = int(sys.argv[1])
    env = VecFrameStack(make_atari_env('ALE/Pong-v5', n_envs=8, seed=0,
                                       env_kwargs={'frameskip': 1}), 4)
    times = []
    class Clock(BaseCallback):
        def _on_step(self):
            return True
        def _on_rollout_end(self):
            times.append(time.perf_counter())
    model = PPO('CnnPolicy', env, n_steps=128, n_epochs=4, batch_size=256,
                learning_rate=2.5e-4, clip_range=0.1, ent_coef=0.01,
                vf_coef=0.5, seed=0, device='cpu', verbose=0)
    model.learn(total_timesteps=1024 * (rollouts + 1), callback=Clock())
    print(json.dumps({'times': times}), flush=True)
''')


def time_ppo(rollouts: int, root_dir: str) -> float:
  """Env steps/s of our PPO on Pong over `rollouts` rollouts after the
  first: collection, the Reverb queue and the update, each rollout."""
  from rlds_reverb.agents.onpolicy import ppo  # pylint: disable=g-import-not-at-top
  from rlds_reverb.experiments import onpolicy  # pylint: disable=g-import-not-at-top
  agent_config = ppo.defaults_for('ppo', True, image=True)
  size = agent_config.rollout_size
  steps = size * (rollouts + 1)
  times = []
  onpolicy.train_onpolicy(onpolicy.OnPolicyConfig(
      env='ALE/Pong-v5', agent='ppo', root_dir=root_dir, env_steps=steps,
      eval_interval=steps, eval_episodes=1, checkpoint_interval=steps,
      ppo_config=agent_config), show_progress=False,
                          on_update=lambda _: times.append(
                              time.perf_counter()))
  return size * (len(times) - 1) / (times[-1] - times[0])


def episode_spec() -> trajectory.Trajectory:
  scalar = lambda dtype: tf.TensorSpec([], dtype)
  return trajectory.Trajectory(
      step_type=scalar(tf.int32),
      observation=tf.TensorSpec(FRAME, tf.uint8),
      action=tensor_spec.BoundedTensorSpec([], tf.int64, 0, ACTIONS - 1),
      policy_info=(), next_step_type=scalar(tf.int32),
      reward=scalar(tf.float32), discount=scalar(tf.float32))


def episodes(transitions: int, steps: int, rng: np.random.Generator):
  """Converted episodes of `steps` + 1 rows each (the final observation
  row holds no transition) until `transitions` transitions."""
  out, total = [], 0
  while total < transitions:
    n = min(steps, transitions - total) + 1
    step_type = np.ones(n, np.int32)
    step_type[0], step_type[-1] = 0, 2
    out.append(trajectory.Trajectory(
        step_type=step_type,
        observation=rng.integers(0, 256, (n,) + FRAME, np.uint8),
        action=rng.integers(0, ACTIONS, n).astype(np.int64), policy_info=(),
        next_step_type=np.concatenate([step_type[1:], [0]]).astype(np.int32),
        reward=np.ones(n, np.float32), discount=np.ones(n, np.float32)))
    total += n - 1
  return out


def in_graph_draws(memory: memory_lib.TransitionMemory, batch_size: int,
                   draws: int):
  """`draws` draws in one graph call, each read (a checksum of one pixel
  per stack), so that no draw can be pruned."""
  @tf.function
  def run():
    total = tf.constant(0, tf.int32)
    for _ in tf.range(draws):
      batch = memory.sample(batch_size)
      total += tf.reduce_sum(tf.cast(batch.observation[..., 0, 0], tf.int32))
    return total
  return run


def time_ours(draw, batch_size: int, seconds: float) -> float:
  for _ in range(10):
    draw()
  count, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    draw()
    count += 1
  return count * batch_size / (time.perf_counter() - start)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--transitions', type=int, default=50_000,
                      help='Atari-shaped transitions held in the memory '
                           '(and in SB3\'s buffer).')
  parser.add_argument('--episode_steps', type=int, default=1000,
                      help='Transitions per episode (Pong: about 800 to '
                           '4,000 agent steps).')
  parser.add_argument('--batch_size', type=int, default=32,
                      help='Stacked transitions per draw, ours and SB3\'s.')
  parser.add_argument('--draws_per_call', type=int, default=100,
                      help='Draws per graph call for '
                           'stacked_transitions_per_s.')
  parser.add_argument('--rounds', type=int, default=5,
                      help='Timed runs per sampling rate, ours and SB3\'s '
                           'in turn; the median is reported.')
  parser.add_argument('--seconds', type=float, default=2.0,
                      help='Length of one timed sampling run.')
  parser.add_argument('--ppo_rollouts', type=int, default=4,
                      help='Timed PPO rollouts on Pong (of 1,024 env '
                           'steps) after the first; 0: no PPO figures.')
  parser.add_argument('--sb3_python', default='',
                      help='Interpreter with stable-baselines3 (the peer '
                           'venv of ../shared/peers.md); empty: ours only.')
  args = parser.parse_args()

  memory = memory_lib.from_episodes(
      episode_spec(), episodes(args.transitions, args.episode_steps,
                               np.random.default_rng(0)),
      frame_stack=STACK)
  transitions = int(memory.num_transitions)
  draw = tf.function(lambda: memory.sample(args.batch_size))
  draws = in_graph_draws(memory, args.batch_size, args.draws_per_call)
  batch = draw()
  assert batch.observation.shape.as_list() == [args.batch_size, 2, STACK,
                                               *FRAME]
  scalars = 4 + 4 + 8 + 4 + 4  # step types, action, reward, discount

  sb3 = None
  if args.sb3_python:
    sb3 = subprocess.Popen(
        [args.sb3_python, '-c', _SB3, str(args.transitions),
         str(args.batch_size), str(args.seconds), str(args.episode_steps)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, 'OMP_NUM_THREADS': '1'})
    sb3_bytes = json.loads(sb3.stdout.readline())['bytes_per_transition']
  ours, ours_one, theirs = [], [], []
  for _ in range(args.rounds):
    ours.append(time_ours(draws, args.batch_size * args.draws_per_call,
                          args.seconds))
    ours_one.append(time_ours(draw, args.batch_size, args.seconds))
    if sb3 is not None:
      sb3.stdin.write('go\n')
      sb3.stdin.flush()
      theirs.append(float(sb3.stdout.readline()))
  if sb3 is not None:
    sb3.stdin.close()
    sb3.wait(timeout=60)

  ppo_rate = sb3_ppo_rate = None
  if args.ppo_rollouts:
    with tempfile.TemporaryDirectory() as root_dir:
      ppo_rate = time_ppo(args.ppo_rollouts, root_dir)
    if args.sb3_python:
      done = subprocess.run(
          [args.sb3_python, '-c', _SB3_PPO, str(args.ppo_rollouts)],
          capture_output=True, text=True, check=True, timeout=3600)
      times = json.loads(done.stdout.strip().splitlines()[-1])['times']
      sb3_ppo_rate = 1024 * (len(times) - 1) / (times[-1] - times[0])

  frame_bytes = int(np.prod(FRAME))
  result = {
      'bench': 'pixels', 'transitions': transitions,
      'batch_size': args.batch_size, 'frame_stack': STACK,
      'bytes_per_transition': round(memory.bytes / transitions, 1),
      'bytes_goal': round(1.1 * (frame_bytes + scalars), 1),
      'draws_per_call': args.draws_per_call,
      'stacked_transitions_per_s': round(statistics.median(ours)),
      'stacked_transitions_per_s_one_per_call': round(
          statistics.median(ours_one)),
      'stacked_goal': 100_000,
      'sb3_bytes_per_transition': (round(sb3_bytes, 1) if sb3 is not None
                                   else None),
      'sb3_stacked_transitions_per_s': (round(statistics.median(theirs))
                                        if theirs else None),
      'ppo_rollouts': args.ppo_rollouts,
      'ppo_env_steps_per_s': (round(ppo_rate, 1) if ppo_rate else None),
      'sb3_ppo_env_steps_per_s': (round(sb3_ppo_rate, 1) if sb3_ppo_rate
                                  else None),
      'machine': f'{os.cpu_count()} cores, {platform.machine()}, no GPU',
      'date': datetime.date.today().isoformat()}
  result['bytes_goal_met'] = result['bytes_per_transition'] <= result[
      'bytes_goal']
  if theirs:
    result['ours_vs_sb3'] = round(result['stacked_transitions_per_s'] /
                                  result['sb3_stacked_transitions_per_s'], 2)
  if ppo_rate and sb3_ppo_rate:
    result['ppo_ours_vs_sb3'] = round(ppo_rate / sb3_ppo_rate, 2)
  print(json.dumps(result))


if __name__ == '__main__':
  main()
