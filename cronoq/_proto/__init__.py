"""Generated gRPC stubs of the cronoq.v1 API (``cronoq.proto`` beside them).

``cronoq_pb2`` holds the messages, ``cronoq_pb2_grpc`` the service stubs and
servicers. Regenerate them with ``python -m cronoq._proto.generate`` after
editing the .proto; a test fails while they are stale.
"""

import pathlib

PROTO_PATH = pathlib.Path(__file__).resolve().parent / "cronoq.proto"
PROTOCOL_VERSION = 3   # the worker protocol this API describes

__all__ = ["PROTO_PATH", "PROTOCOL_VERSION", "proto_text"]


def proto_text() -> str:
    """The text of cronoq.proto, as ``cronoq-server --print-proto`` prints it."""
    return PROTO_PATH.read_text(encoding="utf-8")
