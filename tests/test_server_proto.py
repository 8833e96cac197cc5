"""The generated stubs in cronoq._proto match cronoq.proto, and the API keeps
the names and numbers that other languages' stubs rely on."""

from __future__ import annotations

import pathlib

from cronoq._proto import PROTO_PATH, PROTOCOL_VERSION, cronoq_pb2, proto_text
from cronoq._proto.generate import GENERATED, generate


def test_committed_stubs_are_those_the_proto_generates(tmp_path):
    fresh = generate(tmp_path)
    here = PROTO_PATH.parent
    stale = [name for name in GENERATED if (here / name).read_text() != fresh[name]]
    assert not stale, (f"cronoq/_proto/{', '.join(stale)} differ from what cronoq.proto generates: "
                       "run python -m cronoq._proto.generate and commit the result")


def test_a_changed_proto_would_be_caught(tmp_path):
    # The check above compares real output: a proto with one more field generates other text.
    original = generate(tmp_path / "a")["cronoq_pb2.py"]
    changed = tmp_path / "b" / "cronoq" / "_proto"
    changed.mkdir(parents=True)
    text = PROTO_PATH.read_text().replace("message SetSlots {\n  uint32 slots = 1;\n}",
                                          "message SetSlots {\n  uint32 slots = 1;\n  bool extra = 2;\n}")
    assert text != PROTO_PATH.read_text()
    import shutil
    from grpc_tools import protoc
    (changed / "cronoq.proto").write_text(text)
    include = pathlib.Path(protoc.__file__).resolve().parent / "_proto"
    root = tmp_path / "b"
    assert protoc.main(["protoc", f"-I{root}", f"-I{include}", f"--python_out={root}",
                        "cronoq/_proto/cronoq.proto"]) == 0
    assert (changed / "cronoq_pb2.py").read_text() != original
    shutil.rmtree(root)


def test_package_services_and_protocol_version():
    text = proto_text()
    assert "package cronoq.v1;" in text
    names = {s.full_name for s in cronoq_pb2.DESCRIPTOR.services_by_name.values()}
    assert names == {"cronoq.v1.Tasks", "cronoq.v1.Workers", "cronoq.v1.Admin"}
    tasks = cronoq_pb2.DESCRIPTOR.services_by_name["Tasks"]
    assert [m.name for m in tasks.methods] == ["Submit", "SubmitBatch", "Get", "Wait", "Cancel",
                                               "ListTasks", "Watch", "Explain", "Dependents"]
    admin = cronoq_pb2.DESCRIPTOR.services_by_name["Admin"]
    assert [m.name for m in admin.methods] == ["ListWorkers", "ListRecurring", "AddRecurring",
                                               "RemoveRecurring", "Snapshot", "History"]
    work = cronoq_pb2.DESCRIPTOR.services_by_name["Workers"].methods_by_name["Work"]
    assert work.client_streaming and work.server_streaming
    assert PROTOCOL_VERSION == 3
    # Enum zero values are the defaults' placeholders.
    for enum in ("Priority", "EdgeCond", "MissPolicy", "Overlap", "TaskStatus"):
        zero = cronoq_pb2.DESCRIPTOR.enum_types_by_name[enum].values_by_number[0]
        assert zero.name.endswith("_UNSPECIFIED"), enum
