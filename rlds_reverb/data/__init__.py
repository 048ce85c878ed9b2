"""RLDS in and out: the data side, which knows nothing of Reverb or learners.

`convert` (RLDS steps -> TF-Agents trajectories, the drop-in contract),
`validate` (episode checks that name episode, step and field), `datasets`
(TFDS names, local TFDS directories, Minari, D4RL files), `minari_source`,
`d4rl_format` (D4RL rows and TFDS's d4rl encoding), `recording`
(MuJoCo episodes -> RLDS), `tfds_writer` (RLDS -> a TFDS directory),
`behaviour_policies` (the shipped policies D4RL-style datasets are
recorded with).
"""
