"""RelayRL on a real Slurm cluster: one sbatch of deploy/slurm/relayrl.sbatch runs a run to
its end, a second is cancelled mid-run with scancel, and both runs' ledgers must balance.

    python bench/slurm.py [--steps 20] [--config examples/tiny_cpu.yaml]

The cluster is this machine: Debian's slurm-wlm and munge (installed with apt-get when
`sbatch` is missing; root), a slurmctld and a slurmd on free ports with their state in a
temporary directory, stopped and removed at the end. Reported: each job's final state and
seconds, the steps trained, `relayrl audit`'s verdict on each run, and the seconds from
scancel until no process of the run is left. --smoke runs the first job for 2 steps, and
is skipped where Slurm is not installed (installing it is the full run's job).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import harness  # noqa: E402
from bench.common import assign_free_ports  # noqa: E402
from relayrl.runtime.grpc_util import free_ports  # noqa: E402

SCRIPT = ROOT / "deploy/slurm/relayrl.sbatch"
JOB_DEADLINE_S = 900
STOP_DEADLINE_S = 180
PACKAGES = ["slurm-wlm", "munge"]
MUNGE_KEY = Path("/etc/munge/munge.key")


def sh(*cmd: str, env: dict | None = None, check: bool = True) -> str:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return proc.stdout


def install() -> None:
    if shutil.which("sbatch") is None:
        print("installing slurm-wlm and munge ...", flush=True)
        sh("apt-get", "install", "-y", *PACKAGES,
           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


class Cluster:
    """One node (this machine) of a Slurm cluster whose files are all in `home`."""

    def __init__(self, home: Path):
        self.home = home
        self.node = socket.gethostname().split(".")[0]
        self.conf = home / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.munged: subprocess.Popen | None = None

    def start(self) -> None:
        ctld, slurmd = free_ports(2)
        for d in ("state", "spool", "munge"):
            (self.home / d).mkdir()
        cpus = os.cpu_count() or 2
        memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
        self.conf.write_text("\n".join([
            "ClusterName=relayrl", f"SlurmctldHost={self.node}", "SlurmUser=root",
            "SlurmdUser=root", "AuthType=auth/munge",
            f"StateSaveLocation={self.home}/state", f"SlurmdSpoolDir={self.home}/spool",
            f"SlurmctldPidFile={self.home}/slurmctld.pid",
            f"SlurmdPidFile={self.home}/slurmd.pid",
            f"SlurmctldLogFile={self.home}/slurmctld.log",
            f"SlurmdLogFile={self.home}/slurmd.log",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
            "ReturnToService=2", "KillWait=120", f"SlurmctldPort={ctld}",
            f"SlurmdPort={slurmd}",
            f"NodeName={self.node} CPUs={cpus} RealMemory={memory} State=UNKNOWN",
            f"PartitionName=main Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
            ""]))
        if not MUNGE_KEY.exists():
            MUNGE_KEY.parent.mkdir(parents=True, exist_ok=True)
            MUNGE_KEY.write_bytes(os.urandom(1024))
            MUNGE_KEY.chmod(0o400)
        socket_path = self.home / "munge/munge.socket"
        self.env["MUNGE_SOCKET"] = str(socket_path)
        self.munged = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={socket_path}",
             f"--pid-file={self.home}/munge/munged.pid", f"--seed-file={self.home}/munge/seed",
             f"--log-file={self.home}/munge/munged.log"], env=self.env)
        # slurm's munge plugin reads the socket from the config's AuthInfo
        with self.conf.open("a") as f:
            f.write(f"AuthInfo=socket={socket_path}\n")
        deadline = time.monotonic() + 30
        while not socket_path.exists():
            if time.monotonic() > deadline or self.munged.poll() is not None:
                raise RuntimeError("munged did not start")
            time.sleep(0.1)
        sh("slurmctld", env=self.env)
        sh("slurmd", env=self.env)
        deadline = time.monotonic() + 60
        while "idle" not in sh("sinfo", "-h", "-o", "%T", env=self.env, check=False):
            if time.monotonic() > deadline:
                raise RuntimeError("the node never became idle:\n"
                                   + (self.home / "slurmctld.log").read_text()[-2000:])
            time.sleep(0.5)

    def submit(self, config: Path, log: Path) -> str:
        return sh("sbatch", "--parsable", f"--chdir={ROOT}", f"--output={log}",
                  f"--export=ALL,RELAYRL_PYTHON={sys.executable},PYTHONPATH={ROOT},"
                  f"RELAYRL_PLACED={config.with_suffix('.placed.yaml')}",
                  str(SCRIPT), str(config), env=self.env).strip().split(";")[0]

    def state(self, job: str) -> str:
        out = sh("scontrol", "show", "job", job, "-o", env=self.env, check=False)
        for field in out.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return "GONE"

    def wait_done(self, job: str, deadline_s: float) -> str:
        deadline = time.monotonic() + deadline_s
        while (state := self.state(job)) in ("PENDING", "RUNNING", "CONFIGURING",
                                             "COMPLETING"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} still {state} after {deadline_s:.0f} s")
            time.sleep(1)
        return state

    def stop(self) -> None:
        for name in ("slurmd", "slurmctld"):
            pid_file = self.home / f"{name}.pid"
            if pid_file.exists():
                try:
                    os.kill(int(pid_file.read_text()), signal.SIGTERM)
                except (ProcessLookupError, ValueError):
                    pass
        if self.munged is not None:
            self.munged.terminate()
            self.munged.wait(timeout=10)


def run_config(base: Path, run_dir: Path, steps: int) -> dict:
    data = yaml.safe_load(base.read_text())
    assign_free_ports(data)
    data["run_dir"] = str(run_dir)
    data["trainer"] = {**data["trainer"], "max_steps": steps, "progress": False}
    data.setdefault("eval", {})["every"] = 0
    return data


def run_processes(run_dir: Path) -> list[int]:
    """Processes whose command line names the run (its config or directory)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(run_dir) in cmd and int(proc.name) != os.getpid():
            pids.append(int(proc.name))
    return pids


def steps_of(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return 0
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return max((int(r.get("step", 0)) for r in rows), default=0)


def audit(config: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "relayrl_ops.cli", "audit", str(config)],
                          cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    print(proc.stdout.strip(), flush=True)
    return {"balanced": proc.returncode == 0, "exit": proc.returncode}


def job(cluster: Cluster, home: Path, name: str, base: Path, steps: int,
        cancel_after_steps: int | None = None) -> dict:
    run_dir = home / name
    config = home / f"{name}.yaml"
    config.write_text(yaml.safe_dump(run_config(base, run_dir, steps)))
    t0 = time.monotonic()
    job_id = cluster.submit(config, home / f"{name}.out")
    print(f"{name}: job {job_id} submitted", flush=True)
    record: dict = {"job": job_id}
    if cancel_after_steps is not None:
        deadline = time.monotonic() + JOB_DEADLINE_S
        while steps_of(run_dir) < cancel_after_steps:
            if cluster.state(job_id) not in ("PENDING", "RUNNING", "CONFIGURING"):
                raise RuntimeError(f"job {job_id} ended before step {cancel_after_steps}: "
                                   + (home / f"{name}.out").read_text()[-3000:])
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} reached no step {cancel_after_steps}")
            time.sleep(1)
        record["steps_at_cancel"] = steps_of(run_dir)
        cancelled = time.monotonic()
        sh("scancel", job_id, env=cluster.env)
        while run_processes(run_dir):
            if time.monotonic() - cancelled > STOP_DEADLINE_S:
                raise TimeoutError(f"processes of {run_dir} left {STOP_DEADLINE_S} s after "
                                   f"scancel: {run_processes(run_dir)}")
            time.sleep(0.2)
        record["stop_s"] = round(time.monotonic() - cancelled, 1)
    record["state"] = cluster.wait_done(job_id, JOB_DEADLINE_S)
    record["seconds"] = round(time.monotonic() - t0, 1)
    record["steps"] = steps_of(run_dir)
    record["processes_left"] = len(run_processes(run_dir))
    record["audit"] = audit(config)
    print(f"{name}: {record}", flush=True)
    if record["state"] != ("CANCELLED" if cancel_after_steps else "COMPLETED"):
        print((home / f"{name}.out").read_text()[-3000:], flush=True)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = harness.parser("slurm", __doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "examples/tiny_cpu.yaml")
    parser.add_argument("--steps", type=int, default=20, help="steps of the job run to its end")
    parser.add_argument("--cancel-after", type=int, default=3,
                        help="steps the second job trains before scancel")
    args = parser.parse_args(argv)
    if args.smoke:
        if shutil.which("sbatch") is None:
            harness.skip(args, "Slurm is not installed here; `python bench/slurm.py` "
                               "installs it")
        args.steps = 2
    if os.geteuid() != 0:
        raise SystemExit("bench/slurm.py runs slurmctld and slurmd as root: run it as root")
    install()
    home = Path(tempfile.mkdtemp(prefix="relayrl-slurm-"))
    cluster = Cluster(home)
    try:
        cluster.start()
        version = sh("sinfo", "--version", env=cluster.env).strip()
        to_end = job(cluster, home, "to_end", args.config, args.steps)
        cancelled = None if args.smoke else job(
            cluster, home, "cancelled", args.config, 10_000, cancel_after_steps=args.cancel_after)
    finally:
        cluster.stop()
        shutil.rmtree(home, ignore_errors=True)
    ok = to_end["state"] == "COMPLETED" and to_end["audit"]["balanced"] and (
        cancelled is None or (cancelled["state"] == "CANCELLED"
                              and cancelled["audit"]["balanced"]
                              and cancelled["processes_left"] == 0))
    harness.report(args, {"bench": "slurm", "node": cluster.node,
                          "slurm": version, "to_end": to_end,
                          "cancelled": cancelled, "ok": ok})


if __name__ == "__main__":
    main()
