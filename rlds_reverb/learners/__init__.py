"""TF-Agents learners fed from Reverb tables: online, offline, fine-tuning.

Acting (envs, numpy policies, collection, evaluation) lives below, in
`rlds_reverb.acting`; how learners get their data (tables, memory, feeds,
replay variants) in `rlds_reverb.replay`. Modules, one job each: `agents`
(agent builders), `dqn` (DQN and its dueling network), `export` (TF-Agents
actor -> numpy policy), `offline_data` (dataset -> table, checks, statistics),
`loop` (the learner's checkpoint, logs, curves), `run` (the one run loop:
phases, evaluation, checkpoints, exports), `online` and `offline` (what an
online or offline run wires together).
"""
