#!/bin/bash
# SAC HalfCheetah-v5, 1 server + 1 learner + 2 actor processes, seed 0,
# 100k env steps, paced actors (--actors 2): each keeps within its share of
# the env steps the learner's gradient steps call for, plus one episode;
# fresh weights: the learner publishes every 10
# gradient steps, each actor fetches every 10 env steps (docs/distributed.md,
# Results). Run from the repo root.
set -u
PY=${PY:-.venv/bin/python}
D=${D:-runs/dist_sac_paced}
PORT=${PORT:-18700}
SEED=${SEED:-0}
REFRESH=${REFRESH:-10}
mkdir -p "$D"
$PY -m pipelines.serve --env HalfCheetah-v5 --port $PORT --checkpoint_dir $D/reverb --checkpoint_interval 600 > $D/serve.log 2>&1 &
SERVE=$!
sleep 15
$PY -m pipelines.act --reverb_address localhost:$PORT --env HalfCheetah-v5 --agent sac --run_dir $D --seed $((2 * SEED + 1)) --initial_random_steps 5000 --policy_refresh_steps $REFRESH --actors 2 --noprogress > $D/act1.log 2>&1 &
A1=$!
$PY -m pipelines.act --reverb_address localhost:$PORT --env HalfCheetah-v5 --agent sac --run_dir $D --seed $((2 * SEED + 2)) --initial_random_steps 5000 --policy_refresh_steps $REFRESH --actors 2 --noprogress > $D/act2.log 2>&1 &
A2=$!
$PY -m pipelines.train --agent sac --env HalfCheetah-v5 --reverb_address localhost:$PORT --num_actors 0 --root_dir $D/learner --steps 100000 --seed $SEED --publish_every $REFRESH > $D/train.log 2>&1
echo "train rc=$?" >> $D/train.log
kill -TERM $A1 $A2; sleep 10; kill -TERM $SERVE; wait
