"""Experiments: what a training run wires together, and the run loop.

Agents come from `rlds_reverb.agents`, data from `rlds_reverb.replay`,
acting from `rlds_reverb.acting`. Modules, one job each: `offline_data`
(dataset -> table, checks, statistics), `loop` (the learner's checkpoint,
logs, curves), `run` (the one run loop: phases, evaluation, checkpoints,
exports), `resume` (what a run directory must hold to resume), `curves`,
`distributed` (the learner of actor/learner runs), and `offline`, `online`,
`onpolicy` (what each kind of run wires together).
"""
