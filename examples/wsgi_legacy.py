"""A threaded WSGI app (standard library only) that schedules legacy tasks.

Each request handler calls the legacy API from its own server thread:

    GET /submit?id=job-1&duration=0.2&priority=HIGH   -> 202 {"id": ..., "cronoq_id": ...}
    GET /wait?id=job-1                                -> 200 {"status": "succeeded"}
    GET /metrics                                      -> 200 QualityMetrics as JSON

Run it with ``python examples/wsgi_legacy.py [--port 8000]`` and open
http://127.0.0.1:8000/metrics.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import socketserver
import sys
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from cronoq_compat import CompatError, ElasticPriorityScheduler, Priority, Task


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):  # keep test output clean
        pass


def make_app(scheduler: ElasticPriorityScheduler):
    def respond(start_response, status: str, body: dict):
        data = json.dumps(body).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        query = {k: v[0] for k, v in parse_qs(environ.get("QUERY_STRING", "")).items()}
        try:
            if path == "/submit":
                task = Task(id=query["id"], duration=float(query.get("duration", "0")),
                            priority=Priority[query.get("priority", "NORMAL").upper()],
                            dependencies=[d for d in query.get("after", "").split(",") if d])
                cronoq_id = scheduler.submit(task)
                return respond(start_response, "202 Accepted", {"id": task.id, "cronoq_id": cronoq_id})
            if path == "/wait":
                handle = scheduler.native.handle(query["id"])
                handle.result(timeout=float(query.get("timeout", "30")))
                return respond(start_response, "200 OK", {"id": query["id"], "status": handle.status})
            if path == "/metrics":
                return respond(start_response, "200 OK", dataclasses.asdict(scheduler.get_metrics()))
            return respond(start_response, "404 Not Found", {"error": f"no route {path}"})
        except (CompatError, KeyError, ValueError) as exc:
            return respond(start_response, "400 Bad Request", {"error": str(exc)})

    return app


def make_server_for(scheduler: ElasticPriorityScheduler, host: str = "127.0.0.1", port: int = 8000):
    return make_server(host, port, make_app(scheduler), server_class=ThreadingWSGIServer,
                       handler_class=QuietHandler)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="wsgi_legacy.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8000, help="the port to serve on, on 127.0.0.1 (default 8000)")
    args = parser.parse_args(argv[1:])
    port = args.port
    with ElasticPriorityScheduler(initial_workers=2, max_workers=8) as scheduler:
        server = make_server_for(scheduler, port=port)
        print(f"serving on http://127.0.0.1:{server.server_port}/metrics (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
