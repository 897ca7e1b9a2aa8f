"""The environments RelayRL ships (the calculator, verifiers and OpenEnv adapters) and how a
run loads its environment (loading.py). How an episode is played against one is
relayrl_tasks.episodes."""

from relayrl_tasks.envs.loading import BUILTIN, load_environment, make_environment

__all__ = ["BUILTIN", "load_environment", "make_environment"]
