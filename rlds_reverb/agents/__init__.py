"""TF-Agents agents: the ones TF-Agents ships, built with their published
settings (`factory`), and the ones it lacks, written as TF-Agents agents.

`factory` (agent kind + config -> a TF-Agents agent), `dqn`,
`actor_critic` (on-policy networks), `export` (a TF-Agents actor -> a numpy
policy); `offline/` (IQL, AWAC, ReBRAC, SAC-N, EDAC, Cal-QL and their
shared ensemble critics); `onpolicy/` (PPO, GAIL, GAE, normalisation).
"""
