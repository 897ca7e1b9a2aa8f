"""rollout_svc: generation workers that lease prompts, sample, score and append to the buffer."""
