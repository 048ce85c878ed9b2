"""Tools that make the published runs and results (`python -m tools.X`).

Not benchmarks (bench/ only times things against a reference) and not the
library: `offline_suite` drives the offline learners' published runs,
`offline_table` and `onpolicy_table` build docs/results from their small
inputs, `offline_to_online` and `cartpole_per` summarise runs, `rlds_npz`
exports a dataset for peer libraries.
"""
