"""Acting: environments, numpy policies, rollouts, collection, evaluation.

Recording datasets, collecting online data and evaluating a policy all step
gymnasium envs with a numpy policy; this layer does it once, below both
`rlds_reverb.data.recording` and `rlds_reverb.experiments`, and imports neither
(recording's shipped behaviour policies are numpy policies; learners export
their TF-Agents actors to them). Modules: `envs` (making envs, TF-Agents
specs, D4RL scores), `numpy_policy` (MLP actors without TensorFlow),
`rollout` (the one rollout loop and RLDS episode buffer), `collect` (actor
-> Reverb), `evaluation` (greedy episodes, D4RL score).
"""
