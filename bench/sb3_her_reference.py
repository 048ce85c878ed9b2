"""Reference benchmark: Stable-Baselines3 in-process ``HerReplayBuffer.sample`` speed.

Measures how many HER transitions per second SB3's in-process ``HerReplayBuffer``
delivers from ``sample(batch_size)`` (goal relabelling with the 'future' strategy,
reward recomputation through ``env.env_method("compute_reward", ...)`` and
conversion to CPU torch tensors, i.e. exactly what an SB3 off-policy learner gets).

The buffer is filled from an npz of whole FetchReach episodes (keys: observation
[E, T+1, 10], achieved_goal [E, T+1, 3], desired_goal [E, T+1, 3], action [E, T, 4],
reward [E, T], terminated [E]) with one ``buffer.add`` per transition, the way SB3's
off-policy collection does it for a single-env DummyVecEnv.

Runs in a separate venv that has stable-baselines3 (not a dependency of rlds_reverb):

    /tmp/sb3_venv/bin/python bench/sb3_her_reference.py --episodes_npz FILE

Prints one JSON line with the median transitions/s over --rounds timed rounds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import gymnasium as gym
import numpy as np
import stable_baselines3
import torch
from gymnasium import spaces
from stable_baselines3 import HerReplayBuffer
from stable_baselines3.common.vec_env import DummyVecEnv

DISTANCE_THRESHOLD = 0.05  # FetchReach's success radius


class FallbackFetchReach(gym.Env):
    """GoalEnv-like stand-in with FetchReach's spaces and sparse reward (no MuJoCo)."""

    def __init__(self) -> None:
        box = lambda n: spaces.Box(-np.inf, np.inf, (n,), np.float64)  # noqa: E731
        self.observation_space = spaces.Dict(
            {"achieved_goal": box(3), "desired_goal": box(3), "observation": box(10)}
        )
        self.action_space = spaces.Box(-1.0, 1.0, (4,), np.float32)

    def compute_reward(self, achieved_goal: np.ndarray, desired_goal: np.ndarray, info: Any) -> np.ndarray:
        d = np.linalg.norm(achieved_goal - desired_goal, axis=-1)
        return -(d > DISTANCE_THRESHOLD).astype(np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        return {k: np.zeros(s.shape, s.dtype) for k, s in self.observation_space.spaces.items()}, {}

    def step(self, action: np.ndarray) -> tuple[dict, float, bool, bool, dict]:
        obs, _ = self.reset()
        return obs, -1.0, False, False, {}


def make_env() -> tuple[gym.Env, str]:
    try:
        import gymnasium_robotics

        gym.register_envs(gymnasium_robotics)
        return gym.make("FetchReach-v4"), "FetchReach-v4"
    except Exception:  # gymnasium-robotics / mujoco unavailable
        return FallbackFetchReach(), "fallback"


def fill_buffer(buffer: HerReplayBuffer, data: dict[str, np.ndarray]) -> None:
    """One ``add`` per transition, as OffPolicyAlgorithm._store_transition does (n_envs=1)."""
    keys = ("observation", "achieved_goal", "desired_goal")
    num_episodes, horizon = data["action"].shape[:2]
    for e in range(num_episodes):
        ep = {k: data[k][e] for k in keys}
        terminated = bool(data["terminated"][e])
        for t in range(horizon):
            obs = {k: ep[k][t][None] for k in keys}
            next_obs = {k: ep[k][t + 1][None] for k in keys}
            last = t == horizon - 1
            infos: list[dict[str, Any]] = [{"TimeLimit.truncated": True}] if last and not terminated else [{}]
            buffer.add(
                obs,
                next_obs,
                data["action"][e, t][None],
                data["reward"][e, t][None],
                np.array([last]),
                infos,
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes_npz", required=True,
                   help="npz of whole FetchReach episodes the buffer is "
                        "filled from")
    p.add_argument("--batch_size", type=int, default=256,
                   help="transitions per sample call")
    p.add_argument("--seconds", type=float, default=3.0,
                   help="timed seconds per round")
    p.add_argument("--rounds", type=int, default=3,
                   help="timed rounds; the median transitions/s is reported")
    p.add_argument("--n_sampled_goal", type=int, default=4,
                   help="SB3's n_sampled_goal: relabelled goals per real "
                        "transition (HER's k)")
    p.add_argument("--strategy", default="future",
                   choices=["future", "final", "episode"],
                   help="SB3's goal selection strategy for relabelling")
    args = p.parse_args()

    with np.load(args.episodes_npz) as f:
        data = {k: f[k] for k in f.files}
    num_episodes, horizon = data["action"].shape[:2]
    transitions = num_episodes * horizon

    env, reward_env = make_env()
    vec_env = DummyVecEnv([lambda: env])
    buffer = HerReplayBuffer(
        transitions,
        vec_env.observation_space,
        vec_env.action_space,
        env=vec_env,
        device="cpu",
        n_sampled_goal=args.n_sampled_goal,
        goal_selection_strategy=args.strategy,
        copy_info_dict=False,
        handle_timeout_termination=True,
    )
    fill_buffer(buffer, data)
    assert buffer.full and (buffer.ep_length == horizon).all()

    np.random.seed(0)  # SB3 samples with the global numpy RNG
    for _ in range(10):  # warm-up
        buffer.sample(args.batch_size)
    rates: list[float] = []
    for _ in range(args.rounds):
        batches, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < args.seconds:
            buffer.sample(args.batch_size)
            batches += 1
        rates.append(batches * args.batch_size / elapsed)

    print(
        json.dumps(
            {
                "sb3_version": stable_baselines3.__version__,
                "torch_version": torch.__version__,
                "transitions": transitions,
                "batch_size": args.batch_size,
                "sb3_transitions_per_s": statistics.median(rates),
                "rounds_per_s": rates,
                "reward_env": reward_env,
                "obs_dtype": str(buffer.observations["observation"].dtype),
            }
        )
    )


if __name__ == "__main__":
    main()
