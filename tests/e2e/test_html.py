"""The HTML page in a real browser: headless Chromium (Debian's chromium and chromium-driver) driven by selenium.

`make e2e` installs the three when missing and sets ATTNCHECK_BROWSER_REQUIRED, so that a missing browser fails
there; run on its own without them, these tests skip. Screenshots and the benchmark page's figures are saved in
build/artifacts/ (ATTNCHECK_ARTIFACTS overrides it).
"""
from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from htmlcases import FAILING, GPT2, NASTY, NASTY_NODE, failing_copy, nasty_dump, nasty_model
from pipeline import BIN, LLAMA, again_if_cut

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("ATTNCHECK_ARTIFACTS", ROOT / "build" / "artifacts"))
BENCH = ROOT / "bench" / "gpt2-deep-48l.txt.xz"  # shipped: `make bench` unpacks it into build/ too
# the machine's network is closed: without these Chromium waits on connections it cannot make
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1280,1000")
# before the page's own script: alert and friends are recorded, not shown, so a test can tell that none ran
WATCH = """window.__ran = []; ["alert", "confirm", "prompt"].forEach(function (f) {
  window[f] = function (m) { window.__ran.push(f + ":" + String(m)); }; });"""


def _tools() -> tuple[str | None, str | None, bool]:
    try:
        import selenium  # noqa: F401
        have = True
    except ImportError:
        have = False
    return shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver"), have


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver_path, have_selenium = _tools()
    if not (chromium and driver_path and have_selenium):
        missing = "chromium, chromedriver and selenium (make e2e installs them)"
        if os.environ.get("ATTNCHECK_BROWSER_REQUIRED"):
            pytest.fail(f"the browser test needs {missing}")
        pytest.skip(f"needs {missing}")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*FLAGS, f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH})
    yield driver
    driver.quit()


def page(*args: str | Path, code: int) -> None:
    r = subprocess.run([sys.executable, "-m", "attncheck", *map(str, args)], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr


def open_page(driver, path: Path) -> float:
    """Load the page from disk; the seconds until its script had run. No console message may be an error."""
    t0 = time.perf_counter()
    driver.get(path.resolve().as_uri())
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, 30).until(lambda d: d.find_element("tag name", "body").get_attribute("data-ready") == "1")
    seconds = time.perf_counter() - t0
    assert_clean(driver)
    return seconds


def assert_clean(driver) -> None:
    """No console error, nothing alerted, no element the page did not make itself."""
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, errors
    assert driver.execute_script("return window.__ran") == []
    assert driver.execute_script("return document.querySelectorAll('img, iframe, object, embed').length") == 0


def css(driver, selector: str):
    return driver.find_elements("css selector", selector)


def shot(driver, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    out = ARTIFACTS / name
    driver.save_screenshot(str(out))
    return out


def click_and_wait(driver, cell, selector: str):
    from selenium.webdriver.support.ui import WebDriverWait

    cell.click()
    return WebDriverWait(driver, 10).until(lambda d: css(d, selector))


@pytest.mark.parametrize("with_model", [False, True], ids=["dump-only", "model"])
def test_a_failing_dump_in_the_browser(browser, tmp_path, with_model):
    out = tmp_path / "page.html"
    model = ("--model", GPT2) if with_model else ()
    page("check", failing_copy(tmp_path / "bad.txt"), "--html", out, "-q", *model, code=1)
    open_page(browser, out)
    assert len(css(browser, "table.grid.ev td.c")) == 1 * 2 * 12  # evaluations × layers × heads
    failing = css(browser, "table.grid.ev td.c.failing")
    assert len(failing) == 1 and failing[0].text == "✗"
    from selenium.webdriver.common.action_chains import ActionChains

    ActionChains(browser).move_to_element(failing[0]).perform()  # hover: the cell's counts
    assert "eval 0 layer 0 head 0: need " in failing[0].get_attribute("title")
    assert "beyond their bound" in failing[0].get_attribute("title")
    bad = click_and_wait(browser, failing[0], "#head-view table.heat.p td.bad")
    head, query, slot = FAILING
    assert len(bad) == 1
    title = bad[0].get_attribute("title")
    assert f"query {query} · slot {slot}" in title and "FAIL" in title and "dumped 0.0310" in title
    assert bad[0].text.startswith("0.0310")  # the dumped value, outlined
    assert css(browser, "#head-view table.heat.o td.bad")  # the kqv elements it feeds
    assert f"head {head} of 0..11" in browser.find_element("css selector", "#head-view h2").text
    if with_model:  # the reference over the visible slots 0..1, then the printed empty slots 2, 253..255
        first_row = css(browser, "#head-view table.heat.p tbody tr")[0]
        assert len(first_row.find_elements("css selector", "td")) == 2 + 1 + 1 + 3  # a gap for 3..252
        assert len(css(browser, "#head-view table.heat.o tbody tr:first-child td")) == 64  # every dim
    shot(browser, f"check-failing-{'model' if with_model else 'dump-only'}.png")
    from selenium.webdriver.common.keys import Keys

    browser.find_element("tag name", "body").send_keys(Keys.ARROW_RIGHT)  # the next head, by keyboard
    assert "head 1 of 0..11" in browser.find_element("css selector", "#head-view h2").text
    assert browser.find_element("id", "slider-h").get_attribute("value") == "1"
    browser.find_element("tag name", "body").send_keys(Keys.ARROW_DOWN)  # the next layer
    assert "layer 1" in browser.find_element("css selector", "#head-view h2").text
    assert_clean(browser)


def test_untrusted_text_shows_as_text_and_runs_nothing(browser, tmp_path):
    out = tmp_path / "page.html"
    page("check", nasty_dump(tmp_path / "nasty.txt"), "--model", nasty_model(tmp_path / "nasty.gguf"),
         "--html", out, "-q", code=1)
    open_page(browser, out)
    assert NASTY_NODE in browser.find_element("css selector", "ul.failures").text
    click_and_wait(browser, css(browser, "table.grid.ev td.c.failing")[0], "#head-view table.heat.p td.bad")
    assert NASTY_NODE in browser.find_element("css selector", "#head-view h3").text
    slot0 = css(browser, "#head-view table.heat.p thead th")[1]
    assert json.dumps(NASTY) in slot0.text  # token 257's text on the slot axis, quoted as the page quotes tokens
    for cell in css(browser, "table.grid.ev td.c.failing"):
        cell.click()
    assert_clean(browser)
    shot(browser, "untrusted-text.png")


def test_the_benchmark_dump_page_is_small_and_opens(browser, tmp_path):
    if not BENCH.exists():
        pytest.fail(f"the benchmark dump {BENCH} is missing from the repository")
    dump = ROOT / "build" / BENCH.name.removesuffix(".xz")
    if not dump.exists():
        dump.parent.mkdir(exist_ok=True)
        with lzma.open(BENCH) as src, open(dump.with_suffix(".tmp"), "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        dump.with_suffix(".tmp").rename(dump)
    out = tmp_path / "bench.html"
    t0 = time.perf_counter()
    page("check", dump, "--html", out, "-q", code=0)
    made = time.perf_counter() - t0
    size = out.stat().st_size
    assert size < 5_000_000
    seconds = open_page(browser, out)
    assert len(css(browser, "table.grid.ev td.c")) == 13 * 48 * 6
    click_and_wait(browser, css(browser, "table.grid.ev td.c")[-1], "#head-view table.heat.p")
    assert "layer 47" in browser.find_element("css selector", "#head-view h2").text
    assert_clean(browser)
    shot(browser, "bench.png")
    figures = {"dump_bytes": dump.stat().st_size, "page_bytes": size, "check_with_html_s": round(made, 2),
               "browser_open_s": round(seconds, 2)}
    (ARTIFACTS / "bench-page.json").write_text(json.dumps(figures) + "\n")
    print(f"\nbenchmark page: {size / 1e6:.2f} MB, made in {made:.1f} s, opened in {seconds:.2f} s")


@pytest.mark.skipif(not BIN, reason="set LLAMA_EVAL_CALLBACK (make e2e builds and sets it)")
def test_run_writes_the_page_of_what_it_checked(browser, tmp_path):
    out, doc = tmp_path / "run.html", tmp_path / "run.json"
    r = again_if_cut(lambda: subprocess.run(
        [sys.executable, "-m", "attncheck", "run", "-m", str(LLAMA), "-p", "I like to draw", "--html", str(out),
         "--json", str(doc), "-q", "--", "-t", "2", "--seed", "1"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "LLAMA_EVAL_CALLBACK": BIN}))
    assert r.returncode == 0, r.stderr
    open_page(browser, out)
    sites = json.loads(doc.read_text())["sites"]
    assert len(css(browser, "table.grid.ev td.c")) == sum(s["H"] for s in sites)
    click_and_wait(browser, css(browser, "table.grid.ev td.c")[0], "#head-view table.heat.p")
    assert "reference P (--model)" in browser.find_element("id", "head-view").text  # run checks against -m
    assert_clean(browser)


def test_inspect_page_opens_on_its_head(browser, tmp_path):
    out = tmp_path / "head.html"
    page("inspect", failing_copy(tmp_path / "bad.txt"), "--layer", "0", "--head", "0", "--model", GPT2,
         "--html", out, code=1)
    open_page(browser, out)
    head, query, slot = FAILING
    (bad,) = css(browser, "#head-view table.heat.p td.bad")  # drawn without a click
    assert f"query {query} · slot {slot}" in bad.get_attribute("title")
    assert not browser.find_element("css selector", "#head-view .controls").is_displayed()
    shot(browser, "inspect.png")


def test_diff_page_links_the_first_divergent_node(browser, tmp_path):
    out = tmp_path / "diff.html"
    fixtures = ROOT / "fixtures"
    page("diff", fixtures / "gpt2-how-are-you.txt", fixtures / "gpt2-kv-f32.txt", "--exact", "-q", "--html", out, code=1)
    open_page(browser, out)
    (first,) = css(browser, ".strip a.first")
    first.click()
    row = browser.find_element("css selector", "tr.first")
    assert browser.execute_script("return location.hash") == "#" + row.get_attribute("id")
    assert "first divergent node" in row.text and "DIFF" in row.text
    assert_clean(browser)
    shot(browser, "diff.png")


def test_the_docs_picture_script_draws_the_page(tmp_path):
    """scripts/page_picture.py, which makes docs/html-page.png: here into a scratch file, the grids and one failing
    head 1000 px wide (its own Chromium: the script is run as a user runs it)."""
    import struct

    if not all(_tools()):
        if os.environ.get("ATTNCHECK_BROWSER_REQUIRED"):
            pytest.fail("the picture script needs chromium, chromedriver and selenium (make e2e installs them)")
        pytest.skip("needs chromium, chromedriver and selenium (make e2e installs them)")
    out = tmp_path / "page.png"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "page_picture.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    png = out.read_bytes()
    width, height = struct.unpack(">II", png[16:24])  # the IHDR chunk
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and width == 1000 and 400 < height < 2000
    assert f"wrote {out} (1000 × {height} px)" in r.stdout
