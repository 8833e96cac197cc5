"""Which scalers are due, without I/O: each scaler is reconciled every
``intervalSeconds`` of its own spec (the operator's one loop asks ``due``
and sleeps until ``next_due``). A changed spec is reconciled at once."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .spec import DEFAULT_INTERVAL_S

__all__ = ["ScalerTable", "Entry"]

Key = tuple[str, str]      # (namespace, name)


@dataclass(slots=True)
class Entry:
    spec: Mapping[str, Any]
    generation: int | None
    due: float
    running: bool = field(default=False)
    changed_while_running: bool = field(default=False)


def _interval(spec: Mapping[str, Any]) -> float:
    value = spec.get("intervalSeconds", DEFAULT_INTERVAL_S)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return float(DEFAULT_INTERVAL_S)     # the invalid spec is reported by the pass itself
    return float(value)


class ScalerTable:
    def __init__(self) -> None:
        self._entries: dict[Key, Entry] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def upsert(self, key: Key, spec: Mapping[str, Any], generation: int | None, now: float) -> None:
        entry = self._entries.get(key)
        if entry is None:
            self._entries[key] = Entry(dict(spec), generation, due=now)
        elif entry.spec != spec:
            entry.spec, entry.generation, entry.due = dict(spec), generation, now
            entry.changed_while_running = entry.running

    def remove(self, key: Key) -> None:
        self._entries.pop(key, None)

    def due(self, now: float) -> list[tuple[Key, Mapping[str, Any], int | None]]:
        """The scalers to reconcile now; each is marked running until ``done``."""
        ready = [(key, entry) for key, entry in self._entries.items() if not entry.running and entry.due <= now]
        for _, entry in ready:
            entry.running = True
        return [(key, entry.spec, entry.generation) for key, entry in ready]

    def done(self, key: Key, now: float) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.running = False
            # A spec changed during the pass is reconciled again at once.
            entry.due = now if entry.changed_while_running else now + _interval(entry.spec)
            entry.changed_while_running = False

    def next_due(self) -> float | None:
        waiting = [entry.due for entry in self._entries.values() if not entry.running]
        return min(waiting) if waiting else None
