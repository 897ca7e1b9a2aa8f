"""Generated gRPC stubs; regenerate with scripts/gen_protos.py."""
