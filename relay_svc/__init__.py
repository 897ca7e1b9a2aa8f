"""relay_svc: serves immutable, verified weight versions over gRPC."""
