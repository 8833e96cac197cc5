"""Regenerate the gRPC stubs from cronoq.proto (a development step).

    python -m cronoq._proto.generate

writes cronoq_pb2.py, cronoq_pb2.pyi and cronoq_pb2_grpc.py next to the
.proto, with the grpcio-tools of the dev extra (pinned, so that every
checkout generates the same text). tests/test_server_proto.py regenerates
them into a temporary directory and fails when the committed ones differ.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
PROTO = HERE / "cronoq.proto"
GENERATED = ("cronoq_pb2.py", "cronoq_pb2.pyi", "cronoq_pb2_grpc.py")


def generate(out_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Generate the stubs under ``out_dir``; returns file name -> text."""
    from grpc_tools import protoc  # a development dependency only

    root = pathlib.Path(out_dir)
    package = root / "cronoq" / "_proto"
    package.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PROTO, package / "cronoq.proto")
    include = pathlib.Path(protoc.__file__).resolve().parent / "_proto"
    args = ["protoc", f"-I{root}", f"-I{include}", f"--python_out={root}", f"--pyi_out={root}",
            f"--grpc_python_out={root}", "cronoq/_proto/cronoq.proto"]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed on cronoq.proto")
    return {name: (package / name).read_text() for name in GENERATED}


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in generate(tmp).items():
            (HERE / name).write_text(text)
            print(f"wrote {HERE / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
