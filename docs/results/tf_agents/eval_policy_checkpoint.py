"""Evaluates the greedy policy of a TF-Agents Learner run at one of its
policy checkpoints (PolicySavedModelTrigger's), as examples/cql_sac_offline.py
evaluates: 10 episodes of the env seeded with the run's seed. Prints one
JSON line in the example's format.

Used for seeds 0 and 1 of run_cql_sac_learner.sh, whose own evaluations
(before the example evaluated greedily) sampled from the policy.

  python docs/results/tf_agents/eval_policy_checkpoint.py ROOT_DIR STEP SEED
"""

import json
import os
import sys

import numpy as np
from tf_agents.policies import py_tf_eager_policy

from rlds_reverb.acting import envs
from rlds_reverb.acting import tf_agents_env

ENV = 'HalfCheetah-v5'
EPISODES = 10


def main(root_dir: str, step: int, seed: int) -> None:
  policy = py_tf_eager_policy.SavedModelPyTFEagerPolicy(
      os.path.join(root_dir, 'policies', 'greedy_policy'),
      load_specs_from_pbtxt=True)
  policy.update_from_checkpoint(os.path.join(
      root_dir, 'policies', 'checkpoints', f'policy_checkpoint_{step:010d}'))
  env = tf_agents_env.GymnasiumEnvironment(ENV, seed=seed)
  returns, lengths = [], []
  for _ in range(EPISODES):
    time_step, total, length = env.reset(), 0.0, 0
    while not time_step.is_last():
      time_step = env.step(policy.action(time_step).action)
      total, length = total + float(time_step.reward), length + 1
    returns.append(total)
    lengths.append(length)
  average = float(np.mean(returns))
  print(json.dumps({
      'train_step': step, 'policy': 'greedy', 'AverageReturn': average,
      'AverageEpisodeLength': float(np.mean(lengths)),
      'normalized_score': envs.normalized_score(ENV, average),
      'evaluated_from': 'policy checkpoint'}), flush=True)


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
