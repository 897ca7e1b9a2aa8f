"""The run's operator state as a pure state machine (no I/O): running, paused, stopping.

Paused: no lease at all is handed out, and the leases out finish. Stopping: no new prompt
is handed out, but a prompt whose lease lapsed is still re-issued, so that everything handed
out ends trained or failed, as in a run that reached scheduler.max_prompts. Stopping is
final: it can be neither paused nor resumed.
"""

from __future__ import annotations

from dataclasses import dataclass

from relayrl.contracts.control import RunState


class TransitionError(ValueError):
    """An operator asked for a change the run's state does not allow."""


@dataclass
class RunControl:
    state: RunState = RunState.RUNNING

    def pause(self) -> None:
        if self.state is RunState.STOPPING:
            raise TransitionError("the run is stopping; it cannot be paused")
        self.state = RunState.PAUSED

    def resume(self) -> None:
        if self.state is RunState.STOPPING:
            raise TransitionError("the run is stopping; it cannot be resumed")
        self.state = RunState.RUNNING

    def stop(self) -> None:
        self.state = RunState.STOPPING

    @property
    def leases_allowed(self) -> bool:
        return self.state is not RunState.PAUSED

    @property
    def new_prompts_allowed(self) -> bool:
        return self.state is RunState.RUNNING

    @property
    def stopping(self) -> bool:
        return self.state is RunState.STOPPING
