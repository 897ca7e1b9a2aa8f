"""A service stand-in for tests/unit/test_zygote.py, forked by a zygote as
`python -m tests.unit.zygote_child MODE [ARG]`: reports what it was given, then exits (exit
ARG), raises (raise), sleeps (sleep) or leaves a thread still writing, an idle thread pool
and an exit handler behind and exits with a message (finish)."""

import atexit
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

print(json.dumps({"argv": sys.argv, "name": __name__, "env": dict(os.environ),
                  "ppid": os.getppid(), "stdin": sys.stdin.read()}))
print("this line went to stderr", file=sys.stderr)
mode = sys.argv[1]
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "raise":
    raise RuntimeError("the service failed")
if mode == "sleep":
    time.sleep(120)
if mode == "finish":
    def late_line():
        time.sleep(0.5)
        print("the thread finished", flush=True)

    threading.Thread(target=late_line).start()
    pool = ThreadPoolExecutor(1)  # never shut down: its idle worker must not hold the exit
    pool.submit(print, "the pool ran").result()
    atexit.register(print, "the exit handler ran")
    sys.exit("a message")
