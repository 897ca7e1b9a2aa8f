"""trainer_svc: reads batches, optimises the policy, publishes versions, checkpoints."""
