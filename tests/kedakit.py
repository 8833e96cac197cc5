"""A KEDA-side client of the external scaler API, independent of cronoq's stubs.

KEDA's wire (package externalscaler, the messages' field numbers and types,
the rpcs) is written out below from KEDA's externalscaler.proto, compiled
with grpcio-tools into a descriptor set and loaded into a private descriptor
pool: nothing is shared with cronoq._proto, so a field cronoq numbered
differently from KEDA shows up as a wrong answer here. StreamMetricSpec is
KEDA's optional rpc that cronoq leaves out (KEDA falls back when it is
UNIMPLEMENTED).
"""

from __future__ import annotations

import pathlib
import tempfile

KEDA_WIRE = """
syntax = "proto3";
package externalscaler;

service ExternalScaler {
  rpc IsActive(ScaledObjectRef) returns (IsActiveResponse) {}
  rpc StreamIsActive(ScaledObjectRef) returns (stream IsActiveResponse) {}
  rpc GetMetricSpec(ScaledObjectRef) returns (GetMetricSpecResponse) {}
  rpc GetMetrics(GetMetricsRequest) returns (GetMetricsResponse) {}
  rpc StreamMetricSpec(ScaledObjectRef) returns (stream GetMetricSpecResponse) {}
}
message ScaledObjectRef { string name = 1; string namespace = 2; map<string, string> scalerMetadata = 3; }
message IsActiveResponse { bool result = 1; }
message GetMetricSpecResponse { repeated MetricSpec metricSpecs = 1; }
message MetricSpec { string metricName = 1; int64 targetSize = 2; double targetSizeFloat = 3; }
message GetMetricsRequest { ScaledObjectRef scaledObjectRef = 1; string metricName = 2; }
message GetMetricsResponse { repeated MetricValue metricValues = 1; }
message MetricValue { string metricName = 1; int64 metricValue = 2; double metricValueFloat = 3; }
"""

SERVICE = "/externalscaler.ExternalScaler/"


class KedaWire:
    """The message classes of KEDA's proto, from their own descriptor pool."""

    def __init__(self) -> None:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
        from grpc_tools import protoc

        with tempfile.TemporaryDirectory() as tmp:
            root = pathlib.Path(tmp)
            (root / "externalscaler.proto").write_text(KEDA_WIRE)
            out = root / "keda.desc"
            args = ["protoc", f"-I{root}", f"--descriptor_set_out={out}", "externalscaler.proto"]
            assert protoc.main(args) == 0
            files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
        self.pool = descriptor_pool.DescriptorPool()
        for file in files.file:
            self.pool.Add(file)

        def message(name: str):
            return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(f"externalscaler.{name}"))

        self.ScaledObjectRef = message("ScaledObjectRef")
        self.IsActiveResponse = message("IsActiveResponse")
        self.GetMetricSpecResponse = message("GetMetricSpecResponse")
        self.GetMetricsRequest = message("GetMetricsRequest")
        self.GetMetricsResponse = message("GetMetricsResponse")


_wire: KedaWire | None = None


def wire() -> KedaWire:
    global _wire
    if _wire is None:
        _wire = KedaWire()
    return _wire


class KedaClient:
    """What KEDA calls, on a grpc.aio channel, with KEDA's messages."""

    def __init__(self, target: str, *, credentials=None) -> None:
        import grpc

        self.w = wire()
        self.channel = (grpc.aio.secure_channel(target, credentials) if credentials is not None
                        else grpc.aio.insecure_channel(target))

    def ref(self, pool: str | None = "default", **metadata: str):
        if pool is not None:
            metadata["pool"] = pool
        return self.w.ScaledObjectRef(name="workers", namespace="jobs", scalerMetadata=metadata)

    def _unary(self, method: str, response):
        return self.channel.unary_unary(SERVICE + method, request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=response.FromString)

    async def is_active(self, ref, metadata=()) -> bool:
        call = self._unary("IsActive", self.w.IsActiveResponse)
        return (await call(ref, metadata=metadata, timeout=30)).result

    async def metric_spec(self, ref, metadata=()):
        call = self._unary("GetMetricSpec", self.w.GetMetricSpecResponse)
        return await call(ref, metadata=metadata, timeout=30)

    async def metrics(self, ref, metric_name: str = "", metadata=()):
        request = self.w.GetMetricsRequest(scaledObjectRef=ref, metricName=metric_name)
        call = self._unary("GetMetrics", self.w.GetMetricsResponse)
        return await call(request, metadata=metadata, timeout=30)

    async def desired(self, ref, metadata=()) -> int:
        (value,) = (await self.metrics(ref, metadata=metadata)).metricValues
        assert value.metricValueFloat == value.metricValue
        return int(value.metricValue)

    def stream_is_active(self, ref, metadata=()):
        return self.channel.unary_stream(SERVICE + "StreamIsActive",
                                         request_serializer=lambda m: m.SerializeToString(),
                                         response_deserializer=self.w.IsActiveResponse.FromString)(
            ref, metadata=metadata)

    def stream_metric_spec(self, ref, metadata=()):
        return self.channel.unary_stream(SERVICE + "StreamMetricSpec",
                                         request_serializer=lambda m: m.SerializeToString(),
                                         response_deserializer=self.w.GetMetricSpecResponse.FromString)(
            ref, metadata=metadata)

    async def close(self) -> None:
        await self.channel.close()
