"""TF-Agents learners fed from Reverb tables: online, offline, fine-tuning.

Acting (envs, numpy policies, collection, evaluation) lives below, in
`rlds_reverb.acting`. Modules, one job each: `agents` (agent builders),
`dqn` (DQN and its dueling network), `export` (TF-Agents actor -> numpy
policy), `offline_data` (dataset -> table -> batches), `loop` (checkpoints,
logs, curves), `curves`, `online`, `offline` and `her_offline` (the
training loops).
"""
