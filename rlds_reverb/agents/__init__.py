"""TF-Agents agents: the ones TF-Agents ships, built with their published
settings, and the ones it lacks, written as TF-Agents agents.

`registry` (one record per agent kind; `make_agent`: kind + config -> a
TF-Agents agent), `factory` (`AgentConfig` and the makers of the agents
TF-Agents ships), `dqn`, `actor_critic` (on-policy networks), `export` (a
TF-Agents actor -> a numpy policy); `offline/` (IQL, AWAC, ReBRAC, SAC-N,
EDAC, Cal-QL and their shared ensemble critics); `onpolicy/` (PPO, GAIL,
GAE, normalisation).
"""
