"""An OpenEnv environment written in OpenEnv's own API, for the adapter's tests: guess a
digit, told whether it was right; served over HTTP by OpenEnv's own server (`app`), and
played through its HTTPEnvClient. Each reset and step appends a line to $GUESS_LOG."""

import json
import os
from dataclasses import dataclass

from openenv_core.client_types import StepResult
from openenv_core.env_server import Action, Environment, Observation, State
from openenv_core.env_server.http_server import create_fastapi_app
from openenv_core.http_env_client import HTTPEnvClient


@dataclass(kw_only=True)
class GuessAction(Action):
    guess: str


@dataclass(kw_only=True)
class GuessObservation(Observation):
    feedback: str = ""


class GuessEnv(Environment):
    def __init__(self, secret: str = "7"):
        super().__init__()
        self.secret = secret
        self._state = State(episode_id=None, step_count=0)

    def reset(self) -> GuessObservation:
        self._state = State(episode_id=os.urandom(4).hex(), step_count=0)
        self._log("reset")
        return GuessObservation(feedback="Guess a digit.")

    def step(self, action: GuessAction) -> GuessObservation:
        self._state.step_count += 1
        self._log("step")
        if action.guess.strip() == self.secret:
            return GuessObservation(feedback="Right.", done=True, reward=1.0)
        return GuessObservation(feedback="Wrong, guess again.", reward=0.0)

    @property
    def state(self) -> State:
        return self._state

    def _log(self, what: str) -> None:
        if os.environ.get("GUESS_LOG"):
            with open(os.environ["GUESS_LOG"], "a") as f:
                f.write(json.dumps({"what": what, "episode": self._state.episode_id}) + "\n")


class GuessClient(HTTPEnvClient[GuessAction, GuessObservation]):
    def _step_payload(self, action: GuessAction) -> dict:
        return {"guess": action.guess}

    def _parse_result(self, payload: dict) -> StepResult[GuessObservation]:
        obs = payload.get("observation", {})
        return StepResult(GuessObservation(feedback=obs.get("feedback", ""),
                                           done=payload.get("done", False),
                                           reward=payload.get("reward")),
                          reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict) -> State:
        return State(**payload)


app = create_fastapi_app(GuessEnv(), GuessAction, GuessObservation)  # uvicorn serves it
