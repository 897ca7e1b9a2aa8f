"""`python -m eval_svc --config F [--set a.b=c ...]`: the separate evaluator
(eval_svc.follower). The config is read first, so a bad one fails fast (exit status 2, the
field named), before torch and the model load."""

import sys

from relayrl.config import ConfigError
from relayrl.runtime.cli_args import install_run_credentials, parse_service_args
from relayrl.runtime.procs import die_with_launcher


def main() -> None:
    die_with_launcher()
    cfg, _ = parse_service_args("eval_svc")
    if cfg.eval.mode != "separate":  # the trainer evaluates these versions itself
        print(f"eval.mode is {cfg.eval.mode!r}: the evaluator runs with eval.mode separate "
              "only", file=sys.stderr)
        raise SystemExit(2)
    part = cfg.part("eval_svc")
    install_run_credentials(cfg)
    from eval_svc.follower import serve

    try:
        serve(part)
    except ConfigError as err:  # refused once it meets the machine (a GPU that is not there)
        print(f"eval_svc: {err}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
