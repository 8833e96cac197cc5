"""The web dashboard (/ui) in a real headless browser: the distribution's
Chromium driven by Playwright, against real cronoq-server processes with
worker processes, all on free 127.0.0.1 ports.

Without a browser the tests skip with the reason; with
CRONOQ_REQUIRE_BROWSER=1 (.ci/run) they fail instead. Every wait is for
something the page shows, with a generous timeout that only matters when a
test fails. With CRONOQ_DASHBOARD_SHOTS=DIR the screenshots (PNG) go to DIR:
docs/dashboard.md shows those of a run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path


from dashkit import WAIT_MS, api, capacity, open_page, sign_in, wait_until
from serverkit import ADMIN, AUTH, CLIENT, LISTEN, METRICS, shards_toml


CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
[[pools]]
name = "reports"
[[recurring]]
name = "nightly-report"
cron = "0 3 * * *"
tz = "Europe/Paris"
pool = "reports"
kind = "report"
"""


def sqlite_config(path: Path) -> str:
    return LISTEN + AUTH + f"""
[store]
kind = "sqlite"
path = "{path}"
lease_ttl_s = 10
lease_renew_s = 1
lock_poll_s = 0.1
full_sync = false
[[pools]]
name = "default"
"""


def test_a_submitted_task_appears_and_finishes_without_a_reload(browser, servers, workers, shots):
    server = servers(CONFIG, name="dash")
    workers(server.target, slots=2)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http) == 2, what="the worker connecting")
        page = open_page(browser, server, None, "tasks")
        # A wrong token is refused and the page asks again.
        page.fill("#token", "not-a-token-of-this-server-at-all")
        page.click("#login-form button[type=submit]")
        page.wait_for_selector("#login-error:has-text('The token was refused')", timeout=WAIT_MS)
        assert page.evaluate("sessionStorage.getItem('cronoq.token')") is None
        sign_in(page, ADMIN)
        # The token lives in this tab's sessionStorage only: not in the address, not in a cookie.
        assert page.evaluate("sessionStorage.getItem('cronoq.token')") == ADMIN
        assert ADMIN not in page.url and page.context.cookies() == []
        page.evaluate("window.notReloaded = true")
        sub = http.post("/v1/tasks", json={"payload": {"sleep": 1.0, "fail_until": 2}, "key": "dash/visible",
                                           "tags": {"team": "web"},
                                           "retry": {"max_attempts": 3, "initial_backoff_s": 0.01}}).json()
        row = page.locator(f'#task-table tr[data-id="{sub["id"]}"]')
        row.wait_for(timeout=WAIT_MS)
        page.wait_for_selector(f'#task-table tr[data-id="{sub["id"]}"][data-status="succeeded"]', timeout=WAIT_MS)
        assert row.locator("td").nth(2).inner_text() == "dash/visible"
        assert page.evaluate("window.notReloaded") is True
        row.click()
        page.wait_for_selector("#drawer-result:has-text('slept')", timeout=WAIT_MS)
        assert page.locator('#drawer-fields dd[data-field="tags"]').inner_text() == "team=web"
        attempts = page.locator("#drawer-attempts li")
        assert [attempts.nth(i).get_attribute("data-status") for i in range(attempts.count())] == \
            ["retrying", "succeeded"]
        assert "failed as asked" in attempts.nth(0).inner_text()
        # A dependent task's drawer draws its dependency, with the dependency's status.
        after = http.post("/v1/tasks", json={"after": ["dash/visible"], "key": "dash/after"}).json()
        page.locator(f'#task-table tr[data-id="{after["id"]}"]').click()
        page.wait_for_selector('#drawer-dag g.node.status-succeeded[data-role="dependency"][data-ref="dash/visible"]',
                               timeout=WAIT_MS)
        shown = page.locator('#drawer-dag g.node[data-role="dependency"]')
        assert (shown.locator("text.name").text_content(), shown.locator("text.status").text_content()) == (
            "dash/visible", "succeeded")
        page.wait_for_selector(f'#task-table tr[data-id="{after["id"]}"][data-status="succeeded"]', timeout=WAIT_MS)
        page.wait_for_selector('#drawer-fields dd[data-field="status"]:text-is("succeeded")', timeout=WAIT_MS)
        shots(page, "task-deps")
        page.click('#drawer-dag g[data-ref="dash/visible"]')   # opens the dependency's drawer
        page.wait_for_selector(f'#drawer-title:text-is("Task {sub["id"]}")', timeout=WAIT_MS)
        page.wait_for_selector("#drawer-result:has-text('slept')", timeout=WAIT_MS)
        shots(page, "task-drawer")
        # The page keeps the session on reload, from sessionStorage.
        page.reload()
        page.wait_for_selector('#conn[data-state="live"]', timeout=WAIT_MS)
        page.context.close()


def test_a_tasks_drawer_shows_its_checkpointed_stages(browser, servers, workers):
    server = servers(CONFIG, name="dash")
    workers(server.target, slots=1)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http) == 1, what="the worker connecting")
        page = open_page(browser, server, CLIENT, "tasks")
        # Attempt 1 checkpoints chunk and embed, then fails; attempt 2 finds both saved.
        sub = http.post("/v1/tasks", json={"payload": {"checkpoint": ["chunk", "embed"], "fail_until": 2},
                                           "stages": ["chunk", "embed", "index"],
                                           "retry": {"max_attempts": 3, "initial_backoff_s": 0.01}}).json()
        page.locator(f'#task-table tr[data-id="{sub["id"]}"][data-status="succeeded"]').wait_for(timeout=WAIT_MS)
        page.locator(f'#task-table tr[data-id="{sub["id"]}"]').click()
        page.wait_for_selector('#drawer-stages li[data-stage="embed"][data-state="done"]', timeout=WAIT_MS)
        stages = page.locator("#drawer-stages li")
        assert [(stages.nth(i).get_attribute("data-stage"), stages.nth(i).get_attribute("data-state"))
                for i in range(stages.count())] == [("chunk", "done"), ("embed", "done"), ("index", "open")]
        assert "checkpointed by attempt 1" in stages.nth(0).inner_text()
        # A task without stages hides the part.
        plain = http.post("/v1/tasks", json={"payload": {}}).json()
        page.locator(f'#task-table tr[data-id="{plain["id"]}"][data-status="succeeded"]').click(timeout=WAIT_MS)
        page.wait_for_selector(f'#drawer-title:text-is("Task {plain["id"]}")', timeout=WAIT_MS)
        page.wait_for_selector("#drawer-stages-part", state="hidden", timeout=WAIT_MS)
        page.context.close()


def test_the_overview_charts_move_with_the_pools(browser, servers, workers, shots):
    from playwright.sync_api import expect

    server = servers(CONFIG, name="dash")
    workers(server.target, slots=1)
    with api(server, METRICS) as http:
        wait_until(lambda: capacity(http) == 1, what="the first worker")
        page = open_page(browser, server, METRICS)
        card = page.locator('.pool[data-pool="default"]')
        card.locator('dd[data-field="capacity"]:text-is("1")').wait_for(timeout=WAIT_MS)
        chart = card.locator('.history-plot[data-chart="capacity"]')
        expect(chart).to_have_attribute("data-points", re.compile(r"^([2-9]|\d\d+)$"), timeout=WAIT_MS)
        workers(server.target, slots=2)
        card.locator('dd[data-field="capacity"]:text-is("3")').wait_for(timeout=WAIT_MS)
        # The capacity line rose: its last point is above its first (the chart follows the snapshots).
        page.wait_for_function("(el) => JSON.parse(el.dataset.lastValues || '{}').capacity === 3",
                               arg=chart.element_handle(), timeout=WAIT_MS)
        assert json.loads(chart.get_attribute("data-first-values"))["capacity"] < 3
        # A metrics token gets the charts but no status events; the overview says nothing is missing.
        assert page.locator("#overview-note").inner_text() == ""
        with api(server, CLIENT) as client_http:
            for _ in range(6):
                client_http.post("/v1/tasks", json={"payload": {"sleep": 0.5}, "pool": "default"})
        card.locator('dd[data-field="succeeded"]:text-is("6")').wait_for(timeout=WAIT_MS)
        # Window counts and totals say what they count, and over what span.
        assert card.locator("p.window").inner_text().startswith("waits, rates and attempts: last 60 s")
        assert card.locator('dd[data-field="succeeded"]').locator("xpath=preceding-sibling::dt[1]").inner_text() \
            == "attempts succeeded"
        groups = page.locator("#totals .total-group").all_inner_texts()
        assert [g.split(":")[0] for g in groups][:4] == ["now", "since start, tasks", "since start, attempts",
                                                         "since start, schedule occurrences"], groups
        assert "submitted" in groups[1] and "dispatched" in groups[2] and "dispatched" not in groups[1]
        shots(page, "overview")
        page.context.close()


def test_cancelling_a_running_task_from_its_drawer(browser, servers, workers):
    server = servers(CONFIG, name="dash")
    workers(server.target)
    with api(server, CLIENT) as http:
        page = open_page(browser, server, CLIENT, "tasks")
        sub = http.post("/v1/tasks", json={"payload": {"sleep": 3600}}).json()
        page.wait_for_selector(f'#task-table tr[data-id="{sub["id"]}"][data-status="running"]', timeout=WAIT_MS)
        page.click(f'#task-table tr[data-id="{sub["id"]}"]')
        page.wait_for_selector('#drawer-fields dd[data-field="status"]:text-is("running")', timeout=WAIT_MS)
        assert page.locator("#drawer-why-part").is_hidden()   # a running task waits for nothing
        # The one slot is taken: a second task's drawer says why it waits, from the server's explanation.
        queued = http.post("/v1/tasks", json={"payload": {"n": 1}, "priority": "low"}).json()
        page.click(f'#task-table tr[data-id="{queued["id"]}"]')
        page.wait_for_selector('#drawer-reasons li[data-code="pool_full"]', timeout=WAIT_MS)
        assert "1 of 1 busy" in page.locator('#drawer-reasons li[data-code="pool_full"]').inner_text()
        assert "Number 1 of 1 in line" in page.locator("#drawer-why").inner_text()
        page.click(f'#task-table tr[data-id="{sub["id"]}"]')
        page.wait_for_selector('#drawer-fields dd[data-field="status"]:text-is("running")', timeout=WAIT_MS)
        page.wait_for_selector("#drawer-why-part", state="hidden", timeout=WAIT_MS)
        page.click("#drawer-cancel")
        page.wait_for_selector("#drawer-message:text-is('cancelled')", timeout=WAIT_MS)
        page.wait_for_selector(f'#task-table tr[data-id="{sub["id"]}"][data-status="cancelled"]', timeout=WAIT_MS)
        assert http.get(f"/v1/tasks/{sub['id']}").json()["status"] == "cancelled"
        assert page.locator("#drawer-cancel").is_disabled()
        page.context.close()


def test_a_client_token_is_refused_the_admin_resubmit_and_an_admin_token_is_not(browser, servers, workers, shots):
    server = servers(CONFIG, name="dash")
    workers(server.target)
    with api(server, CLIENT) as http:
        dead = http.post("/v1/tasks", json={"payload": {"fail": True}, "retry": {"max_attempts": 1},
                                            "key": "dash-dead", "wait": True}).json()
        assert dead["result"]["status"] == "dead_lettered"
        page = open_page(browser, server, CLIENT, "dead")
        row = page.locator(f'#dead-table tr[data-id="{dead["id"]}"]')
        row.wait_for(timeout=WAIT_MS)
        row.locator("button").click()
        page.wait_for_selector("#dead-error:has-text('403')", timeout=WAIT_MS)
        assert "admin role" in page.locator("#dead-error").inner_text()
        assert [t["id"] for t in http.get("/v1/tasks").json()["tasks"]] == [dead["id"]]   # nothing submitted
        page.click("#logout")
        page.wait_for_selector("#login:visible", timeout=WAIT_MS)
        assert page.evaluate("sessionStorage.getItem('cronoq.token')") is None
        sign_in(page, ADMIN)
        row.locator("button").click()
        page.wait_for_selector(f'#dead-table tr[data-id="{dead["id"]}"]:has-text("submitted again as task")',
                               timeout=WAIT_MS)
        tasks = http.get("/v1/tasks").json()["tasks"]
        assert len(tasks) == 2 and tasks[1]["tags"] == {"resubmitted_from": dead["id"]}
        page.wait_for_selector(f'#dead-table tr[data-id="{tasks[1]["id"]}"]', timeout=WAIT_MS)   # it failed too
        # The live re-read keeps what was done.
        assert row.locator("td").last.inner_text() == f"submitted again as task {tasks[1]['id']}"
        shots(page, "dead-letters")
        page.context.close()


def test_events_workers_and_recurring_pages(browser, servers, workers, shots):
    server = servers(CONFIG, name="dash")
    workers(server.target, "reports", slots=3)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http, "reports") == 3, what="the worker connecting")
        page = open_page(browser, server, ADMIN, "events")
        sub = http.post("/v1/tasks", json={"pool": "reports", "key": "dash-event", "payload": {"sleep": 0.2}}).json()
        page.wait_for_selector(f'#event-table tr[data-id="{sub["id"]}"]:has-text("succeeded")', timeout=WAIT_MS)
        assert page.locator(f'#event-table tr[data-id="{sub["id"]}"]:has-text("running")').count() == 1
        # The attempt, of those allowed (the pool's policy: 3).
        ended = page.locator(f'#event-table tr[data-id="{sub["id"]}"]:has-text("succeeded")')
        assert ended.locator("td").nth(5).inner_text() == "1/3"
        shots(page, "events")
        # A burst (600 tasks: about 1,800 events) is drawn in batches and the page keeps the last 500 rows.
        http.post("/v1/tasks:batch", json={"tasks": [{"pool": "reports", "key": f"burst-{i}"} for i in range(600)]})
        page.wait_for_selector('#event-table tr:has-text("burst-599"):has-text("succeeded")', timeout=WAIT_MS)
        assert page.locator("#event-table tbody tr").count() == 500
        assert page.locator("#event-table tbody tr").first.locator("td").nth(4).inner_text() == "succeeded"
        page.click("#nav a[data-page=workers]")
        worker_row = page.locator("#worker-table tbody tr")
        worker_row.first.wait_for(timeout=WAIT_MS)
        cells = worker_row.first.locator("td").all_inner_texts()
        assert cells[1:3] == ["dash-reports", "reports"] and cells[4] == "3"
        page.click("#nav a[data-page=recurring]")
        schedule = page.locator('#recurring-table tr[data-name="nightly-report"]')
        schedule.wait_for(timeout=WAIT_MS)
        cells = schedule.locator("td").all_inner_texts()
        assert cells[1:4] == ["0 3 * * *", "Europe/Paris", "reports"] and cells[6].endswith("Z")
        shots(page, "recurring")
        schedule.locator("button").click()
        schedule.wait_for(state="detached", timeout=WAIT_MS)
        assert http.get("/v1/recurring").json()["schedules"] == []
        page.context.close()


def test_the_events_page_starts_with_the_leaders_recent_events(browser, servers, workers):
    server = servers(CONFIG, name="dash")
    workers(server.target, "reports", slots=1)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http, "reports") == 1, what="the worker connecting")
        sub = http.post("/v1/tasks", json={"pool": "reports", "key": "before-the-page"}).json()
        assert http.get(f"/v1/tasks/{sub['id']}/result").json()["status"] == "succeeded"
        page = open_page(browser, server, ADMIN, "overview")   # the events came before the page existed
        page.click("#nav a[data-page=events]")
        row = f'#event-table tr[data-id="{sub["id"]}"]'
        page.wait_for_selector(f'{row}:has-text("succeeded")', timeout=WAIT_MS)
        assert page.locator(row).count() == 3   # ready, running, succeeded: each once
        page.context.close()


def test_the_page_shows_standby_and_disconnected_and_follows_the_new_leader(browser, servers, tmp_path, shots):
    config = sqlite_config(tmp_path / "state.db")
    leader = servers(config, name="a")
    standby = servers(config, name="b", wait_for="standing by")
    on_leader = open_page(browser, leader, ADMIN)
    on_standby = open_page(browser, standby, None)
    sign_in(on_standby, ADMIN, state="standby")
    assert "not the leader" in on_standby.locator("#conn").inner_text()
    assert "goes live by itself" in on_standby.locator("#banner").inner_text()
    shots(on_standby, "standby")
    assert leader.stop() == 0
    on_leader.wait_for_selector('#conn[data-state="disconnected"]', timeout=WAIT_MS)
    assert "connection to the server is lost" in on_leader.locator("#banner").inner_text()
    standby.wait_for("serving as the leader", timeout=30)
    on_standby.wait_for_selector('#conn[data-state="live"]', timeout=WAIT_MS)
    assert on_standby.locator("#banner").is_hidden()
    on_standby.click("#nav a[data-page=tasks]")
    with api(standby, CLIENT) as http:
        sub = http.post("/v1/tasks", json={"key": "after-failover"}).json()
    on_standby.wait_for_selector(f'#task-table tr[data-id="{sub["id"]}"]', timeout=WAIT_MS)
    on_leader.context.close()
    on_standby.context.close()


def shard_config(directory: Path, ports: dict[str, int], shard: str) -> str:
    return f"""
[server]
grpc_addr = "127.0.0.1:{ports[shard]}"
http_addr = "127.0.0.1:0"
shutdown_grace_s = 2
{AUTH}
[store]
kind = "sqlite"
path = "{directory}/shard-{{shard}}.db"
full_sync = false
""" + shards_toml({"a": (["default"], f"http://127.0.0.1:{ports['a']}"),
                    "b": (["gpu"], f"http://127.0.0.1:{ports['b']}")})


def test_a_shards_server_shows_every_shard_and_marks_one_that_cannot_be_reached(browser, servers, workers,
                                                                                   tmp_path, shots):
    import socket

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    ports = {"a": free_port(), "b": free_port()}
    a = servers(shard_config(tmp_path, ports, "a"), args=("--shard", "a"), name="a")
    b = servers(shard_config(tmp_path, ports, "b"), args=("--shard", "b"), name="b")
    workers(b.target, "gpu", slots=2)
    with api(a, ADMIN) as http:
        wait_until(lambda: capacity(http, "gpu") == 2, what="the worker of shard b, seen through a")
        page = open_page(browser, a, ADMIN, "events")
        # A task of shard b, submitted through a: its events reach a's page (the stream covers every shard).
        sub = http.post("/v1/tasks", json={"pool": "gpu", "key": "dash-in-b", "payload": {"sleep": 0.1}}).json()
        assert int(sub["id"]) >> 56 == 2
        page.wait_for_selector(f'#event-table tr[data-id="{sub["id"]}"]:has-text("succeeded")', timeout=WAIT_MS)
        assert page.locator("#shards-banner").is_hidden()
        page.click("#nav a[data-page=overview]")
        b.kill()
        banner = page.locator('#shards-banner[data-shards="b"]')
        banner.wait_for(timeout=WAIT_MS)
        assert "Shard b cannot be reached" in banner.inner_text()
        # gpu's card stays, with its last figures, marked as its shard's.
        gpu = page.locator('article.pool.unavailable[data-pool="gpu"]')
        gpu.wait_for(timeout=WAIT_MS)
        assert "its shard cannot be reached" in gpu.inner_text()
        assert page.locator('article.pool.unavailable[data-pool="default"]').count() == 0
        shots(page, "shard-unavailable")
        # The page stays live for the shard it is connected to.
        assert page.locator("#conn").get_attribute("data-state") == "live"
        mine = http.post("/v1/tasks", json={"pool": "default", "key": "dash-in-a"}).json()
        assert int(mine["id"]) >> 56 == 1
        page.context.close()
