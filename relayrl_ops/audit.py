"""Reconcile a run's prompt ledger: every prompt handed out is accounted for exactly once.

The services record prompt ids in the run's ledger (relayrl.contracts.ledger, one set of ids per
stage) as they pass each stage: the scheduler `leased` and `failed`, the buffer `batched`,
the trainer `consumed` and `dropped` (stale, or filtered by the loss) once the step that
used them is durable in a checkpoint; `dropped` includes the groups the trainer set aside
(quarantined as poison, or in a step whose loss was not finite), each of which it also
records in the run's quarantine (trainer_svc.quarantine), reported here beside the
books. The trainer also keeps a running count of the
scheduler prompts it has stepped past, which a set cannot: a group trained twice would
count twice there but once in the sets. The books balance when
no stage holds a prompt the previous one never passed on, nothing is both trained and
dropped, and (once the trainer's last step is durable) its count equals what the sets hold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from redis.exceptions import ResponseError

from relayrl.contracts import ledger
from relayrl.contracts.keys import LEDGER_SETS, TRAINER_GROUP, RunKeys, is_external

QUARANTINE_SHOWN = 20  # newest quarantine records listed by render(); audit.json has all


@dataclass
class Check:
    """One reconciliation check: whether it holds, and what it states."""
    ok: bool
    what: str


@dataclass
class AuditReport:
    """A run's prompt ledger reconciled: its counts, the checks on them, and the quarantine."""
    counts: dict[str, int]
    checks: list[Check] = field(default_factory=list)
    quarantined: dict[str, dict] = field(default_factory=dict)  # "entry id:kind" -> record

    @property
    def balanced(self) -> bool:
        """True when every check holds: the ledger balances."""
        return all(c.ok for c in self.checks)

    def to_dict(self) -> dict:
        """The report as JSON-ready data (what `relayrl audit` writes to audit.json)."""
        return {"balanced": self.balanced, "counts": self.counts,
                "checks": [{"ok": c.ok, "what": c.what} for c in self.checks],
                "quarantined": self.quarantined}

    def render(self) -> str:
        """The report as the table `relayrl audit` prints."""
        c = self.counts
        lines = [
            f"prompts leased                      {c['leased']:>8}",
            f"  failed after retries              {c['failed']:>8}",
            f"  assembled into batches            {c['batched']:>8}",
            f"    trained (durable)               {c['trained']:>8}",
            f"    dropped (stale/filtered/poison) {c['dropped']:>8}",
            f"    awaiting the trainer            {c['awaiting_trainer']:>8}",
            f"  still generating or buffered      {c['in_flight']:>8}",
            f"external groups assembled           {c['external_batched']:>8}",
            f"  trained / dropped                 {c['external_trained']:>5} / "
            f"{c['external_dropped']}",
            f"trainer's count of finished prompts {c['trainer_finished']:>8}",
            f"batch entries quarantined           {c['quarantined_entries']:>8}",
            "",
        ]
        lines += [f"  {entry} {r.get('kind')}: prompts {r.get('prompt_ids')}: {r.get('reason')}"
                  for entry, r in sorted(self.quarantined.items(),
                                         key=lambda kv: _entry_order(kv[0]))[-QUARANTINE_SHOWN:]]
        lines += [f"{'ok  ' if ch.ok else 'FAIL'} {ch.what}" for ch in self.checks]
        lines.append("books balance" if self.balanced else "books do NOT balance")
        return "\n".join(lines)


def reconcile(sets: dict[str, set[int]], trainer_finished: int, run_finished: bool,
              quarantined: dict[str, dict] | None = None) -> AuditReport:
    """The pure part: ledger sets and the trainer's count in, counts and checks out.
    `run_finished`: the trainer's last step is durable, so its count must match exactly.
    `quarantined`: the trainer's quarantine records ("entry id:kind"), reported as they are
    (their prompts are in `dropped` once the trainer's next checkpoint is durable)."""
    missing = set(LEDGER_SETS) - set(sets)
    if missing:
        raise ValueError(f"ledger: sets missing: {sorted(missing)}")
    ours = {name: {p for p in ids if not is_external(p)} for name, ids in sets.items()}
    ext = {name: {p for p in ids if is_external(p)} for name, ids in sets.items()}
    leased, failed, batched = ours["leased"], ours["failed"], ours["batched"]
    trained, dropped = ours["consumed"], ours["dropped"]
    finished = trained | dropped
    counts = {
        "leased": len(leased), "failed": len(failed), "batched": len(batched),
        "trained": len(trained), "dropped": len(dropped),
        "awaiting_trainer": len(batched - finished),
        "in_flight": len(leased - failed - batched),
        "external_batched": len(ext["batched"]),
        "external_trained": len(ext["consumed"]),
        "external_dropped": len(ext["dropped"]),
        "trainer_finished": trainer_finished,
        "quarantined_entries": len(quarantined or {}),
    }
    both = (trained & dropped) | (ext["consumed"] & ext["dropped"])
    unassembled = (finished - batched) | ((ext["consumed"] | ext["dropped"]) - ext["batched"])
    never_leased = batched - leased
    failed_and_batched = failed & batched
    count_rule = "==" if run_finished else ">="
    count_ok = (trainer_finished == len(finished) if run_finished
                else trainer_finished >= len(finished))
    report = AuditReport(counts, quarantined=dict(quarantined or {}))
    report.checks = [
        Check(not both, f"no prompt both trained and dropped ({_few(both)})"),
        Check(not unassembled,
              f"every trained or dropped prompt was assembled first ({_few(unassembled)})"),
        Check(not never_leased, f"every assembled prompt was leased ({_few(never_leased)})"),
        Check(not failed_and_batched,
              f"no prompt both failed and assembled ({_few(failed_and_batched)})"),
        Check(count_ok, f"trainer's count of finished prompts ({trainer_finished}) "
                        f"{count_rule} trained + dropped ({len(finished)}): none trained twice"),
    ]
    return report


def _entry_order(key: str) -> tuple[int, ...]:
    """A quarantine key "ms-seq:kind" as the entry id's numbers, for stream order."""
    try:
        return tuple(int(x) for x in key.split(":")[0].split("-"))
    except ValueError:
        return ()


def _few(ids: set[int], most: int = 5) -> str:
    if not ids:
        return "none"
    shown = ", ".join(map(str, sorted(ids)[:most]))
    return f"{len(ids)}: {shown}{', ...' if len(ids) > most else ''}"


def audit_redis(redis, run_id: str, max_steps: int | None = None) -> AuditReport:
    """Read the run's ledger from Redis and reconcile it. The run counts as finished when
    the trainer has reached `max_steps` and no trained batch awaits acknowledgement."""
    keys = RunKeys(run_id)
    sets = ledger.all_members(redis, keys)
    trainer_finished = int(redis.get(keys.prompts_finished) or 0)
    version = int(redis.get(keys.trainer_version) or 0)
    try:
        pending = redis.xpending(keys.batches, TRAINER_GROUP)["pending"]
    except ResponseError:  # no batch stream or no trainer yet
        pending = 0
    finished = max_steps is not None and version >= max_steps and pending == 0
    return reconcile(sets, trainer_finished, finished, read_quarantine(redis, keys))


def read_quarantine(redis, keys: RunKeys) -> dict[str, dict]:
    """The trainer's quarantine records (trainer_svc.quarantine), by "entry id:kind"."""
    raw = redis.hgetall(keys.quarantine_index)
    return {(k.decode() if isinstance(k, bytes) else k): json.loads(v) for k, v in raw.items()}
