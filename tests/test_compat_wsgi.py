"""The threaded WSGI example of examples/wsgi_legacy.py, driven by concurrent clients."""

from __future__ import annotations

import importlib.util
import json
import threading
import urllib.request
from pathlib import Path

from cronoq_compat import ElasticPriorityScheduler

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "wsgi_legacy.py"


def load_example():
    spec = importlib.util.spec_from_file_location("wsgi_legacy", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get(base: str, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(base + path, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_request_handlers_submit_from_their_own_threads():
    example = load_example()
    with ElasticPriorityScheduler(initial_workers=2, max_workers=4) as scheduler:
        server = example.make_server_for(scheduler, port=0)
        serving = threading.Thread(target=server.serve_forever, daemon=True)
        serving.start()
        base = f"http://127.0.0.1:{server.server_port}"
        try:
            results: dict[str, tuple] = {}

            def client(k: int) -> None:
                for i in range(10):
                    task_id = f"c{k}-{i}"
                    results[task_id] = get(base, f"/submit?id={task_id}&duration=0.001&priority=high")

            clients = [threading.Thread(target=client, args=(k,)) for k in range(8)]
            for c in clients:
                c.start()
            for c in clients:
                c.join()
            assert len(results) == 80
            assert all(status == 202 for status, _ in results.values())
            assert len({body["cronoq_id"] for _, body in results.values()}) == 80
            for task_id in results:
                assert get(base, f"/wait?id={task_id}") == (200, {"id": task_id, "status": "succeeded"})
            status, body = get(base, "/submit?id=c0-0&duration=0")
            assert status == 400 and "already submitted" in body["error"]
            status, body = get(base, "/submit?id=orphan&after=missing")
            assert status == 400 and "missing" in body["error"]
            status, metrics = get(base, "/metrics")
            assert status == 200
            assert metrics["completed"] == 80
            assert 0.0 <= metrics["schedule_quality"] <= 1.0
        finally:
            server.shutdown()
            server.server_close()


def test_the_example_explains_itself_and_refuses_a_bad_port():
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, str(EXAMPLE), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "usage: wsgi_legacy.py" in shown.stdout and "--port" in shown.stdout
    refused = subprocess.run([sys.executable, str(EXAMPLE), "--port", "eighty"], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "invalid int value: 'eighty'" in refused.stderr
    assert "Traceback" not in shown.stderr + refused.stderr
