"""TF-Agents learners fed from Reverb tables: online, offline, fine-tuning.

Modules, one job each: `agents` (agent builders), `envs` (specs, D4RL
scores), `numpy_policy` (actors without TensorFlow), `collect` (actor ->
Reverb), `offline_data` (dataset -> table -> batches), `loop` (checkpoints,
logs, curves), `online` and `offline` (the training loops).
"""
