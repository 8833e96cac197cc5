"""``cronoq.compat``: the legacy ``ElasticPriorityScheduler`` API (see ``cronoq_compat``)."""

from cronoq_compat import (  # noqa: F401  (re-exports)
    LEGACY_POOL, CompatError, DuplicateTaskError, ElasticPriorityScheduler, Priority, QualityMetrics,
    ReservationConflictError, Task, UnknownDependencyError, __all__,
)
