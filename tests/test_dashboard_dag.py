"""The drawer's DAG view (ui/dag.js) in a real browser against a real server
and worker processes: a task's dependencies and dependents drawn in layers
with their statuses, following the status events, and a click on a node
opening that task's drawer."""

from __future__ import annotations

from dashkit import WAIT_MS, api, capacity, open_page, wait_until
from serverkit import ADMIN, AUTH, LISTEN

CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
[[pools]]
name = "later"
"""


def node(role: str, task_id: str, status: str | None = None) -> str:
    selector = f'#drawer-dag g.node[data-role="{role}"][data-id="{task_id}"]'
    return selector + (f'[data-status="{status}"]' if status else "")


def test_the_drawer_draws_dependencies_and_dependents_and_follows_them(browser, servers, workers, shots):
    server = servers(CONFIG, name="dash-dag")
    workers(server.target, slots=2)
    with api(server, ADMIN) as http:
        wait_until(lambda: capacity(http) == 2, what="the worker connecting")
        # root -> middle -> (left, right), left -> leaf. The middle task's pool has no worker yet: it waits ready.
        ids = {t: s["id"] for t, s in zip(("root", "middle", "left", "right", "leaf"), http.post("/v1/tasks:batch", json={"tasks": [
            {"key": "dag/root", "payload": {"sleep": 0.05}},
            {"key": "dag/middle", "pool": "later", "after": ["dag/root"]},
            {"key": "dag/left", "payload": {"sleep": 0.05}, "after": ["dag/middle"]},
            {"key": "dag/right", "payload": {"sleep": 0.05}, "deps": [{"key": "dag/middle", "cond": "on_complete"}]},
            {"key": "dag/leaf", "payload": {"sleep": 0.05}, "after": ["dag/left"]},
        ]}).json()["tasks"])}
        wait_until(lambda: http.get(f"/v1/tasks/{ids['root']}").json()["status"] == "succeeded", what="the root")
        page = open_page(browser, server, ADMIN, "tasks")
        page.locator(f'#task-table tr[data-id="{ids["middle"]}"]').click()
        page.wait_for_selector(f'#drawer-title:text-is("Task {ids["middle"]}")', timeout=WAIT_MS)
        page.wait_for_selector(node("dependency", ids["root"], "succeeded"), timeout=WAIT_MS)
        page.wait_for_selector(node("self", ids["middle"], "ready"), timeout=WAIT_MS)
        for name in ("left", "right", "leaf"):
            page.wait_for_selector(node("dependent", ids[name], "blocked"), timeout=WAIT_MS)
        for name, status in (("root", "succeeded"), ("middle", "ready"), ("left", "blocked"), ("right", "blocked"),
                             ("leaf", "blocked")):   # each node names its task (its key) and its status
            shown = page.locator(f'#drawer-dag g.node[data-id="{ids[name]}"]')
            assert (shown.locator("text.name").text_content(), shown.locator("text.status").text_content()) == (
                f"dag/{name}", status)
        # Layers left to right: the dependency, this task, its dependents, theirs.
        xs = {name: float(page.locator(f'#drawer-dag g.node[data-id="{ids[name]}"] rect').get_attribute("x"))
              for name in ids}
        assert xs["root"] < xs["middle"] < xs["left"] == xs["right"] < xs["leaf"]
        # An arrow for each edge: root -> middle, middle -> left and right, left -> leaf.
        edges = {(p.get_attribute("data-from"), p.get_attribute("data-to"))
                 for p in page.locator("#drawer-dag path.edge").all()}
        assert edges == {(ids["root"], ids["middle"]), (ids["middle"], ids["left"]), (ids["middle"], ids["right"]),
                         (ids["left"], ids["leaf"])}
        shots(page, "dag")
        # A worker for the middle task's pool: everything runs, and the nodes follow without a reopen.
        workers(server.target, pool="later")
        page.wait_for_selector(node("self", ids["middle"], "succeeded"), timeout=WAIT_MS)
        for name in ("left", "right", "leaf"):
            page.wait_for_selector(node("dependent", ids[name], "succeeded"), timeout=WAIT_MS)
        # A click on a dependent opens its drawer, where the middle task is a dependency.
        page.click(node("dependent", ids["left"]))
        page.wait_for_selector(f'#drawer-title:text-is("Task {ids["left"]}")', timeout=WAIT_MS)
        page.wait_for_selector(node("self", ids["left"], "succeeded"), timeout=WAIT_MS)
        page.wait_for_selector(node("dependency", ids["middle"], "succeeded"), timeout=WAIT_MS)
        page.wait_for_selector(node("dependency", ids["root"], "succeeded"), timeout=WAIT_MS)
        page.wait_for_selector(node("dependent", ids["leaf"], "succeeded"), timeout=WAIT_MS)
        assert page.locator(node("dependent", ids["right"])).count() == 0   # a sibling, not a dependent
        page.context.close()
