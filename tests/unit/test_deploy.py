"""The deployment files agree with the package and with the run configs they mount.

No Docker engine or cluster here: docker-compose.yml is rendered in Python (YAML merge keys,
${VAR} interpolation) and deploy/k8s is validated offline against the Kubernetes schemas that
kubernetes-validate bundles. Either way, every command must name a module of the package and
every port a probe, Service or peer uses must be the one the mounted run config gives.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shlex
import subprocess
from importlib.metadata import entry_points
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from setuptools import find_packages

from eval_svc.follower import EVAL_FILE
from relayrl.config import RunConfig, load_run_config
from relayrl.contracts.keys import RunKeys
from relayrl.runtime.service import LIVENESS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
COMPOSE_GPU = ROOT / "docker-compose.gpu.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
K8S = ROOT / "deploy" / "k8s"
K8S_VERSION = "1.30"  # the oldest cluster the manifests target (gRPC probes: 1.27+)
SERVICES = ("relay_svc", "scheduler_svc", "buffer_svc", "trainer_svc", "rollout_svc", "eval_svc")
EVALUATOR = "eval_svc"  # serves no port: pulls from the relays, writes <run_dir>/eval.jsonl


def own_endpoint(module: str, cfg: RunConfig):
    """The endpoint a service binds; None for the evaluator, which serves nothing."""
    return {"relay_svc": cfg.relay.endpoint, "scheduler_svc": cfg.scheduler.endpoint,
            "buffer_svc": cfg.buffer.endpoint, "trainer_svc": cfg.trainer.endpoint,
            "rollout_svc": cfg.rollout.endpoint, EVALUATOR: None}[module]


def dials(module: str, cfg: RunConfig) -> list[tuple[str, int, str]]:
    """(host, port, module serving it) of every peer a service connects to."""
    redis = urlparse(cfg.redis.url or "")
    out = [] if module == EVALUATOR else [(redis.hostname, redis.port or 6379, "redis")]
    addrs = {"trainer_svc": [(cfg.relay.endpoint.address, "relay_svc")],
             "relay_svc": [(a, "relay_svc") for a in cfg.relay.upstream],
             "rollout_svc": [(a, "relay_svc") for a in cfg.relay_addresses]
             + [(cfg.scheduler.endpoint.address, "scheduler_svc")],
             EVALUATOR: [(a, "relay_svc") for a in cfg.relay_addresses]}.get(module, [])
    for addr, peer in addrs:
        host, port = addr.rsplit(":", 1)
        out.append((host, int(port), peer))
    return out


def eval_probe(cfg: RunConfig) -> list[str]:
    """The evaluator's health: its first record is in <run_dir>/eval.jsonl."""
    return ["test", "-s", str(Path(cfg.run_dir) / EVAL_FILE)]


def mounted_at(mounts: dict[str, str], path: str) -> tuple[str, str] | None:
    """(mount path, source) of the mount holding path (the longest prefix), or None."""
    held = [(t, src) for t, src in mounts.items() if Path(path).is_relative_to(t)]
    return max(held, default=None, key=lambda m: len(m[0]))


def in_volume(mounts: dict[str, str], path: str) -> tuple[str, Path] | None:
    """(source, path inside it) of `path`, or None where no mount holds it."""
    held = mounted_at(mounts, path)
    return held and (held[1], Path(path).relative_to(held[0]))


def service_args(argv: list[str]) -> tuple[str, argparse.Namespace]:
    """The module that `python -m` or `torchrun ... -m` runs, and its parsed arguments."""
    if argv[0] == "python":
        assert argv[1] == "-m", argv
        i = 1
    else:
        assert argv[0] == "torchrun", f"unknown command {argv}"
        assert entry_points(group="console_scripts", name="torchrun"), "torch has no torchrun"
        i = argv.index("-m")
    module = argv[i + 1]
    assert module in SERVICES, argv
    assert importlib.util.find_spec(f"{module}.__main__"), f"python -m {module} cannot run"
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", required=True)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    return module, parser.parse_args(argv[i + 2:])


# --- docker-compose.yml -------------------------------------------------------------------

def interpolate(value, env: dict[str, str]):
    """Compose's ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?error}, ${VAR?error}, $$."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        unset = name not in env or (op.startswith(":") and not env[name])
        if op.endswith("?") and unset:
            raise KeyError(f"{name}: {arg}")
        return arg if op.endswith("-") and unset else env.get(name, "")

    return re.sub(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}", sub, value)


def render_compose(env: dict[str, str]) -> dict:
    return interpolate(yaml.safe_load(COMPOSE.read_text()), env)  # safe_load merges <<


# every variable docker-compose.yml requires
COMPOSE_ENV = {"RELAYRL_TOKEN": "test-token", "RELAYRL_TRAINER_TOKEN": "trainer-token",
               "RELAYRL_REDIS_PASSWORD": "redis-password", "RELAYRL_SIGNING_KEY": "private",
               "RELAYRL_VERIFY_KEY": "public"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return render_compose(COMPOSE_ENV)


def compose_config(svc: dict) -> tuple[str, RunConfig]:
    module, args = service_args(svc["command"])
    mounts = dict(reversed(v.split(":")[:2]) for v in svc["volumes"])
    assert args.config in mounts, f"--config {args.config} is not mounted"
    host = COMPOSE.parent / mounts[args.config]
    assert host.is_file(), f"mounted config {host} does not exist"
    return module, load_run_config(host, args.overrides)


@pytest.mark.parametrize("missing", sorted(COMPOSE_ENV))
def test_compose_refuses_to_start_without_each_secret(missing):
    """Every secret is required: the token, the trainer's (beyond loopback the service token
    would otherwise publish), Redis's password, and the manifest key pair."""
    with pytest.raises(KeyError, match=missing):
        render_compose({k: v for k, v in COMPOSE_ENV.items() if k != missing})


def test_compose_gives_the_signing_key_to_the_trainer_alone(compose):
    relayrl = {name: svc for name, svc in compose["services"].items() if "build" in svc}
    signers = {name for name, svc in relayrl.items() if "RELAYRL_SIGNING_KEY" in svc["environment"]}
    assert signers == {"trainer"}
    assert all(svc["environment"]["RELAYRL_VERIFY_KEY"] == "public" for svc in relayrl.values())


def test_k8s_gives_the_signing_key_to_the_trainer_alone():
    for path in [*(ROOT / "deploy/k8s").glob("*.yaml"), *(ROOT / "deploy/k8s/gpu").glob("*.yaml")]:
        text = path.read_text()
        assert ("name: RELAYRL_SIGNING_KEY" in text) == (path.name == "trainer.yaml"), path
        if "name: RELAYRL_TOKEN " in text:
            assert "name: RELAYRL_VERIFY_KEY" in text, f"{path}: no verify key beside the token"


def test_compose_services_have_healthchecks_and_restart_policies(compose):
    for name, svc in compose["services"].items():
        assert svc.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
        assert not svc["healthcheck"].get("disable"), name
        restart = svc.get("restart", "no")
        assert restart in ("always", "unless-stopped") or restart.startswith("on-failure"), name
        for dep in svc.get("depends_on", {}):
            assert dep in compose["services"], f"{name} depends on unknown {dep}"
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            assert src.startswith((".", "/")) or src in compose["volumes"], f"{name}: {vol}"


def test_compose_redis_persists(compose):
    redis = compose["services"]["redis"]
    assert redis["command"] == ["sh", "/etc/redis/start.sh"]
    assert "./deploy/redis:/etc/redis:ro" in redis["volumes"]
    assert any(v.split(":")[0] in compose["volumes"] and v.split(":")[1] == "/data"
               for v in redis["volumes"]), "redis keeps /data in no named volume"


def test_compose_commands_ports_and_peers_agree_with_the_run_config(compose):
    services = compose["services"]
    runs = {n: compose_config(s) for n, s in services.items() if "build" in s}
    assert {m for m, _ in runs.values()} == set(SERVICES)
    for name, (module, cfg) in runs.items():
        svc = services[name]
        assert (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file()
        ep = own_endpoint(module, cfg)
        if ep is None:  # the evaluator: its probe is the file it writes, on a volume
            assert svc["healthcheck"]["test"] == ["CMD", *eval_probe(cfg)], name
            assert "ports" not in svc, f"{name} serves nothing to publish"
            # it exits 0 when done: a policy that restarts that would run it again
            assert svc["restart"].startswith("on-failure"), name
        else:
            assert ep.bind_address.split(":")[0] == "0.0.0.0", \
                f"{name} binds {ep.bind_address}: unreachable from other containers"
            probe = re.fullmatch(r"CMD relayrl health 127\.0\.0\.1:(\d+)",
                                 " ".join(svc["healthcheck"]["test"]))
            assert probe and int(probe.group(1)) == ep.port, f"{name} probes another port"
        for host, port, peer in dials(module, cfg):
            assert host in services, f"{name} dials {host}, which is no compose service"
            if peer == "redis":
                assert services[host]["image"].startswith("redis") and port == 6379
            else:
                peer_module, peer_cfg = runs[host]
                assert (peer_module, own_endpoint(peer, peer_cfg).port) == (peer, port), name
    workers = sorted(cfg.rollout.worker_index for m, cfg in runs.values() if m == "rollout_svc")
    cfg = runs["scheduler"][1]
    assert workers == list(range(cfg.rollout.num_workers))
    for name, (module, run) in runs.items():  # the REST API takes the run's token too
        env = services[name]["environment"]
        assert env[run.auth.token_env] == "test-token", name
        assert {run.auth.agent_token_env, run.auth.operator_token_env} <= set(env), name
        # only the trainer and the root relay, which checks its publishes, see its token
        publishes = module == "trainer_svc" or (module == "relay_svc" and not run.relay.upstream)
        assert (env.get(run.auth.trainer_token_env) == "trainer-token") == publishes, name
    assert cfg.scheduler.rest_host == "0.0.0.0"
    assert [p.rsplit(":", 1)[1] for p in services["scheduler"]["ports"]] == [
        str(cfg.scheduler.rest_port)]


def test_compose_evaluator_runs_when_the_run_config_asks(compose):
    """Plain `docker compose up` starts the evaluator exactly when the mounted run config
    has eval.mode separate (else the trainer evaluates inline and the evaluator waits behind
    a profile), and it finds the trainer's model on the trainer's volume and keeps its run
    directory on a volume of its own."""
    services = compose["services"]
    runs = {n: compose_config(s) for n, s in services.items() if "build" in s}
    (name,) = [n for n, (m, _) in runs.items() if m == EVALUATOR]
    cfg = runs[name][1]
    started = not services[name].get("profiles")
    assert started == (cfg.eval.mode == "separate"), f"{name}: eval.mode is {cfg.eval.mode}"
    assert all(not s.get("profiles") for n, s in services.items() if n != name)
    (trainer,) = [n for n, (m, _) in runs.items() if m == "trainer_svc"]
    assert services[name]["depends_on"][trainer] == {"condition": "service_healthy"}
    mounts = {name: {v.split(":")[1]: v.split(":")[0] for v in services[name]["volumes"]}
              for name in (name, trainer)}
    trainer_cfg = runs[trainer][1]
    model, run = (mounted_at(mounts[name], p) for p in (cfg.model.cache_dir, cfg.run_dir))
    assert run and run[1] in compose["volumes"], f"{name}: {cfg.run_dir} is on no named volume"
    assert in_volume(mounts[name], cfg.model.cache_dir) == in_volume(
        mounts[trainer], trainer_cfg.model.cache_dir), f"{name} sees another model cache"
    assert run[1] != mounted_at(mounts[trainer], trainer_cfg.run_dir)[1], \
        f"{name} writes its run directory on the trainer's volume"
    assert model[1] != run[1]


def test_compose_runs_a_relay_tree_that_workers_pull_from(compose):
    """The root relay takes the trainer's versions; a child follows it, and every worker
    and the evaluator pulls from the child first."""
    runs = {n: compose_config(s) for n, s in compose["services"].items() if "build" in s}
    relays = {n: cfg for n, (m, cfg) in runs.items() if m == "relay_svc"}
    roots = [n for n, cfg in relays.items() if not cfg.relay.upstream]
    children = {n for n, cfg in relays.items() if cfg.relay.upstream}
    assert len(roots) == 1 and children
    trainer = next(cfg for m, cfg in runs.values() if m == "trainer_svc")
    assert trainer.relay.endpoint.host == roots[0]
    for name in children:
        assert [a.rsplit(":", 1)[0] for a in relays[name].relay.upstream] == roots
    for name, (module, cfg) in runs.items():
        if module in ("rollout_svc", EVALUATOR):
            assert cfg.relay_addresses[0].rsplit(":", 1)[0] in children, name
            assert compose["services"][name]["depends_on"].keys() & children, name


def docker_builds(text: str) -> dict[str, dict[str, str]]:
    """The `docker build -f deploy/Dockerfile -t TAG --build-arg K=V ... .` commands in a text
    (a Dockerfile's comments or the README), joined across `\\` lines: tag -> build args."""
    text = re.sub(r"\\\n\s*(?:#\s*)?", " ", re.sub(r"^#\s?", "", text, flags=re.M))
    builds = {}
    for line in re.findall(r"docker build .*", text):
        argv = shlex.split(line.split("&&")[0])
        assert argv[argv.index("-f") + 1] == "deploy/Dockerfile", line
        args = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--build-arg")
        tag = argv[argv.index("-t") + 1].rsplit("/", 1)[-1]  # <registry>/relayrl:cuda too
        assert builds.setdefault(tag, args) == args, f"{tag} is built two ways"
    return builds


def dockerfile_pip_installs(build_args: dict[str, str]) -> list[str]:
    """The build stage's `pip install` commands with the ARGs (defaults, then build args)
    substituted as docker build does ($VAR, ${VAR}, ${VAR:+word})."""
    text = DOCKERFILE.read_text()
    args = {}
    for name, default in re.findall(r"^ARG (\w+)(?:=(\S*))?$", text, re.M):
        args[name] = build_args.get(name, default)
    assert set(build_args) <= set(args), f"no such ARG: {set(build_args) - set(args)}"

    def sub(m: re.Match) -> str:
        name, plus = m.group(1) or m.group(3), m.group(2)
        if plus is not None:
            return expand(plus) if args.get(name) else ""
        return args.get(name, "")

    def expand(s: str) -> str:
        return re.sub(r"\$\{(\w+)(?::\+([^}]*))?\}|\$(\w+)", sub, s)

    build = text.split("\nFROM ")[1]  # the first stage
    runs = re.findall(r"^RUN (.*(?:\\\n.*)*)", build, re.M)
    out = []
    for run in runs:
        run = expand(run)
        out += [c.strip() for c in re.split(r"&&", run) if c.strip().startswith("pip install")]
    return out


def torch_index(build_args: dict[str, str]) -> str:
    torch = [c for c in dockerfile_pip_installs(build_args) if " torch==" in c]
    assert len(torch) == 1, torch
    return shlex.split(torch[0])[shlex.split(torch[0]).index("--index-url") + 1]


def test_dockerfile_cpu_and_cuda_variants():
    """relayrl:cpu (the defaults) installs torch from PyTorch's CPU index; relayrl:cuda, as
    the Dockerfile and the README both build it, from an index whose Linux wheel is CUDA's."""
    documented = docker_builds(DOCKERFILE.read_text())
    readme = docker_builds((ROOT / "deploy" / "README.md").read_text())
    assert "relayrl:cuda" in documented and "relayrl:cpu" in readme
    assert readme["relayrl:cuda"] == documented["relayrl:cuda"], "README and Dockerfile differ"
    assert readme["relayrl:cpu"] == {}, "the CPU image is the Dockerfile's defaults"
    assert torch_index({}) == "https://download.pytorch.org/whl/cpu"
    cuda = torch_index(documented["relayrl:cuda"])
    assert cuda == "https://pypi.org/simple" or re.fullmatch(
        r"https://download\.pytorch\.org/whl/cu\d+", cuda), f"{cuda} has no CUDA torch"
    assert "vllm" in documented["relayrl:cuda"].get("EXTRAS", "").split(","), \
        "the CUDA image leaves out the vLLM engine"


def test_the_cuda_image_has_the_c_compiler_triton_needs():
    """Triton (vLLM's kernels on a GPU) compiles its launcher with gcc at first use: the
    runtime stage installs one exactly when EXTRAS has vllm, the CUDA image's."""
    runtime = DOCKERFILE.read_text().rsplit("\nFROM ", 1)[1]
    step = re.search(r'RUN case ",\$EXTRAS," in \*,vllm,\*\) (.*?);; esac', runtime, re.S)
    assert step and "apt-get install" in step.group(1) and " gcc " in step.group(1)
    assert "ARG EXTRAS" in runtime  # the stage sees the build argument


def test_compose_gpu_override(compose):
    """docker-compose.gpu.yml (used as `-f docker-compose.yml -f docker-compose.gpu.yml`)
    overrides only services of docker-compose.yml, and gives the trainer and every rollout
    worker the CUDA image, built as the Dockerfile documents, and an NVIDIA GPU of its own."""
    gpu = interpolate(yaml.safe_load(COMPOSE_GPU.read_text()), {})
    assert set(gpu) <= {"services"} | {k for k in gpu if k.startswith("x-")}, set(gpu)
    services = compose["services"]
    assert set(gpu["services"]) <= set(services), "the override names unknown services"
    workers = {n for n, s in services.items() if "build" in s
               and service_args(s["command"])[0] in ("trainer_svc", "rollout_svc")}
    assert set(gpu["services"]) == workers, "GPUs go to the trainer and rollout workers"
    cuda_args = docker_builds(DOCKERFILE.read_text())["relayrl:cuda"]
    devices = {}
    for name, svc in gpu["services"].items():
        assert svc["image"] == "relayrl:cuda", name
        assert svc["build"]["args"] == cuda_args, f"{name} builds another image"
        (dev,) = svc["deploy"]["resources"]["reservations"]["devices"]
        assert dev["driver"] == "nvidia" and "gpu" in dev["capabilities"], name
        assert ("count" in dev) != ("device_ids" in dev), f"{name}: count or device_ids"
        devices[name] = tuple(dev.get("device_ids", ()))
        assert set(svc) <= {"image", "build", "deploy"}, f"{name} changes more than the GPU"
    assert len(set(devices.values())) == len(devices), "services share a GPU by default"


def test_dockerfile_is_multistage_nonroot_cpu_torch():
    text = DOCKERFILE.read_text()
    assert len(re.findall(r"^FROM ", text, re.M)) >= 2
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    pyproject = (ROOT / "pyproject.toml").read_text()  # no tomllib on Python 3.10
    torch_pin = re.search(r'^    "torch==([^"]+)",$', pyproject, re.M).group(1)
    assert f"ARG TORCH_VERSION={torch_pin}\n" in text
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu\n" in text
    copied = set(re.findall(r"^COPY (?!--)(\S+) ", text, re.M))
    include = re.search(r"^include = (\[[^]]*\])$", pyproject, re.M).group(1)
    installed = {p.split(".")[0] for p in find_packages(str(ROOT), include=yaml.safe_load(include))}
    assert installed and installed <= copied, f"the image lacks {sorted(installed - copied)}"
    roots = re.search(r"^root_packages = (\[[^]]*\])$", pyproject, re.M).group(1)
    shipped = set(yaml.safe_load(roots)) - {"relayrl_testkit"}  # test support: never installed
    assert installed == shipped, f"not installed: {sorted(shipped - installed)}"
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert not copied & ignored and {".venv", "runs", ".cache"} <= ignored


# --- deploy/k8s ---------------------------------------------------------------------------

def k8s_files(variant: str) -> list[Path]:
    """The files `kubectl apply` takes: deploy/k8s/*.yaml, or for GPUs those with the ones
    deploy/k8s/gpu/ replaces (trainer, rollout) swapped for gpu/'s."""
    files = sorted(K8S.glob("*.yaml"))
    if variant == "gpu":
        gpu = sorted((K8S / "gpu").glob("*.yaml"))
        names = {f.name for f in gpu}
        assert names <= {f.name for f in files}, "a GPU manifest replaces no CPU one"
        files = [f for f in files if f.name not in names] + gpu
    return files


def load_manifests(variant: str) -> list[dict]:
    docs = [d for f in k8s_files(variant) for d in yaml.safe_load_all(f.read_text())]
    return [d for d in docs if d]


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def manifests(request) -> list[dict]:
    """Every k8s test runs on the CPU manifests and on the GPU set."""
    return load_manifests(request.param)


def by_kind(manifests, kind: str) -> dict[str, dict]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


@pytest.fixture(scope="module")
def k8s_run_config(manifests, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("k8s") / "run.yaml"
    path.write_text(by_kind(manifests, "ConfigMap")["relayrl-run"]["data"]["run.yaml"])
    return path


def test_k8s_manifests_match_the_kubernetes_schemas(manifests):
    try:
        import kubernetes_validate
    except ImportError:
        pytest.fail("kubernetes-validate is not installed; it is in the dev extra: "
                    "`make install` (or pip install -e '.[dev]')", pytrace=False)
    for m in manifests:
        try:
            kubernetes_validate.validate(m, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{m['kind']}/{m['metadata']['name']}: {err.message} at "
                        f"{'.'.join(map(str, err.path))}")


def workloads(manifests) -> dict[str, dict]:
    return {**by_kind(manifests, "Deployment"), **by_kind(manifests, "StatefulSet"),
            **by_kind(manifests, "Job")}


def k8s_argv(container: dict, pod_name: str, tmp_path: Path) -> list[str]:
    """What the container executes: $(VAR) expanded as Kubernetes does, then any `sh -c`
    script run with stand-ins for python and torchrun that print their argv."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        elif e["valueFrom"].get("fieldRef", {}).get("fieldPath") == "metadata.name":
            env[e["name"]] = pod_name
    expand = lambda s: re.sub(r"\$\$|\$\(([A-Za-z_]\w*)\)",  # noqa: E731
                              lambda m: env.get(m.group(1), m.group(0)) if m.group(1) else "$", s)
    argv = [expand(a) for a in container["command"] + container.get("args", [])]
    if argv[:2] != ["sh", "-c"]:
        return argv
    for exe in ("python", "torchrun"):
        (tmp_path / exe).write_text(f"#!/bin/sh\nprintf '%s\\n' {exe} \"$@\"\n")
        (tmp_path / exe).chmod(0o755)
    out = subprocess.run(["sh", "-c", argv[2]], capture_output=True, text=True, check=True,
                         env={**os.environ, **env, "PATH": f"{tmp_path}:{os.environ['PATH']}"})
    return out.stdout.splitlines()


def k8s_runs(manifests, run_config: Path, tmp_path: Path, ordinals=(0, 1, 255)):
    """(workload, container, module, config) of each RelayRL container; a StatefulSet's once
    per pod ordinal, since its pods may differ by ordinal."""
    for name, w in workloads(manifests).items():
        spec = w["spec"]["template"]["spec"]
        configmaps = {v["name"]: v["configMap"]["name"] for v in spec.get("volumes", [])
                      if "configMap" in v}
        for c in spec["containers"]:
            if not c["image"].startswith("relayrl"):
                continue
            for i in ordinals if w["kind"] == "StatefulSet" else (0,):
                module, args = service_args(k8s_argv(c, f"{name}-{i}", tmp_path))
                mounts = {m["mountPath"]: configmaps.get(m["name"]) for m in c["volumeMounts"]}
                assert mounts.get(str(Path(args.config).parent)) == "relayrl-run", name
                assert Path(args.config).name == "run.yaml"
                yield w, c, module, load_run_config(run_config, args.overrides)


def test_k8s_workloads_ports_and_peers_agree_with_the_run_config(manifests, k8s_run_config,
                                                                 tmp_path):
    services = by_kind(manifests, "Service")
    loads = workloads(manifests)
    runs = list(k8s_runs(manifests, k8s_run_config, tmp_path))
    # the evaluator's Job is left out with eval.mode inline (the test below)
    assert set(SERVICES) - {EVALUATOR} <= {m for _, _, m, _ in runs} <= set(SERVICES)

    def serving(svc_name: str, port: int | None):
        """The workloads behind a Service port (None: any), and the container port it targets."""
        svc = services[svc_name]
        target = next((p.get("targetPort", p["port"]) for p in svc["spec"]["ports"]
                       if port is None or p["port"] == port), None)
        assert target is not None, f"Service {svc_name} exposes no port {port}"
        picked = [w for w in loads.values() if svc["spec"]["selector"].items()
                  <= w["spec"]["template"]["metadata"]["labels"].items()]
        return picked, target

    for w, c, module, cfg in runs:
        name = w["metadata"]["name"]
        ep = own_endpoint(module, cfg)
        if ep is None:  # the evaluator: no port, ready once eval.jsonl has its first record
            assert not c.get("ports"), f"{name} serves nothing"
            assert not [s for s in services if w in serving(s, None)[0]], f"a Service picks {name}"
            assert c["readinessProbe"]["exec"]["command"] == eval_probe(cfg), name
            assert "livenessProbe" not in c, f"{name}: it serves nothing a probe could find hung"
            assert w["kind"] == "Job", f"{name} exits 0 when done: only a Job lets it"
            assert w["spec"]["template"]["spec"]["restartPolicy"] == "OnFailure", name
        else:
            assert ep.bind_address.split(":")[0] == "0.0.0.0", f"{name} binds {ep.bind_address}"
            for probe in ("readinessProbe", "livenessProbe"):
                assert c[probe]["grpc"]["port"] == ep.port, f"{name} {probe}"
            # readiness is lost while a service waits out a peer's outage; liveness (and the
            # startup probe that stands in for it) must not be, or the wait gets it restarted
            assert "service" not in c["readinessProbe"]["grpc"], name
            for probe in ("livenessProbe", "startupProbe"):
                if probe in c:
                    assert c[probe]["grpc"].get("service") == LIVENESS, f"{name} {probe}"
            assert ep.port in [p["containerPort"] for p in c["ports"]]
        for host, port, peer in dials(module, cfg):
            assert host in services, f"{name} dials {host}: no such Service"
            picked, target = serving(host, port)
            assert picked, f"Service {host} selects no workload"
            for p in picked:
                ports = {q["name"]: q["containerPort"] for q in
                         p["spec"]["template"]["spec"]["containers"][0]["ports"]}
                assert ports.get(target, target) == port, f"Service {host}:{port} -> {target}"
                if peer != "redis":
                    peers = [r for r in runs if r[0] is p]
                    assert peers and all(r[2] == peer for r in peers), f"{host} runs no {peer}"


def test_k8s_shape(manifests, k8s_run_config, tmp_path):
    cfg = load_run_config(k8s_run_config)
    kinds = {(m["kind"], m["metadata"]["name"]) for m in manifests}
    assert {("StatefulSet", "redis"), ("Deployment", "relay-root"), ("Deployment", "relay"),
            ("StatefulSet", "rollout"), ("Deployment", "scheduler"), ("Job", "trainer"),
            ("ConfigMap", "relayrl-run")} <= kinds
    redis = by_kind(manifests, "StatefulSet")["redis"]["spec"]
    assert redis["template"]["spec"]["containers"][0]["command"] == ["sh", "/etc/redis/start.sh"]
    assert {"name": "redis-config", "configMap": {"name": "redis-config"}} in redis[
        "template"]["spec"]["volumes"]
    claim = redis["volumeClaimTemplates"][0]["metadata"]["name"]
    assert {"name": claim, "mountPath": "/data"} in redis["template"]["spec"]["containers"][0][
        "volumeMounts"]
    trainer = by_kind(manifests, "Job")["trainer"]["spec"]["template"]["spec"]
    assert trainer["restartPolicy"] == "OnFailure"
    assert shlex.join(trainer["containers"][0]["command"]).startswith("torchrun ")
    for w, c, _, run in k8s_runs(manifests, k8s_run_config, tmp_path, ordinals=(0,)):
        env = {e["name"]: e for e in c.get("env", [])}  # the REST API takes the run's token
        assert env.get(run.auth.token_env, {}).get("valueFrom", {}).get("secretKeyRef") == {
            "name": "relayrl-token", "key": "token"}, f"{w['metadata']['name']} gets no token"
        keys = {name: e["valueFrom"]["secretKeyRef"]["key"] for name, e in env.items()
                if "secretKeyRef" in e.get("valueFrom", {})}
        assert keys.get(run.auth.agent_token_env) == "agent-token"
        assert keys.get(run.auth.operator_token_env) == "operator-token"
        publishes = w["metadata"]["name"] in ("trainer", "relay-root")  # not the followers
        trainer_ref = env.get(run.auth.trainer_token_env, {}).get("valueFrom", {}).get(
            "secretKeyRef")  # a Secret of its own, required
        assert (trainer_ref == {"name": "relayrl-trainer-token", "key": "token"}) == publishes, \
            w["metadata"]["name"]
    assert cfg.scheduler.rest_port in [
        p["port"] for p in by_kind(manifests, "Service")["scheduler"]["spec"]["ports"]]
    claims = set(by_kind(manifests, "PersistentVolumeClaim"))
    for name, w in workloads(manifests).items():
        spec = w["spec"]["template"]["spec"]
        assert spec.get("restartPolicy", "Always") in ("Always", "OnFailure"), name
        for v in spec.get("volumes", []):
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, name
        for c in spec["containers"]:  # the evaluator serves no port: readiness alone
            assert c.get("readinessProbe"), f"{name}/{c['name']}"
            assert c.get("livenessProbe") or not c.get("ports"), f"{name}/{c['name']}"


def test_k8s_evaluator_runs_when_the_run_config_asks(manifests, k8s_run_config, tmp_path):
    """The evaluator Job is among the manifests exactly when the ConfigMap has eval.mode
    separate, and it finds the trainer's model on the trainer's claim and keeps its run
    directory on a claim of its own."""
    cfg = load_run_config(k8s_run_config)
    runs = {m: (w, c, run) for w, c, m, run in k8s_runs(manifests, k8s_run_config, tmp_path,
                                                        (0,))}
    assert (EVALUATOR in runs) == (cfg.eval.mode == "separate"), cfg.eval.mode
    if EVALUATOR not in runs:
        return

    def claims(w: dict, c: dict, _) -> dict[str, str]:
        vols = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName")
                for v in w["spec"]["template"]["spec"]["volumes"]}
        return {m["mountPath"]: vols[m["name"]] for m in c["volumeMounts"]}

    evaluator, trainer = claims(*runs[EVALUATOR]), claims(*runs["trainer_svc"])
    own, trainer_cfg = runs[EVALUATOR][2], runs["trainer_svc"][2]
    run = mounted_at(evaluator, own.run_dir)
    assert run and run[1], f"the evaluator keeps {own.run_dir} on no claim"
    assert in_volume(evaluator, own.model.cache_dir) == in_volume(
        trainer, trainer_cfg.model.cache_dir), "the evaluator sees another model cache"
    assert run[1] != mounted_at(trainer, trainer_cfg.run_dir)[1], \
        "the evaluator writes its run directory on the trainer's claim"


def gpus(container: dict) -> int:
    res = container.get("resources", {})
    limit = int(res.get("limits", {}).get("nvidia.com/gpu", 0))
    assert int(res.get("requests", {}).get("nvidia.com/gpu", limit)) == limit, \
        "an extended resource's request must equal its limit"
    return limit


def nproc_per_node(argv: list[str]) -> int:
    for i, a in enumerate(argv):
        if a.startswith("--nproc-per-node=") or a.startswith("--nproc_per_node="):
            return int(a.split("=", 1)[1])
        if a in ("--nproc-per-node", "--nproc_per_node"):
            return int(argv[i + 1])
    return 1  # torchrun's default


def test_k8s_gpu_variant(tmp_path):
    """deploy/k8s/gpu: the trainer runs one torchrun process per GPU it requests, every
    rollout pod has one GPU, and every GPU workload runs the CUDA image; the CPU manifests
    request no GPU and run the CPU image."""
    cpu, gpu = load_manifests("cpu"), load_manifests("gpu")
    for w in workloads(cpu).values():
        for c in w["spec"]["template"]["spec"]["containers"]:
            assert not gpus(c) and c["image"] != "relayrl:cuda", w["metadata"]["name"]
    loads = workloads(gpu)
    trainer = loads["trainer"]["spec"]["template"]["spec"]
    (c,) = trainer["containers"]
    argv = k8s_argv(c, "trainer", tmp_path)
    assert argv[0] == "torchrun" and gpus(c) >= 1
    assert nproc_per_node(argv) == gpus(c), "torchrun's processes != the GPUs requested"
    (c,) = loads["rollout"]["spec"]["template"]["spec"]["containers"]
    assert gpus(c) == 1, "a rollout worker takes one GPU"
    on_gpu = {name for name, w in loads.items()
              if any(gpus(c) for c in w["spec"]["template"]["spec"]["containers"])}
    assert on_gpu == {"trainer", "rollout"}
    for name in on_gpu:
        spec = loads[name]["spec"]["template"]["spec"]
        assert all(c["image"] == "relayrl:cuda" for c in spec["containers"]), name
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
            spec.get("tolerations", []), f"{name} does not tolerate GPU nodes' taint"
    dshm = [v for v in trainer["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
    assert any(m["mountPath"] == "/dev/shm" and m["name"] == v["name"]
               for m in trainer["containers"][0]["volumeMounts"] for v in dshm), \
        "NCCL needs more than the container's default /dev/shm"


def test_shipped_redis_is_durable_and_never_evicts():
    """deploy/redis/redis.conf, which both compose and Kubernetes start Redis on."""
    conf = dict(line.split(None, 1) for line in
                (ROOT / "deploy/redis/redis.conf").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    assert conf["appendonly"] == "yes" and conf["appendfsync"] == "always"
    assert conf["maxmemory-policy"] == "noeviction"


def test_the_redis_acl_user_is_the_one_every_run_config_logs_in_as(compose, k8s_run_config):
    """The URL's user is users.acl's, its keys are the run's (RunKeys), and the password
    variable the services read is the one Redis is started with."""
    acl = (ROOT / "deploy/redis/users.acl").read_text()
    for cfg in (load_run_config(ROOT / "deploy/compose.yaml"), load_run_config(k8s_run_config)):
        assert urlparse(cfg.redis.url).username == "relayrl"
        assert f"~{RunKeys(cfg.run_id).prefix}* " in acl
        assert cfg.auth.redis_password_env == "RELAYRL_REDIS_PASSWORD"
    for name, svc in compose["services"].items():
        assert "RELAYRL_REDIS_PASSWORD" in svc["environment"], name


def test_only_the_runs_pods_reach_redis(manifests):
    policy = by_kind(manifests, "NetworkPolicy")["redis"]["spec"]
    assert policy["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "redis"}
    (rule,) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/part-of": "relayrl"}}}]
    for name, w in workloads(manifests).items():
        spec = w["spec"]["template"]
        assert spec["metadata"]["labels"]["app.kubernetes.io/part-of"] == "relayrl", name
        for c in spec["spec"]["containers"]:
            assert "RELAYRL_REDIS_PASSWORD" in {e["name"] for e in c.get("env", [])}, name
