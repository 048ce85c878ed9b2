"""RLDS in and out: the data side, which knows nothing of Reverb or learners.

`convert` (RLDS steps -> TF-Agents trajectories, the drop-in contract),
`validate` (episode checks that name episode, step and field), `datasets`
(TFDS names, local TFDS directories, Minari), `minari_source`, `recording`
(MuJoCo episodes -> RLDS), `tfds_writer` (RLDS -> a TFDS directory),
`behaviour_policies` (the shipped policies D4RL-style datasets are
recorded with).
"""
