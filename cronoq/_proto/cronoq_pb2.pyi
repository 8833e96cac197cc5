from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Priority(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PRIORITY_UNSPECIFIED: _ClassVar[Priority]
    PRIORITY_CRITICAL: _ClassVar[Priority]
    PRIORITY_HIGH: _ClassVar[Priority]
    PRIORITY_NORMAL: _ClassVar[Priority]
    PRIORITY_LOW: _ClassVar[Priority]

class EdgeCond(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EDGE_COND_UNSPECIFIED: _ClassVar[EdgeCond]
    EDGE_COND_ON_SUCCESS: _ClassVar[EdgeCond]
    EDGE_COND_ON_FAILURE: _ClassVar[EdgeCond]
    EDGE_COND_ON_COMPLETE: _ClassVar[EdgeCond]

class MissPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MISS_POLICY_UNSPECIFIED: _ClassVar[MissPolicy]
    MISS_POLICY_RUN_LATE: _ClassVar[MissPolicy]
    MISS_POLICY_SKIP: _ClassVar[MissPolicy]
    MISS_POLICY_FAIL: _ClassVar[MissPolicy]

class Overlap(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERLAP_UNSPECIFIED: _ClassVar[Overlap]
    OVERLAP_SKIP: _ClassVar[Overlap]
    OVERLAP_ALLOW: _ClassVar[Overlap]
    OVERLAP_QUEUE: _ClassVar[Overlap]
    OVERLAP_QUEUE_ON_SUCCESS: _ClassVar[Overlap]

class TaskStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TASK_STATUS_UNSPECIFIED: _ClassVar[TaskStatus]
    TASK_STATUS_BLOCKED: _ClassVar[TaskStatus]
    TASK_STATUS_SCHEDULED: _ClassVar[TaskStatus]
    TASK_STATUS_READY: _ClassVar[TaskStatus]
    TASK_STATUS_RUNNING: _ClassVar[TaskStatus]
    TASK_STATUS_RETRYING: _ClassVar[TaskStatus]
    TASK_STATUS_SUCCEEDED: _ClassVar[TaskStatus]
    TASK_STATUS_FAILED: _ClassVar[TaskStatus]
    TASK_STATUS_DEAD_LETTERED: _ClassVar[TaskStatus]
    TASK_STATUS_CANCELLED: _ClassVar[TaskStatus]
    TASK_STATUS_SKIPPED: _ClassVar[TaskStatus]
    TASK_STATUS_MISSED: _ClassVar[TaskStatus]
    TASK_STATUS_SHED: _ClassVar[TaskStatus]

class AbortReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ABORT_REASON_UNSPECIFIED: _ClassVar[AbortReason]
    ABORT_REASON_CANCELLED: _ClassVar[AbortReason]
    ABORT_REASON_TIMEOUT: _ClassVar[AbortReason]
    ABORT_REASON_LEASE_EXPIRED: _ClassVar[AbortReason]
    ABORT_REASON_SHUTDOWN: _ClassVar[AbortReason]

class WorkerHealth(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKER_HEALTH_UNSPECIFIED: _ClassVar[WorkerHealth]
    WORKER_HEALTH_HEALTHY: _ClassVar[WorkerHealth]
    WORKER_HEALTH_SUSPECT: _ClassVar[WorkerHealth]
PRIORITY_UNSPECIFIED: Priority
PRIORITY_CRITICAL: Priority
PRIORITY_HIGH: Priority
PRIORITY_NORMAL: Priority
PRIORITY_LOW: Priority
EDGE_COND_UNSPECIFIED: EdgeCond
EDGE_COND_ON_SUCCESS: EdgeCond
EDGE_COND_ON_FAILURE: EdgeCond
EDGE_COND_ON_COMPLETE: EdgeCond
MISS_POLICY_UNSPECIFIED: MissPolicy
MISS_POLICY_RUN_LATE: MissPolicy
MISS_POLICY_SKIP: MissPolicy
MISS_POLICY_FAIL: MissPolicy
OVERLAP_UNSPECIFIED: Overlap
OVERLAP_SKIP: Overlap
OVERLAP_ALLOW: Overlap
OVERLAP_QUEUE: Overlap
OVERLAP_QUEUE_ON_SUCCESS: Overlap
TASK_STATUS_UNSPECIFIED: TaskStatus
TASK_STATUS_BLOCKED: TaskStatus
TASK_STATUS_SCHEDULED: TaskStatus
TASK_STATUS_READY: TaskStatus
TASK_STATUS_RUNNING: TaskStatus
TASK_STATUS_RETRYING: TaskStatus
TASK_STATUS_SUCCEEDED: TaskStatus
TASK_STATUS_FAILED: TaskStatus
TASK_STATUS_DEAD_LETTERED: TaskStatus
TASK_STATUS_CANCELLED: TaskStatus
TASK_STATUS_SKIPPED: TaskStatus
TASK_STATUS_MISSED: TaskStatus
TASK_STATUS_SHED: TaskStatus
ABORT_REASON_UNSPECIFIED: AbortReason
ABORT_REASON_CANCELLED: AbortReason
ABORT_REASON_TIMEOUT: AbortReason
ABORT_REASON_LEASE_EXPIRED: AbortReason
ABORT_REASON_SHUTDOWN: AbortReason
WORKER_HEALTH_UNSPECIFIED: WorkerHealth
WORKER_HEALTH_HEALTHY: WorkerHealth
WORKER_HEALTH_SUSPECT: WorkerHealth

class TaskRef(_message.Message):
    __slots__ = ("id", "key")
    ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    id: int
    key: str
    def __init__(self, id: _Optional[int] = ..., key: _Optional[str] = ...) -> None: ...

class Dep(_message.Message):
    __slots__ = ("ref", "cond")
    REF_FIELD_NUMBER: _ClassVar[int]
    COND_FIELD_NUMBER: _ClassVar[int]
    ref: TaskRef
    cond: EdgeCond
    def __init__(self, ref: _Optional[_Union[TaskRef, _Mapping]] = ..., cond: _Optional[_Union[EdgeCond, str]] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "initial_backoff_s", "multiplier", "max_backoff_s", "jitter")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_BACKOFF_S_FIELD_NUMBER: _ClassVar[int]
    MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    MAX_BACKOFF_S_FIELD_NUMBER: _ClassVar[int]
    JITTER_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    initial_backoff_s: float
    multiplier: float
    max_backoff_s: float
    jitter: bool
    def __init__(self, max_attempts: _Optional[int] = ..., initial_backoff_s: _Optional[float] = ..., multiplier: _Optional[float] = ..., max_backoff_s: _Optional[float] = ..., jitter: _Optional[bool] = ...) -> None: ...

class TaskSpec(_message.Message):
    __slots__ = ("payload", "content_type", "pool", "kind", "priority", "key", "tenant", "deadline_in_s", "deadline_unix_ns", "start_in_s", "start_unix_ns", "tolerance_s", "on_miss", "timeout_s", "duration_hint_s", "retry", "resources", "after", "deps", "tags", "labels", "stages")
    class ResourcesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_IN_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    START_IN_S_FIELD_NUMBER: _ClassVar[int]
    START_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    TOLERANCE_S_FIELD_NUMBER: _ClassVar[int]
    ON_MISS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    DURATION_HINT_S_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    DEPS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    content_type: str
    pool: str
    kind: str
    priority: Priority
    key: str
    tenant: str
    deadline_in_s: float
    deadline_unix_ns: int
    start_in_s: float
    start_unix_ns: int
    tolerance_s: float
    on_miss: MissPolicy
    timeout_s: float
    duration_hint_s: float
    retry: RetryPolicy
    resources: _containers.ScalarMap[str, int]
    after: _containers.RepeatedCompositeFieldContainer[TaskRef]
    deps: _containers.RepeatedCompositeFieldContainer[Dep]
    tags: _containers.ScalarMap[str, str]
    labels: _containers.ScalarMap[str, str]
    stages: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., pool: _Optional[str] = ..., kind: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., key: _Optional[str] = ..., tenant: _Optional[str] = ..., deadline_in_s: _Optional[float] = ..., deadline_unix_ns: _Optional[int] = ..., start_in_s: _Optional[float] = ..., start_unix_ns: _Optional[int] = ..., tolerance_s: _Optional[float] = ..., on_miss: _Optional[_Union[MissPolicy, str]] = ..., timeout_s: _Optional[float] = ..., duration_hint_s: _Optional[float] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., resources: _Optional[_Mapping[str, int]] = ..., after: _Optional[_Iterable[_Union[TaskRef, _Mapping]]] = ..., deps: _Optional[_Iterable[_Union[Dep, _Mapping]]] = ..., tags: _Optional[_Mapping[str, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., stages: _Optional[_Iterable[str]] = ...) -> None: ...

class TaskResult(_message.Message):
    __slots__ = ("id", "status", "output", "content_type", "message", "output_available")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    id: int
    status: TaskStatus
    output: bytes
    content_type: str
    message: str
    output_available: bool
    def __init__(self, id: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., output: _Optional[bytes] = ..., content_type: _Optional[str] = ..., message: _Optional[str] = ..., output_available: _Optional[bool] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("task", "wait", "wait_timeout_s")
    TASK_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    task: TaskSpec
    wait: bool
    wait_timeout_s: float
    def __init__(self, task: _Optional[_Union[TaskSpec, _Mapping]] = ..., wait: _Optional[bool] = ..., wait_timeout_s: _Optional[float] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("id", "duplicate", "result")
    ID_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    id: int
    duplicate: bool
    result: TaskResult
    def __init__(self, id: _Optional[int] = ..., duplicate: _Optional[bool] = ..., result: _Optional[_Union[TaskResult, _Mapping]] = ...) -> None: ...

class SubmitBatchRequest(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskSpec]
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskSpec, _Mapping]]] = ...) -> None: ...

class SubmitBatchResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[SubmitResponse]
    def __init__(self, tasks: _Optional[_Iterable[_Union[SubmitResponse, _Mapping]]] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ...) -> None: ...

class TaskInfo(_message.Message):
    __slots__ = ("id", "status", "pool", "key", "kind", "attempt", "max_attempts", "message", "output_available", "created_unix_ns", "started_unix_ns", "finished_unix_ns", "priority", "tenant", "tags", "deps", "attempts", "stages", "checkpoints", "labels", "payload_preview", "payload_size", "content_type")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    DEPS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_PREVIEW_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    id: int
    status: TaskStatus
    pool: str
    key: str
    kind: str
    attempt: int
    max_attempts: int
    message: str
    output_available: bool
    created_unix_ns: int
    started_unix_ns: int
    finished_unix_ns: int
    priority: Priority
    tenant: str
    tags: _containers.ScalarMap[str, str]
    deps: _containers.RepeatedCompositeFieldContainer[Dep]
    attempts: _containers.RepeatedCompositeFieldContainer[Attempt]
    stages: _containers.RepeatedScalarFieldContainer[str]
    checkpoints: _containers.RepeatedCompositeFieldContainer[StageCheckpoint]
    labels: _containers.ScalarMap[str, str]
    payload_preview: bytes
    payload_size: int
    content_type: str
    def __init__(self, id: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., pool: _Optional[str] = ..., key: _Optional[str] = ..., kind: _Optional[str] = ..., attempt: _Optional[int] = ..., max_attempts: _Optional[int] = ..., message: _Optional[str] = ..., output_available: _Optional[bool] = ..., created_unix_ns: _Optional[int] = ..., started_unix_ns: _Optional[int] = ..., finished_unix_ns: _Optional[int] = ..., priority: _Optional[_Union[Priority, str]] = ..., tenant: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ..., deps: _Optional[_Iterable[_Union[Dep, _Mapping]]] = ..., attempts: _Optional[_Iterable[_Union[Attempt, _Mapping]]] = ..., stages: _Optional[_Iterable[str]] = ..., checkpoints: _Optional[_Iterable[_Union[StageCheckpoint, _Mapping]]] = ..., labels: _Optional[_Mapping[str, str]] = ..., payload_preview: _Optional[bytes] = ..., payload_size: _Optional[int] = ..., content_type: _Optional[str] = ...) -> None: ...

class Attempt(_message.Message):
    __slots__ = ("attempt", "status", "message", "started_unix_ns", "ended_unix_ns", "worker_id", "worker_name", "traceback")
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STARTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    ENDED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    attempt: int
    status: TaskStatus
    message: str
    started_unix_ns: int
    ended_unix_ns: int
    worker_id: int
    worker_name: str
    traceback: str
    def __init__(self, attempt: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., message: _Optional[str] = ..., started_unix_ns: _Optional[int] = ..., ended_unix_ns: _Optional[int] = ..., worker_id: _Optional[int] = ..., worker_name: _Optional[str] = ..., traceback: _Optional[str] = ...) -> None: ...

class StageCheckpoint(_message.Message):
    __slots__ = ("stage", "data", "content_type", "attempt", "saved_unix_ns")
    STAGE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    SAVED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    stage: str
    data: bytes
    content_type: str
    attempt: int
    saved_unix_ns: int
    def __init__(self, stage: _Optional[str] = ..., data: _Optional[bytes] = ..., content_type: _Optional[str] = ..., attempt: _Optional[int] = ..., saved_unix_ns: _Optional[int] = ...) -> None: ...

class ExplainRequest(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ...) -> None: ...

class WaitReason(_message.Message):
    __slots__ = ("code", "message", "detail_json")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_JSON_FIELD_NUMBER: _ClassVar[int]
    code: str
    message: str
    detail_json: str
    def __init__(self, code: _Optional[str] = ..., message: _Optional[str] = ..., detail_json: _Optional[str] = ...) -> None: ...

class Explanation(_message.Message):
    __slots__ = ("id", "status", "pool", "priority", "key", "tenant", "summary", "score", "position", "queued", "reasons", "at_unix_ns")
    ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    REASONS_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    id: int
    status: TaskStatus
    pool: str
    priority: Priority
    key: str
    tenant: str
    summary: str
    score: float
    position: int
    queued: int
    reasons: _containers.RepeatedCompositeFieldContainer[WaitReason]
    at_unix_ns: int
    def __init__(self, id: _Optional[int] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., pool: _Optional[str] = ..., priority: _Optional[_Union[Priority, str]] = ..., key: _Optional[str] = ..., tenant: _Optional[str] = ..., summary: _Optional[str] = ..., score: _Optional[float] = ..., position: _Optional[int] = ..., queued: _Optional[int] = ..., reasons: _Optional[_Iterable[_Union[WaitReason, _Mapping]]] = ..., at_unix_ns: _Optional[int] = ...) -> None: ...

class WaitRequest(_message.Message):
    __slots__ = ("task", "timeout_s")
    TASK_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    timeout_s: float
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., timeout_s: _Optional[float] = ...) -> None: ...

class CancelRequest(_message.Message):
    __slots__ = ("task",)
    TASK_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ...) -> None: ...

class CancelResponse(_message.Message):
    __slots__ = ("cancelled",)
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    cancelled: bool
    def __init__(self, cancelled: _Optional[bool] = ...) -> None: ...

class ListTasksRequest(_message.Message):
    __slots__ = ("pools", "statuses", "after", "limit", "query", "newest_first", "before")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    STATUSES_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    NEWEST_FIRST_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedScalarFieldContainer[str]
    statuses: _containers.RepeatedScalarFieldContainer[TaskStatus]
    after: int
    limit: int
    query: str
    newest_first: bool
    before: int
    def __init__(self, pools: _Optional[_Iterable[str]] = ..., statuses: _Optional[_Iterable[_Union[TaskStatus, str]]] = ..., after: _Optional[int] = ..., limit: _Optional[int] = ..., query: _Optional[str] = ..., newest_first: _Optional[bool] = ..., before: _Optional[int] = ...) -> None: ...

class ListTasksResponse(_message.Message):
    __slots__ = ("tasks", "next_after", "unavailable_shards", "next_before")
    TASKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_AFTER_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedCompositeFieldContainer[TaskInfo]
    next_after: int
    unavailable_shards: _containers.RepeatedScalarFieldContainer[str]
    next_before: int
    def __init__(self, tasks: _Optional[_Iterable[_Union[TaskInfo, _Mapping]]] = ..., next_after: _Optional[int] = ..., unavailable_shards: _Optional[_Iterable[str]] = ..., next_before: _Optional[int] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("pools", "terminal_only", "recent")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    TERMINAL_ONLY_FIELD_NUMBER: _ClassVar[int]
    RECENT_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedScalarFieldContainer[str]
    terminal_only: bool
    recent: int
    def __init__(self, pools: _Optional[_Iterable[str]] = ..., terminal_only: _Optional[bool] = ..., recent: _Optional[int] = ...) -> None: ...

class StatusEvent(_message.Message):
    __slots__ = ("id", "pool", "key", "status", "attempt", "at_unix_ns", "message", "stage", "max_attempts")
    ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    id: int
    pool: str
    key: str
    status: TaskStatus
    attempt: int
    at_unix_ns: int
    message: str
    stage: str
    max_attempts: int
    def __init__(self, id: _Optional[int] = ..., pool: _Optional[str] = ..., key: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., attempt: _Optional[int] = ..., at_unix_ns: _Optional[int] = ..., message: _Optional[str] = ..., stage: _Optional[str] = ..., max_attempts: _Optional[int] = ...) -> None: ...

class DependentsRequest(_message.Message):
    __slots__ = ("task", "depth", "limit")
    TASK_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    task: TaskRef
    depth: int
    limit: int
    def __init__(self, task: _Optional[_Union[TaskRef, _Mapping]] = ..., depth: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class Dependent(_message.Message):
    __slots__ = ("id", "key", "status", "pool", "depth", "depends_on", "deps")
    ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    DEPTH_FIELD_NUMBER: _ClassVar[int]
    DEPENDS_ON_FIELD_NUMBER: _ClassVar[int]
    DEPS_FIELD_NUMBER: _ClassVar[int]
    id: int
    key: str
    status: TaskStatus
    pool: str
    depth: int
    depends_on: _containers.RepeatedScalarFieldContainer[int]
    deps: _containers.RepeatedCompositeFieldContainer[Dep]
    def __init__(self, id: _Optional[int] = ..., key: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., pool: _Optional[str] = ..., depth: _Optional[int] = ..., depends_on: _Optional[_Iterable[int]] = ..., deps: _Optional[_Iterable[_Union[Dep, _Mapping]]] = ...) -> None: ...

class DependentsResponse(_message.Message):
    __slots__ = ("id", "key", "status", "dependents", "truncated", "unavailable_shards")
    ID_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    DEPENDENTS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    id: int
    key: str
    status: TaskStatus
    dependents: _containers.RepeatedCompositeFieldContainer[Dependent]
    truncated: bool
    unavailable_shards: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[int] = ..., key: _Optional[str] = ..., status: _Optional[_Union[TaskStatus, str]] = ..., dependents: _Optional[_Iterable[_Union[Dependent, _Mapping]]] = ..., truncated: _Optional[bool] = ..., unavailable_shards: _Optional[_Iterable[str]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("pool", "slots", "worker_name", "protocol_version", "labels", "accept_batches", "accept_checkpoints")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    POOL_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_BATCHES_FIELD_NUMBER: _ClassVar[int]
    ACCEPT_CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    pool: str
    slots: int
    worker_name: str
    protocol_version: int
    labels: _containers.ScalarMap[str, str]
    accept_batches: bool
    accept_checkpoints: bool
    def __init__(self, pool: _Optional[str] = ..., slots: _Optional[int] = ..., worker_name: _Optional[str] = ..., protocol_version: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., accept_batches: _Optional[bool] = ..., accept_checkpoints: _Optional[bool] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("lease",)
    LEASE_FIELD_NUMBER: _ClassVar[int]
    lease: int
    def __init__(self, lease: _Optional[int] = ...) -> None: ...

class Complete(_message.Message):
    __slots__ = ("lease", "output", "content_type")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    lease: int
    output: bytes
    content_type: str
    def __init__(self, lease: _Optional[int] = ..., output: _Optional[bytes] = ..., content_type: _Optional[str] = ...) -> None: ...

class Fail(_message.Message):
    __slots__ = ("lease", "message", "permanent", "retry_after_s", "traceback")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PERMANENT_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    TRACEBACK_FIELD_NUMBER: _ClassVar[int]
    lease: int
    message: str
    permanent: bool
    retry_after_s: float
    traceback: str
    def __init__(self, lease: _Optional[int] = ..., message: _Optional[str] = ..., permanent: _Optional[bool] = ..., retry_after_s: _Optional[float] = ..., traceback: _Optional[str] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("lease", "reason")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    lease: int
    reason: str
    def __init__(self, lease: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class Cancelled(_message.Message):
    __slots__ = ("lease", "message")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    lease: int
    message: str
    def __init__(self, lease: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class SetSlots(_message.Message):
    __slots__ = ("slots",)
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    slots: int
    def __init__(self, slots: _Optional[int] = ...) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("lease", "stage", "data", "content_type", "seq")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    lease: int
    stage: str
    data: bytes
    content_type: str
    seq: int
    def __init__(self, lease: _Optional[int] = ..., stage: _Optional[str] = ..., data: _Optional[bytes] = ..., content_type: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class WorkerBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[WorkerMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[WorkerMessage, _Mapping]]] = ...) -> None: ...

class WorkerMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "complete", "fail", "nack", "cancelled", "set_slots", "batch", "checkpoint")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    FAIL_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    CANCELLED_FIELD_NUMBER: _ClassVar[int]
    SET_SLOTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    complete: Complete
    fail: Fail
    nack: Nack
    cancelled: Cancelled
    set_slots: SetSlots
    batch: WorkerBatch
    checkpoint: Checkpoint
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., complete: _Optional[_Union[Complete, _Mapping]] = ..., fail: _Optional[_Union[Fail, _Mapping]] = ..., nack: _Optional[_Union[Nack, _Mapping]] = ..., cancelled: _Optional[_Union[Cancelled, _Mapping]] = ..., set_slots: _Optional[_Union[SetSlots, _Mapping]] = ..., batch: _Optional[_Union[WorkerBatch, _Mapping]] = ..., checkpoint: _Optional[_Union[Checkpoint, _Mapping]] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("worker_id", "lease_ttl_s", "slots", "protocol_version", "max_message_bytes", "checkpoints")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_S_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    worker_id: int
    lease_ttl_s: float
    slots: int
    protocol_version: int
    max_message_bytes: int
    checkpoints: bool
    def __init__(self, worker_id: _Optional[int] = ..., lease_ttl_s: _Optional[float] = ..., slots: _Optional[int] = ..., protocol_version: _Optional[int] = ..., max_message_bytes: _Optional[int] = ..., checkpoints: _Optional[bool] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease", "task_id", "attempt", "pool", "payload", "content_type", "kind", "key", "tags", "timeout_s", "deadline_unix_ns", "priority", "tenant", "labels", "stages", "checkpoints")
    class TagsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LEASE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    CONTENT_TYPE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    STAGES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINTS_FIELD_NUMBER: _ClassVar[int]
    lease: int
    task_id: int
    attempt: int
    pool: str
    payload: bytes
    content_type: str
    kind: str
    key: str
    tags: _containers.ScalarMap[str, str]
    timeout_s: float
    deadline_unix_ns: int
    priority: Priority
    tenant: str
    labels: _containers.ScalarMap[str, str]
    stages: _containers.RepeatedScalarFieldContainer[str]
    checkpoints: _containers.RepeatedCompositeFieldContainer[StageCheckpoint]
    def __init__(self, lease: _Optional[int] = ..., task_id: _Optional[int] = ..., attempt: _Optional[int] = ..., pool: _Optional[str] = ..., payload: _Optional[bytes] = ..., content_type: _Optional[str] = ..., kind: _Optional[str] = ..., key: _Optional[str] = ..., tags: _Optional[_Mapping[str, str]] = ..., timeout_s: _Optional[float] = ..., deadline_unix_ns: _Optional[int] = ..., priority: _Optional[_Union[Priority, str]] = ..., tenant: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., stages: _Optional[_Iterable[str]] = ..., checkpoints: _Optional[_Iterable[_Union[StageCheckpoint, _Mapping]]] = ...) -> None: ...

class Abort(_message.Message):
    __slots__ = ("lease", "reason", "code")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    lease: int
    reason: str
    code: AbortReason
    def __init__(self, lease: _Optional[int] = ..., reason: _Optional[str] = ..., code: _Optional[_Union[AbortReason, str]] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("reason", "not_leader")
    REASON_FIELD_NUMBER: _ClassVar[int]
    NOT_LEADER_FIELD_NUMBER: _ClassVar[int]
    reason: str
    not_leader: bool
    def __init__(self, reason: _Optional[str] = ..., not_leader: _Optional[bool] = ...) -> None: ...

class CheckpointSaved(_message.Message):
    __slots__ = ("lease", "stage", "seq", "error")
    LEASE_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    lease: int
    stage: str
    seq: int
    error: str
    def __init__(self, lease: _Optional[int] = ..., stage: _Optional[str] = ..., seq: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class SlotsGranted(_message.Message):
    __slots__ = ("slots",)
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    slots: int
    def __init__(self, slots: _Optional[int] = ...) -> None: ...

class ServerBatch(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ServerMessage]
    def __init__(self, messages: _Optional[_Iterable[_Union[ServerMessage, _Mapping]]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("registered", "lease", "abort", "shutdown", "slots_granted", "batch", "checkpoint_saved")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    SLOTS_GRANTED_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SAVED_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    lease: Lease
    abort: Abort
    shutdown: Shutdown
    slots_granted: SlotsGranted
    batch: ServerBatch
    checkpoint_saved: CheckpointSaved
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., abort: _Optional[_Union[Abort, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ..., slots_granted: _Optional[_Union[SlotsGranted, _Mapping]] = ..., batch: _Optional[_Union[ServerBatch, _Mapping]] = ..., checkpoint_saved: _Optional[_Union[CheckpointSaved, _Mapping]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ("pools",)
    POOLS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pools: _Optional[_Iterable[str]] = ...) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("id", "name", "pool", "labels", "slots", "busy", "connected_unix_ns", "health", "lease_expiries", "last_seen_unix_ns")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRIES_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    id: int
    name: str
    pool: str
    labels: _containers.ScalarMap[str, str]
    slots: int
    busy: int
    connected_unix_ns: int
    health: WorkerHealth
    lease_expiries: int
    last_seen_unix_ns: int
    def __init__(self, id: _Optional[int] = ..., name: _Optional[str] = ..., pool: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., slots: _Optional[int] = ..., busy: _Optional[int] = ..., connected_unix_ns: _Optional[int] = ..., health: _Optional[_Union[WorkerHealth, str]] = ..., lease_expiries: _Optional[int] = ..., last_seen_unix_ns: _Optional[int] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers", "unavailable_shards")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerInfo]
    unavailable_shards: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerInfo, _Mapping]]] = ..., unavailable_shards: _Optional[_Iterable[str]] = ...) -> None: ...

class ListRecurringRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RecurringInfo(_message.Message):
    __slots__ = ("name", "cron", "tz", "pool", "kind", "overlap", "next_unix_ns", "last_task_id")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TZ_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    NEXT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    LAST_TASK_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    cron: str
    tz: str
    pool: str
    kind: str
    overlap: Overlap
    next_unix_ns: int
    last_task_id: int
    def __init__(self, name: _Optional[str] = ..., cron: _Optional[str] = ..., tz: _Optional[str] = ..., pool: _Optional[str] = ..., kind: _Optional[str] = ..., overlap: _Optional[_Union[Overlap, str]] = ..., next_unix_ns: _Optional[int] = ..., last_task_id: _Optional[int] = ...) -> None: ...

class ListRecurringResponse(_message.Message):
    __slots__ = ("schedules", "unavailable_shards")
    SCHEDULES_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    schedules: _containers.RepeatedCompositeFieldContainer[RecurringInfo]
    unavailable_shards: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, schedules: _Optional[_Iterable[_Union[RecurringInfo, _Mapping]]] = ..., unavailable_shards: _Optional[_Iterable[str]] = ...) -> None: ...

class AddRecurringRequest(_message.Message):
    __slots__ = ("name", "cron", "tz", "template", "overlap")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CRON_FIELD_NUMBER: _ClassVar[int]
    TZ_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    name: str
    cron: str
    tz: str
    template: TaskSpec
    overlap: Overlap
    def __init__(self, name: _Optional[str] = ..., cron: _Optional[str] = ..., tz: _Optional[str] = ..., template: _Optional[_Union[TaskSpec, _Mapping]] = ..., overlap: _Optional[_Union[Overlap, str]] = ...) -> None: ...

class AddRecurringResponse(_message.Message):
    __slots__ = ("next_unix_ns",)
    NEXT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    next_unix_ns: int
    def __init__(self, next_unix_ns: _Optional[int] = ...) -> None: ...

class RemoveRecurringRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveRecurringResponse(_message.Message):
    __slots__ = ("removed",)
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    removed: bool
    def __init__(self, removed: _Optional[bool] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerGroup(_message.Message):
    __slots__ = ("labels", "capacity", "busy")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    labels: _containers.ScalarMap[str, str]
    capacity: int
    busy: int
    def __init__(self, labels: _Optional[_Mapping[str, str]] = ..., capacity: _Optional[int] = ..., busy: _Optional[int] = ...) -> None: ...

class PoolSnapshot(_message.Message):
    __slots__ = ("name", "capacity", "busy", "held", "desired", "pending", "pending_by_class", "reservations", "dispatched", "succeeded", "failed", "priority_adherence", "fixed_start_hit_rate", "utilization", "schedule_efficiency", "wait_p50_s", "wait_p90_s", "wait_p99_s", "cost", "workers_connected", "groups")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    PENDING_BY_CLASS_FIELD_NUMBER: _ClassVar[int]
    RESERVATIONS_FIELD_NUMBER: _ClassVar[int]
    DISPATCHED_FIELD_NUMBER: _ClassVar[int]
    SUCCEEDED_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_ADHERENCE_FIELD_NUMBER: _ClassVar[int]
    FIXED_START_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_FIELD_NUMBER: _ClassVar[int]
    SCHEDULE_EFFICIENCY_FIELD_NUMBER: _ClassVar[int]
    WAIT_P50_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_P90_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_P99_S_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    WORKERS_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    name: str
    capacity: int
    busy: int
    held: int
    desired: int
    pending: int
    pending_by_class: _containers.RepeatedScalarFieldContainer[int]
    reservations: int
    dispatched: int
    succeeded: int
    failed: int
    priority_adherence: float
    fixed_start_hit_rate: float
    utilization: float
    schedule_efficiency: float
    wait_p50_s: float
    wait_p90_s: float
    wait_p99_s: float
    cost: float
    workers_connected: int
    groups: _containers.RepeatedCompositeFieldContainer[WorkerGroup]
    def __init__(self, name: _Optional[str] = ..., capacity: _Optional[int] = ..., busy: _Optional[int] = ..., held: _Optional[int] = ..., desired: _Optional[int] = ..., pending: _Optional[int] = ..., pending_by_class: _Optional[_Iterable[int]] = ..., reservations: _Optional[int] = ..., dispatched: _Optional[int] = ..., succeeded: _Optional[int] = ..., failed: _Optional[int] = ..., priority_adherence: _Optional[float] = ..., fixed_start_hit_rate: _Optional[float] = ..., utilization: _Optional[float] = ..., schedule_efficiency: _Optional[float] = ..., wait_p50_s: _Optional[float] = ..., wait_p90_s: _Optional[float] = ..., wait_p99_s: _Optional[float] = ..., cost: _Optional[float] = ..., workers_connected: _Optional[int] = ..., groups: _Optional[_Iterable[_Union[WorkerGroup, _Mapping]]] = ...) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("pools", "live_tasks", "running", "pending", "workers_connected", "unavailable_shards", "totals", "at_unix_ns", "metrics_window_s", "environment", "region")
    class TotalsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    POOLS_FIELD_NUMBER: _ClassVar[int]
    LIVE_TASKS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    WORKERS_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    TOTALS_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    METRICS_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolSnapshot]
    live_tasks: int
    running: int
    pending: int
    workers_connected: int
    unavailable_shards: _containers.RepeatedScalarFieldContainer[str]
    totals: _containers.ScalarMap[str, int]
    at_unix_ns: int
    metrics_window_s: float
    environment: str
    region: str
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolSnapshot, _Mapping]]] = ..., live_tasks: _Optional[int] = ..., running: _Optional[int] = ..., pending: _Optional[int] = ..., workers_connected: _Optional[int] = ..., unavailable_shards: _Optional[_Iterable[str]] = ..., totals: _Optional[_Mapping[str, int]] = ..., at_unix_ns: _Optional[int] = ..., metrics_window_s: _Optional[float] = ..., environment: _Optional[str] = ..., region: _Optional[str] = ...) -> None: ...

class HistoryRequest(_message.Message):
    __slots__ = ("pools", "range_s", "points")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    RANGE_S_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedScalarFieldContainer[str]
    range_s: float
    points: int
    def __init__(self, pools: _Optional[_Iterable[str]] = ..., range_s: _Optional[float] = ..., points: _Optional[int] = ...) -> None: ...

class PoolHistory(_message.Message):
    __slots__ = ("name", "t_unix_ms", "capacity", "desired", "busy", "held", "pending", "pending_by_class", "throughput_per_s", "failures_per_s", "wait_p50_s", "wait_p99_s", "wait_p50_s_by_class", "wait_p99_s_by_class", "cost")
    class ByClass(_message.Message):
        __slots__ = ("critical", "high", "normal", "low")
        CRITICAL_FIELD_NUMBER: _ClassVar[int]
        HIGH_FIELD_NUMBER: _ClassVar[int]
        NORMAL_FIELD_NUMBER: _ClassVar[int]
        LOW_FIELD_NUMBER: _ClassVar[int]
        critical: _containers.RepeatedScalarFieldContainer[float]
        high: _containers.RepeatedScalarFieldContainer[float]
        normal: _containers.RepeatedScalarFieldContainer[float]
        low: _containers.RepeatedScalarFieldContainer[float]
        def __init__(self, critical: _Optional[_Iterable[float]] = ..., high: _Optional[_Iterable[float]] = ..., normal: _Optional[_Iterable[float]] = ..., low: _Optional[_Iterable[float]] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    T_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_FIELD_NUMBER: _ClassVar[int]
    DESIRED_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    PENDING_BY_CLASS_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_PER_S_FIELD_NUMBER: _ClassVar[int]
    FAILURES_PER_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_P50_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_P99_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_P50_S_BY_CLASS_FIELD_NUMBER: _ClassVar[int]
    WAIT_P99_S_BY_CLASS_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    name: str
    t_unix_ms: _containers.RepeatedScalarFieldContainer[int]
    capacity: _containers.RepeatedScalarFieldContainer[float]
    desired: _containers.RepeatedScalarFieldContainer[float]
    busy: _containers.RepeatedScalarFieldContainer[float]
    held: _containers.RepeatedScalarFieldContainer[float]
    pending: _containers.RepeatedScalarFieldContainer[float]
    pending_by_class: PoolHistory.ByClass
    throughput_per_s: _containers.RepeatedScalarFieldContainer[float]
    failures_per_s: _containers.RepeatedScalarFieldContainer[float]
    wait_p50_s: _containers.RepeatedScalarFieldContainer[float]
    wait_p99_s: _containers.RepeatedScalarFieldContainer[float]
    wait_p50_s_by_class: PoolHistory.ByClass
    wait_p99_s_by_class: PoolHistory.ByClass
    cost: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, name: _Optional[str] = ..., t_unix_ms: _Optional[_Iterable[int]] = ..., capacity: _Optional[_Iterable[float]] = ..., desired: _Optional[_Iterable[float]] = ..., busy: _Optional[_Iterable[float]] = ..., held: _Optional[_Iterable[float]] = ..., pending: _Optional[_Iterable[float]] = ..., pending_by_class: _Optional[_Union[PoolHistory.ByClass, _Mapping]] = ..., throughput_per_s: _Optional[_Iterable[float]] = ..., failures_per_s: _Optional[_Iterable[float]] = ..., wait_p50_s: _Optional[_Iterable[float]] = ..., wait_p99_s: _Optional[_Iterable[float]] = ..., wait_p50_s_by_class: _Optional[_Union[PoolHistory.ByClass, _Mapping]] = ..., wait_p99_s_by_class: _Optional[_Union[PoolHistory.ByClass, _Mapping]] = ..., cost: _Optional[_Iterable[float]] = ...) -> None: ...

class HistoryResponse(_message.Message):
    __slots__ = ("pools", "interval_s", "kept_s", "at_unix_ns", "unavailable_shards")
    POOLS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    KEPT_S_FIELD_NUMBER: _ClassVar[int]
    AT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_SHARDS_FIELD_NUMBER: _ClassVar[int]
    pools: _containers.RepeatedCompositeFieldContainer[PoolHistory]
    interval_s: float
    kept_s: float
    at_unix_ns: int
    unavailable_shards: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pools: _Optional[_Iterable[_Union[PoolHistory, _Mapping]]] = ..., interval_s: _Optional[float] = ..., kept_s: _Optional[float] = ..., at_unix_ns: _Optional[int] = ..., unavailable_shards: _Optional[_Iterable[str]] = ...) -> None: ...
