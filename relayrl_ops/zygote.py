"""The launcher's zygote: one process that imports torch and transformers once, then forks
each service from itself, so a local run pays those imports (about 4.5 s of CPU) once
instead of once per trainer, worker and relay.

    launcher --stdin, a JSON line per request--> zygote --fork--> service
    launcher <--stdout, a JSON line per event--- zygote

Requests: {"op": "spawn", "name", "module", "argv", "env", "log", "stderr_to_log"} answered
{"pid": P} (or {"error": ...}); {"op": "signal", "pid", "signal"}, sent only to a child
not yet reaped, so a recycled pid is never hit. Events: {"exited": P, "code": C}, C as
subprocess reports it (negative: the signal). EOF on stdin ends the zygote, and its
children with it.

A forked service is `python -m <module>` in all but its exec: its environment, stdio, argv
and signal dispositions are set first and it runs through runpy, outside every frame of the
zygote's loop; it ends as the interpreter would, less the teardown of its modules (_exit).
/proc/PID/cmdline shows that command line (setproctitle); /proc/PID/environ shows the
zygote's exec environment, which holds no trainer token (or the part of it the title
overwrote), never what the service was given. Each child dies with the zygote, which dies
with the launcher (relayrl.runtime.procs). The launcher's end, relayrl_ops.zygote_client,
starts it as `python -u -m relayrl_ops.zygote LAUNCHER_PID RUN_DIR MODULE...` (the run
directory only names it in `ps`; the modules are imported before the first fork).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import select
import signal
import sys
import threading
import traceback

from setproctitle import setproctitle

from relayrl.runtime.procs import PARENT_ENV, die_with_parent

# what the services share and spend start-up on; a module that fails to import here is
# imported (and reported) by the service that needs it
PRELOAD = ("torch", "transformers", "transformers.models.auto.modeling_auto",
           "transformers.models.llama.modeling_llama", "grpc", "pydantic", "yaml")
POLL_S = 0.1
REPLY_FD = 3  # main() moves the reply pipe here: whatever an import prints goes to stderr


def _reply(message: dict) -> None:
    os.write(REPLY_FD, (json.dumps(message) + "\n").encode())


def _reap(live: set[int]) -> None:
    while live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        live.discard(pid)
        _reply({"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def serve(live: set[int]) -> dict | None:
    """Answer requests until stdin closes (None); in a forked child, return its request."""
    pending = b""
    while True:
        readable, _, _ = select.select([0], [], [], POLL_S)
        _reap(live)
        if not readable:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:
            return None
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            request = json.loads(line)
            if request["op"] == "signal":
                if request["pid"] in live:
                    os.kill(request["pid"], request["signal"])
                continue
            try:
                pid = os.fork()
            except OSError as err:
                _reply({"error": f"fork failed: {err}"})
                continue
            if pid == 0:
                return request
            live.add(pid)
            _reply({"pid": pid})


def run_child(request: dict) -> None:
    """Become the service `request` names, as `python -m` would have started it."""
    zygote = os.getppid()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    die_with_parent(zygote)
    os.close(REPLY_FD)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the zygote's request pipe
    os.close(null)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    if request["stderr_to_log"]:
        os.dup2(log, 2)
    os.close(log)
    # before the environment changes: setproctitle finds argv's memory beside environ's
    setproctitle(" ".join([sys.executable, "-m", request["module"], *request["argv"]]))
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[PARENT_ENV] = str(zygote)
    sys.argv = [request["module"], *request["argv"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as end:
        code = _exit_status(end.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    _exit(code)


def _exit_status(code: object) -> int:
    """The status `sys.exit(code)` gives a process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _exit(code: int) -> None:
    """End a forked service as the interpreter would (thread pools shut down and other
    threads joined, exit handlers run, output flushed) but without tearing down its modules:
    that teardown drops a reference to every object the zygote imported, writing to each
    page the child shares with the zygote and so copying it, which took seconds per service
    when a run's services stopped together. multiprocessing ends its forked children the
    same way (threading._shutdown, then os._exit)."""
    threading._shutdown()  # what the interpreter's exit runs first: thread pools told, joined
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main() -> None:
    """The zygote process: import the preloaded modules, then serve spawn and signal
    requests from stdin until it closes."""
    die_with_parent(int(sys.argv[1]))
    os.dup2(1, REPLY_FD, inheritable=False)
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the launcher's to handle
    for module in sys.argv[3:]:
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    request = serve(set())
    if request is not None:
        run_child(request)
    # stdin closed: the children die with this process; nothing of its own needs tearing down
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
