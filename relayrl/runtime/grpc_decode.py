"""A server interceptor that turns a request gRPC cannot decode into INVALID_ARGUMENT naming
the method and the message type it expected, on every method of every service.

Left alone, gRPC answers such a request with a generic `INTERNAL: Exception deserializing
request!`, which reads as a server fault. The interceptor wraps each handler's request
deserializer: bytes that do not parse become a marker, and the handler, rebuilt around the
servicer's, aborts on meeting one (for a streaming request, on reaching it in the stream).
"""

from __future__ import annotations

import grpc

_KINDS = {
    (False, False): (grpc.unary_unary_rpc_method_handler, "unary_unary"),
    (False, True): (grpc.unary_stream_rpc_method_handler, "unary_stream"),
    (True, False): (grpc.stream_unary_rpc_method_handler, "stream_unary"),
    (True, True): (grpc.stream_stream_rpc_method_handler, "stream_stream"),
}


class _Undecodable:
    __slots__ = ("error",)

    def __init__(self, error: Exception):
        self.error = error


def _type_name(deserializer) -> str:
    owner = getattr(deserializer, "__self__", None)  # Message.FromString, bound to its class
    descriptor = getattr(owner, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", None) or getattr(owner, "__name__", "the request")


class DecodeErrorInterceptor(grpc.ServerInterceptor):
    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        method, parse = handler_call_details.method, handler.request_deserializer
        message = f"{method}: the request is not a valid {_type_name(parse)}"

        def decode(data: bytes):
            try:
                return parse(data)
            except Exception as err:  # noqa: BLE001 (any parser failure is the caller's)
                return _Undecodable(err)

        def refuse(request, context):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{message} ({request.error})")

        def checked(requests, context):
            for request in requests:
                if isinstance(request, _Undecodable):
                    refuse(request, context)
                yield request

        build, attribute = _KINDS[(handler.request_streaming, handler.response_streaming)]
        behavior = getattr(handler, attribute)

        if handler.request_streaming:
            def run(requests, context):
                return behavior(checked(requests, context), context)
        elif handler.response_streaming:
            def run(request, context):
                if isinstance(request, _Undecodable):
                    refuse(request, context)
                yield from behavior(request, context)
        else:
            def run(request, context):
                if isinstance(request, _Undecodable):
                    refuse(request, context)
                return behavior(request, context)

        return build(run, request_deserializer=decode,
                     response_serializer=handler.response_serializer)
