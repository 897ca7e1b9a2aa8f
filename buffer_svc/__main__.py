from relayrl.runtime.cli_args import run_service

if __name__ == "__main__":
    run_service("buffer_svc")
