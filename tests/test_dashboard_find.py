"""Finding and acting on tasks in the dashboard (ui/find.js, ui/router.js), in
a real headless browser against real server and worker processes: search,
newest first and sortable columns, deep links opened cold, the Submit task
page with the server's validation message, and bulk cancel with its
confirmation dialog."""

from __future__ import annotations

from dashkit import WAIT_MS, api, capacity, open_page, wait_until
from serverkit import ADMIN, AUTH, CLIENT, LISTEN

CONFIG = LISTEN + AUTH + """
[limits]
max_key_bytes = 64
[[pools]]
name = "default"
[[pools]]
name = "idle"
"""


def row(page, task_id: str):
    return page.locator(f'#task-table tbody tr[data-id="{task_id}"]')


def until(page, expression: str) -> None:
    """Waits until ``expression`` holds in the page (polled with evaluate: the
    page's CSP forbids the eval that wait_for_function uses)."""
    for _ in range(WAIT_MS // 50):
        if page.evaluate(expression):
            return
        page.wait_for_timeout(50)
    raise AssertionError(f"timed out waiting for {expression}")


def shown_ids(page) -> list[str]:
    return page.locator("#task-table tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")


def test_search_finds_by_key_and_kind_newest_first_with_sortable_columns(browser, servers, workers, shots):
    server = servers(CONFIG, name="find-search")
    workers(server.target, slots=2)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http) == 2, what="the worker connecting")
        done = http.post("/v1/tasks", json={"payload": {"sleep": 0.3}, "key": "invoice/2026-03", "kind": "billing",
                                            "wait": True}).json()
        made = [http.post("/v1/tasks", json={"pool": "idle", "key": f"report/{n}", "kind": "render",
                                             "payload": {}}).json()["id"] for n in range(3)]
        page = open_page(browser, server, CLIENT, "tasks")
        # Newest first by default: the last submitted on top.
        row(page, made[-1]).wait_for(timeout=WAIT_MS)
        assert shown_ids(page)[:4] == [*reversed(made), done["id"]]
        assert page.locator("#task-table th[data-sort=id]").get_attribute("aria-sort") == "descending"
        # The duration of the finished task (started -> finished), and the created date.
        finished = row(page, done["id"])
        assert finished.locator("td.duration").inner_text().endswith(" ms") or \
            finished.locator("td.duration").inner_text().endswith(" s")
        assert finished.locator("td.created").inner_text()[:2] == "20"
        # "/" focuses the search box; a key matches in any case, and the address follows.
        page.locator("h1").click()
        page.keyboard.press("/")
        assert page.evaluate("document.activeElement.id") == "task-search"
        page.keyboard.type("INVOICE/2026")
        until(page, "document.querySelectorAll('#task-table tbody tr').length === 1")
        assert shown_ids(page) == [done["id"]]
        until(page, "location.hash.includes('q=INVOICE')")
        shots(page, "search")
        # A kind finds its tasks.
        page.fill("#task-search", "render")
        until(page, "document.querySelectorAll('#task-table tbody tr').length === 3")
        assert shown_ids(page) == list(reversed(made))
        # Sorting by a column sorts the page's rows; a second click reverses it.
        page.click("#task-table th[data-sort=key] button")
        assert page.locator("#task-table th[data-sort=key]").get_attribute("aria-sort") == "ascending"
        assert page.locator("#task-table th[data-sort=id]").get_attribute("aria-sort") is None
        assert shown_ids(page) == made
        page.click("#task-table th[data-sort=key] button")
        assert page.locator("#task-table th[data-sort=key]").get_attribute("aria-sort") == "descending"
        assert shown_ids(page) == list(reversed(made))
        # Oldest first, from the order switch.
        page.fill("#task-search", "")
        page.click("#task-table th[data-sort=id] button")   # (back to id order, ascending)
        page.select_option("#task-filters [name=order]", "oldest")
        until(page, "location.hash.includes('order=oldest')")
        until(page, f"document.querySelector('#task-table tbody tr').dataset.id === '{done['id']}'")
        assert shown_ids(page) == [done["id"], *made]


def test_deep_links_restore_the_filters_open_a_task_and_highlight_a_pool(browser, servers):
    server = servers(CONFIG, name="find-links")
    with api(server, CLIENT) as http:
        idle = [http.post("/v1/tasks", json={"pool": "idle", "key": f"deep/{n}", "payload": {}}).json()["id"]
                for n in range(3)]
        other = http.post("/v1/tasks", json={"key": "elsewhere", "payload": {}}).json()["id"]
        page = open_page(browser, server, CLIENT, "tasks?pool=idle&status=ready&q=deep&order=oldest")
        row(page, idle[0]).wait_for(timeout=WAIT_MS)
        assert page.input_value("#task-filters [name=pool]") == "idle"
        assert page.input_value("#task-filters [name=status]") == "ready"
        assert page.input_value("#task-search") == "deep"
        assert page.input_value("#task-filters [name=order]") == "oldest"
        assert shown_ids(page) == idle and row(page, other).count() == 0
        # A task's drawer, opened cold over the Tasks page.
        cold = open_page(browser, server, CLIENT, f"task/{idle[1]}")
        cold.wait_for_selector(f"#drawer:not([hidden]) #drawer-title:has-text('Task {idle[1]}')")
        assert cold.locator("#tasks").is_visible()
        cold.wait_for_selector("#drawer-fields:has-text('deep/1')", timeout=WAIT_MS)
        cold.click("#drawer-close")
        until(cold, "location.hash.startsWith('#tasks?')")
        # Clicking a row puts its task in the address.
        row(cold, idle[2]).click()
        until(cold, f"location.hash === '#task/{idle[2]}'")
    with api(server, ADMIN) as http:
        # A pool's card, highlighted, and the Tasks link filtered to it.
        pools = open_page(browser, server, ADMIN, "pool/idle")
        pools.wait_for_selector('#pools article.pool.highlight[data-pool="idle"]', timeout=WAIT_MS)
        assert pools.locator("#pools article.pool.highlight").count() == 1
        assert pools.locator('#nav a[data-page="tasks"]').get_attribute("href") == "#tasks?pool=idle&order=newest"
        pools.click('#pools article.pool[data-pool="idle"] a.pool-tasks')
        row(pools, idle[0]).wait_for(timeout=WAIT_MS)
        assert pools.input_value("#task-filters [name=pool]") == "idle" and row(pools, other).count() == 0
        # The built-in pages still answer to their plain addresses.
        pools.evaluate("location.hash = '#events'")
        pools.wait_for_selector("#events:not([hidden])", timeout=WAIT_MS)
        assert pools.locator("#pools article.pool.highlight").count() == 0


def test_submit_shows_the_servers_validation_message_then_the_new_task(browser, servers, workers, shots):
    server = servers(CONFIG, name="find-submit")
    workers(server.target, slots=1)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http) == 1, what="the worker connecting")
        page = open_page(browser, server, CLIENT, "submit")
        form = page.locator("#submit-form")
        form.locator("[name='retry.max_attempts']").wait_for(timeout=WAIT_MS)
        # Every option of the request is offered.
        for name in ("pool", "key", "kind", "priority", "tenant", "tags", "labels", "resources", "after", "deps",
                     "start_in_s", "start_unix_ns", "deadline_in_s", "timeout_s", "stages", "retry.jitter", "wait"):
            assert form.locator(f"[name='{name}']").count() == 1, name
        page.fill("#submit-form [name=payload_value]", '{"sleep": 0.1}')
        page.fill("#submit-form [name=key]", "k" * 65)
        page.fill("#submit-form [name=tags]", "team=web\nreason=demo")
        page.select_option("#submit-form [name=priority]", "high")
        page.fill("#submit-form [name='retry.max_attempts']", "2")
        page.click("#submit-form button[type=submit]")
        page.wait_for_selector("#submit-error:has-text('key')", timeout=WAIT_MS)
        message = page.inner_text("#submit-error")
        assert "64 bytes" in message and message.startswith("key"), message
        assert page.locator("#submit-form [name=key][aria-invalid=true]").count() == 1
        shots(page, "submit")
        page.fill("#submit-form [name=key]", "from-the-form")
        page.click("#submit-form button[type=submit]")
        link = page.locator("#submit-done a")
        link.wait_for(timeout=WAIT_MS)
        assert page.inner_text("#submit-error") == ""
        task_id = link.get_attribute("data-id")
        info = http.get(f"/v1/tasks/{task_id}").json()
        assert info["key"] == "from-the-form" and info["priority"] == "high" and info["max_attempts"] == 2
        assert info["tags"] == {"team": "web", "reason": "demo"}
        link.click()
        page.wait_for_selector(f"#drawer:not([hidden]) #drawer-title:has-text('Task {task_id}')", timeout=WAIT_MS)
        until(page, f"location.hash === '#task/{task_id}'")


def test_bulk_cancel_asks_for_confirmation_then_shows_each_result(browser, servers, shots):
    server = servers(CONFIG, name="find-bulk")
    with api(server, CLIENT) as http:
        ids = [http.post("/v1/tasks", json={"pool": "idle", "key": f"bulk/{n}", "payload": {}}).json()["id"]
               for n in range(4)]
        page = open_page(browser, server, CLIENT, "tasks?pool=idle")
        row(page, ids[0]).wait_for(timeout=WAIT_MS)
        assert page.is_disabled("#bulk-cancel")
        # A box selects its row without opening the drawer.
        for task_id in ids[:3]:
            row(page, task_id).locator("input.pick").check()
        assert page.locator("#drawer").is_hidden()
        assert page.inner_text("#bulk-count") == "3 selected"
        assert page.evaluate("document.querySelector('#pick-all').indeterminate") is True
        # Back changes nothing.
        page.click("#bulk-cancel")
        page.wait_for_selector("#bulk-dialog[open]", timeout=WAIT_MS)
        assert page.inner_text("#bulk-question") == "Cancel 3 tasks?"
        page.click("#bulk-dialog button[value=back]")
        page.wait_for_selector("#bulk-dialog[open]", state="detached", timeout=WAIT_MS)
        assert all(http.get(f"/v1/tasks/{i}").json()["status"] == "ready" for i in ids)
        # Confirm cancels them and lists each result.
        page.click("#bulk-cancel")
        page.wait_for_selector("#bulk-dialog[open]", timeout=WAIT_MS)
        shots(page, "bulk")
        page.click("#bulk-confirm")
        page.wait_for_selector("#bulk-results li[data-result=cancelled] >> nth=2", timeout=WAIT_MS)
        assert page.locator("#bulk-results li").count() == 3
        for task_id in ids[:3]:
            page.wait_for_selector(f'#task-table tr[data-id="{task_id}"][data-status="cancelled"]', timeout=WAIT_MS)
        assert http.get(f"/v1/tasks/{ids[3]}").json()["status"] == "ready"
        assert page.inner_text("#bulk-count") == "none selected"
        # Select all of the page: the finished ones are named in the question.
        page.check("#pick-all")
        assert page.inner_text("#bulk-count") == "4 selected"
        page.click("#bulk-cancel")
        page.wait_for_selector("#bulk-dialog[open]", timeout=WAIT_MS)
        assert "3 of them already finished" in page.inner_text("#bulk-detail")
        page.click("#bulk-confirm")
        page.wait_for_selector(f'#bulk-results li[data-id="{ids[0]}"][data-result=finished]', timeout=WAIT_MS)
        assert page.locator(f'#bulk-results li[data-id="{ids[3]}"][data-result=cancelled]').count() == 1
