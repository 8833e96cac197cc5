"""The dashboard's look and keyboard use: the light and dark themes (their
tokens, their contrast, the system's choice and the toggle), the phone
layout, the keyboard shortcuts and the drawer's focus, and the strict
Content-Security-Policy kept by every file of cronoq/server/ui.

The first tests read the files (and ask an in-process server for them); the
browser tests drive the system Chromium against a real cronoq-server process
with a worker process (see tests/test_dashboard.py for the style).
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest

import cronoq.server
from cronoq.server.gateway import _UI_HEADERS, UI_FILES
from dashkit import WAIT_MS, DashWorker, api, capacity, wait_until
from serverkit import ADMIN, AUTH, LISTEN

UI = Path(cronoq.server.__file__).parent / "ui"

# XML namespace names: identifiers that a script passes to createElementNS, never fetched.
NAMESPACES = {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xhtml", "http://www.w3.org/1999/xlink"}


# A vendored library's own header comment, kept as published (docs/dashboard.md, How it is built).
VENDORED = {"uplot.min.js": {"https://github.com/leeoniya/uPlot"}}


def ui_texts() -> dict[str, str]:
    return {path.name: path.read_text(encoding="utf-8") for path in sorted(UI.iterdir())
            if path.is_file() and path.suffix in (".html", ".js", ".css", ".svg")}


# ---------------------------------------------------------------- the CSP, without a browser

@pytest.mark.asyncio
async def test_every_dashboard_file_is_served_with_the_strict_csp():
    expected = dict(_UI_HEADERS)
    csp = expected["content-security-policy"]
    directives = dict(part.strip().split(" ", 1) for part in csp.split(";"))
    assert directives["default-src"] == "'none'" and directives["script-src"] == "'self'"
    assert directives["style-src"] == "'self'" and directives["connect-src"] == "'self'"
    assert "unsafe" not in csp and "*" not in csp and "http" not in csp
    assert set(UI_FILES) == set(ui_texts()), "the gateway serves every file of cronoq/server/ui"
    async with cronoq.server.serve(LISTEN) as server:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.http_port}", timeout=30,
                                     headers={"host": "localhost"}) as anonymous:
            for name in sorted(UI_FILES) + [""]:
                r = await anonymous.get(f"/ui/{name}")
                assert r.status_code == 200, name
                for header, value in expected.items():
                    assert r.headers[header] == value, (name, header)


class _Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.problems: list[str] = []
        self.scripts: list[str] = []

    def handle_starttag(self, tag, attrs):
        names = dict(attrs)
        if tag == "script":
            if not names.get("src"):
                self.problems.append(f"an inline <script> at line {self.getpos()[0]}")
            else:
                self.scripts.append(names["src"])
        if tag == "style":
            self.problems.append(f"a <style> element at line {self.getpos()[0]}")
        for name, value in attrs:
            if name == "style":
                self.problems.append(f"a style attribute on <{tag}> at line {self.getpos()[0]}")
            if name.startswith("on"):
                self.problems.append(f"a handler attribute {name} on <{tag}> at line {self.getpos()[0]}")
            if value and value.strip().lower().startswith("javascript:"):
                self.problems.append(f"a javascript: URL on <{tag}> at line {self.getpos()[0]}")


def test_the_html_has_no_inline_script_style_or_handler():
    markup = _Markup()
    markup.feed((UI / "index.html").read_text(encoding="utf-8"))
    assert markup.problems == []
    # theme.js first (a classic script, so the theme applies before the page is drawn), then the modules.
    assert markup.scripts[0] == "theme.js" and {"app.js", "keys.js"} <= set(markup.scripts)
    assert all((UI / src).is_file() for src in markup.scripts)


def test_no_dashboard_file_names_another_origin_or_needs_what_the_csp_forbids():
    # Any http(s) URL counts, comments included (a licence or a reference belongs in the docs),
    # except the XML namespace names above.
    for name, text in ui_texts().items():
        urls = set(re.findall(r"https?://[^\s\"'`<>)]+", text)) - NAMESPACES - VENDORED.get(name, set())
        assert urls == set(), f"{name} names another origin: {sorted(urls)}"
        assert not re.search(r"url\(\s*['\"]?//", text), f"{name} has a protocol-relative url()"
        if name.endswith(".js"):
            for forbidden in (r"\beval\(", r"new Function\(", r"setAttribute\(\s*['\"](style|on\w+)['\"]",
                              r"javascript:", r"\bstyle=\\?[\"']", r"<[a-z][^>]*\son[a-z]+="):
                assert not re.search(forbidden, text), f"{name} does what the CSP forbids: {forbidden}"
        if name.endswith(".css"):
            assert "@import" not in text, name


# ---------------------------------------------------------------- the palettes, without a browser

def _block(css: str, selector: str) -> dict[str, str]:
    start = css.index(selector + " {") + len(selector) + 2
    body = css[start:css.index("}", start)]
    return dict(re.findall(r"(--[\w-]+):\s*([^;]+);", body))


def palettes() -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    css = (UI / "app.css").read_text(encoding="utf-8")
    return (_block(css, ":root"), _block(css, ':root:not([data-theme="light"])'),
            _block(css, ':root[data-theme="dark"]'))


def statuses() -> list[str]:
    found = re.search(r"const STATUSES = \[([^\]]*)\]", (UI / "app.js").read_text(encoding="utf-8"))
    assert found is not None
    return re.findall(r'"(\w+)"', found.group(1))


def test_both_palettes_define_the_same_tokens_and_the_two_dark_blocks_agree():
    light, dark_by_system, dark_by_choice = palettes()
    assert dark_by_system == dark_by_choice, "the dark palette differs between the media query and data-theme"
    assert set(light) == set(dark_by_system)
    wanted = {"--bg", "--fg", "--muted", "--card", "--border", "--accent", "--ok", "--warn", "--bad",
              "--focus",
              *(f"--series-{i}" for i in range(1, 7)), *(f"--status-{s}" for s in statuses())}
    assert wanted <= set(light), sorted(wanted - set(light))


def _luminance(hex_colour: str) -> float:
    value = hex_colour.strip().lstrip("#")
    assert re.fullmatch(r"[0-9a-fA-F]{6}", value), f"not a #rrggbb colour: {hex_colour}"

    def channel(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(int(value[i:i + 2], 16) / 255) for i in (0, 2, 4))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_text_colour_meets_wcag_aa_and_chart_lines_3_to_1(theme):
    light, dark, _ = palettes()
    tokens = light if theme == "light" else dark
    texts = ["--fg", "--muted", "--accent", "--ok", "--warn", "--bad", *(f"--status-{s}" for s in statuses())]
    pairs = [(text, ground) for text in texts for ground in ("--bg", "--card", "--card-2")]
    pairs += [(text, ground) for text in ["--fg", *(f"--status-{s}" for s in statuses())]
              for ground in ("--hover", "--selected")]
    pairs += [("--accent", "--selected"), ("--ok", "--ok-bg"), ("--warn", "--warn-bg"), ("--bad", "--bad-bg"), ("--fg", "--neutral-bg"),
              ("--accent-fg", "--accent")]
    poor = [(text, ground, round(contrast(tokens[text], tokens[ground]), 2)) for text, ground in pairs
            if contrast(tokens[text], tokens[ground]) < 4.5]
    assert poor == []
    series = [f"--series-{i}" for i in range(1, 7)]
    lines = [(line, round(contrast(tokens[line], tokens["--card-2"]), 2)) for line in series
             if contrast(tokens[line], tokens["--card-2"]) < 3]
    assert lines == []
    assert min(contrast(tokens["--focus"], tokens[ground]) for ground in ("--bg", "--card")) >= 3


# ---------------------------------------------------------------- in the browser

CONFIG = LISTEN + AUTH + """
[[pools]]
name = "default"
[[pools]]
name = "reports"
"""

# Each page reports a CSP violation on its console, with the console's own "Refused to ..." errors.
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) =>
  console.error(`csp-violation: ${e.violatedDirective} blocked ${e.blockedURI || "inline"} ` +
                `at ${e.sourceFile}:${e.lineNumber}`));
new MutationObserver((records, observer) => {
  if (document.body) {
    window.themeWhenTheBodyCame = document.documentElement.getAttribute("data-theme");
    observer.disconnect();
  }
}).observe(document, {childList: true, subtree: true});
"""


def violations(messages: list[str]) -> list[str]:
    return [m for m in messages if m.startswith("csp-violation") or "Content Security Policy" in m]


def look_page(browser, server, page_name="overview", viewport=(1280, 800), scheme="light"):
    """A signed-in page (its own context, so its own storage) whose console messages are kept in
    page.messages."""
    context = browser.new_context(viewport={"width": viewport[0], "height": viewport[1]}, color_scheme=scheme)
    context.add_init_script(REPORT_VIOLATIONS)
    page = context.new_page()
    page.messages = []
    page.on("console", lambda message: page.messages.append(message.text))
    page.goto(f"http://127.0.0.1:{server.http_port}/ui/#{page_name}")
    page.fill("#token", ADMIN)
    page.click("#login-form button[type=submit]")
    page.wait_for_selector('#conn[data-state="live"]', timeout=WAIT_MS)
    return page


@pytest.fixture(scope="module")
def dash(module_servers):
    """A server with a worker and a few finished tasks: "look/first", "look/second" and
    "look/after" (which waited for look/first)."""
    server = module_servers(CONFIG, name="look")
    worker = DashWorker(server.target, slots=2)
    try:
        with api(server, ADMIN) as http:
            wait_until(lambda: capacity(http) == 2, what="the worker connecting")
            ids = {}
            for key in ("look/first", "look/second"):
                ids[key] = http.post("/v1/tasks", json={"payload": {"sleep": 0}, "key": key}).json()["id"]
            after = http.post("/v1/tasks", json={"after": ["look/first"], "key": "look/after"}).json()
            ids["look/after"] = after["id"]
            wait_until(lambda: all(http.get(f"/v1/tasks/{i}").json()["status"] == "succeeded"
                                   for i in ids.values()), what="the tasks finishing")
        server.ids = ids
        yield server
    finally:
        worker.stop()


def background(page) -> str:
    return page.evaluate("getComputedStyle(document.documentElement).backgroundColor")


def token(page, name: str) -> str:
    """The token's value resolved to rgb(...) as the page computes it."""
    return page.evaluate("""(name) => {
        const probe = document.createElement("i");
        probe.style.color = `var(${name})`;
        document.body.append(probe);
        const colour = getComputedStyle(probe).color;
        probe.remove();
        return colour;
    }""", name)


LIGHT_BG, DARK_BG = "rgb(246, 247, 249)", "rgb(14, 19, 26)"


def test_the_theme_follows_the_system_and_the_toggle_overrides_it_across_reloads(browser, dash, shots):
    page = look_page(browser, dash, "overview", scheme="light")
    toggle = page.locator("#theme-toggle")
    assert background(page) == LIGHT_BG and toggle.get_attribute("data-choice") == "system"
    assert toggle.inner_text() == "Theme: system" and "press for light" in toggle.get_attribute("title")
    chart = '#pools article[data-pool="default"] .history-plot[data-chart="capacity"]'
    page.locator(chart + " canvas").wait_for(state="attached", timeout=WAIT_MS)
    # (uPlot draws on canvas: the colours it drew the series with are on the chart's element)
    stroke = lambda: json.loads(page.locator(chart).get_attribute("data-colors"))["capacity"]   # noqa: E731
    assert stroke() == token(page, "--series-1") == "rgb(37, 99, 235)"

    # The system asks for dark: the page follows, its charts too.
    page.emulate_media(color_scheme="dark")
    assert background(page) == DARK_BG
    page.wait_for_function("(sel) => JSON.parse(document.querySelector(sel).dataset.colors).capacity "
                           "=== 'rgb(132, 173, 255)'", arg=chart, timeout=WAIT_MS)
    assert stroke() == token(page, "--series-1") == "rgb(132, 173, 255)"
    assert page.evaluate("document.documentElement.hasAttribute('data-theme')") is False

    # The toggle overrides the system, and the choice survives a reload, applied before the body is parsed.
    toggle.click()
    assert toggle.get_attribute("data-choice") == "light" and background(page) == LIGHT_BG
    assert page.evaluate("localStorage.getItem('cronoq.theme')") == "light"
    page.reload()
    page.wait_for_selector('#conn[data-state="live"]', timeout=WAIT_MS)
    assert page.evaluate("window.themeWhenTheBodyCame") == "light"
    assert background(page) == LIGHT_BG and toggle.inner_text() == "Theme: light"
    toggle.click()
    assert toggle.get_attribute("data-choice") == "dark"
    page.emulate_media(color_scheme="light")
    assert background(page) == DARK_BG, "a chosen dark theme stays dark on a light system"
    assert page.evaluate("localStorage.getItem('cronoq.theme')") == "dark"

    # The drawer's graph takes the theme's colours: its nodes are tinted by status, from the tokens.
    page.click("nav a[data-page=tasks]")
    row = page.locator(f'#task-table tr[data-id="{dash.ids["look/after"]}"]')
    row.click()
    node = page.locator('#drawer-dag g.node.status-succeeded[data-ref="look/first"] rect')
    node.wait_for(timeout=WAIT_MS)
    dark_fill = node.evaluate("(r) => getComputedStyle(r).fill")
    node_stroke = lambda: node.evaluate("(r) => getComputedStyle(r).stroke")   # noqa: E731
    assert node_stroke() == token(page, "--status-succeeded") == "rgb(74, 222, 128)"
    shots(page, "dark")

    # Back to the system's (light): nothing kept, the graph follows.
    page.keyboard.press("Escape")
    toggle.click()
    row.click()
    node.wait_for(timeout=WAIT_MS)
    assert toggle.get_attribute("data-choice") == "system" and background(page) == LIGHT_BG
    assert page.evaluate("localStorage.getItem('cronoq.theme')") is None
    assert node.evaluate("(r) => getComputedStyle(r).fill") != dark_fill
    assert node_stroke() == token(page, "--status-succeeded") == "rgb(19, 115, 51)"
    assert violations(page.messages) == []
    page.context.close()


def overflow(page) -> int:
    """How far the page is wider than the window (0: no sideways scrolling of the page)."""
    return page.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def small_targets(page) -> list[str]:
    return page.evaluate("""() => [...document.querySelectorAll(
            "button, select, input:not([type=checkbox]):not([type=radio]), nav a")]
        .filter((el) => el.getClientRects().length && !el.closest("[hidden]"))
        .map((el) => [el.id || el.textContent.trim() || el.name, el.getBoundingClientRect().height])
        .filter(([, height]) => height < 40).map(([name, height]) => `${name}: ${height}px`)""")


def test_a_phone_gets_one_column_scrolling_strips_and_a_full_screen_drawer(browser, dash, shots):
    page = look_page(browser, dash, "overview", viewport=(390, 844))
    page.wait_for_selector('#pools article[data-pool="reports"]', timeout=WAIT_MS)
    assert overflow(page) <= 0
    cards = page.locator("#pools article.pool")
    boxes = [cards.nth(i).bounding_box() for i in range(cards.count())]
    assert len(boxes) == 2 and boxes[0]["x"] == boxes[1]["x"]
    assert boxes[1]["y"] > boxes[0]["y"] + boxes[0]["height"] - 1, "the cards are one above the other"
    assert all(box["x"] >= 0 and box["x"] + box["width"] <= 390 for box in boxes)
    # The page links are one strip that scrolls sideways inside the header.
    nav = page.locator("#nav")
    assert nav.evaluate("(n) => getComputedStyle(n).overflowX") == "auto"
    assert nav.bounding_box()["x"] + nav.bounding_box()["width"] <= 390
    assert small_targets(page) == []
    shots(page, "phone")
    # Every page fits the width; a wide table scrolls inside its own box.
    for link in page.locator("#nav a").all():
        link.scroll_into_view_if_needed()
        link.click()
        page.wait_for_selector(f'section#{link.get_attribute("data-page")}:not([hidden])', timeout=WAIT_MS)
        assert overflow(page) <= 0, link.get_attribute("data-page")
        assert small_targets(page) == [], link.get_attribute("data-page")
    # A page reached by its shortcut brings its link into the strip's view.
    page.locator("#main").focus()
    page.keyboard.press("g")
    page.keyboard.press("o")
    page.wait_for_function("""() => {
        const link = document.querySelector("#nav a.current"), nav = document.getElementById("nav");
        return link.dataset.page === "overview" &&
               link.getBoundingClientRect().left >= nav.getBoundingClientRect().left; }""", timeout=WAIT_MS)
    page.keyboard.press("g")
    page.keyboard.press("t")
    table = page.locator("#task-table")
    page.locator(f'#task-table tr[data-id="{dash.ids["look/first"]}"]').wait_for(timeout=WAIT_MS)
    assert table.evaluate("(t) => t.scrollWidth > t.clientWidth && getComputedStyle(t).overflowX === 'auto'")
    assert overflow(page) <= 0
    # The drawer takes the whole screen.
    page.locator(f'#task-table tr[data-id="{dash.ids["look/first"]}"] td').first.click()
    page.wait_for_selector("#drawer-result:has-text('slept')", timeout=WAIT_MS)
    box = page.locator("#drawer").bounding_box()
    assert box["x"] == 0 and box["width"] == 390 and box["height"] == 844
    assert small_targets(page) == []
    assert violations(page.messages) == []
    page.context.close()


def shown_page(page) -> str:
    """The page the address names (its hash, before the page's own state)."""
    return page.url.partition("#")[2].partition("?")[0]


def active(page) -> dict:
    return page.evaluate("""() => { const el = document.activeElement;
        return {tag: el.tagName.toLowerCase(), id: el.id, row: el.dataset ? el.dataset.id || null : null,
                ref: el.dataset ? el.dataset.ref || null : null,
                className: String(el.className && el.className.baseVal !== undefined ? el.className.baseVal
                                                                                     : el.className),
                inDrawer: document.getElementById("drawer").contains(el),
                outline: getComputedStyle(el).outlineStyle}; }""")


def test_the_keyboard_reaches_pages_rows_the_drawer_and_the_help(browser, dash):
    page = look_page(browser, dash, "overview")
    assert active(page)["id"] == "main", "signing in moves the focus to the content"
    # On a page loaded signed in, the skip link comes first and moves the focus to the content, not to
    # another page.
    page.reload()
    page.wait_for_selector('#conn[data-state="live"]', timeout=WAIT_MS)
    page.keyboard.press("Tab")
    assert active(page)["className"] == "skip-link" and active(page)["outline"] != "none"
    page.keyboard.press("Enter")
    assert active(page)["id"] == "main" and page.url.endswith("#overview")

    page.keyboard.press("g")
    page.keyboard.press("t")
    page.wait_for_selector("section#tasks:not([hidden])", timeout=WAIT_MS)
    assert shown_page(page) == "tasks"
    first = page.locator("#task-table tbody tr").first
    first.wait_for(timeout=WAIT_MS)
    ids = page.eval_on_selector_all("#task-table tbody tr", "(rows) => rows.map((r) => r.dataset.id)")
    assert len(ids) >= 3

    # Typing in a field is not a shortcut.
    page.locator("#task-filters [name=tenant]").focus()
    page.keyboard.type("go")
    assert shown_page(page) == "tasks" and page.locator("#task-filters [name=tenant]").input_value() == "go"
    page.locator("#task-filters [name=tenant]").fill("")
    # A control that takes no text (a checkbox another module adds) leaves them on.
    page.evaluate("""() => { const box = document.createElement("input");
        box.type = "checkbox"; box.id = "a-checkbox"; document.getElementById("tasks").prepend(box); }""")
    page.locator("#a-checkbox").focus()
    page.keyboard.press("k")
    assert active(page)["row"] == ids[-1]
    page.evaluate("document.getElementById('a-checkbox').remove()")
    page.locator("#main").focus()

    # j and k move through the rows, with a visible ring.
    page.keyboard.press("j")
    assert active(page)["row"] == ids[0] and active(page)["outline"] != "none"
    page.keyboard.press("j")
    page.keyboard.press("j")
    assert active(page)["row"] == ids[2]
    page.keyboard.press("k")
    assert active(page)["row"] == ids[1]

    # Enter opens the row's drawer; Tab stays in it; Escape closes it and gives the focus back to the row.
    page.keyboard.press("Enter")
    page.wait_for_selector(f'#drawer-title:text-is("Task {ids[1]}")', timeout=WAIT_MS)
    page.wait_for_selector("#drawer-result:has-text('slept')", timeout=WAIT_MS)
    assert active(page)["inDrawer"]
    for _ in range(8):
        page.keyboard.press("Tab")
        assert active(page)["inDrawer"], active(page)
    for _ in range(3):
        page.keyboard.press("Shift+Tab")
        assert active(page)["inDrawer"], active(page)
    # With the drawer open, j shows the next row's task.
    page.keyboard.press("j")
    page.wait_for_selector(f'#drawer-title:text-is("Task {ids[2]}")', timeout=WAIT_MS)
    page.keyboard.press("Escape")
    page.wait_for_selector("#drawer", state="hidden", timeout=WAIT_MS)
    assert active(page)["row"] == ids[2]

    # A dependency in the drawer's graph is reached by Tab and opened by Enter.
    after, first_id = dash.ids["look/after"], dash.ids["look/first"]
    page.locator(f'#task-table tr[data-id="{after}"]').focus()
    page.keyboard.press("Enter")
    page.wait_for_selector('#drawer-dag g.node[data-ref="look/first"][tabindex="0"]', timeout=WAIT_MS)
    for _ in range(12):
        page.keyboard.press("Tab")
        if active(page)["ref"] == "look/first":
            break
    assert active(page)["ref"] == "look/first"
    page.keyboard.press("Enter")
    page.wait_for_selector(f'#drawer-title:text-is("Task {first_id}")', timeout=WAIT_MS)
    page.keyboard.press("Escape")
    page.wait_for_selector("#drawer", state="hidden", timeout=WAIT_MS)
    assert active(page)["row"] == after

    # ? lists the shortcuts in a modal dialog; Escape closes it.
    page.keyboard.press("?")
    dialog = page.locator("dialog#shortcuts")
    dialog.wait_for(timeout=WAIT_MS)
    assert dialog.evaluate("(d) => d.open && d.matches(':modal')")
    listed = dialog.locator("tbody tr").evaluate_all("(rows) => rows.map((r) => r.dataset.keys)")
    assert {"g o", "g t", "g e", "g w", "g r", "g d", "j", "k", "?"} <= set(listed)
    page.keyboard.press("g")   # (not a shortcut while the dialog is open)
    page.keyboard.press("o")
    assert shown_page(page) == "tasks"
    page.keyboard.press("Escape")
    page.wait_for_selector("dialog#shortcuts", state="hidden", timeout=WAIT_MS)

    # The other pages, by their shortcuts.
    for key, name in [("e", "events"), ("w", "workers"), ("r", "recurring"), ("d", "dead"),
                      ("o", "overview")]:
        page.keyboard.press("g")
        page.keyboard.press(key)
        page.wait_for_selector(f"section#{name}:not([hidden])", timeout=WAIT_MS)
    assert page.evaluate("document.querySelector('section#workers').getAttribute('aria-label')") == "Workers"
    assert violations(page.messages) == []
    page.context.close()


def test_no_csp_violation_on_any_page_and_the_check_sees_one(browser, dash):
    page = look_page(browser, dash, "overview", scheme="dark")
    page.wait_for_selector('#pools article[data-pool="default"] .history-plot canvas', timeout=WAIT_MS)
    for link in page.locator("#nav a").all():
        link.click()
        page.wait_for_selector(f'section#{link.get_attribute("data-page")}:not([hidden])', timeout=WAIT_MS)
    page.locator('#nav a[data-page="tasks"]').click()
    page.locator(f'#task-table tr[data-id="{dash.ids["look/after"]}"]').click()
    page.wait_for_selector('#drawer-dag g.node[data-ref="look/first"]', timeout=WAIT_MS)
    page.keyboard.press("Escape")
    for _ in range(3):
        page.click("#theme-toggle")
    page.click("#shortcuts-button")
    page.wait_for_selector("dialog#shortcuts", timeout=WAIT_MS)
    page.keyboard.press("Escape")
    assert violations(page.messages) == []
    # The check works: an inline style attribute is refused and reported.
    with page.expect_console_message(lambda m: m.text.startswith("csp-violation"), timeout=WAIT_MS):
        page.evaluate("document.body.insertAdjacentHTML('beforeend', '<i style=\"color: red\"></i>')")
    assert any("style-src" in m for m in violations(page.messages))
    page.context.close()
