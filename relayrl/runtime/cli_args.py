"""The argument parser every `python -m <svc>` shares: --config F [--set a.b=c ...]."""

from __future__ import annotations

import argparse
import sys

from relayrl.config import ConfigError, RunConfig, load_run_config


def parse_service_args(
    service: str, argv: list[str] | None = None
) -> tuple[RunConfig, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog=f"python -m {service}")
    parser.add_argument("--config", required=True, help="run config YAML")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
        help="override one config field (repeatable)",
    )
    args = parser.parse_args(argv)
    try:
        cfg = load_run_config(args.config, args.overrides)
    except ConfigError as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None
    return cfg, args


def install_run_credentials(cfg: RunConfig, service: str = "") -> None:
    """This process's tokens and TLS, from cfg.auth; exit 2 naming what is missing. The
    trainer and a relay that takes its publishes (one that follows no upstream) need the
    trainer token when the run reaches beyond loopback."""
    from relayrl.runtime import auth
    publishes = service == "trainer_svc" or (service == "relay_svc" and not cfg.relay.upstream)
    try:
        if publishes and cfg.beyond_loopback:
            auth.require_trainer_token(cfg.auth, service)
        auth.install(auth.load_credentials(cfg.auth))
    except ValueError as err:
        print(err, file=sys.stderr)
        raise SystemExit(2) from None


def run_service(service: str) -> None:
    """The whole of every `python -m <svc>`: parse the config first, so a bad one fails fast,
    then import the service's server module (torch, transformers, ...) and serve. A setting
    the service refuses only once it meets the machine or the data (a GPU that is not there,
    a dataset path that does not exist: a ConfigError) ends it as a bad file does: exit
    status 2, the message on stderr, no traceback."""
    import importlib

    from relayrl.runtime.procs import die_with_launcher

    die_with_launcher()
    cfg, _ = parse_service_args(service)
    install_run_credentials(cfg, service)
    try:
        importlib.import_module(f"{service}.server").serve(cfg.part(service))
    except ConfigError as err:
        print(f"{service}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
