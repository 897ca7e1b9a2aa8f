"""What a run trains on and how it is scored and played: the tasks, rewards and environments
RelayRL ships, and the rules that run a user's plug-ins (task construction, scoring, the
episode). Built on the plug-in API (relayrl.plugins); the services and relayrl_torch sit
above it."""
