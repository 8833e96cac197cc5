"""How payloads and outputs are written to a store."""

from __future__ import annotations

import json
from typing import Any, Protocol

__all__ = ["Codec", "JsonCodec"]


class Codec(Protocol):
    def encode(self, value: Any) -> bytes: ...
    def decode(self, data: bytes) -> Any: ...


class JsonCodec:
    """JSON, strictly: values JSON cannot hold exactly (bytes, sets, arbitrary
    objects, NaN) raise ``TypeError``/``ValueError`` at submission. Decoding
    never runs code."""

    # One encoder for all calls: json.dumps with options builds a new one each time.
    _encode = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode

    def encode(self, value: Any) -> bytes:
        try:
            return self._encode(value).encode("utf-8")
        except ValueError as exc:
            raise TypeError(f"the payload cannot be stored as JSON: {exc}") from exc
        except TypeError as exc:
            raise TypeError(f"the payload cannot be stored as JSON: {exc} "
                            f"(pass codec= to the Scheduler for other types)") from exc

    _decode_text = json.JSONDecoder().decode

    def decode(self, data: bytes) -> Any:
        # Straight to the decoder for the UTF-8 this codec writes (recovery decodes
        # millions); anything else goes through json.loads and its encoding detection.
        if type(data) is bytes:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                return json.loads(data)
            if not text.startswith("\ufeff"):
                return self._decode_text(text)
        return json.loads(data)

    def __repr__(self) -> str:
        return "JsonCodec()"
