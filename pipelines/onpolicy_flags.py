"""pipelines.train's flags of the on-policy agents (--agent ppo / a2c).

Each flag sets the `ppo.PpoConfig` field of its name (the GAIL flags:
`onpolicy.OnPolicyConfig`'s); a flag left unset takes the setting for the
agent and the env's kind of action space (`ppo.defaults_for`), or a gin
binding of the field if there is one.
"""

from absl import flags

NUM_ENVS = flags.DEFINE_integer(
    'num_envs', None, 'ppo/a2c: env copies stepped together (gymnasium vector '
    'env); a rollout is num_envs x rollout_steps env steps. Default: ppo 1 '
    '(continuous) / 8 (discrete), a2c 4 / 8.', lower_bound=1)
ROLLOUT_STEPS = flags.DEFINE_integer(
    'rollout_steps', None, 'ppo/a2c: steps of each env copy per rollout '
    "(PPO's n_steps, A2C's n). Default: ppo 2048 (continuous) / 32 "
    '(discrete), a2c 5.', lower_bound=1)
EPOCHS = flags.DEFINE_integer(
    'epochs', None, 'ppo: passes over each rollout. Default 10 (continuous) '
    '/ 20 (discrete).', lower_bound=1)
MINIBATCHES = flags.DEFINE_integer(
    'minibatches', None, 'ppo: minibatches per pass; must divide the rollout '
    'size. Default 32 (continuous) / 1 (discrete).', lower_bound=1)
LEARNING_RATE = flags.DEFINE_float(
    'learning_rate', None, "ppo/a2c: Adam's (ppo) or RMSprop's (a2c) "
    'learning rate. Default: ppo 3e-4 (continuous) / 1e-3 (discrete), a2c '
    '7e-4.', lower_bound=0)
LR_DECAY = flags.DEFINE_bool(
    'lr_decay', None, 'ppo/a2c: the learning rate falls linearly to 0 over '
    '--steps. Default: on for ppo, off for a2c.')
CLIP_DECAY = flags.DEFINE_bool(
    'clip_decay', None, "ppo: the clip range falls linearly to 0 over --steps "
    '(RL Zoo\'s CartPole setting). Default: on for discrete actions, off '
    'for continuous (the seed codebase keeps it).')
GAMMA = flags.DEFINE_float(
    'gamma', None, 'ppo/a2c: discount. Default 0.99 (ppo discrete: 0.98).',
    lower_bound=0, upper_bound=1)
GAE_LAMBDA = flags.DEFINE_float(
    'gae_lambda', None, "ppo/a2c: GAE's lambda; 1 gives n-step returns. "
    'Default: ppo 0.95 (continuous) / 0.8 (discrete), a2c 1.0.',
    lower_bound=0, upper_bound=1)
CLIP_RATIO = flags.DEFINE_float(
    'clip_ratio', None, "ppo: the surrogate's clip range. Default 0.2.",
    lower_bound=0)
CLIP_VALUE = flags.DEFINE_bool(
    'clip_value', None, 'ppo: clip the value loss around the old values by '
    "the clip range (PPO2's and the seed codebase's value clipping). "
    'Default: on for continuous actions, off for discrete (RL Zoo).')
VALUE_COEF = flags.DEFINE_float(
    'value_coef', None, 'ppo/a2c: weight of the value loss. Default 0.5.',
    lower_bound=0)
ENTROPY_COEF = flags.DEFINE_float(
    'entropy_coef', None, 'ppo/a2c: weight of the entropy bonus. Default 0.',
    lower_bound=0)
MAX_GRAD_NORM = flags.DEFINE_float(
    'max_grad_norm', None, 'ppo/a2c: gradients clipped to this global norm. '
    'Default 0.5.', lower_bound=0)
OBSERVATION_CLIP = flags.DEFINE_float(
    'observation_clip', None, 'ppo/a2c: observations are normalised by their '
    'running mean and std, then clipped to +-this (VecNormalize); 0 turns '
    'normalisation off. The statistics are checkpointed and go into the '
    'exported policy. Default 10 (continuous) / 0 (discrete).',
    lower_bound=0)
REWARD_CLIP = flags.DEFINE_float(
    'reward_clip', None, 'ppo/a2c: rewards are divided by the running std of '
    'the discounted return, then clipped to +-this (VecNormalize); 0 turns '
    'reward scaling off. Default 10 (continuous) / 0 (discrete).',
    lower_bound=0)
PROPER_TIME_LIMITS = flags.DEFINE_bool(
    'proper_time_limits', None, 'ppo/a2c: a step cut off by a time limit '
    'bootstraps on the value of its real final observation; '
    '--noproper_time_limits treats it as terminal (for comparison). '
    'Default on.')

RECURRENT = flags.DEFINE_bool(
    'recurrent', None, 'ppo/a2c: a GRU on the observation feeds the actor and '
    'the critic (the seed codebase\'s recurrent policy), its state reset at '
    'episode starts and carried across rollouts; minibatches are whole env '
    'copies\' sequences, so --minibatches must divide --num_envs. For '
    'partially observed envs such as CartPoleNoVelocity-v1. Default off.')
GAIL_DATASET = flags.DEFINE_string(
    'gail_dataset', None, 'ppo/a2c: GAIL from these RLDS demonstrations (a '
    'TFDS name or a directory, e.g. the --out of pipelines.generate): a '
    "discriminator learns the expert's (observation, action) pairs and its "
    "reward replaces the env's. Continuous actions only.")
GAIL_TRAJECTORIES = flags.DEFINE_integer(
    'gail_trajectories', None, "GAIL: expert episodes used, the dataset's "
    'first. Default 4.', lower_bound=1)
GAIL_SUBSAMPLE = flags.DEFINE_integer(
    'gail_subsample', None, 'GAIL: every k-th step of each expert episode, '
    'from a random start. Default 20.', lower_bound=1)
GAIL_EPOCHS = flags.DEFINE_integer(
    'gail_epochs', None, 'GAIL: discriminator epochs per update after the '
    'warm-up (100 epochs in each of the first 10 updates). Default 5.',
    lower_bound=1)

# What a2c refuses: it takes one step per rollout, unclipped.
PPO_ONLY = (EPOCHS, MINIBATCHES, CLIP_RATIO, CLIP_VALUE, CLIP_DECAY)

# OnPolicyConfig fields set by the GAIL flags.
GAIL_FLAGS = {
    'gail_dataset': GAIL_DATASET, 'gail_trajectories': GAIL_TRAJECTORIES,
    'gail_subsample': GAIL_SUBSAMPLE, 'gail_epochs': GAIL_EPOCHS,
}

FIELD_FLAGS = {
    'num_envs': NUM_ENVS, 'rollout_steps': ROLLOUT_STEPS, 'epochs': EPOCHS,
    'minibatches': MINIBATCHES, 'learning_rate': LEARNING_RATE,
    'lr_decay': LR_DECAY, 'clip_decay': CLIP_DECAY, 'gamma': GAMMA,
    'gae_lambda': GAE_LAMBDA,
    'clip_ratio': CLIP_RATIO, 'clip_value': CLIP_VALUE,
    'value_coef': VALUE_COEF, 'entropy_coef': ENTROPY_COEF,
    'max_grad_norm': MAX_GRAD_NORM, 'observation_clip': OBSERVATION_CLIP,
    'reward_clip': REWARD_CLIP, 'proper_time_limits': PROPER_TIME_LIMITS,
    'recurrent': RECURRENT,
}


def given(fields: dict = FIELD_FLAGS) -> dict:
  """{field: value} of the flags of `fields` on the command line
  (FIELD_FLAGS: PpoConfig's; GAIL_FLAGS: OnPolicyConfig's)."""
  return {field: flag.value for field, flag in fields.items()
          if flags.FLAGS[flag.name].present}
