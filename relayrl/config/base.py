"""Shared pieces of every config model: strictness, endpoints, device specs and YAML
loading."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")

# a device spec's spelling; what it names is resolved where the service runs
# (relayrl_torch.devices)
DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]+)?)$"
DEVICE_HELP = ("auto (CUDA when present, else the CPU), cpu, cuda (cuda:LOCAL_RANK under "
               "torchrun, else cuda:0) or cuda:N")


class StrictModel(BaseModel):
    """Unknown keys are errors: a typo in a config must never be silently ignored. A key a
    model refuses with a message of its own (refused_keys: an old key naming its new place,
    a field of another kind) is reported beside every other error of the config, so a config
    written for an older schema learns all it must change from one load."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @classmethod
    def refused_keys(cls, data: dict[str, Any]) -> dict[str, str]:
        """Key of `data` -> why this model refuses it; none here."""
        return {}

    @model_validator(mode="wrap")
    @classmethod
    def _refuse_keys_together(cls, data: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if not isinstance(data, dict):
            return handler(data)  # a model already built, or an assignment
        return validate_refusing(data, cls.refused_keys(data), handler, cls.__name__)


def validate_refusing(data: dict[str, Any], refused: dict[str, str],
                      validate: Callable[[dict[str, Any]], T], title: str) -> T:
    """validate(data) when nothing is `refused` (key -> why); else one ValidationError that
    holds each refusal and every error validate meets in the other keys, rather than the
    first refusal alone."""
    if not refused:
        return validate(data)
    errors = [InitErrorDetails(type=PydanticCustomError("refused_key", why), loc=(key,),
                               input=data[key]) for key, why in refused.items()]
    try:
        validate({k: v for k, v in data.items() if k not in refused})
    except ValidationError as err:
        # each error as it was met (type and message), whatever type produced it
        errors += [InitErrorDetails(type=PydanticCustomError(e["type"], e["msg"]),
                                    loc=e["loc"], input=e["input"])
                   for e in err.errors(include_url=False)]
    raise ValidationError.from_exception_data(title, errors)


WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")


def is_loopback(host: str) -> bool:
    """Whether `host` (a name, an address, [v6]) stays on this machine: localhost or a
    loopback address. A wildcard (0.0.0.0, ::) binds every interface, so it does not."""
    import ipaddress

    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


class Endpoint(StrictModel):
    host: str = Field(
        "127.0.0.1", min_length=1, max_length=253,
        description="Host every peer dials this server at (a name or address of the "
        "network they share), which it binds too unless `bind` says otherwise.")
    port: int = Field(..., ge=1, le=65535, description="TCP port of the gRPC server.")
    bind: str | None = Field(
        None, max_length=253,
        description="Interface the server binds, where it differs from `host` (0.0.0.0 "
        "binds every interface, as a container does behind the name peers dial); None: host.")

    @property
    def address(self) -> str:
        """host:port, where peers dial."""
        return f"{self.host}:{self.port}"

    @property
    def bind_address(self) -> str:
        """interface:port, where the server listens."""
        return f"{self.bind or self.host}:{self.port}"

    @property
    def dialable(self) -> bool:
        """Whether `host` names one machine a peer can dial (not a wildcard interface)."""
        return self.host not in WILDCARD_HOSTS


MiB = 1 << 20


class GrpcLimits(StrictModel):
    """What one service's gRPC server takes in: each section holding a server has one, its
    defaults sized to what that service is sent."""

    max_receive_bytes: int | None = Field(
        None, ge=4096, le=1 << 30,
        description="Largest gRPC message the server reads; a larger one is refused by gRPC "
        "itself (RESOURCE_EXHAUSTED) before it is read. None: what the service is sent, sized "
        "from the section's other fields (its `grpc` field says how).")
    max_concurrent_rpcs: int = Field(
        256, ge=1, le=100_000,
        description="Most calls the server holds at once (running, or waiting for one of its "
        "threads; health checks and open streams count); the next is refused with "
        "RESOURCE_EXHAUSTED before it runs, which the run's own clients wait out and retry.")

    def receive_bytes(self, needed: int) -> int:
        """The receive limit: the one set, else `needed` (the section's own sizing)."""
        return self.max_receive_bytes or needed


def grpc_limits(concurrent: int) -> Callable[[], GrpcLimits]:
    """A section's `grpc` field default: GrpcLimits with `concurrent` calls at once."""
    return lambda: GrpcLimits(max_concurrent_rpcs=concurrent)


class ConfigError(ValueError):
    """A config that cannot be used; the message names every offending field."""


def format_validation_error(err: ValidationError, source: str, data: Any = None) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        field = ".".join(readable_loc(e["loc"], data, e["type"] == "missing")) or "<root>"
        lines.append(f"  {field}: {e['msg']}")
    return "\n".join(lines)


def readable_loc(loc: tuple, data: Any, missing: bool = False) -> list[str]:
    """The error's path as the user wrote it: pydantic puts a tagged union's tag (the loss
    recipe's name) into the path, trainer.loss.dapo.clip_eps_high, where the config has
    trainer.loss.clip_eps_high; the tag is dropped and named after the path instead. A part
    the data lacks is a tag (the data's `kind` or `name`, or the default one where it has
    neither) unless the error is that a required field is `missing`."""
    out, node, tag = [], data, None
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif (isinstance(node, str) and node == part) or (
                isinstance(node, dict) and isinstance(part, str) and _is_tag(node, part)
                and not (missing and i == len(loc) - 1)):
            tag = part
            continue
        else:
            node = None
        out.append(str(part))
    if tag is not None and out:
        out[-1] += f" ({tag})"
    return out


def _is_tag(node: dict, part: str) -> bool:
    """Whether `part`, absent from `node`, is the tag pydantic chose for it: the node's
    `kind` or `name`, or a default tag where it names neither."""
    tags = [node[k] for k in ("kind", "name") if k in node]
    return part in tags if tags else True


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], parsed YAML scalar or collection)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like section.field=value")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(f"override {text!r} has an empty field name")
    try:
        return path, yaml.safe_load(raw)
    except yaml.YAMLError as err:
        raise ConfigError(f"override {text!r}: the value is not valid YAML: {err}") from None


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is not a section")
            node = child
        node[path[-1]] = value
    return data


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a key written twice in one mapping, which YAML would settle by
    silently keeping the last (a second `auth:` section would drop the first)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<` merges may be overridden, as YAML means them to be
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"{key!r} is set twice in one section", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _load_unique(text: str) -> Any:
    loader = _UniqueKeyLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml(path: str | Path, allow_empty: bool = True) -> dict[str, Any]:
    """The mapping a YAML file holds; an empty or comment-only file is {} where allow_empty,
    else refused."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = _load_unique(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if data is None:
        if not allow_empty:
            raise ConfigError(f"config file {path} holds no settings (it is empty or only "
                              "comments); write the run's settings, or `{}` to run every "
                              "default (the tiny model on the addition task)")
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def load_model(cls: type[M], data: dict[str, Any], source: str) -> M:
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source, data)) from None


def tagged_shorthand(value: Any, tag: str, default: str) -> Any:
    """For a tagged union's field: a bare name is short for {tag: name}, and a mapping
    without the tag is the `default` member's."""
    if isinstance(value, str):
        return {tag: value}
    if isinstance(value, dict) and tag not in value:
        return {tag: default, **value}
    return value


def foreign_fields(data: dict[str, Any], model: type[BaseModel], members: dict[str, Any],
                   tag: str, kind: str) -> dict[str, str]:
    """For a tagged union's member `model` (`tag` its discriminator, `members` every member
    by tag): each key of `data` it lacks -> a refusal naming the members that have it, so a
    field left behind after a change of tag does not pass silently."""
    own = model.model_fields
    refused = {}
    for key in data:
        if key in own:
            continue
        owners = [n for n, c in members.items() if key in c.model_fields]
        where = f"a field of {', '.join(owners)}" if owners else f"no {kind}'s field"
        refused[key] = (f"{key!r} is not a field of {kind} {own[tag].default!r} ({where}); "
                        f"its fields: {', '.join(k for k in own if k != tag)}")
    return refused
