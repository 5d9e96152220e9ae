"""The book as a reader meets it: two real notebooks run by scripts/book.py, the site served on localhost, read in
headless Chromium. Every notebook has a page, every image loads, every internal link (and #anchor) resolves, the
search page finds a lesson by a word of its claim, and a page at a phone's width never scrolls sideways. Requests
that leave localhost are refused, so the site is also shown to read with no network.

CI builds the book from the two cheapest notebooks with a figure (00 and 01); `make book` builds all of them.
Needs Debian's chromium (`make browser-deps`), playwright and the book's packages (requirements.txt); skipped
without them.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urldefrag, urljoin, urlparse

import pytest

from tests.browser_support import find_chromium, free_port, port_is_free

CHROMIUM = find_chromium()
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (run `make browser-deps`)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
pytest.importorskip("myst_nb", reason="the book's packages are not installed (pip install -r requirements.txt)")

from tests.browser_page import launch_chromium  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = ("00_start_here.ipynb", "01_gpu_utilization.ipynb")
PHONE = {"width": 390, "height": 844}
STOP_WORDS = {"the", "and", "with", "that", "than", "from", "every", "each", "this", "more", "less", "lower", "over"}


@pytest.fixture(scope="module")
def book(tmp_path_factory) -> Path:
    """The book built from NOTEBOOKS by `scripts/book.py build` (the same command `make book` runs); with
    LABKIT_BOOK_BUILT=folder, that folder's book (built from at least NOTEBOOKS) is read instead."""
    if os.environ.get("LABKIT_BOOK_BUILT"):
        return Path(os.environ["LABKIT_BOOK_BUILT"])
    out = tmp_path_factory.mktemp("book")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "book.py"), "build", "--out", str(out),
                           "--notebooks", *NOTEBOOKS], capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def site(book):
    """The built HTML served by `python -m http.server` on a free localhost port; stopped and the port freed."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
                               "--directory", str(book / "html")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}/"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(base, timeout=2).close()
                break
            except OSError:
                subprocess.run(["sleep", "0.1"], check=True)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=15)
        assert port_is_free(port), f"port {port} still in use after the server stopped"


@pytest.fixture(scope="module")
def browser(site, tmp_path_factory):
    """Headless system Chromium that refuses every request leaving the local site (listed in .refused)."""
    with sync_api.sync_playwright() as playwright:
        context = launch_chromium(playwright, CHROMIUM, tmp_path_factory.mktemp("chromium-profile"))
        context.refused = []

        def only_local(route):
            if route.request.url.startswith(site):
                route.continue_()
            else:
                context.refused.append(route.request.url)
                route.abort()

        context.route("**/*", only_local)
        try:
            yield context
        finally:
            context.close()


def page_urls(site: str) -> list[str]:
    """The front page and one page per notebook."""
    return [site + "index.html"] + [site + f"notebooks/{Path(n).stem}.html" for n in NOTEBOOKS]


def test_every_notebook_has_a_page_linked_from_the_front_page(browser, site):
    page = browser.new_page()
    try:
        page.goto(site + "index.html")
        hrefs = page.eval_on_selector_all("article a[href]", "as => as.map(a => a.href)")
        for name in NOTEBOOKS:
            assert any(h.split("#")[0].endswith(f"notebooks/{Path(name).stem}.html") for h in hrefs), name
            response = page.request.get(site + f"notebooks/{Path(name).stem}.html")
            assert response.status == 200, name
        assert page.locator("article img").count() >= 1, "the front page shows no key-figure thumbnail"
    finally:
        page.close()


def test_every_page_says_where_it_ran_and_its_tally(browser, site):
    page = browser.new_page()
    try:
        for url in page_urls(site)[1:]:
            page.goto(url)
            header = page.locator(".book-ran-on").first.inner_text()
            assert re.search(r"Ran .* \d+ s, on .*CPU cores", header), header
            assert re.search(r"\d+ of \d+ lessons checked on this run", header), header
            assert page.get_by_role("link", name="Open in JupyterLab").count() == 1
            assert page.get_by_role("link", name="Open on Binder").count() == 1
    finally:
        page.close()


def test_every_image_loads(browser, site):
    page = browser.new_page()
    try:
        seen = 0
        for url in page_urls(site):
            page.goto(url, wait_until="load")
            broken = page.eval_on_selector_all(
                "img", "imgs => imgs.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)")
            assert not broken, f"{url}: images that did not load: {broken}"
            seen += page.locator("img").count()
        assert seen >= 2, "the pages show almost no images: the figures were lost"
    finally:
        page.close()


def test_internal_links_resolve(browser, site):
    page = browser.new_page()
    checked: dict[str, str] = {}
    try:
        for url in page_urls(site):
            page.goto(url)
            for href in page.eval_on_selector_all("a[href]", "as => as.map(a => a.href)"):
                if not href.startswith(site):
                    continue
                target, anchor = urldefrag(href)
                if target not in checked:
                    response = page.request.get(target)
                    assert response.status == 200, f"{url} links to {href}: HTTP {response.status}"
                    checked[target] = response.text()
                if anchor and target.endswith(".html"):
                    assert re.search(rf'id="{re.escape(anchor)}"', checked[target]), f"{url}: no #{anchor} in {target}"
        assert len(checked) >= 3
    finally:
        page.close()


def lesson_word(book: Path) -> tuple[str, str]:
    """(a distinctive word of a checked lesson claim, the notebook that checked it)."""
    for log in sorted((book / "logs").glob("*.jsonl")):
        for line in log.read_text().splitlines():
            record = json.loads(line)
            for claim in record.get("checked", []):
                words = [w for w in re.findall(r"[a-z]{6,}", claim.lower()) if w not in STOP_WORDS]
                if words:
                    return max(words, key=len), log.stem
    raise AssertionError("no notebook checked a lesson on this run")


def test_search_finds_a_lesson_by_a_word_of_its_claim(browser, site, book):
    word, stem = lesson_word(book)
    page = browser.new_page()
    try:
        page.goto(site + f"search.html?q={word}")
        results = page.locator("#search-results a")
        results.first.wait_for(timeout=30_000)
        hrefs = [urlparse(urljoin(site, h)).path for h in results.evaluate_all("as => as.map(a => a.href)")]
        assert any(h.endswith(f"/notebooks/{stem}.html") for h in hrefs), (word, hrefs)
    finally:
        page.close()


def test_pages_read_at_a_phones_width(browser, site):
    page = browser.new_page()
    page.set_viewport_size(PHONE)
    try:
        for url in page_urls(site):
            page.goto(url, wait_until="load")
            width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
            assert width[0] <= width[1] + 1, f"{url} scrolls sideways at {PHONE['width']} px: {width}"
    finally:
        page.close()


def test_the_site_needs_no_network(browser):
    """Runs last in this file: every request the pages above made stayed on localhost."""
    assert not browser.refused, f"the pages asked the network for: {sorted(set(browser.refused))[:10]}"
