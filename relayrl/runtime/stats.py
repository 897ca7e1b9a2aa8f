"""Typed statistics: each figure a service reports is declared once, as a field of a `Stats`
dataclass, with its kind and help text; the Prometheus exporter (relayrl.runtime.exporter) builds
its metrics from those fields and metrics.jsonl takes its records from the same objects.

    @dataclass
    class RelayStats(Stats, section="relay"):
        versions_held: int = gauge("Complete versions held.")
        bytes_served: int = counter("Bytes of weights served.")

names the figures `relay/versions_held` and `relay/bytes_served` (a field may name another
section); `RelayStats(versions_held=2, bytes_served=10).figures()` gives them as metrics.jsonl
records them. The unit is the name's suffix, as in metrics.jsonl: `_s` seconds, `_per_s` per
second; the Prometheus name spells it out (`relayrl_weights_pull_seconds`). A field left None
is not reported (not yet measured); a field with a `label` holds {label value: number}.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

PREFIX = "relayrl_"
STAT = "relayrl.stat"  # the field metadata key

Kind = Literal["counter", "gauge"]
Figure = float | Mapping[str, float]


@dataclass(frozen=True)
class MetricSpec:
    name: str  # hierarchical: section/figure, seconds end in _s, rates in _per_s
    kind: Kind
    help: str
    label: str | None = None  # the value is a mapping keyed by this label (e.g. "worker")

    @property
    def unit(self) -> str:
        """The base unit the name's suffix gives ("" for a count or a ratio)."""
        return ("per_second" if self.name.endswith("_per_s")
                else "seconds" if self.name.endswith("_s") else "")

    @property
    def prometheus_name(self) -> str:
        return prometheus_name(self.name)

    @property
    def sample_name(self) -> str:
        """The name a scrape shows and a query uses (counters end in _total)."""
        return self.prometheus_name + ("_total" if self.kind == "counter" else "")


def prometheus_name(name: str) -> str:
    """`weights/pull_s` -> `relayrl_weights_pull_seconds`; Prometheus wants base units
    spelled out and no slashes."""
    base = re.sub(r"[^a-zA-Z0-9_]", "_", name)
    if base.endswith("_per_s"):
        base = base[:-len("_per_s")] + "_per_second"
    elif base.endswith("_s"):
        base = base[:-len("_s")] + "_seconds"
    return PREFIX + base


@dataclass(frozen=True)
class Declared:
    """A field's declaration: `counter(...)` or `gauge(...)` put it in the field's metadata."""

    kind: Kind
    help: str
    section: str | None
    label: str | None
    exported: bool = True  # False: recorded in metrics.jsonl, not on /metrics


def counter(help: str, *, section: str | None = None, label: str | None = None) -> Any:
    """A total that only grows (Prometheus adds `_total` to its name)."""
    return field(metadata={STAT: Declared("counter", help, section, label)})


def gauge(help: str, *, section: str | None = None, label: str | None = None,
          optional: bool = False, exported: bool = True) -> Any:
    """A level: the figure's value now, or at the last step. An optional one defaults to
    None (not measured); one not exported is left off /metrics (where a counter of the same
    name may hold its running total)."""
    metadata = {STAT: Declared("gauge", help, section, label, exported)}
    return field(default=None, metadata=metadata) if optional else field(metadata=metadata)


class Stats:
    """Base of a service's statistics dataclasses: `class X(Stats, section="buffer")`."""

    section: ClassVar[str] = ""

    def __init_subclass__(cls, section: str = "", **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if section:
            cls.section = section

    @classmethod
    def declared(cls) -> list[tuple[str, MetricSpec]]:
        """(field name, its spec) for every field, in declaration order."""
        out = []
        for f in fields(cls):  # type: ignore[arg-type]
            d: Declared = f.metadata[STAT]
            out.append((f.name, MetricSpec(f"{d.section or cls.section}/{f.name}", d.kind,
                                           d.help, d.label)))
        return out

    @classmethod
    def specs(cls) -> tuple[MetricSpec, ...]:
        """The specs of the exported fields."""
        return tuple(spec for f, (_, spec) in zip(fields(cls), cls.declared(), strict=True)
                     if f.metadata[STAT].exported)

    @classmethod
    def from_attributes(cls, *sources: object, **given: Any):
        """Each field from `given`, else from the first source with an attribute of its name
        (the live counter it reports); AttributeError when none has one."""
        values = {}
        for f in fields(cls):  # type: ignore[arg-type]
            if f.name in given:
                values[f.name] = given.pop(f.name)
                continue
            source = next((s for s in sources if hasattr(s, f.name)), None)
            if source is None:
                raise AttributeError(f"{cls.__name__}.{f.name}: no source has it")
            values[f.name] = getattr(source, f.name)
        if given:
            raise TypeError(f"{cls.__name__} has no figures {sorted(given)}")
        return cls(**values)

    @classmethod
    def from_figures(cls, figures: Mapping[str, Any]):
        """The instance holding whichever of its figures `figures` (a metrics.jsonl record)
        has, the rest None."""
        return cls(**{name: figures.get(spec.name) for name, spec in cls.declared()})

    def exported_figures(self) -> dict[str, Figure]:
        """figures() less those not exported."""
        names = {spec.name for spec in self.specs()}
        return {name: value for name, value in self.figures().items() if name in names}

    def figures(self) -> dict[str, Figure]:
        """{hierarchical name: value} of the figures held (None ones left out)."""
        out = {}
        for name, spec in self.declared():
            value = getattr(self, name)
            if value is not None:
                out[spec.name] = dict(value) if spec.label else value
        return out


def specs_of(kinds: Iterable[type[Stats]]) -> tuple[MetricSpec, ...]:
    return tuple(spec for kind in kinds for spec in kind.specs())
