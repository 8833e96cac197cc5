"""The dashboard's Timeline page in a real headless browser, against a real
cronoq-server process and worker processes: a fixed start drawn ahead of now
before it starts, attempts in their worker's lanes, a retry linked to its
previous attempt, a missed deadline marked, the tooltip, the drawer naming
the worker, a slot held for a fixed start, and the pool filter."""

from __future__ import annotations

from dashkit import WAIT_MS, api, capacity, open_page, wait_until
from serverkit import ADMIN, AUTH, LISTEN

CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
retry = { max_attempts = 3, initial_backoff_s = 0.01, jitter = false }
[[pools]]
name = "fixed"
"""


def attempt_rect(task_id: str, attempt: int | None = None, status: str | None = None) -> str:
    selector = f'#timeline-svg rect.attempt[data-id="{task_id}"]'
    if attempt is not None:
        selector += f'[data-attempt="{attempt}"]'
    if status is not None:
        selector += f'[data-status="{status}"]'
    return selector


def test_the_timeline_draws_reservations_ahead_attempts_per_lane_retries_and_deadlines(
        browser, servers, workers, shots):
    server = servers(CONFIG, name="dash-timeline")
    workers(server.target, slots=2)
    workers(server.target, slots=2)
    workers(server.target, pool="fixed", slots=1)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http) == 4 and capacity(http, "fixed") == 1,
                   what="the workers connecting")
        page = open_page(browser, server, ADMIN, "timeline")
        page.wait_for_selector("#timeline-svg g.worker", timeout=WAIT_MS)
        worker_ids = {w["id"] for w in http.get("/v1/workers", params={"pool": "default"}).json()["workers"]}
        assert len(worker_ids) == 2

        # A fixed start a minute ahead: drawn right of "now" while the task still waits for its start.
        nightly = http.post("/v1/tasks", json={"payload": {}, "pool": "fixed", "key": "dash/nightly",
                                               "kind": "nightly", "start_in_s": 60}).json()
        reservation = page.locator(f'#timeline-svg g.reserved[data-pool="fixed"] '
                                   f'rect.reservation[data-id="{nightly["id"]}"]')
        reservation.wait_for(timeout=WAIT_MS)
        assert http.get(f"/v1/tasks/{nightly['id']}").json()["status"] == "scheduled"
        now_x = float(page.locator("#timeline-svg line.now").get_attribute("x1"))
        assert float(reservation.get_attribute("x")) > now_x
        assert reservation.get_attribute("data-held") == "false"
        assert "dash/nightly" in page.locator('#timeline-svg g.reserved[data-pool="fixed"]').inner_html()

        # A tolerance longer than the wait: the fixed worker's slot is held for it at once, and marked so.
        held = http.post("/v1/tasks", json={"payload": {}, "pool": "fixed", "key": "dash/held", "start_in_s": 40,
                                            "tolerance_s": 45}).json()
        page.wait_for_selector(f'#timeline-svg rect.reservation.held[data-id="{held["id"]}"][data-held="true"]',
                               timeout=WAIT_MS)
        page.wait_for_selector('#timeline-svg g.reserved[data-pool="fixed"][data-held="1"]', timeout=WAIT_MS)
        label = page.locator('#timeline-svg g.reserved[data-pool="fixed"] text.reserved-name')
        assert "1 held" in label.text_content()

        # Three at once over two workers of two slots: each bar in its worker's lanes.
        busy = [http.post("/v1/tasks", json={"payload": {"sleep": 1.5}, "kind": "busy"}).json()["id"]
                for _ in range(3)]
        for task_id in busy:
            page.wait_for_selector(attempt_rect(task_id, 1), timeout=WAIT_MS)
        lanes = page.evaluate("""(ids) => ids.map((id) => {
            const rect = document.querySelector(`#timeline-svg rect.attempt[data-id="${id}"]`);
            const group = rect.closest("g.worker");
            return [group.dataset.workerId, group.dataset.workerName, Number(rect.dataset.lane),
                    Number(group.dataset.lanes), rect.dataset.worker];
        })""", busy)
        assert {lane[0] for lane in lanes} == worker_ids            # both workers got some
        for group_worker, name, lane, count, bar_worker in lanes:
            assert name == "dash-default" and 0 <= lane < count == 2 and bar_worker == group_worker
        for task_id in busy:
            page.wait_for_selector(attempt_rect(task_id, 1, "succeeded"), timeout=WAIT_MS)

        # A retried task: both attempts, the second linked to the first.
        flaky = http.post("/v1/tasks", json={"payload": {"fail_until": 2, "sleep": 3}, "key": "dash/flaky"}
                          ).json()["id"]
        page.wait_for_selector(attempt_rect(flaky, 1, "retrying"), timeout=WAIT_MS)
        page.wait_for_selector(attempt_rect(flaky, 2, "succeeded"), timeout=WAIT_MS)
        link = page.locator(f'#timeline-svg path.retry-link[data-id="{flaky}"]')
        link.wait_for(timeout=WAIT_MS)
        assert (link.get_attribute("data-from"), link.get_attribute("data-to")) == ("1", "2")

        # A deadline missed: its tick is red, and so is the bar's outline.
        late = http.post("/v1/tasks", json={"payload": {"sleep": 1.0}, "key": "dash/late",
                                            "deadline_in_s": 0.2}).json()["id"]
        page.wait_for_selector(f'#timeline-svg rect.deadline.missed[data-id="{late}"]', timeout=WAIT_MS)
        page.wait_for_selector(attempt_rect(late, 1, "succeeded") + ".missed", timeout=WAIT_MS)

        # Hovering a bar tells its task, worker and outcome; a click opens the drawer naming the worker.
        page.select_option("#timeline-range", "60")    # a minute: the 3 s bar is wide enough to point at
        page.wait_for_function("""(id) => {
            const selector = `#timeline-svg rect.attempt[data-id="${id}"][data-attempt="2"]`;
            const bar = document.querySelector(selector);
            return bar && Number(bar.getAttribute("width")) > 12;
        }""", arg=flaky, timeout=WAIT_MS)
        bar = page.locator(attempt_rect(flaky, 2))
        bar.hover()
        tip = page.locator("#timeline-tip")
        tip.wait_for(state="visible", timeout=WAIT_MS)
        text = tip.inner_text()
        assert "dash/flaky" in text and "dash-default" in text and "succeeded" in text and "2 of 3" in text
        shots(page, "timeline")
        bar.click()
        page.wait_for_selector(f'#drawer-title:has-text("Task {flaky}")', timeout=WAIT_MS)
        page.wait_for_selector('#drawer-attempts li[data-worker="dash-default"]', timeout=WAIT_MS)
        items = page.locator("#drawer-attempts li")
        assert items.count() == 2 and "on dash-default" in items.nth(1).inner_text()
        page.click("#drawer-close")

        # The pool filter: only that pool's lanes.
        page.select_option("#timeline-pool", "fixed")
        page.wait_for_function("""() => {
            const pools = [...document.querySelectorAll('#timeline-svg g.worker')].map((g) => g.dataset.pool);
            return pools.length > 0 && pools.every((p) => p === 'fixed');
        }""", timeout=WAIT_MS)
        assert page.locator(f'#timeline-svg rect.reservation[data-id="{nightly["id"]}"]').count() == 1
        assert page.locator(f'#timeline-svg rect.reservation[data-id="{held["id"]}"]').count() == 1
        assert page.locator(attempt_rect(flaky)).count() == 0
        http.delete(f"/v1/tasks/{held['id']}")
        http.delete(f"/v1/tasks/{nightly['id']}")
        page.wait_for_selector(f'#timeline-svg rect.reservation[data-id="{nightly["id"]}"]', state="detached",
                               timeout=WAIT_MS)
