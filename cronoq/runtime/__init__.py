"""The asyncio runtime: drives ``cronoq.core`` on an event loop."""

from .clock import Clock, SystemClock, VirtualClock
from .context import TaskContext
from .events import EventStream
from .handle import TaskHandle
from .listing import RecurringInfo
from .pool import Pool
from .scheduler import Scheduler

__all__ = ["Scheduler", "Pool", "TaskContext", "TaskHandle", "EventStream", "RecurringInfo", "Clock", "SystemClock",
           "VirtualClock"]
