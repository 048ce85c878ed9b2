"""How learners get their data: Reverb stores, the learner samples in memory.

`episode_table` reads whole-episode Reverb tables once per pass; `memory`
holds the episodes as tensors and draws uniform (and n-step) transitions
in-graph; `sum_tree` and `feeds` (uniform, prioritized, mixed) are what a
learner's train step calls; `hindsight` relabels goals; `follow` moves new
episodes into memory; `variants` says what each kind of replay owns.
"""
