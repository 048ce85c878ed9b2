"""Reference run: d3rlpy's ReBRAC, TD3+BC, IQL or AWAC trained on the project's own dataset.

Tells the data from the implementation when a score differs from CORL's: an
independent implementation (d3rlpy 2.x, PyTorch) trains on the same episodes as
the project's learner (exported by tools/rlds_npz.py) and is evaluated the same
way (greedy, 10 episodes of the same HalfCheetah-v5, D4RL's normalisation). If
d3rlpy lands where our learner lands, the gap to CORL is the data's; if it lands
near CORL, it is ours.

Settings are CORL's and d3rlpy's reproduction script's for halfcheetah-medium:
ReBRAC with 3x256 actor and critics, LayerNorm in the critics, batch 1024,
learning rates 1e-3, gamma 0.99, tau 0.005, policy noise 0.2 clipped 0.5, actor
every 2 steps, --actor_beta / --critic_beta (medium: 0.001 / 0.01); no
observation or reward scaling. IQL's and AWAC's are in `make_algo` (CORL's,
batch 256); hopper and walker2d data take --env Hopper-v5 /
Walker2d-v5. The transitions are the RLDS pairs (t, t+1) of
each episode: a time-limit cut keeps its final observation as the last next
observation, a terminal ends the episode's bootstrap (d3rlpy's
terminals/timeouts).

Runs in a separate venv that has d3rlpy, torch and gymnasium[mujoco] (see
shared/peers.md; not dependencies of rlds_reverb):

    .venv/bin/python -m tools.rlds_npz --dataset data/halfcheetah_v5_medium \\
        --out /tmp/medium_steps.npz
    /tmp/peer_venv/bin/python bench/d3rlpy_offline.py --steps_npz /tmp/medium_steps.npz \\
        --steps 100000 --eval_interval 5000 --seed 0 \\
        --reference docs/results/offline_rl/medium_1m_rebrac_seed0_eval.jsonl

--reference names an eval.jsonl of the project's learner on the same data and
seed (a committed run): its score at the steps d3rlpy was evaluated at is put
beside d3rlpy's. Progress and evaluations go to stderr (and --eval_log); one
JSON line to stdout at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time

import numpy as np

# D4RL's reference returns (random, expert), as in rlds_reverb.acting.envs,
# which this interpreter cannot import (TensorFlow).
REFERENCE_RETURNS = {
    "HalfCheetah": (-280.178953, 12135.0),
    "Hopper": (-20.272305, 3234.3),
    "Walker2d": (1.629008, 4592.3),
}
EVAL_SEED_BASE = 10_000  # The project's evaluation seeds: 10_000 + seed + i.
# The per-agent batch when --batch_size is not given (CORL's configs).
DEFAULT_BATCH = {"rebrac": 1024, "td3_bc": 256, "iql": 256, "awac": 256}


def normalized_score(average_return: float, env_id: str = "HalfCheetah-v5") -> float:
    random, expert = REFERENCE_RETURNS[env_id.split("-")[0]]
    return 100.0 * (average_return - random) / (expert - random)


def episode_flags(is_last: np.ndarray, is_terminal: np.ndarray, where: str = "steps"
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which RLDS rows d3rlpy keeps, and its terminals/timeouts flags for them.

    RLDS keeps a final step per episode (the final observation; its action and
    reward meaningless). A time-limit cut keeps that row, flagged `timeouts`
    (d3rlpy makes no transition from an episode's last row then, only uses its
    observation); a terminal episode drops it and flags the step before as
    `terminals` (d3rlpy's last transition of a terminated episode bootstraps
    nothing).
    """
    is_last, is_terminal = is_last.astype(bool), is_terminal.astype(bool)
    if not len(is_last) or not is_last[-1]:
        raise ValueError(f"{where}: the last row must end an episode (is_last)")
    if (is_terminal & ~is_last).any():
        row = int(np.flatnonzero(is_terminal & ~is_last)[0])
        raise ValueError(f"{where}: row {row} is terminal but not last")
    ends = np.flatnonzero(is_last)
    starts = np.concatenate([[0], ends[:-1] + 1])
    if (is_terminal[ends] & (ends - starts < 1)).any():
        raise ValueError(f"{where}: a terminal episode needs a step before its final one")
    keep = ~(is_last & is_terminal)
    terminals = np.zeros(len(is_last), np.float32)
    terminals[np.flatnonzero(is_last & is_terminal) - 1] = 1.0
    timeouts = (is_last & ~is_terminal).astype(np.float32)
    return keep, terminals[keep], timeouts[keep]


def make_dataset(d3rlpy, path: str):
    """d3rlpy's MDPDataset from RLDS step rows (see `episode_flags`)."""
    with np.load(path) as f:
        obs, act, rew = f["observation"], f["action"], f["reward"]
        keep, terminals, timeouts = episode_flags(f["is_last"], f["is_terminal"], path)
    return d3rlpy.dataset.MDPDataset(
        observations=obs[keep].astype(np.float32),
        actions=act[keep].astype(np.float32),
        rewards=rew[keep].astype(np.float32),
        terminals=terminals,
        timeouts=timeouts,
        action_space=d3rlpy.ActionSpace.CONTINUOUS,
        action_size=act.shape[-1],
    )


def make_algo(d3rlpy, args):
    actor = d3rlpy.models.VectorEncoderFactory(hidden_units=[256, 256, 256])
    critic = d3rlpy.models.VectorEncoderFactory(hidden_units=[256, 256, 256], use_layer_norm=True)
    if args.agent == "iql":
        # d3rlpy's reproduction settings (reproductions/offline/iql.py), which
        # are CORL's: 2x256 networks, expectile 0.7, beta 3, weights capped at
        # 100, rewards scaled by 1000 / (max - min episode return),
        # standardised observations, the actor's rate on a cosine to zero.
        schedule = d3rlpy.optimizers.CosineAnnealingLRFactory(T_max=args.steps)
        config = d3rlpy.algos.IQLConfig(
            batch_size=args.batch_size,
            actor_learning_rate=3e-4, critic_learning_rate=3e-4,
            actor_optim_factory=d3rlpy.optimizers.AdamFactory(lr_scheduler_factory=schedule),
            expectile=0.7, weight_temp=3.0, max_weight=100.0,
            reward_scaler=d3rlpy.preprocessing.ReturnBasedRewardScaler(multiplier=1000.0),
            observation_scaler=d3rlpy.preprocessing.StandardObservationScaler(),
        )
    elif args.agent == "awac":
        # CORL's AWAC (the toolkit's): 3x256 actor and twin critics, lambda
        # 1/3, rates 3e-4, standardised observations, no reward scaling.
        three = d3rlpy.models.VectorEncoderFactory(hidden_units=[256, 256, 256])
        config = d3rlpy.algos.AWACConfig(
            batch_size=args.batch_size,
            actor_learning_rate=3e-4, critic_learning_rate=3e-4,
            actor_encoder_factory=three, critic_encoder_factory=three,
            lam=1.0 / 3.0, n_action_samples=1,
            observation_scaler=d3rlpy.preprocessing.StandardObservationScaler(),
        )
    elif args.agent == "rebrac":
        config = d3rlpy.algos.ReBRACConfig(
            actor_encoder_factory=actor,
            critic_encoder_factory=critic,
            batch_size=args.batch_size,
            actor_beta=args.actor_beta,
            critic_beta=args.critic_beta,
        )
    else:
        # CORL's and the paper's TD3+BC: d3rlpy's defaults (2x256 networks,
        # alpha 2.5, rates 3e-4, target noise 0.2 clipped 0.5, actor every
        # 2 steps) with standardised observations, which d3rlpy leaves off.
        config = d3rlpy.algos.TD3PlusBCConfig(
            batch_size=args.batch_size,
            observation_scaler=d3rlpy.preprocessing.StandardObservationScaler(),
        )
    return config.create(device="cpu")


def evaluate(gym, algo, env_id: str, episodes: int, seed: int) -> list[float]:
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(env_id)] * episodes)
    try:
        obs, _ = envs.reset(seed=[EVAL_SEED_BASE + seed + i for i in range(episodes)])
        returns = np.zeros(episodes)
        done = np.zeros(episodes, bool)
        while not done.all():
            action = algo.predict(obs.astype(np.float32))
            obs, reward, terminated, truncated, _ = envs.step(action)
            returns += np.where(done, 0.0, reward)
            done |= terminated | truncated
        return returns.tolist()
    finally:
        envs.close()


def reference_scores(path: str) -> dict[int, float]:
    if not path:
        return {}
    scores = {}
    with open(path) as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                if record.get("phase", "offline") == "offline":
                    scores[int(record["train_step"])] = record["normalized_score"]
    return scores


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps_npz", required=True, help="RLDS step rows from tools/rlds_npz.py")
    p.add_argument("--agent", default="rebrac", choices=sorted(DEFAULT_BATCH),
                   help="the d3rlpy algorithm trained: ReBRAC, TD3+BC, IQL or AWAC")
    p.add_argument("--steps", type=int, default=100_000, help="gradient steps")
    p.add_argument("--eval_interval", type=int, default=5000, help="gradient steps between evaluations")
    p.add_argument("--eval_episodes", type=int, default=10,
                   help="greedy episodes per evaluation")
    p.add_argument("--batch_size", type=int, default=None,
                   help="transitions per gradient step (default: CORL's for the "
                        "agent, 1024 for ReBRAC, 256 for TD3+BC and IQL)")
    p.add_argument("--actor_beta", type=float, default=0.001, help="ReBRAC's actor BC coefficient")
    p.add_argument("--critic_beta", type=float, default=0.01, help="ReBRAC's critic BC coefficient")
    p.add_argument("--env", default="HalfCheetah-v5",
                   help="gymnasium environment id the policy is evaluated on "
                        f"(one of {', '.join(REFERENCE_RETURNS)}, for D4RL's normalisation)")
    p.add_argument("--seed", type=int, default=0,
                   help="d3rlpy's seed; evaluation episodes reset with seeds "
                        "10000 + seed + i, as the project's")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--eval_log", default="", help="append each evaluation as a JSON line here")
    p.add_argument("--reference", default="", help="the project's eval.jsonl on the same data and seed")
    args = p.parse_args()
    if args.steps < 1 or args.eval_interval < 1:
        p.error("--steps and --eval_interval must be >= 1")
    if args.env.split("-")[0] not in REFERENCE_RETURNS:
        p.error(f"--env {args.env}: no D4RL reference returns; one of {', '.join(REFERENCE_RETURNS)}")
    if args.batch_size is None:
        args.batch_size = DEFAULT_BATCH[args.agent]
    reference = reference_scores(args.reference)

    evals = []
    # d3rlpy logs through structlog on stdout: keep stdout for the JSON line.
    with contextlib.redirect_stdout(sys.stderr):
        import gymnasium as gym
        import structlog
        import torch
        import tqdm

        import d3rlpy

        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
        torch.set_num_threads(args.threads)
        d3rlpy.seed(args.seed)
        dataset = make_dataset(d3rlpy, args.steps_npz)
        algo = make_algo(d3rlpy, args)
        algo.build_with_dataset(dataset)
        # fit() would fit the scalers; update() alone does not.
        for scaler in (algo.config.observation_scaler, algo.config.reward_scaler):
            if scaler is not None and not scaler.built:
                scaler.fit_with_transition_picker(dataset.episodes, dataset.transition_picker)
        train_s = 0.0
        bar = tqdm.tqdm(total=args.steps, desc=f"d3rlpy {args.agent}", unit="step", file=sys.stderr)
        for step in range(1, args.steps + 1):
            t0 = time.perf_counter()
            algo.update(dataset.sample_transition_batch(args.batch_size))
            train_s += time.perf_counter() - t0
            bar.update(1)
            if step % args.eval_interval == 0 or step == args.steps:
                returns = evaluate(gym, algo, args.env, args.eval_episodes, args.seed)
                record = {
                    "train_step": step,
                    "average_return": float(np.mean(returns)),
                    "std_return": float(np.std(returns)),
                    "normalized_score": normalized_score(float(np.mean(returns)), args.env),
                    "reference_score": reference.get(step),
                    "time": round(time.time(), 1),
                }
                evals.append(record)
                bar.write(json.dumps(record), file=sys.stderr)
                if args.eval_log:
                    with open(args.eval_log, "a") as f:
                        f.write(json.dumps(record) + "\n")
        bar.close()

    final = evals[-1]
    print(json.dumps({
        "peer": "d3rlpy",
        "agent": args.agent,
        "env": args.env,
        "steps_npz": args.steps_npz,
        "transitions": dataset.transition_count,
        "episodes": len(dataset.episodes),
        "seed": args.seed,
        "gradient_steps": args.steps,
        "batch_size": args.batch_size,
        "actor_beta": args.actor_beta,
        "critic_beta": args.critic_beta,
        "final_score": final["normalized_score"],
        "final_return": final["average_return"],
        "reference": args.reference or None,
        "reference_final_score": final["reference_score"],
        "scores": [[r["train_step"], round(r["normalized_score"], 2)] for r in evals],
        "reference_scores": [[r["train_step"], r["reference_score"] and round(r["reference_score"], 2)]
                             for r in evals],
        "gradient_steps_per_s": round(args.steps / train_s, 2),
        "threads": torch.get_num_threads(),
        "d3rlpy_version": d3rlpy.__version__,
        "torch_version": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
    }))


if __name__ == "__main__":
    main()
