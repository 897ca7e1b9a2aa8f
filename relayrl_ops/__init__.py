"""Operator tooling, run on the operator's machine and never imported by a service: the
`relayrl` CLI (cli.py), the local launcher behind `relayrl up` (launcher.py) with its
restart policy (restarts.py) and embedded Redis (redis_server.py), the REST client of
`relayrl status | pause | resume | stop | workers` (control_client.py), the prompt-ledger
audit (audit.py), and fault injection for chaos runs (fault_schedule.py, fault_injector.py,
fault_run.py). The simulator beside it is relayrl_sim.

    relayrl --help                 # the installed console script (relayrl_ops.cli:main)
    python -m relayrl_ops.cli up examples/tiny_cpu.yaml
"""
