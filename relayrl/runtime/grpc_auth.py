"""gRPC side of access control: a server interceptor that admits a call only with a token of
a role its method allows (relayrl.runtime.roles), a client interceptor that attaches the token, and
TLS credentials from the run's certificates.

The standard health service stays open: liveness/readiness probes (the launcher's, Docker's,
Kubernetes' grpc probes) carry no credentials, and it reveals nothing but SERVING or not.
"""

from __future__ import annotations

import collections

import grpc

from relayrl.runtime.auth import Credentials, TlsMaterial
from relayrl.runtime.roles import TokenBook, method_roles

OPEN_PREFIXES = ("/grpc.health.v1.Health/",)
AUTH_KEY = "authorization"


def _refusal(handler: grpc.RpcMethodHandler, code: grpc.StatusCode, message: str
             ) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` that aborts before reading any request."""
    def abort(_request, context):
        context.abort(code, message)

    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return kind(abort)  # no deserializer: a refused request is never parsed


class TokenInterceptor(grpc.ServerInterceptor):
    """UNAUTHENTICATED without a token this server knows, PERMISSION_DENIED with one whose
    role the method does not admit; both before the request is read."""

    def __init__(self, book: TokenBook):
        assert book.holders, "no token would let anyone in"
        self._book = book

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or method.startswith(OPEN_PREFIXES):
            return handler
        given = [v for k, v in handler_call_details.invocation_metadata or () if k == AUTH_KEY]
        header = given[0] if len(given) == 1 else ("" if not given else "several")
        refused = self._book.check(header, method_roles(method), method.lstrip("/"))
        if refused is None:
            return handler
        authenticated, message = refused
        code = (grpc.StatusCode.PERMISSION_DENIED if authenticated
                else grpc.StatusCode.UNAUTHENTICATED)
        return _refusal(handler, code, message)


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
    where gRPC's call credentials are refused): `header`, or the one `by_method` names for
    the call's method (a trainer's own token on Relay.Publish)."""

    def __init__(self, header: str, by_method: dict[str, str] | None = None):
        self._header = header
        self._by_method = by_method or {}

    def _with_token(self, details: grpc.ClientCallDetails) -> _CallDetails:
        metadata = [(k, v) for k, v in details.metadata or () if k != AUTH_KEY]
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        metadata.append((AUTH_KEY, self._by_method.get(method, self._header)))
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
    book = creds.book
    return [TokenInterceptor(book)] if book is not None else []
