"""docs/html-page.png, the picture of the `--html` page in docs/html.md, made from the page as it is now.

    python3 scripts/page_picture.py [--out docs/html-page.png]

Makes a failing copy of fixtures/gpt2-ubatch2.txt (one printed weight of layer 1 changed in evaluation 1: head 10,
query 1, slot 1, by +0.0100), writes its page with `attncheck check --model fixtures/models/gpt2-mini-q8_0.gguf
--html`, opens it in headless Chromium (selenium, as tests/e2e/test_html.py does; `make browser` installs them),
clicks the failing cell and saves the grids and the head view below them as a PNG. Run it after a change to the
page (present/page.css, page.js, html.py) and commit the picture with the change.
"""
from __future__ import annotations

import argparse
import base64
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from dumpedit import DumpEdit  # noqa: E402  (the tests' editor of one printed value of a real dump)

DUMP = ROOT / "fixtures" / "gpt2-ubatch2.txt"
MODEL = ROOT / "fixtures" / "models" / "gpt2-mini-q8_0.gguf"
CHANGED = ("kq_soft_max-1", (10, 1, 1), 1, 0.01)  # node, (head, query, slot), evaluation, change of the weight
WIDTH = 1000  # px: the page's width in the picture
# the machine's network may be closed: without these Chromium waits on connections it cannot make
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--hide-scrollbars",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--window-size={WIDTH},900")


def failing_copy(dst: Path) -> Path:
    name, at, evaluation, change = CHANGED
    edit = DumpEdit(DUMP, dst)
    edit.set(name, at, edit.get(name, at, evaluation) + change, evaluation)
    edit.save()
    return dst


def write_page(dump: Path, out: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "attncheck", "check", str(dump), "--model", str(MODEL), "--html",
                        str(out), "-q"], capture_output=True, text=True, cwd=ROOT)
    if r.returncode != 1:  # the copy must fail, or the picture shows no failing element
        sys.exit(f"page_picture: attncheck check exited {r.returncode}, expected 1 (FAIL):\n{r.stderr}")


def browser(profile: Path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        sys.exit("page_picture: needs selenium (make browser installs it, with Chromium and its driver)")
    if not (chromium and driver_path):
        sys.exit("page_picture: needs chromium and chromedriver (make browser installs them)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=Service(driver_path))


def picture(page: Path, out: Path, profile: Path) -> tuple[int, int]:
    """The grids and the opened head, from the "layer × head" heading to the O heatmap's note; (width, height)."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver = browser(profile)
    try:
        driver.get(page.resolve().as_uri())
        WebDriverWait(driver, 30).until(lambda d: d.find_element("tag name", "body").get_attribute("data-ready"))
        driver.find_element("css selector", "table.grid.ev td.c.failing").click()
        WebDriverWait(driver, 10).until(lambda d: d.find_elements("css selector", "#head-view table.heat.o"))
        box = driver.execute_script("""
            var top = document.querySelector("p.need").previousElementSibling.getBoundingClientRect().top +
                      window.scrollY;  // the heading "layer × head" above the legend
            var notes = document.querySelectorAll("#head-view p.note");
            var end = notes[notes.length - 1].getBoundingClientRect().bottom + window.scrollY;
            return [Math.floor(top) - 8, Math.ceil(end) + 8];""")
        shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": box[0], "width": WIDTH, "height": box[1] - box[0], "scale": 1}})
    finally:
        driver.quit()
    out.write_bytes(base64.b64decode(shot["data"]))
    return WIDTH, box[1] - box[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "html-page.png")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dump = failing_copy(work / "gpt2-ubatch2-failing.txt")
        page = work / "page.html"
        write_page(dump, page)
        size = picture(page, args.out, work / "profile")
    print(f"wrote {args.out} ({size[0]} × {size[1]} px)")


if __name__ == "__main__":
    main()
