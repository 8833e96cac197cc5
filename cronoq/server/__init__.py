"""cronoq-server: the scheduler as a service (extra ``cronoq[server]``).

One ``cronoq.Scheduler`` whose pools are served by remote workers, behind the
gRPC API of package cronoq.v1 (``cronoq.proto``) on grpcio's asyncio server,
with /healthz and /readyz on an HTTP listener, all on one event loop. Run it
with ``cronoq-server --config cronoq.toml`` or ``python -m cronoq.server``;
docs/server.md documents the configuration, the API and the protocol rules.

Modules: ``config`` (the TOML file), ``auth`` (roles, tokens, certificates),
``service`` (admission, authorization and limits, transport-neutral),
``remote`` (the remote runner and worker sessions), ``grpc_api`` (the gRPC
transport), ``http`` (probes), ``app`` (the process: listeners, leadership,
graceful stop).
"""

from .config import ConfigError, ServerConfig, default_config, load, parse
from .embed import RunningServer, serve

__all__ = ["ConfigError", "ServerConfig", "default_config", "load", "parse", "serve", "RunningServer"]
