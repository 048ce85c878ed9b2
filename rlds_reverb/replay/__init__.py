"""How learners get their data: Reverb stores, the learner samples in memory.

`episode_table` reads whole-episode Reverb tables once per pass; `memory`
holds the episodes as tensors and draws uniform (and n-step) transitions
in-graph; `sum_tree` and `prioritized` do prioritized replay on it;
`hindsight` relabels goals; `feeds` are what a learner's train step calls.
"""
