"""The `relayrl` command: up (run every service locally), check (a config, its task, reward and
environment, exercised without a service), prepare (build the model), services
(each service's gRPC status), audit, health, simulate (a large cluster, as discrete events),
eval (a checkpoint's held-out scores, eval_svc.offline), and the control API's status,
pause, resume, stop and workers (relayrl_ops.control_client)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys

from relayrl.config import ConfigError, load_run_config


def _load(args):
    try:
        return load_run_config(args.config, args.overrides)
    except ConfigError as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None


def _summary(cfg) -> None:
    from relayrl.runtime.metrics import read_records

    rows = [r for name in ("metrics.jsonl", "eval.jsonl")  # eval.jsonl: eval.mode separate
            for r in read_records(f"{cfg.run_dir}/{name}")
            if r.figures.accuracy_sampled is not None]
    if rows:
        first, last = min(rows, key=lambda r: r.step), max(rows, key=lambda r: r.step)
        a, b = first.figures, last.figures
        greedy = (f"; greedy {a.accuracy_greedy:.3f} -> {b.accuracy_greedy:.3f}"
                  if a.accuracy_greedy is not None and b.accuracy_greedy is not None else "")
        print(f"held-out accuracy (sampled): {a.accuracy_sampled:.3f} at step {first.step} -> "
              f"{b.accuracy_sampled:.3f} at step {last.step}" + greedy)
    print(f"run directory: {cfg.run_dir} (metrics.jsonl, reward.png, checkpoints/, logs/)")


def _client_credentials(cfg):
    """The tokens of the environment, with the run's TLS and Redis password (auth.tls,
    auth.redis_password_env): what a command beside a run (audit, services) dials it with."""
    from relayrl.runtime import auth

    try:
        password = None
        if cfg.auth.redis_password_env:
            password = os.environ.get(cfg.auth.redis_password_env) or None
        return dataclasses.replace(auth.current(), tls=auth.load_tls(cfg.auth.tls),
                                   redis_password=password)
    except ValueError as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None


def cmd_up(args) -> int:
    """Start every service locally and train (relayrl_ops.launcher); exit with the run's code."""
    cfg = _load(args)
    from relayrl_ops.launcher import StartFailed, up

    nodes = len(cfg.resources.nodes) if cfg.resources else 1
    if not 0 <= args.node < nodes:
        print(f"relayrl up: --node {args.node}: the run has {nodes} node(s) "
              f"(resources.nodes), 0..{nodes - 1}", file=sys.stderr)
        return 2
    try:
        code = up(cfg, args.node)
    except StartFailed as err:
        print(f"relayrl up: {err}", file=sys.stderr)
        return 1
    _summary(cfg)
    if code == 0:  # the books of a finished run must balance
        audit = argparse.Namespace(config=str(cfg.run_path / "config.yaml"), overrides=[])
        code = cmd_audit(audit)
    return code


def cmd_check(args) -> int:
    """Exercise a config without starting a service (relayrl_ops.check); exit 1 on a failure."""
    cfg = _load(args)
    from relayrl_ops.check import check

    return check(cfg)


def cmd_prepare(args) -> int:
    """Build and cache the config's model and print its directory."""
    cfg = _load(args)
    from relayrl_torch.models import resolve_model_path

    print(resolve_model_path(cfg.model, cfg.task))
    return 0


def cmd_services(args) -> int:
    """Print each service's gRPC status in a running run, asked where the run's plan says it
    serves (on its node's address in a run over several nodes)."""
    cfg = _load(args)
    import grpc
    from google.protobuf.json_format import MessageToDict

    from relayrl.contracts.proto.v1 import (
        buffer_pb2,
        buffer_pb2_grpc,
        relay_pb2,
        relay_pb2_grpc,
        rollout_pb2,
        rollout_pb2_grpc,
        scheduler_pb2,
        scheduler_pb2_grpc,
        trainer_pb2,
        trainer_pb2_grpc,
    )
    from relayrl.runtime.grpc_util import channel
    from relayrl_ops.plan import plan

    asks = {  # module -> (stub, method, request)
        "relay_svc": (relay_pb2_grpc.RelayStub, "ListVersions", relay_pb2.ListVersionsRequest()),
        "scheduler_svc": (scheduler_pb2_grpc.SchedulerStub, "Status",
                          scheduler_pb2.SchedulerStatusRequest()),
        "buffer_svc": (buffer_pb2_grpc.BufferStub, "Stats", buffer_pb2.BufferStatsRequest()),
        "trainer_svc": (trainer_pb2_grpc.TrainerStub, "Status",
                        trainer_pb2.TrainerStatusRequest()),
        "rollout_svc": (rollout_pb2_grpc.RolloutStub, "Status",
                        rollout_pb2.RolloutStatusRequest()),
    }
    # an operator's token, if set, reads every status (relayrl.runtime.roles)
    creds = _client_credentials(cfg)
    if operator := os.environ.get(cfg.auth.operator_token_env):
        creds = dataclasses.replace(creds, token=operator)
    out = {}
    for process in plan(cfg):
        if not process.address:  # the evaluator serves nothing
            continue
        stub_cls, method, request = asks[process.module]
        call = getattr(stub_cls(channel(process.address, creds)), method)
        try:
            out[process.name] = MessageToDict(call(request, timeout=3),
                                              preserving_proto_field_name=True)
        except grpc.RpcError as err:  # report every service, reachable or not
            out[process.name] = {"error": f"{err.code().name}: {err.details()}"}
    print(json.dumps(out, indent=2))
    return 0


def cmd_audit(args) -> int:
    """Reconcile a run's prompt ledger; exit 1 when the books do not balance."""
    import json
    from pathlib import Path

    from relayrl.runtime import auth
    from relayrl.runtime.redis_conn import redis_session
    from relayrl_ops.audit import audit_redis

    target = Path(args.config)
    if target.is_dir():
        args.config = str(target / "config.yaml")
        if not Path(args.config).is_file():
            print(f"{target}: no config.yaml (is it a run directory?)", file=sys.stderr)
            return 2
    cfg = _load(args)
    url = cfg.redis.url or ""
    if url.startswith("unix://") and not Path(url[len("unix://"):]).exists():
        url = ""  # a stopped run's embedded server: start it again on the run's data file
    # on the way out a live run's server stays up; a stopped run's, started here, stops
    with (auth.using(_client_credentials(cfg)),
          redis_session(url, cfg.run_dir, cfg.redis.socket_timeout_s) as redis):
        report = audit_redis(redis, cfg.run_id, cfg.trainer.max_steps)
    print(report.render())
    out = Path(cfg.run_dir) / "audit.json"
    out.write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if report.balanced else 1


def cmd_control(args) -> int:
    """status, pause, resume, stop, workers: one call to the scheduler's REST control API."""
    from relayrl_ops.control_client import ControlError, resolve_endpoint, run_command

    cfg = _load(args) if args.config else None
    try:
        return run_command(args.command, resolve_endpoint(args.url, args.token, cfg), args.json)
    except ControlError as err:
        print(f"relayrl {args.command}: {err}", file=sys.stderr)
        return 1


def cmd_eval(args) -> int:
    """A checkpoint's scores on the config's eval sets (eval_svc.offline)."""
    args.overrides = [s for s in args.sets if "=" in s]  # SECTION.FIELD=VALUE, as elsewhere
    from eval_svc.offline import main

    names = [s for s in args.sets if "=" not in s]
    return main(_load(args).part("eval_svc"), args.checkpoint, names, args.json)


def cmd_export(args) -> int:
    """A checkpoint as a standalone Hugging Face directory (relayrl_ops.export)."""
    from relayrl_ops.export import main

    return main(_load(args).part("eval_svc"), args.checkpoint, args.out)


def cmd_health(args) -> int:
    """Exit 0 only if the gRPC service at the address reports SERVING (container probes)."""
    from relayrl.runtime.grpc_util import check_health

    healthy = check_health(args.address, args.timeout)
    print(f"{args.address}: {'SERVING' if healthy else 'not serving'}")
    return 0 if healthy else 1


def cmd_simulate(args) -> int:
    """Run the discrete-event simulator of a large cluster (relayrl_sim.sweep)."""
    from relayrl_sim import sweep

    try:
        cfg = sweep.build_config(args.config, args.costs, args.dist, args.seed, args.steps,
                                 args.warmup)
        workers = sweep.parse_list(args.workers, "workers", int)
        modes = sweep.parse_list(args.modes, "modes", str)
        if args.sensitivity:  # every cost x0.5 and x2, at the largest fleet size
            from relayrl_sim import sensitivity

            return sensitivity.main(cfg, max(workers), modes,
                                    args.jobs or min(4, os.cpu_count() or 1))
        return sweep.main(cfg, workers, modes, args.out, args.jobs)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    """The `relayrl` command's parser (docs/reference/cli.md is generated from it)."""
    parser = argparse.ArgumentParser(prog="relayrl", description="Run, control and inspect "
                                     "RelayRL runs.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, fn, text in (("up", cmd_up, "start every service locally and train"),
                           ("check", cmd_check,
                            "load the config, build the task, call the reward and the "
                            "environment once, print what the run will do; start nothing"),
                           ("prepare", cmd_prepare, "build and cache the model only"),
                           ("services", cmd_services, "query each service of a running run"),
                           ("audit", cmd_audit,
                            "reconcile a run's prompt ledger (a run config or run directory); "
                            "exit 1 if it does not balance")):
        p = sub.add_parser(name, help=text)
        p.add_argument("config", help="run config YAML")
        p.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="SECTION.FIELD=VALUE", help="override a config field")
        p.set_defaults(fn=fn)
        if name == "up":
            p.add_argument("--node", type=int, default=0, metavar="K",
                           help="start the processes the plan puts on node K of "
                           "resources.nodes (default 0: on one node, all of them)")
    for name, text in (("status", "the run's state, step, reward, throughput and workers"),
                       ("pause", "hand out no lease until resumed (leases out finish)"),
                       ("resume", "hand out leases again after a pause"),
                       ("stop", "graceful stop: finish and train what is out, checkpoint, end"),
                       ("workers", "the registered rollout workers")):
        p = sub.add_parser(name, help=text + " (REST control API)")
        p.add_argument("--url", help="control API, e.g. http://127.0.0.1:8080 "
                       "(default: $RELAYRL_API_URL, else from --config)")
        p.add_argument("--token", help="bearer token (default: $RELAYRL_API_TOKEN, or the "
                       "variable the config's scheduler.rest_token_env names)")
        p.add_argument("--config", help="run config YAML: the API's address and token variable")
        p.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="SECTION.FIELD=VALUE", help="override a config field")
        p.add_argument("--json", action="store_true", help="print the API's JSON answer")
        p.set_defaults(fn=cmd_control)
    p = sub.add_parser("eval", help="evaluate a checkpoint on the config's eval sets, offline")
    p.add_argument("config", help="run config YAML")
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="a Hugging Face model directory, e.g. run_dir/checkpoints/step_N")
    p.add_argument("--set", dest="sets", action="append", default=[],
                   metavar="NAME | SECTION.FIELD=VALUE",
                   help="evaluate only this eval set (repeatable; default: all), or, with "
                   "an '=', override a config field")
    p.add_argument("--json", action="store_true", help="print the JSON line alone")
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("export", help="write a checkpoint as a standalone Hugging Face model "
                       "directory (an adapter merged into the base model)")
    p.add_argument("config", help="run config YAML")
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="e.g. run_dir/checkpoints/step_N")
    p.add_argument("--out", required=True, metavar="DIR", help="an empty or new directory")
    p.add_argument("--set", dest="overrides", action="append", default=[],
                   metavar="SECTION.FIELD=VALUE", help="override a config field")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("health", help="exit 0 if a service's gRPC health check says SERVING")
    p.add_argument("address", help="HOST:PORT")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds")
    p.set_defaults(fn=cmd_health)
    p = sub.add_parser("simulate", help="discrete-event simulation of a large cluster")
    p.add_argument("--workers", default="8,16,32,64,128,256,512,1024",
                   help="comma-separated fleet sizes")
    p.add_argument("--modes", default="sync,one_step_off,async,async_repack")
    p.add_argument("--dist", default=None,
                   help="response lengths: fixed, uniform, lognormal, heavy_tail (default)")
    p.add_argument("--steps", type=int, default=None, help="trainer steps per run")
    p.add_argument("--warmup", type=int, default=None,
                   help="steps left out of the rates (default: half of --steps)")
    p.add_argument("--config", default=None, help="YAML with workload/costs/sim sections")
    p.add_argument("--costs", default=None, help="JSON or YAML cost parameters")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--jobs", type=int, default=None, help="processes (default: CPU count)")
    p.add_argument("--out", default="runs/sim", help="writes sim.json and sim.png here")
    p.add_argument("--sensitivity", action="store_true",
                   help="instead: every cost x0.5 and x2 at the largest --workers, and which "
                   "conclusions survive (relayrl_sim/sensitivity.py)")
    p.set_defaults(fn=cmd_simulate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The `relayrl` command: parse `argv` and run its subcommand; return the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s relayrl %(message)s")
    args = build_parser().parse_args(argv)
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
