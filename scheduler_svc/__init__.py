"""scheduler_svc: leases prompts to rollout workers and re-issues the ones that expire."""
