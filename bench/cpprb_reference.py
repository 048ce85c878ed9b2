"""Reference benchmark: cpprb in-process replay sampling speed (prioritized and uniform).

Measures how many transitions per second cpprb's ``PrioritizedReplayBuffer`` delivers
in the loop a prioritized off-policy learner runs: ``sample(batch_size, beta)`` and then
``update_priorities(indexes, new_priorities)`` with fresh (random) priorities. A uniform
``ReplayBuffer.sample(batch_size)`` rate over the same data is reported beside it.

Both buffers hold ``--size`` transitions with HalfCheetah shapes (obs 17, act 6, rew 1,
next_obs 17, done 1; all float32), filled with random data (random initial priorities
for the prioritized one) before timing starts.

Runs in a separate venv that has cpprb (not a dependency of rlds_reverb):

    /tmp/peer_venv/bin/python bench/cpprb_reference.py --size 1000000 --seconds 5

Prints one JSON line with the transitions/s of each loop.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib.metadata import version

import cpprb
import numpy as np

OBS_DIM = 17  # HalfCheetah
ACT_DIM = 6
FILL_CHUNK = 100_000


def env_dict() -> dict[str, dict]:
    return {
        "obs": {"shape": OBS_DIM, "dtype": np.float32},
        "act": {"shape": ACT_DIM, "dtype": np.float32},
        "rew": {"shape": 1, "dtype": np.float32},
        "next_obs": {"shape": OBS_DIM, "dtype": np.float32},
        "done": {"shape": 1, "dtype": np.float32},
    }


def random_chunk(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, OBS_DIM), dtype=np.float32),
        "act": rng.uniform(-1.0, 1.0, (n, ACT_DIM)).astype(np.float32),
        "rew": rng.standard_normal((n, 1), dtype=np.float32),
        "next_obs": rng.standard_normal((n, OBS_DIM), dtype=np.float32),
        "done": (rng.random((n, 1)) < 0.001).astype(np.float32),
    }


def fill(
    per: cpprb.PrioritizedReplayBuffer, uniform: cpprb.ReplayBuffer, size: int, rng: np.random.Generator
) -> None:
    """Batched ``add`` calls of FILL_CHUNK transitions into both buffers."""
    for start in range(0, size, FILL_CHUNK):
        n = min(FILL_CHUNK, size - start)
        chunk = random_chunk(rng, n)
        per.add(priorities=rng.uniform(0.01, 1.0, n), **chunk)
        uniform.add(**chunk)


def time_loop(step, seconds: float, warmup: int = 20) -> tuple[int, float]:
    for _ in range(warmup):
        step()
    batches, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        step()
        batches += 1
    return batches, elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=1_000_000,
                   help="transitions each buffer holds, all filled before "
                        "timing")
    p.add_argument("--batch_size", type=int, default=256,
                   help="transitions per sample call")
    p.add_argument("--seconds", type=float, default=5.0, help="timed seconds per loop")
    p.add_argument("--alpha", type=float, default=0.6,
                   help="prioritization exponent of the prioritized buffer")
    p.add_argument("--beta", type=float, default=0.4,
                   help="importance-sampling exponent passed to each "
                        "prioritized sample")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the random fill data and new priorities")
    args = p.parse_args()

    rng = np.random.default_rng(args.seed)
    per = cpprb.PrioritizedReplayBuffer(args.size, env_dict(), alpha=args.alpha)
    uniform = cpprb.ReplayBuffer(args.size, env_dict())
    fill(per, uniform, args.size, rng)
    assert per.get_stored_size() == args.size and uniform.get_stored_size() == args.size

    batch_size, beta = args.batch_size, args.beta

    def per_step() -> None:
        batch = per.sample(batch_size, beta=beta)
        # New priorities as a learner would write back its |TD errors|.
        per.update_priorities(batch["indexes"], rng.uniform(0.01, 1.0, batch_size))

    def uniform_step() -> None:
        uniform.sample(batch_size)

    per_batches, per_elapsed = time_loop(per_step, args.seconds)
    uni_batches, uni_elapsed = time_loop(uniform_step, args.seconds)

    print(
        json.dumps(
            {
                "cpprb_transitions_per_s": per_batches * batch_size / per_elapsed,
                "cpprb_uniform_transitions_per_s": uni_batches * batch_size / uni_elapsed,
                "cpprb_version": version("cpprb"),
                "size": args.size,
                "batch_size": batch_size,
                "alpha": args.alpha,
                "beta": beta,
                "seconds": args.seconds,
                "numpy_version": np.__version__,
            }
        )
    )


if __name__ == "__main__":
    main()
