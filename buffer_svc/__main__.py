from relayrl.cli_args import parse_service_args


def main() -> None:
    cfg, _ = parse_service_args("buffer_svc")
    from buffer_svc.server import serve  # heavy imports only after the config parsed

    serve(cfg)


if __name__ == "__main__":
    main()
