"""The reference torch sampler and what it is made of: batched sampling with per-token
log-probabilities (sampler.py), per-sequence KV states that a continuation resumes from or
a repack migrates (kv_state.py; a batch's cache assembled from them and split back into
them, kv_batch.py), length-bucketed prefill (prefill.py), and held-out accuracy by sampling
(evaluation.py).

Shared, not the rollout worker's own: the torch engine (rollout_svc/engines/torch.py)
generates with it, the trainer's eval (trainer_svc/loop.py) and the tiny model's warm
start (relayrl_torch/models/tiny.py, which any service may run when it resolves its model) score
with it, and a KV state is a wire format between workers (scheduler.proto Lease.kv_states).
"""
