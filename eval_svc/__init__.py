"""Held-out evaluation (the `eval` config section): sets, pass@k, and where it runs.

inline: the trainer calls evaluate_sets between steps (trainer_svc/trainer.py); separate:
`python -m eval_svc.follower --config F` follows the relay and evaluates each new
version; `relayrl eval CONFIG --checkpoint DIR` evaluates a checkpoint (eval_svc.offline).
"""

from eval_svc.runner import SetResult, evaluate_set, evaluate_sets, pass_at_k
from eval_svc.sets import EvalSet, build_sets

__all__ = ["EvalSet", "SetResult", "build_sets", "evaluate_set", "evaluate_sets", "pass_at_k"]
