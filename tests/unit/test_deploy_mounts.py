"""Only the trainer writes the trainer's volume (its model cache and run directory, which
holds the checkpoints it resumes from): in every shipped compose file and Kubernetes manifest,
each other service that mounts it, the rollout workers and the evaluator among them (they run
model-written code), mounts it read-only."""

from __future__ import annotations

import pytest
import yaml

from relayrl.config import load_run_config
from tests.unit.test_deploy import (
    COMPOSE,
    COMPOSE_ENV,
    COMPOSE_GPU,
    by_kind,
    interpolate,
    k8s_runs,
    load_manifests,
    mounted_at,
    render_compose,
    service_args,
)

TRAINER = "trainer_svc"


def compose_mount(entry: str | dict) -> tuple[str, str, bool]:
    """(source, target, read-only) of a compose volume, short (SRC:DST[:MODE]) or long."""
    if isinstance(entry, dict):
        return entry.get("source", ""), entry["target"], bool(entry.get("read_only"))
    source, target, *mode = entry.split(":")
    return source, target, "ro" in (mode[0].split(",") if mode else [])


def compose_services() -> dict[str, dict]:
    """docker-compose.yml's services, with docker-compose.gpu.yml's volumes merged in as
    compose merges them (by target)."""
    services = render_compose(COMPOSE_ENV)["services"]
    override = interpolate(yaml.safe_load(COMPOSE_GPU.read_text()), {})["services"]
    for name, svc in override.items():
        if "volumes" in svc:
            merged = {compose_mount(v)[1]: v for v in services[name].get("volumes", [])}
            merged.update({compose_mount(v)[1]: v for v in svc["volumes"]})
            services[name]["volumes"] = list(merged.values())
    return services


def test_compose_mounts_the_trainer_s_volume_writable_in_the_trainer_alone():
    services = compose_services()
    (trainer,) = [s for s in services.values()
                  if "build" in s and service_args(s["command"])[0] == TRAINER]
    _, args = service_args(trainer["command"])
    mounts = {t: s for s, t, _ in map(compose_mount, trainer["volumes"])}
    config = COMPOSE.parent / mounts[args.config]
    run_dir = load_run_config(config, args.overrides).run_dir
    volume = mounted_at(mounts, run_dir)[1]
    writers = {name for name, svc in services.items()
               for source, _, read_only in map(compose_mount, svc.get("volumes", []))
               if source == volume and not read_only}
    assert writers == {"trainer"}, f"{sorted(writers - {'trainer'})} may write {volume}"
    readers = {name for name, svc in services.items() if svc is not trainer
               for source, *_ in map(compose_mount, svc.get("volumes", [])) if source == volume}
    assert {"rollout-0", "rollout-1", "evaluator"} <= readers  # the model cache, read-only


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
def test_k8s_mounts_the_trainer_s_claim_writable_in_the_trainer_alone(variant, tmp_path):
    manifests = load_manifests(variant)
    run_config = tmp_path / "run.yaml"
    run_config.write_text(by_kind(manifests, "ConfigMap")["relayrl-run"]["data"]["run.yaml"])
    runs = list(k8s_runs(manifests, run_config, tmp_path, ordinals=(0,)))
    (trainer, container, _, cfg) = next(r for r in runs if r[2] == TRAINER)
    names = claims(trainer)
    claim = mounted_at({m["mountPath"]: names[m["name"]] for m in container["volumeMounts"]},
                       cfg.run_dir)[1]
    assert claim, f"the trainer keeps {cfg.run_dir} on no claim"
    writers, readers = set(), set()
    for w, *_ in runs:
        spec = w["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in [*spec.get("initContainers", []), *spec["containers"]]:
            for m in container.get("volumeMounts", []):
                pvc = volumes[m["name"]].get("persistentVolumeClaim", {})
                if pvc.get("claimName") != claim:
                    continue
                writable = not (m.get("readOnly") or pvc.get("readOnly"))
                (writers if writable else readers).add(w["metadata"]["name"])
    assert writers == {"trainer"}, f"{sorted(writers - {'trainer'})} may write claim {claim}"
    assert {"rollout", "evaluator"} <= readers


def claims(workload: dict) -> dict[str, str | None]:
    return {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName")
            for v in workload["spec"]["template"]["spec"].get("volumes", [])}


def test_a_compose_mount_reads_as_compose_reads_it():
    assert compose_mount("data:/data:ro") == ("data", "/data", True)
    assert compose_mount("data:/data") == ("data", "/data", False)
    assert compose_mount("./x:/x:ro,z") == ("./x", "/x", True)
    assert compose_mount({"type": "volume", "source": "d", "target": "/d", "read_only": True}
                         ) == ("d", "/d", True)
