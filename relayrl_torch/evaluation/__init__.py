"""Held-out evaluation (the `eval` config section): sets, pass@k and evaluated episodes.

The trainer evaluates inline between steps with these (eval.mode inline); the evaluator
service, eval_svc, follows the relay and evaluates each due version with the same code
(eval.mode separate); `relayrl eval CONFIG --checkpoint DIR` evaluates a checkpoint
(eval_svc.offline).
"""

from relayrl_torch.evaluation.runner import SetResult, evaluate_set, evaluate_sets, pass_at_k
from relayrl_torch.evaluation.sets import EvalSet, build_sets

__all__ = ["EvalSet", "SetResult", "build_sets", "evaluate_set", "evaluate_sets", "pass_at_k"]
