#!/bin/bash
# SAC HalfCheetah-v5, 1 server + 1 learner + 2 actor processes, 100k env
# steps, fresh weights: the learner publishes every 10 gradient steps (inside
# its phases), each actor looks for new weights every 10 env steps; the
# actors are paced (--actors 2: each keeps within half the env steps the
# learner's gradient steps call for, plus one episode). ACTORS=0 runs them
# unpaced. docs/distributed.md, Results. Run from the repo root:
#   SEED=1 bash docs/results/distributed/run_dist_fresh.sh
set -u
PY=${PY:-.venv/bin/python}
SEED=${SEED:-0}
ACTORS=${ACTORS:-2}
D=${D:-runs/dist_sac_seed$SEED}
PORT=${PORT:-18700}
REFRESH=${REFRESH:-10}
mkdir -p "$D"
$PY -m pipelines.serve --env HalfCheetah-v5 --port $PORT --checkpoint_dir $D/reverb --checkpoint_interval 600 > $D/serve.log 2>&1 &
SERVE=$!
sleep 15
ACTOR_PIDS=()
for A in 1 2; do
  $PY -m pipelines.act --reverb_address localhost:$PORT --env HalfCheetah-v5 --agent sac --run_dir $D --seed $((2 * SEED + A)) --initial_random_steps 5000 --policy_refresh_steps $REFRESH --actors $ACTORS --noprogress > $D/act$A.log 2>&1 &
  ACTOR_PIDS+=($!)
done
$PY -m pipelines.train --agent sac --env HalfCheetah-v5 --reverb_address localhost:$PORT --num_actors 0 --root_dir $D/learner --steps 100000 --seed $SEED --publish_every $REFRESH > $D/train.log 2>&1
echo "train rc=$?" >> $D/train.log
kill -TERM "${ACTOR_PIDS[@]}"; sleep 10; kill -TERM $SERVE; wait
