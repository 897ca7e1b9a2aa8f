"""The plug-in API users write against: tasks and datasets, rewards, environments, and
the buffer client of an external producer."""

