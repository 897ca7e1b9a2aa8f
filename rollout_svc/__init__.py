"""rollout_svc: generation workers that lease prompts, sample, score and append to the buffer.

The worker's training loop is at the top (worker, and the parts it is made of); engines/ holds
the generation engines, serving/ the custom-rollout APIs; server runs them in one process."""
