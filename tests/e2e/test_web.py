"""The browser chat UI (issue 10): web/ served by a real `quire serve` on
stories260K, driven in headless Chromium (Debian's chromium and
chromium-driver) through Selenium.  A message sent and the streamed reply
seen growing; stop mid-stream; reload and find the session; regenerate and
edit-and-resend; JSON mode's reply valid for its schema; a restarted server
and the conversation continued; a model reply holding <script> and an
onerror attribute shown as text; the speculative switch only where the
server drafts; a refused request's text kept in the box; the stats line
and the title as they were after a reload; one row of buttons while
editing; the whole placeholder at a phone's width.  Every test checks that the page logged no
console error and asked for nothing outside the server.  Screenshots of
the main states go to build/e2e-artifacts/web (QUIRE_ARTIFACTS)."""
import asyncio
import json
import os
import pathlib
import re
import shutil
import time

import pytest
import websockets
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

from conftest import ROOT
from test_serve_openai import Server, free_port

ART = pathlib.Path(os.environ.get("QUIRE_ARTIFACTS", ROOT / "build" / "e2e-artifacts")) / "web"


def find_exe(*names):
    for n in names:
        p = shutil.which(n) or (n if os.access(n, os.X_OK) else None)
        if p:
            return p
    return None


@pytest.fixture(scope="module")
def browser():
    chrome = find_exe("chromium", "/usr/bin/chromium", "chromium-browser", "google-chrome")
    driver_bin = find_exe("chromedriver", "/usr/bin/chromedriver")
    if not chrome or not driver_bin:
        pytest.fail("headless Chromium is needed: apt-get install chromium chromium-driver (scripts/deps.sh test)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,860",
              "--no-first-run", "--disable-background-networking", "--disable-component-update",
              "--disable-default-apps", "--disable-sync"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    d = webdriver.Chrome(service=Service(driver_bin), options=opts)
    d.set_script_timeout(30)
    ART.mkdir(parents=True, exist_ok=True)
    yield d
    d.quit()


@pytest.fixture(autouse=True)
def fresh_page(browser):
    """Each test starts from a blank page with the logs read, and leaves one
    (a page left open would go on reconnecting to a stopped server)."""
    browser.get("about:blank")
    browser.get_log("browser"), browser.get_log("performance")
    yield
    browser.get("about:blank")


@pytest.fixture
def server(quire, tmp_path):
    s = Server(quire, "--db", str(tmp_path / "quire.db"))
    yield s
    if s.proc.poll() is None:
        s.stop()


def wait(d, timeout):
    """A wait that looks again when the page redrew what it found (the
    sidebar and the log are redrawn as sessions and replies change)."""
    return WebDriverWait(d, timeout, ignored_exceptions=[StaleElementReferenceException])


def click(d, css, timeout=5):
    wait(d, timeout).until(lambda d: d.find_element(By.CSS_SELECTOR, css).click() or True)


def shot(d, name):
    path = ART / f"{name}.png"
    assert d.save_screenshot(str(path)) and path.stat().st_size > 1000, path


def clean_logs(d, base, expected=()):
    """Asserts no console error and no request outside the server since the
    last call (the logs are read and cleared); expected: substrings of the
    errors a test provokes on purpose."""
    errors = [e for e in d.get_log("browser") if e["level"] == "SEVERE"
              and not any(x in e["message"] for x in expected)]
    assert not errors, f"console errors: {errors}"
    outside = []
    for e in d.get_log("performance"):
        m = json.loads(e["message"])["message"]
        if m["method"] == "Network.requestWillBeSent":
            url = m["params"]["request"]["url"]
        elif m["method"] == "Network.webSocketCreated":
            url = m["params"]["url"]
        else:
            continue
        if not (url.startswith(base) or url.startswith(base.replace("http", "ws", 1)) or url.startswith("data:")):
            outside.append(url)
    assert not outside, f"requests outside the server: {outside}"


def open_page(d, s, path="/"):
    d.get(s.url + path)
    wait_connected(d)
    clean_logs(d, s.url)


def start(d, s, **kv):
    """The page on server s with these settings (a reload applies them)."""
    open_page(d, s)
    settings(d, **kv)
    d.refresh()
    wait_connected(d)


def wait_connected(d, timeout=20):
    wait(d, timeout).until(lambda d: d.find_element(By.ID, "conn").get_attribute("data-state") == "open")


def settings(d, **kv):
    """Sets the page's settings (as the settings panel stores them)."""
    d.execute_script("""
        const s = Object.assign(JSON.parse(localStorage.getItem('quire.settings') || '{}'), arguments[0]);
        localStorage.setItem('quire.settings', JSON.stringify(s));""", kv)


def type_and_send(d, text):
    box = d.find_element(By.ID, "input")
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def wait_idle(d, timeout=30):
    wait(d, timeout).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-running") == "0")


def replies(d):
    return d.find_elements(By.CSS_SELECTOR, "#log .msg.assistant")


def session_id(d):
    h = d.execute_script("return location.hash")
    assert h.startswith("#s="), h
    return h[3:]


def ws_requests(s):
    """Requests the server answered over the WebSocket (its /metrics)."""
    _, text = s.get("/metrics")
    return sum(float(m) for m in re.findall(r'^quire_requests_total\{endpoint="ws[^"]*",status="200"\} (\S+)$', text, re.M))


def record_growth(d):
    """Records the last reply's text length at every change, in the page."""
    d.execute_script("""
        window.__lens = [];
        const log = document.getElementById('log');
        new MutationObserver(() => {
            const r = log.querySelectorAll('.msg.assistant .body');
            if (r.length) window.__lens.push(r[r.length - 1].textContent.length);
        }).observe(log, {childList: true, subtree: true, characterData: true});""")


def test_send_stream_reload(browser, server):
    d = browser
    start(d, server, max_tokens=200, temperature=0, seed="")
    shot(d, "01-empty")
    record_growth(d)
    type_and_send(d, "Tell me a story about a cat.")
    wait_idle(d)
    lens = d.execute_script("return window.__lens")
    text = replies(d)[-1].find_element(By.CSS_SELECTOR, ".body").text
    grew = sorted(set(x for x in lens if x > 0))
    assert len(grew) >= 3, f"the reply did not grow in steps: {lens}"
    assert text.strip(), "no reply"
    stats = replies(d)[-1].find_element(By.CSS_SELECTOR, ".stats").text
    assert "tok/s" in stats and "first token" in stats and "from cache" in stats, stats
    shot(d, "02-reply")
    sid = session_id(d)
    # The session is in the sidebar, its title (from the first message) in the header.
    wait(d, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#sessions li[data-id="{sid}"]'))
    wait(d, 10).until(lambda d: d.find_element(By.ID, "title").text == "Tell me a story about a cat.")
    # A reload brings the conversation back, with its stats line and title as they were.
    d.refresh()
    wait_connected(d)
    wait(d, 10).until(lambda d: len(replies(d)) == 1)
    assert replies(d)[-1].find_element(By.CSS_SELECTOR, ".body").text == text
    assert d.find_element(By.CSS_SELECTOR, "#log .msg.user .body").text == "Tell me a story about a cat."
    assert replies(d)[-1].find_element(By.CSS_SELECTOR, ".stats").text == stats
    assert d.find_element(By.ID, "title").text == "Tell me a story about a cat."
    # The second turn's prompt reuses the first's K/V from the prefix cache.
    type_and_send(d, "What happened next?")
    wait_idle(d)
    stats = replies(d)[-1].find_element(By.CSS_SELECTOR, ".stats").text
    cached = int(stats.split(" from cache")[0].split(", ")[-1])
    assert cached > 0, stats
    shot(d, "03-reloaded-second-turn")
    # A new chat starts empty; the old one is still listed and opens.
    d.find_element(By.ID, "new-chat").click()
    assert not replies(d)
    click(d, f'#sessions li[data-id="{sid}"] .session-open')
    wait(d, 10).until(lambda d: len(replies(d)) == 2)
    clean_logs(d, server.url)


def test_stop_mid_stream(browser, server):
    d = browser
    # JSON mode with a long string: the reply cannot end before the stop.
    start(d, server, max_tokens=400, temperature=0.9, seed=7, json=True,
          schema=json.dumps({"type": "string", "minLength": 300, "maxLength": 1000}))
    # Esc at the first streamed text, from inside the page (as a user's key).
    d.execute_script("""
        const log = document.getElementById('log');
        const obs = new MutationObserver(() => {
            const r = log.querySelector('.msg.assistant .body');
            if (r && r.textContent.length > 0) {
                obs.disconnect();
                document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape', bubbles: true}));
            }
        });
        obs.observe(log, {childList: true, subtree: true, characterData: true});""")
    type_and_send(d, "Once upon a time")
    wait_idle(d)
    r = replies(d)[-1]
    assert r.get_attribute("data-status") == "partial"
    stats = r.find_element(By.CSS_SELECTOR, ".stats").text
    assert "cancelled" in stats, stats
    n = int(stats.split(" tokens")[0].split(" · ")[-1])
    assert 0 < n < 300, stats
    shot(d, "04-stopped")
    # Stored as partial: after a reload it is still marked stopped.
    d.refresh()
    wait_connected(d)
    wait(d, 10).until(lambda d: len(replies(d)) == 1)
    assert replies(d)[-1].get_attribute("data-status") == "partial"
    # Stopped before the server's start (the turn still being stored): the
    # cancel waits for start, and the session gets the turn once, stopped.
    d.execute_script("""
        const box = document.getElementById('input');
        box.value = 'And then?';
        document.getElementById('composer').requestSubmit();
        document.dispatchEvent(new KeyboardEvent('keydown', {key: 'Escape', bubbles: true}));""")
    wait_idle(d)
    sid = session_id(d)
    _, sess = server.request("GET", f"/v1/sessions/{sid}")
    assert [(m["role"], m["status"]) for m in sess["messages"]][2:] == [("user", "done"), ("assistant", "partial")]
    assert len(sess["messages"]) == 4 and len(replies(d)) == 2
    clean_logs(d, server.url)


def test_regenerate_and_edit(browser, server):
    d = browser
    start(d, server, max_tokens=40, temperature=1.0, seed="")
    type_and_send(d, "Tell me about a dog.")
    wait_idle(d)
    sid = session_id(d)
    first = replies(d)[-1].find_element(By.CSS_SELECTOR, ".body").text
    before = ws_requests(server)
    d.find_element(By.CSS_SELECTOR, "#log .msg.assistant .regenerate").click()
    wait_idle(d)
    assert ws_requests(server) == before + 1  # a new request made the reply
    status, sess = server.request("GET", f"/v1/sessions/{sid}")
    assert status == 200
    msgs = [(m["role"], m["content"]) for m in sess["messages"]]
    assert [r for r, _ in msgs] == ["user", "assistant"], msgs  # replaced, not appended
    assert len(replies(d)) == 1 and first.strip()
    # Edit the user message and send it again.
    d.find_element(By.CSS_SELECTOR, "#log .msg.user .edit").click()
    # One row of buttons while editing: Send and Cancel, not Copy and Edit as well.
    rows = d.find_elements(By.CSS_SELECTOR, "#log .msg.user .tools")
    assert [[b.text for b in r.find_elements(By.TAG_NAME, "button")] for r in rows if r.is_displayed()] == [["Send", "Cancel"]]
    area = d.find_element(By.CSS_SELECTOR, "#log .msg.user textarea")
    area.clear()
    area.send_keys("Tell me about a bird.")
    area.send_keys(Keys.ENTER)
    wait_idle(d)
    _, sess = server.request("GET", f"/v1/sessions/{sid}")
    assert [(m["role"], m["content"]) for m in sess["messages"]][0] == ("user", "Tell me about a bird.")
    assert len(sess["messages"]) == 2
    assert len(d.find_elements(By.CSS_SELECTOR, "#log .msg")) == 2
    shot(d, "05-edited")
    clean_logs(d, server.url)


SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}


def test_json_mode(browser, server):
    d = browser
    start(d, server, json=True, schema=json.dumps(SCHEMA), max_tokens=120, temperature=0.8, seed=11)
    assert d.find_element(By.ID, "json-mode").is_selected()
    type_and_send(d, "Who is in the story?")
    wait_idle(d)
    r = replies(d)[-1]
    badge = r.find_element(By.CSS_SELECTOR, ".check")
    assert "valid" in badge.get_attribute("class").split(), badge.text
    value = json.loads(r.find_element(By.CSS_SELECTOR, "pre.json").text)
    assert set(value) == {"name", "age"} and isinstance(value["age"], int) and 0 <= value["age"] <= 99
    shot(d, "06-json")
    # The page's own check: a value against the schema it breaks is marked invalid.
    errs = d.execute_async_script("""
        const done = arguments[arguments.length - 1];
        import('/schema.js').then((m) => done(m.validate({name: 'x', age: 120, extra: 1}, arguments[0])));""", SCHEMA)
    assert len(errs) == 2, errs
    settings(d, json=False)
    clean_logs(d, server.url)


def test_markup_in_replies_is_text(browser, server):
    d = browser
    open_page(d, server)
    payload = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> **bold**'

    # A real model reply holding the markup: the grammar (guided_choice) makes
    # the model write exactly it, into a session the page then opens.
    async def make():
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/v1/ws") as ws:
            await ws.send(json.dumps({"type": "chat", "id": "x", "new_session": True, "max_tokens": 200,
                                      "messages": [{"role": "user", "content": "<b onmouseover=alert(1)>hi</b>"}],
                                      "guided_choice": [payload]}))
            while True:
                m = json.loads(await ws.recv())
                if m["type"] == "done":
                    return m["session"]
                if m["type"] == "error":
                    raise RuntimeError(m["error"])
    sid = asyncio.run(asyncio.wait_for(make(), 60))
    d.get(f"{server.url}/#s={sid}")
    wait_connected(d)
    wait(d, 10).until(lambda d: len(replies(d)) == 1)
    body = replies(d)[0].find_element(By.CSS_SELECTOR, ".body")
    assert "<script>window.__pwned = 1</script>" in body.text
    assert 'onerror="window.__pwned = 2"' in body.text
    assert body.find_elements(By.TAG_NAME, "strong")[0].text == "bold"  # Markdown still applies
    assert not body.find_elements(By.TAG_NAME, "script") and not body.find_elements(By.TAG_NAME, "img")
    assert d.find_element(By.CSS_SELECTOR, "#log .msg.user .body").text == "<b onmouseover=alert(1)>hi</b>"
    assert not d.find_elements(By.CSS_SELECTOR, "#log b")
    time.sleep(0.3)
    assert d.execute_script("return window.__pwned === undefined")
    shot(d, "07-markup-as-text")
    clean_logs(d, server.url)


def test_restart_and_continue(browser, quire, tmp_path):
    d = browser
    port = free_port()
    db = str(tmp_path / "quire.db")
    s = Server(quire, "--db", db, "--cache-disk-load", "always", port=port)
    try:
        start(d, s, max_tokens=30, temperature=0, seed="")
        type_and_send(d, "Tell me a story.")
        wait_idle(d)
        sid = session_id(d)
        s.stop()
        wait(d, 10).until(lambda d: d.find_element(By.ID, "conn").get_attribute("data-state") == "closed")
        shot(d, "08-disconnected")
        assert d.find_element(By.ID, "send").get_attribute("disabled")
        s = Server(quire, "--db", db, "--cache-disk-load", "always", port=port)
        wait_connected(d, timeout=30)  # it reconnects by itself
        type_and_send(d, "What happened next?")
        wait_idle(d)
        # The history's K/V came back from disk, and the reply says so.
        stats = replies(d)[-1].find_element(By.CSS_SELECTOR, ".stats").text
        disk = int(stats.split("disk ")[1].split(")")[0])
        assert disk > 0, stats
        _, sess = s.request("GET", f"/v1/sessions/{sid}")
        assert [m["role"] for m in sess["messages"]] == ["user", "assistant", "user", "assistant"]
        assert len(replies(d)) == 2
        shot(d, "09-reconnected")
        # While the server was down the socket's and /v1/models' connections
        # were refused: those errors are expected, no other.
        clean_logs(d, s.url, expected=("ERR_CONNECTION_REFUSED", "WebSocket connection to 'ws://127.0.0.1:%d/v1/ws' failed" % port))
    finally:
        if s.proc.poll() is None:
            s.stop()


def placeholder_fits(d):
    """The empty message box shows its whole placeholder (two lines at a
    phone's width), not its first line."""
    def measure(d):
        return d.execute_script("""
            const t = document.getElementById('input');
            t.value = t.placeholder;
            const r = [t.scrollHeight, t.clientHeight];
            t.value = '';
            return r;""")
    try:
        wait(d, 3).until(lambda d: measure(d)[0] <= measure(d)[1])
    except TimeoutException:
        need, has = measure(d)
        raise AssertionError(f"placeholder clipped: needs {need}px, has {has}px")


def test_phone_width_and_keyboard(browser, server):
    d = browser
    open_page(d, server)
    try:
        # Narrowed from a desktop's width (a window made smaller, a phone turned): the box follows.
        d.set_window_size(390, 844)
        wait(d, 5).until(lambda d: d.execute_script("return window.innerWidth") <= 390)
        placeholder_fits(d)
        d.refresh()
        wait_connected(d)
        sidebar = d.find_element(By.ID, "sidebar")
        assert sidebar.rect["x"] + sidebar.rect["width"] <= 1  # hidden off screen
        d.find_element(By.ID, "open-side").click()
        wait(d, 5).until(lambda d: d.find_element(By.ID, "sidebar").rect["x"] >= 0)
        shot(d, "10-phone-sidebar")
        d.find_element(By.ID, "close-side").click()
        placeholder_fits(d)
        box = d.find_element(By.ID, "input")
        box.send_keys("line one")
        box.send_keys(Keys.SHIFT, Keys.ENTER)
        box.send_keys("line two")
        assert box.get_attribute("value") == "line one\nline two"  # Shift+Enter: a new line, not sent
        assert not replies(d)
        box.send_keys(Keys.ENTER)
        wait_idle(d)
        assert d.find_element(By.CSS_SELECTOR, "#log .msg.user .body").text == "line one\nline two"
        shot(d, "11-phone-reply")
        clean_logs(d, server.url)
    finally:
        d.set_window_size(1280, 860)


def open_settings(d):
    d.find_element(By.ID, "open-settings").click()
    wait(d, 5).until(lambda d: d.execute_script(
        "const r = document.getElementById('settings').getBoundingClientRect();"
        "return Math.abs(r.right - window.innerWidth) < 1;"))


def test_sidebar_settings_speculative_theme(browser, quire, tmp_path):
    d = browser
    draft = str(ROOT / "tests" / "fixtures" / "models" / "stories260K-draft4.gguf")
    s = Server(quire, "--db", str(tmp_path / "quire.db"), "--draft", draft)
    try:
        start(d, s, max_tokens=60, temperature=0, seed="")
        # Settings: the speculative switch is offered (the server has a draft).
        open_settings(d)
        shot(d, "12-settings")
        assert d.find_element(By.ID, "spec-row").is_displayed()
        assert d.find_element(By.ID, "set-speculative").is_selected()
        d.find_element(By.ID, "close-settings").click()
        type_and_send(d, "Once upon a time there was a")
        wait_idle(d)
        stats = replies(d)[-1].find_element(By.CSS_SELECTOR, ".stats").text
        assert "drafts kept" in stats, stats
        first = session_id(d)
        # Off: the request opts out, and no drafts are made for it.
        open_settings(d)
        d.find_element(By.ID, "set-speculative").click()
        d.find_element(By.ID, "close-settings").click()
        d.find_element(By.ID, "new-chat").click()
        type_and_send(d, "Once upon a time there was a")
        wait_idle(d)
        stats = replies(d)[-1].find_element(By.CSS_SELECTOR, ".stats").text
        assert "drafts kept" not in stats, stats
        second = session_id(d)
        assert first != second
        # Rename the first conversation, delete the second, from the sidebar.
        wait(d, 10).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#sessions li")) == 2)
        click(d, f'#sessions li[data-id="{first}"] .session-rename')
        alert = wait(d, 5).until(lambda d: d.switch_to.alert)
        alert.send_keys("The cat story")
        alert.accept()
        wait(d, 10).until(
            lambda d: d.find_element(By.CSS_SELECTOR, f'#sessions li[data-id="{first}"] .session-open').text
            == "The cat story")
        click(d, f'#sessions li[data-id="{second}"] .session-delete')
        wait(d, 5).until(lambda d: d.switch_to.alert).accept()
        wait(d, 10).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#sessions li")) == 1)
        _, listed = s.request("GET", "/v1/sessions")
        assert [(x["id"], x["title"]) for x in listed["data"]] == [(first, "The cat story")]
        assert not replies(d)  # the open conversation was the deleted one
        # Copy puts the reply on the clipboard (or the page's fallback).
        click(d, f'#sessions li[data-id="{first}"] .session-open')
        wait(d, 10).until(lambda d: len(replies(d)) == 1 and d.find_element(By.ID, "title").text
                                   == "The cat story")
        wait(d, 5).until(
            lambda d: replies(d)[0].find_element(By.CSS_SELECTOR, ".copy").click() or True)
        wait(d, 5).until(
            lambda d: replies(d)[0].find_element(By.CSS_SELECTOR, ".copy").text == "Copied")
        # The dark theme follows the system's.
        light = d.execute_script("return getComputedStyle(document.body).backgroundColor")
        d.execute_cdp_cmd("Emulation.setEmulatedMedia",
                          {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})
        dark = d.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert light != dark
        assert sum(int(x) for x in dark[dark.index("(") + 1:-1].split(",")[:3]) < 150, dark
        shot(d, "13-dark")
        d.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
        clean_logs(d, s.url)
    finally:
        if s.proc.poll() is None:
            s.stop()


def test_no_speculative_switch_without_a_draft(browser, server):
    d = browser
    open_page(d, server)
    wait(d, 10).until(lambda d: d.find_element(By.ID, "model").text)  # the server's answer is in
    open_settings(d)
    assert d.find_element(By.ID, "spec-row").get_attribute("hidden") is not None
    assert not d.find_element(By.ID, "spec-row").is_displayed()
    assert d.find_element(By.ID, "set-max_tokens").is_displayed()  # the panel itself shows
    d.find_element(By.ID, "close-settings").click()
    clean_logs(d, server.url)


def test_refused_request_keeps_the_message(browser, server):
    d = browser
    # A temperature the server refuses: an error before the reply starts.
    start(d, server, temperature=-1, max_tokens=20, seed="")
    type_and_send(d, "A message typed with care")
    wait_idle(d)
    wait(d, 5).until(lambda d: d.find_element(By.ID, "notice").is_displayed())
    assert "temperature" in d.find_element(By.ID, "notice").text
    assert d.find_element(By.ID, "input").get_attribute("value") == "A message typed with care"
    assert not replies(d) and not d.find_elements(By.CSS_SELECTOR, "#log .msg.user")
    # With a temperature it takes, the same text goes as it is.
    settings(d, temperature=0)
    d.refresh()
    wait_connected(d)
    box = d.find_element(By.ID, "input")
    box.send_keys("A message typed with care")
    box.send_keys(Keys.ENTER)
    wait_idle(d)
    assert d.find_element(By.CSS_SELECTOR, "#log .msg.user .body").text == "A message typed with care"
    assert box.get_attribute("value") == ""
    clean_logs(d, server.url)


def test_api_key(browser, quire, tmp_path):
    d = browser
    s = Server(quire, "--db", str(tmp_path / "quire.db"), "--api-key", "s3cret/key=")
    try:
        d.get(s.url + "/")
        # Without the key: refused, and the page says what is missing.
        wait(d, 10).until(lambda d: "API key" in d.find_element(By.ID, "sessions-note").text)
        assert d.find_element(By.ID, "conn").get_attribute("data-state") != "open"
        assert d.find_element(By.ID, "send").get_attribute("disabled")
        open_settings(d)
        box = d.find_element(By.ID, "set-api_key")
        box.send_keys("s3cret/key=")
        d.find_element(By.ID, "close-settings").click()  # the field's change: the socket opens again with it
        wait_connected(d)
        # Before the key: the socket refused and /v1/models and /v1/sessions
        # answered 401, as they should; nothing else.
        clean_logs(d, s.url, expected=("401 (Unauthorized)", "/v1/ws' failed"))
        type_and_send(d, "Hello there")
        wait_idle(d)
        assert replies(d)[-1].find_element(By.CSS_SELECTOR, ".body").text.strip()
        sid = session_id(d)
        # The session belongs to the key: listed with it, unknown without it.
        wait(d, 10).until(lambda d: d.find_elements(By.CSS_SELECTOR, f'#sessions li[data-id="{sid}"]'))
        assert s.request("GET", f"/v1/sessions/{sid}")[0] == 401
        assert s.request("GET", f"/v1/sessions/{sid}", headers={"Authorization": "Bearer s3cret/key="})[0] == 200
        shot(d, "14-api-key")
        clean_logs(d, s.url)

        # The same over a raw socket: the key among the subprotocols, the
        # server answering with quire.v1; a wrong or malformed key refused.
        async def sock(protos):
            try:
                async with websockets.connect(f"ws://127.0.0.1:{s.port}/v1/ws", subprotocols=protos) as ws:
                    return ws.subprotocol
            except (websockets.exceptions.InvalidStatus, websockets.exceptions.InvalidMessage):
                return "refused"
        hexkey = "s3cret/key=".encode().hex()
        assert asyncio.run(sock(["quire.v1", "quire.key." + hexkey])) == "quire.v1"
        assert asyncio.run(sock(["quire.v1", "quire.key." + "wrong".encode().hex()])) == "refused"
        assert asyncio.run(sock(["quire.v1", "quire.key.zz"])) == "refused"
        assert asyncio.run(sock(["quire.v1"])) == "refused"
    finally:
        if s.proc.poll() is None:
            s.stop()



def test_page_modules(browser, server):
    """The page's own modules, in the browser: schema.js's verdicts on
    common schemas, and md.js on input built to be slow or deep (runs of
    backticks, 3,000 nested list markers or quotes) staying fast and safe."""
    d = browser
    open_page(d, server)
    got = d.execute_async_script(r"""
        const done = arguments[arguments.length - 1];
        Promise.all([import('/schema.js'), import('/md.js')]).then(([sc, md]) => {
          const cases = [
            [5, {minimum: 5, exclusiveMinimum: true}, 1], [5, {minimum: 5}, 0], [5.5, {type: 'integer'}, 1],
            [5, {type: 'number'}, 0], ['a-b', {pattern: '^a\\-b$'}, 0], ['x', {pattern: '^a\\-b$'}, 1],
            [{a: 1}, {dependentRequired: {a: ['b']}}, 1], [[1, 1], {uniqueItems: true}, 1],
            [{x: {y: 2}}, {$defs: {p: {type: 'integer', maximum: 1}}, properties: {x: {properties: {y: {$ref: '#/$defs/p'}}}}}, 1],
            [{k1: 1}, {patternProperties: {'^k\\d$': {type: 'integer'}}, additionalProperties: false}, 0],
            ['b', {enum: ['a', 'b']}, 0], [null, {anyOf: [{type: 'string'}, {type: 'integer'}]}, 1],
          ];
          const wrong = cases.filter(([v, s, n]) => sc.validate(v, s).length !== n).map((c) => JSON.stringify(c));
          const t0 = performance.now();
          const f1 = md.renderMarkdown('`'.repeat(5000) + ' x');
          const f2 = md.renderMarkdown('- '.repeat(3000) + 'x');
          const f3 = md.renderMarkdown('> '.repeat(3000) + 'x');
          const ms = performance.now() - t0;
          const host = document.createElement('div');
          host.append(md.renderMarkdown('# T\n\n```js\nlet a = "<b>";\n```\n\n1. one\n2. two\n\n[x](javascript:alert(1))'));
          done({wrong, ms, text: f1.textContent.length + f2.textContent.length + f3.textContent.length,
                tags: Array.from(host.querySelectorAll('*'), (e) => e.tagName).join(','), links: host.querySelectorAll('a').length});
        });""")
    assert got["wrong"] == [], got["wrong"]
    assert got["ms"] < 1000 and got["text"] > 5000, got
    assert got["tags"] == "H3,PRE,CODE,OL,LI,DIV,LI,DIV,P", got["tags"]
    assert got["links"] == 0  # a javascript: link stays text
    clean_logs(d, server.url)
