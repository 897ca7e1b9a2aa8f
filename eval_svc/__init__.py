"""The evaluator: a service that follows the relay and evaluates each due weight version on
the held-out sets (eval.mode separate), so that evaluation never stalls training.

    python -m eval_svc --config runs/tiny/config.yaml   # `relayrl up` starts it

The sets, pass@k and evaluated episodes are relayrl_torch.evaluation, shared with the trainer's
inline evaluation; offline.py evaluates a checkpoint for `relayrl eval`.
"""
