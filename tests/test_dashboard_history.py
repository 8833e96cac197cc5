"""The pool cards' history charts (charts.js, uPlot) in a real headless
browser, against a real cronoq-server and worker processes: the history the
leader kept before the page opened is on the charts at once, a hovered point
reads what GET /v1/history says, and the range switch changes the span shown.
Skips without a browser, as tests/test_dashboard.py does."""

from __future__ import annotations

import json
import time

from dashkit import WAIT_MS, api, capacity, open_page, wait_until
from serverkit import AUTH, CLIENT, LISTEN, METRICS

# 240 samples kept: fewer than the 720 points the page asks for, so every point is a sample.
CONFIG = LISTEN + AUTH + """
[history]
interval_s = 0.5
kept_s = 120
[[pools]]
name = "default"
[[pools]]
name = "reports"
"""


def _history(http, **params):
    response = http.get("/v1/history", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def _pool(answer, name="default"):
    return next(p for p in answer["pools"] if p["name"] == name)


def test_the_charts_hold_the_history_from_before_the_page_opened(browser, servers, workers, shots):
    server = servers(CONFIG, name="dash-history")
    workers(server.target, slots=2)
    with api(server, METRICS) as http, api(server, CLIENT) as client:
        wait_until(lambda: capacity(http) == 2, what="the worker connecting")
        for i in range(6):
            client.post("/v1/tasks", json={"payload": {"sleep": 0.3}, "priority": ["high", "low"][i % 2]})
        wait_until(lambda: http.get("/v1/snapshot").json()["totals"]["succeeded"] == 6, what="the 6 tasks")
        # The history holds the run: busy slots and successes, before any page is open.
        wait_until(lambda: max(_pool(_history(http))["throughput_per_s"]) > 0, what="the successes sampled")
        before_open_ms = time.time() * 1000
        kept = _pool(_history(http))
        assert max(kept["busy"]) >= 1 and kept["t_unix_ms"][0] < before_open_ms

        page = open_page(browser, server, METRICS, viewport=(1280, 1000))
        capacity_chart = page.locator('.pool[data-pool="default"] .history-plot[data-chart="capacity"]')
        capacity_chart.locator("canvas").wait_for(timeout=WAIT_MS)
        # On first load the charts already hold the points sampled before the page opened.
        page.wait_for_function(
            "([sel, t]) => { const el = document.querySelector(sel); "
            "return el && el.dataset.firstT && Number(el.dataset.firstT) < t && Number(el.dataset.points) > 10; }",
            arg=['.pool[data-pool="default"] .history-plot[data-chart="capacity"]', before_open_ms],
            timeout=WAIT_MS)
        assert int(capacity_chart.get_attribute("data-first-t")) <= kept["t_unix_ms"][0] + 1
        for kind in ("capacity", "pending", "throughput", "waits"):
            chart = page.locator(f'.pool[data-pool="default"] .history-plot[data-chart="{kind}"]')
            assert int(chart.get_attribute("data-points")) > 10, kind
            assert chart.locator(".u-legend").count() == 1, kind
        throughput = page.locator('.pool[data-pool="default"] .history-plot[data-chart="throughput"]')
        # The page keeps appending as snapshots come: its last point moves on.
        points = int(capacity_chart.get_attribute("data-points"))
        page.wait_for_function(
            "([sel, n]) => Number(document.querySelector(sel).dataset.points) > n",
            arg=['.pool[data-pool="default"] .history-plot[data-chart="capacity"]', points], timeout=WAIT_MS)
        assert json.loads(capacity_chart.get_attribute("data-last-values"))["capacity"] == 2

        # Hover the capacity chart: the legend shows the values of the point under the cursor,
        # the same as the server's history at that time.
        over = capacity_chart.locator(".u-over")
        box = over.bounding_box()
        over.hover(position={"x": box["width"] * 0.6, "y": box["height"] / 2})
        page.wait_for_function("(sel) => document.querySelector(sel).dataset.cursorT",
                               arg='.pool[data-pool="default"] .history-plot[data-chart="capacity"]',
                               timeout=WAIT_MS)
        at = int(capacity_chart.get_attribute("data-cursor-t"))
        shown = json.loads(capacity_chart.get_attribute("data-cursor-values"))
        server_side = _pool(_history(http))
        index = server_side["t_unix_ms"].index(at)
        for label, key in (("capacity", "capacity"), ("desired", "desired"), ("busy", "busy"), ("cost", "cost")):
            assert shown[label] == server_side[key][index], label
        legend = {capacity_chart.locator(".u-legend .u-series").nth(i).locator(".u-label").inner_text():
                  capacity_chart.locator(".u-legend .u-series").nth(i).locator(".u-value").inner_text()
                  for i in range(1, 5)}
        assert legend["capacity"] == str(server_side["capacity"][index]).removesuffix(".0")
        # And a point of the throughput chart where tasks succeeded reads the server's rate.
        rates = server_side["throughput_per_s"]
        busiest = max(range(len(rates)), key=rates.__getitem__)
        x_min, x_max = float(throughput.get_attribute("data-x-min")), float(throughput.get_attribute("data-x-max"))
        tbox = throughput.locator(".u-over").bounding_box()
        x = (server_side["t_unix_ms"][busiest] / 1000 - x_min) / (x_max - x_min) * tbox["width"]
        throughput.locator(".u-over").hover(position={"x": max(0.0, min(x, tbox["width"] - 1)),
                                                       "y": tbox["height"] / 2})
        page.wait_for_function("(sel) => document.querySelector(sel).dataset.cursorT",
                               arg='.pool[data-pool="default"] .history-plot[data-chart="throughput"]',
                               timeout=WAIT_MS)
        at = int(throughput.get_attribute("data-cursor-t"))
        shown = json.loads(throughput.get_attribute("data-cursor-values"))
        assert shown["succeeded/s"] == server_side["throughput_per_s"][server_side["t_unix_ms"].index(at)]
        shots(page, "history")

        # The range switch: 5 min and 1 h are windows ending now; all kept spans the points held.
        switch = page.locator("#history-range")
        assert switch.is_visible()
        pending = '.pool[data-pool="default"] .history-plot[data-chart="pending"]'
        for range_name, span in (("300", 300), ("3600", 3600)):
            switch.locator(f'button[data-range="{range_name}"]').click()
            assert switch.locator(f'button[data-range="{range_name}"]').get_attribute("aria-pressed") == "true"
            page.wait_for_function(
                "([sel, span]) => { const el = document.querySelector(sel); "
                "return Math.abs(Number(el.dataset.xMax) - Number(el.dataset.xMin) - span) < 1; }",
                arg=[pending, span], timeout=WAIT_MS)
        switch.locator('button[data-range="all"]').click()
        page.wait_for_function(
            "(sel) => { const el = document.querySelector(sel); "
            "return Math.abs(Number(el.dataset.xMin) * 1000 - Number(el.dataset.firstT)) < 1; }",
            arg=pending, timeout=WAIT_MS)
        first = int(page.locator(pending).get_attribute("data-first-t"))
        assert first <= kept["t_unix_ms"][0] + 1 and int(page.locator(pending).get_attribute("data-points")) > 10
        page.context.close()
