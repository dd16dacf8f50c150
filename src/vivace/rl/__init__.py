"""Reinforcement learning: rollouts scored by the benchmark, group advantages, the policy-gradient
trainer, weight sync to the sampler, checkpoints, and the controller that runs the loop."""
