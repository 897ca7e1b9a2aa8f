"""What the benchmarks share: starting one service process from a config dict, or a whole
stack on free ports."""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from relayrl.config import AuthConfig, RunConfig
from relayrl.runtime.auth import install_launcher_credentials
from relayrl.runtime.grpc_util import free_ports, wait_healthy
from relayrl.runtime.metrics import StepRecord, read_records
from relayrl.runtime.procs import child_env
from relayrl_ops.launcher import Launcher
from relayrl_testkit.ports import free_port_block
from relayrl_torch.weights.signing import ManifestKeys

ROOT = Path(__file__).resolve().parents[1]


def spawn_service(module: str, config: dict, workdir: Path, name: str, address: str,
                  timeout_s: float = 300) -> subprocess.Popen:
    """`python -m module --config` with its log in `workdir`, healthy on `address`; it dies
    with this script, even on a crash. It gets the run's token as from `relayrl up`."""
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    install_launcher_credentials(AuthConfig.model_validate(config.get("auth", {})))
    with open(workdir / f"{name}.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", module, "--config", str(path)],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=child_env())
    wait_healthy(address, timeout_s, alive=lambda: proc.poll() is None)
    return proc


def trainer_keys() -> ManifestKeys:
    """The manifest keys a bench that publishes holds: the pair spawn_service put in the
    environment (as `relayrl up` does), so the relays it started take its versions."""
    return ManifestKeys.from_config(AuthConfig())


def assign_free_ports(data: dict) -> None:
    """Point every endpoint of a run config (as a dict) at ports free now, so a bench run
    never collides with another stack on this machine. Rollout workers need consecutive
    ports (base_port + i), found as a free block."""
    relay, scheduler, buffer, trainer = free_ports(4)
    data["relay"]["endpoint"] = {**data["relay"].get("endpoint", {}), "port": relay}
    data["scheduler"]["endpoint"] = {**data["scheduler"].get("endpoint", {}), "port": scheduler}
    data["buffer"]["endpoint"] = {**data["buffer"].get("endpoint", {}), "port": buffer}
    data["trainer"]["endpoint"] = {**data["trainer"].get("endpoint", {}), "port": trainer}
    workers = data["rollout"].get("num_workers", 1)
    data["rollout"]["base_port"] = free_port_block(workers)
    if data["rollout"].get("http_base_port"):
        data["rollout"]["http_base_port"] = free_port_block(workers)
    if data["scheduler"].get("rest_port"):
        data["scheduler"]["rest_port"] = free_ports(1)[0]


def run_stack(cfg: RunConfig) -> list[StepRecord]:
    """Every service of `cfg` as its own process (relayrl up's launcher) until the trainer
    stops; the run's metrics rows. Raises if the run did not finish."""
    launcher = Launcher(cfg, show_trainer_output=False)
    try:
        launcher.start()
        if launcher.wait() != 0:
            raise RuntimeError(f"{cfg.run_id} failed; see {cfg.run_dir}/logs")
    finally:
        launcher.shutdown()
    return read_records(Path(cfg.run_dir) / "metrics.jsonl")


def evaluate_checkpoint(cfg: RunConfig, checkpoint: Path) -> dict[str, float]:
    """A saved policy (a Hugging Face directory) on the config's eval sets, offline, with the
    eval's seed: the record an eval of the run would write."""
    import torch

    from eval_svc.offline import load_checkpoint
    from relayrl_torch.evaluation import build_sets, evaluate_sets

    torch.set_num_threads(cfg.trainer.torch_threads)
    record, _ = evaluate_sets(load_checkpoint(cfg, checkpoint), build_sets(cfg),
                              seed=cfg.eval.seed, batch_size=cfg.eval.batch_size)
    return record


class CpuSampler:
    """The machine's busy share of CPU while a run's metrics file grows from one row count to
    another: samples /proc/stat (Linux) and the file's row count twice a second. Tells a run
    that uses every core (bound by the machine) from one that leaves them idle."""

    def __init__(self, metrics: Path, every_s: float = 0.5):
        self.metrics, self.every_s = metrics, every_s
        self.samples: list[tuple[int, int, int]] = []  # (rows, busy ticks, all ticks)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CpuSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            try:
                ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
            except (OSError, ValueError):
                return  # not Linux: no figure
            rows = (self.metrics.read_bytes().count(b"\n") if self.metrics.is_file() else 0)
            idle = ticks[3] + ticks[4]  # idle and iowait
            self.samples.append((rows, sum(ticks) - idle, sum(ticks)))
            if self._stop.wait(self.every_s):
                return

    def busy_share(self, from_rows: int, to_rows: int) -> float | None:
        """Busy over all ticks between the first sample with at least `from_rows` rows and
        the first with at least `to_rows`; None without two such samples."""
        first = next((s for s in self.samples if s[0] >= from_rows), None)
        last = next((s for s in self.samples if s[0] >= to_rows), None)
        if first is None or last is None or last[2] <= first[2]:
            return None
        return round((last[1] - first[1]) / (last[2] - first[2]), 2)


def window_figures(rows: list[StepRecord], skip: int, steps: int) -> dict[str, float]:
    """samples/s, mean lag and stale groups over the steps after `skip` up to `steps`."""
    by_step = {r.step: r.figures for r in rows if r.figures.elapsed_s is not None}
    missing = [s for s in (skip, steps) if s not in by_step]
    if missing:
        raise RuntimeError(f"the run has no metrics for step {missing[0]}")
    window = [by_step[s] for s in range(skip + 1, steps + 1) if s in by_step]
    seconds = by_step[steps].elapsed_s - by_step[skip].elapsed_s
    lags = [f.lag_mean for f in window if f.lag_mean is not None]
    return {"samples_per_s": sum(f.samples or 0 for f in window) / seconds,
            "lag_mean": statistics.fmean(lags) if lags else float("nan"),
            "groups_dropped_stale": sum(f.groups_dropped_stale or 0 for f in window)}


def fastest_pull_s(client, repeats: int = 3) -> float:
    """The fastest of `repeats` pulls of a RelayClient's newest version, into one staging
    buffer reused across them, as a worker reuses its own."""
    import time

    import torch

    from relayrl_torch.weights.layout import flat_size

    staging = torch.zeros(flat_size(client.manifest(0)), dtype=torch.uint8)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        client.pull(0, staging=staging)
        times.append(time.perf_counter() - start)
    return min(times)

