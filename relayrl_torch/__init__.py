"""The model side, shared by the services that hold tensors (the trainer, the relay, the
rollout worker, the evaluator): where a run's model is and loading it (models), the torch
sampler (sampling), versioned weights and their data planes (weights), held-out evaluation
(evaluation) and the device a service's tensors live on (devices). Built on relayrl_tasks
and the shared core, which never import it."""
