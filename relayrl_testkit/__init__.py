"""Test support, imported from the repository by the tests and the benchmarks and never
installed: free ports (ports.py), seeded schedules of process faults (fault_schedule.py), the
injector that carries them out on a live run (fault_injector.py) and a whole run under one
(fault_run.py). No service and nothing in relayrl/ imports it (import-linter, `make lint`).
"""
