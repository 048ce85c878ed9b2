"""Reference benchmark: d3rlpy 2.x offline learners' gradient steps per second on the CPU.

Measures BC, TD3+BC and CQL (continuous) from d3rlpy at batch 256 on a random
``MDPDataset`` with HalfCheetah shapes (obs 17, act 6), built the way ``algo.fit`` builds
them (``build_with_dataset``), then stepped the way ``algo.fitter``'s loop steps them:
``batch = dataset.sample_transition_batch(batch_size)`` (d3rlpy's own replay buffer and
transition picker) followed by ``algo.update(batch)``, minus fit's logging and progress bar.

Reported per agent, after --warmup untimed steps:
- ``d3rlpy_steps_per_s``: whole steps (sample + update) per second, what ``fit`` delivers.
- ``d3rlpy_update_steps_per_s``: the same steps counting only the time inside ``update``
  (batch already in memory), for comparison with learners fed pre-made batches.

Runs in a separate venv that has d3rlpy and torch (not dependencies of rlds_reverb):

    /tmp/peer_venv/bin/python bench/d3rlpy_reference.py --agents bc,td3_bc,cql --seconds 10

Prints one JSON line; everything else (d3rlpy's log, warnings) goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time

OBS_DIM = 17  # HalfCheetah
ACT_DIM = 6
AGENTS = ("bc", "td3_bc", "cql")


def make_dataset(d3rlpy, np, transitions: int, episode_length: int, seed: int):
    """Random continuous-control MDPDataset, every episode ending in a timeout."""
    rng = np.random.default_rng(seed)
    timeouts = np.zeros(transitions, np.float32)
    timeouts[episode_length - 1 :: episode_length] = 1.0
    timeouts[-1] = 1.0  # close a trailing partial episode too
    return d3rlpy.dataset.MDPDataset(
        observations=rng.standard_normal((transitions, OBS_DIM), dtype=np.float32),
        actions=rng.uniform(-1.0, 1.0, (transitions, ACT_DIM)).astype(np.float32),
        rewards=rng.standard_normal(transitions, dtype=np.float32),
        terminals=np.zeros(transitions, np.float32),
        timeouts=timeouts,
        action_space=d3rlpy.ActionSpace.CONTINUOUS,
        action_size=ACT_DIM,
    )


def make_algo(d3rlpy, name: str, batch_size: int):
    configs = {
        "bc": d3rlpy.algos.BCConfig,
        "td3_bc": d3rlpy.algos.TD3PlusBCConfig,
        "cql": d3rlpy.algos.CQLConfig,
    }
    return configs[name](batch_size=batch_size).create(device="cpu")


def time_agent(algo, dataset, batch_size: int, seconds: float, warmup: int) -> dict[str, float]:
    for _ in range(warmup):
        algo.update(dataset.sample_transition_batch(batch_size))
    steps, update_s = 0, 0.0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        batch = dataset.sample_transition_batch(batch_size)
        t0 = time.perf_counter()
        algo.update(batch)
        update_s += time.perf_counter() - t0
        steps += 1
    return {"steps": steps, "elapsed": elapsed, "update_s": update_s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", default=",".join(AGENTS), help=f"comma-separated subset of {','.join(AGENTS)}")
    p.add_argument("--batch_size", type=int, default=256,
                   help="transitions per update step")
    p.add_argument("--seconds", type=float, default=10.0, help="timed seconds per agent")
    p.add_argument("--warmup", type=int, default=5, help="untimed update steps per agent")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--transitions", "--size", dest="transitions", type=int,
                   default=100_000, help="transitions in the random dataset")
    p.add_argument("--episode_length", type=int, default=1000,
                   help="steps per episode of the random dataset (each ends "
                        "in a timeout)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of d3rlpy and of the random dataset")
    args = p.parse_args()
    agents = [a.strip() for a in args.agents.split(",") if a.strip()]
    unknown = sorted(set(agents) - set(AGENTS))
    if unknown or not agents:
        p.error(f"--agents: unknown {unknown}, choose from {','.join(AGENTS)}")

    results: dict[str, dict[str, float]] = {}
    # d3rlpy logs through structlog (and gym prints a deprecation notice) on stdout:
    # keep stdout for the single JSON line.
    with contextlib.redirect_stdout(sys.stderr):
        import numpy as np
        import structlog
        import torch

        import d3rlpy

        structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
        torch.set_num_threads(args.threads)
        d3rlpy.seed(args.seed)
        dataset = make_dataset(d3rlpy, np, args.transitions, args.episode_length, args.seed)
        for name in agents:
            algo = make_algo(d3rlpy, name, args.batch_size)
            algo.build_with_dataset(dataset)
            results[name] = time_agent(algo, dataset, args.batch_size, args.seconds, args.warmup)

    print(
        json.dumps(
            {
                "d3rlpy_steps_per_s": {n: r["steps"] / r["elapsed"] for n, r in results.items()},
                "d3rlpy_update_steps_per_s": {n: r["steps"] / r["update_s"] for n, r in results.items()},
                "d3rlpy_version": d3rlpy.__version__,
                "torch_version": torch.__version__,
                "batch_size": args.batch_size,
                "threads": torch.get_num_threads(),
                "transitions": dataset.transition_count,
                "episodes": len(dataset.episodes),
                "seconds": args.seconds,
                "steps": {n: r["steps"] for n, r in results.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
