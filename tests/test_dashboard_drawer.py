"""The task drawer's details in a real headless browser (tests/test_dashboard.py
tells how these tests run): the payload, the output read with max_bytes, a
failure's traceback, per attempt its traceback; event rows that open the
drawer; times that carry their date. Real cronoq-server and worker processes
(tests/dashkit.py DashWorker) on free 127.0.0.1 ports."""

from __future__ import annotations

import base64
import re

from dashkit import WAIT_MS, api, capacity, open_page, wait_until
from serverkit import ADMIN, AUTH, LISTEN

CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
[[pools]]
name = "idle"
"""

# time() and dateTime() of app.js: the date, the time of day (with milliseconds or not), UTC.
MOMENT = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{3})?Z")


def open_task(page, task_id: str) -> None:
    page.goto(page.url.split("#")[0] + "#tasks")
    row = page.locator(f'#task-table tr[data-id="{task_id}"]')
    row.wait_for(timeout=WAIT_MS)
    row.click()
    page.wait_for_selector(f'#drawer-title:has-text("Task {task_id}")', timeout=WAIT_MS)


def test_a_failures_payload_and_traceback_show_in_the_drawer(browser, servers, workers, shots):
    server = servers(CONFIG, name="drawer")
    workers(server.target)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http) == 1, what="the worker connecting")
        task_id = http.post("/v1/tasks", json={"payload": {"raise": "the disk is full", "key": [1, 2]},
                                               "retry": {"max_attempts": 2, "initial_backoff_s": 0.01}}).json()["id"]
        assert http.get(f"/v1/tasks/{task_id}/result", params={"timeout_s": 30}).json()["status"] == "dead_lettered"
        page = open_page(browser, server, ADMIN, "tasks")
        open_task(page, task_id)
        # The payload, pretty-printed JSON.
        payload = page.locator("#drawer-payload pre")
        payload.wait_for(timeout=WAIT_MS)
        assert payload.inner_text() == '{\n  "raise": "the disk is full",\n  "key": [\n    1,\n    2\n  ]\n}'
        assert page.locator("#drawer-payload .preview-note").inner_text() == "application/json, 40 bytes"   # as sent, compact
        # The error, and its traceback (the last attempt's) folded in a <details>.
        page.wait_for_selector("#drawer-traceback:not([hidden])", timeout=WAIT_MS)
        assert "the disk is full" in page.locator("#drawer-result").inner_text()
        traceback = page.locator("#drawer-traceback pre")
        assert not traceback.is_visible()
        page.click("#drawer-traceback summary")
        assert traceback.is_visible()
        lines = traceback.inner_text().splitlines()
        assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ValueError: the disk is full"
        assert page.locator("#drawer-traceback summary").inner_text() == "Traceback (attempt 2)"
        # Each attempt's own traceback.
        attempts = page.locator("#drawer-attempts li details.traceback")
        assert attempts.count() == 2
        attempts.nth(0).locator("summary").click()
        assert attempts.nth(0).locator("pre").inner_text().splitlines()[-1] == "ValueError: the disk is full"
        # Every time of the drawer carries its date.
        for text in page.locator("#drawer-attempts li").all_inner_texts():
            assert MOMENT.match(text), text
        for field in ("created", "started", "finished"):
            assert MOMENT.fullmatch(page.locator(f'#drawer-fields dd[data-field="{field}"]').inner_text())
        page.locator("#drawer-output").scroll_into_view_if_needed()
        shots(page, "drawer-traceback")
        page.context.close()


def test_a_big_output_and_a_binary_payload_show_cut(browser, servers, workers):
    server = servers(CONFIG, name="drawer")
    workers(server.target)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http) == 1, what="the worker connecting")
        big = http.post("/v1/tasks", json={"payload": {"output_size": 100_000}}).json()["id"]
        assert http.get(f"/v1/tasks/{big}/result", params={"timeout_s": 30}).json()["status"] == "succeeded"
        data = bytes(range(256)) * 8
        binary = http.post("/v1/tasks", json={"payload_b64": base64.b64encode(data).decode(),
                                              "pool": "idle"}).json()["id"]
        page = open_page(browser, server, ADMIN, "tasks")
        open_task(page, big)
        page.wait_for_selector('#drawer-output[data-state="truncated"]', timeout=WAIT_MS)
        assert page.locator("#drawer-output .preview-note").inner_text() == "truncated: 65536 of 100000 bytes shown"
        assert page.locator("#drawer-result").inner_text() == "x" * 65536
        assert page.locator("#drawer-traceback").is_hidden()
        open_task(page, binary)
        page.wait_for_selector('#drawer-payload[data-state="truncated"]', timeout=WAIT_MS)
        assert page.locator("#drawer-payload .preview-note").inner_text() == "truncated: 1024 of 2048 bytes shown"
        shown = page.locator("#drawer-payload pre").inner_text().splitlines()
        assert shown[0] == "binary, 2048 bytes (application/octet-stream)"
        assert shown[1] == "000000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f"
        assert page.locator("#drawer-result").inner_text() == "(not finished)"
        page.context.close()


def test_an_event_row_opens_its_tasks_drawer_and_times_carry_the_date(browser, servers, workers):
    server = servers(CONFIG, name="drawer")
    workers(server.target)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http) == 1, what="the worker connecting")
        page = open_page(browser, server, ADMIN, "events")
        task_id = http.post("/v1/tasks", json={"payload": {"sleep": 0}, "key": "drawer-event"}).json()["id"]
        row = page.locator(f'#event-table tr[data-id="{task_id}"]:has-text("succeeded")')
        row.wait_for(timeout=WAIT_MS)
        assert MOMENT.fullmatch(row.locator("td").first.inner_text())
        row.click()
        page.wait_for_selector(f'#drawer-title:has-text("Task {task_id}")', timeout=WAIT_MS)
        page.wait_for_selector("#drawer-result:has-text('slept')", timeout=WAIT_MS)
        assert page.locator('#drawer-fields dd[data-field="key"]').inner_text() == "drawer-event"
        # The task list's times carry the date too.
        page.click("#nav a[data-page=tasks]")
        listed = page.locator(f'#task-table tr[data-id="{task_id}"]')
        listed.wait_for(timeout=WAIT_MS)
        assert MOMENT.fullmatch(listed.locator("td").nth(-2).inner_text())   # created (then its duration)
        page.context.close()
