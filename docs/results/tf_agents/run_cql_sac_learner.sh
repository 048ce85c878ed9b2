#!/usr/bin/env bash
# CQL-SAC on the local HalfCheetah-v5 medium dataset through TF-Agents' own
# Learner (examples/cql_sac_offline.py), at the toolkit's CQL-SAC budget and
# settings (30k gradient steps, configs/cql_sac_d4rl_mujoco.gin's values),
# seeds 0, 1, 2 side by side. Each seed's evaluations (every 10k steps, 10
# episodes) go to cql_sac_learner_seed<N>.jsonl; a rerun resumes from the
# Learner's checkpoints in runs/tf_agents_cql_sac/seed<N>.
#
#   make medium && bash docs/results/tf_agents/run_cql_sac_learner.sh
set -euo pipefail
cd "$(dirname "$0")/../../.."
PY=${PY:-.venv/bin/python}
OUT=docs/results/tf_agents
for seed in ${SEEDS:-0 1 2}; do
  "$PY" examples/cql_sac_offline.py \
      --root_dir "runs/tf_agents_cql_sac/seed$seed" \
      --gin_file examples/configs/cql_sac_mujoco_medium.gin \
      --gin_bindings 'train_eval.dataset="data/halfcheetah_v5_medium"' \
      --gin_bindings 'train_eval.num_gradient_updates=30000' \
      --gin_bindings 'train_eval.eval_interval=10000' \
      --gin_bindings 'train_eval.policy_save_interval=10000' \
      --gin_bindings "train_eval.seed=$seed" \
      2> "runs/tf_agents_cql_sac/seed$seed.log" \
      | grep --line-buffered '^{' >> "$OUT/cql_sac_learner_seed$seed.jsonl" &
done
wait
