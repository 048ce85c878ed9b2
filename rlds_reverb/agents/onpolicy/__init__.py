"""On-policy pieces: PPO (and A2C), GAIL's discriminator, GAE, VecNormalize."""
