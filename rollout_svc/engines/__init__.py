"""The generation engines a rollout worker samples with, behind one interface (api: Engine,
SamplingSpec): the compact torch engine (torch) and vLLM (vllm, with its KV transfer, LoRA
serving, sampling and weight-transfer parts in vllm_*). factory builds the one a run's config
names. The worker's loop and the custom-rollout serving share one engine."""
