"""gRPC side of access control: a server interceptor that refuses calls without the run's
token, a client interceptor that attaches it, and TLS credentials from the run's certificates.

The standard health service stays open: liveness/readiness probes (the launcher's, Docker's,
Kubernetes' grpc probes) carry no credentials, and it reveals nothing but SERVING or not.
"""

from __future__ import annotations

import collections

import grpc

from relayrl.auth import Credentials, TlsMaterial, bearer_matches

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
AUTH_KEY = "authorization"


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that aborts before reading any request."""
    def abort(_request, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return kind(abort)  # no deserializer: a refused request is never parsed


class TokenInterceptor(grpc.ServerInterceptor):
    def __init__(self, token: str, token_env: str):
        assert token, "an empty token would let anyone in"
        self._token = token
        self._hint = f"send metadata 'authorization: Bearer <token>' (the run's ${token_env})"

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_PREFIXES):
            return handler
        given = [v for k, v in handler_call_details.invocation_metadata or () if k == AUTH_KEY]
        if not given:
            return _refusal(handler, f"missing bearer token: {self._hint}")
        if len(given) > 1 or not bearer_matches(given[0], self._token):
            return _refusal(handler, f"invalid bearer token: {self._hint}")
        return handler


class _CallDetails(
        collections.namedtuple("_CallDetails", ("method", "timeout", "metadata", "credentials",
                                                "wait_for_ready", "compression")),
        grpc.ClientCallDetails):
    pass


class BearerClientInterceptor(grpc.UnaryUnaryClientInterceptor,
                              grpc.UnaryStreamClientInterceptor,
                              grpc.StreamUnaryClientInterceptor,
                              grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call (works on plaintext channels too,
    where gRPC's call credentials are refused)."""

    def __init__(self, header: str):
        self._header = header

    def _with_token(self, details: grpc.ClientCallDetails) -> _CallDetails:
        metadata = [(k, v) for k, v in details.metadata or () if k != AUTH_KEY]
        metadata.append((AUTH_KEY, self._header))
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            details.wait_for_ready, details.compression)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)


def server_credentials(tls: TlsMaterial) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials([(tls.key, tls.cert)])


def channel_credentials(tls: TlsMaterial) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=tls.ca)


def server_interceptors(creds: Credentials) -> list[grpc.ServerInterceptor]:
    return [TokenInterceptor(creds.token, creds.token_env)] if creds.token else []
