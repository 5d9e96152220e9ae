"""The lab as a learner sees it: real JupyterLab, real headless Chromium, dashboards used by clicking.

Starts JupyterLab (this environment, localhost, random token, free port) on copies of the notebooks,
opens them in Debian's Chromium through Playwright (``executable_path``; nothing downloads a browser),
runs the cells each dashboard needs (Shift+Enter; the whole notebooks run under nbval), then uses the
dashboards: the batch-size dashboard (move the batch slider past what fits and see it refused before running,
then to a batch, press Run, watch the live readout and plots, see a second Run refused, press Stop, again at a
second batch size, compare in the results table) and the all-reduce ring view (move the step slider, press Play,
watch it advance, press Stop). Fails on any JavaScript error in the page console and on any widget shown
as a text fallback; a probe notebook, run from the Run menu, proves that check can fail. Screenshots go
to ``runs/screenshots/``. The server is shut down and its port freed even when a test fails.
Needs Debian's chromium (`make browser-deps` runs `apt-get install -y chromium`); skipped without it.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import nbformat
import pytest

from tests.browser_support import (WIDGETS_EXTENSION, active_extensions, cells_to_run, find_chromium, leftover_processes,
                             parse_numbers, port_is_free, stage_notebooks, start_lab, stop_lab)

CHROMIUM = find_chromium()
if CHROMIUM is None:
    pytest.skip("Debian's chromium is not installed (run `make browser-deps` or `apt-get install -y chromium`)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install playwright)")

from tests.browser_page import (ConsoleWatch, LabPage, click_button, launch_chromium, move_slider,  # noqa: E402
                                set_control)

REPO = Path(__file__).resolve().parents[1]
SCREENSHOTS = REPO / "runs" / "screenshots"
BATCH_NOTEBOOK = "02_batch_size.ipynb"
# Notebook 02 as a whole (sweeps, finder, LR scaling, Keras) runs under nbval; here only what the dashboard
# needs runs in the browser: the mode cell, the cell that loads `data`, and the dashboard cell.
BATCH_CELLS = ("get_mode()", "data = load_data(", "BatchSizeDashboard(")
RING_NOTEBOOK = "06_all_reduce.ipynb"
# Likewise for 06: the mode cell, the imports, the cell that seeds `rng`, and the ring view (no process launches,
# no timing claims, so nothing here can flake on a busy machine).
RING_CELLS = ("get_mode()", "from labkit.ui.ring_view import", "rng = np.random.default_rng(0)", "ring_view(")
NOTEBOOK_TIMEOUT_S = 240.0
LIVE_TIMEOUT_S = 90.0


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on copies of the notebooks; always shut down, port checked free afterwards."""
    work = tmp_path_factory.mktemp("jupyterlab")
    root = work / "root"
    stage_notebooks(REPO, [n for n in (BATCH_NOTEBOOK, RING_NOTEBOOK) if (REPO / "notebooks" / n).exists()],
                    root)
    # Kernels run in fast mode on the shipped digits, offline: the same small work on any machine, no downloads.
    server = start_lab(root, work, env_extra={"LABKIT_MODE": "fast", "LABKIT_OFFLINE": "1",
                                              "LABKIT_DATASET": "digits"})
    try:
        assert WIDGETS_EXTENSION in active_extensions(server), (
            f"the ipywidgets lab extension {WIDGETS_EXTENSION} is not active in JupyterLab; "
            "reinstall jupyterlab_widgets into the environment")
        yield server
    finally:
        stop_lab(server)
        assert port_is_free(server.port), f"port {server.port} still in use after the server was shut down"
        assert not leftover_processes(server), f"processes left after shutdown: {leftover_processes(server)}"


@pytest.fixture(scope="module")
def browser(lab, tmp_path_factory):
    """Headless system Chromium with an empty profile."""
    with sync_api.sync_playwright() as playwright:
        context = launch_chromium(playwright, CHROMIUM, tmp_path_factory.mktemp("chromium-profile"))
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def lab_page(browser, lab, request):
    """A fresh tab; fails the test on any JavaScript error it logged."""
    page = browser.new_page()
    watch = ConsoleWatch().attach(page)
    try:
        yield LabPage(page, lab, watch)
        assert not watch.errors, "JavaScript errors in the page:\n" + "\n".join(watch.errors)
    finally:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        try:
            page.screenshot(path=str(SCREENSHOTS / f"{request.node.name}_last.png"))
        except Exception:  # noqa: BLE001 - a screenshot of a dead page must not hide the real failure
            pass
        page.close()


def shot(locator, name: str) -> Path:
    """Screenshot of one element into runs/screenshots/."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / name
    locator.scroll_into_view_if_needed()
    locator.screenshot(path=str(path))
    return path


def wait_until_stopped(lab_page: LabPage, dashboard, quiet_s: float = 3.0) -> str:
    """After Stop, wait until the readout holds still for `quiet_s` (the run really ended)."""
    deadline = time.monotonic() + LIVE_TIMEOUT_S
    text, since = dashboard.locator(".labkit-readout").first.inner_text(), time.monotonic()
    while time.monotonic() < deadline:
        lab_page.page.wait_for_timeout(250)
        now = dashboard.locator(".labkit-readout").first.inner_text()
        if now != text:
            text, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return text
    raise AssertionError(f"the readout kept changing {LIVE_TIMEOUT_S:.0f} s after Stop: {text!r}")


READOUT_FIELDS = {"step": r"step\s+(\d+)", "samples_per_s": r"([\d.,]+)\s*samples/s",
                  "step_time_ms": r"([\d.,]+)\s*ms", "peak_mem_mb": r"([\d.,]+)\s*MB"}


def readout_fields(text: str) -> dict[str, float]:
    """The agreed live numbers in the dashboard's readout: step, samples/s, step time (ms), peak memory (MB)."""
    found = {}
    for name, pattern in READOUT_FIELDS.items():
        match = re.search(pattern, text)
        if match:
            found[name] = float(match.group(1).replace(",", ""))
    missing = set(READOUT_FIELDS) - set(found)
    assert not missing, f"the readout lacks {sorted(missing)}: {text!r}"
    return found


def wait_for_steps(lab_page: LabPage, dashboard, min_step: int, before: str) -> dict[str, float]:
    """Wait until the live readout (no longer showing `before`) reports `min_step` steps, counting up."""
    deadline = time.monotonic() + LIVE_TIMEOUT_S
    seen: list[float] = []
    while time.monotonic() < deadline:
        text = dashboard.locator(".labkit-readout").first.inner_text()
        if text != before and re.search(READOUT_FIELDS["step"], text):
            before = ""   # the new run has reported once; from here every text counts
            fields = readout_fields(text)
            if not seen or fields["step"] != seen[-1]:
                seen.append(fields["step"])
            if fields["step"] >= min_step and len(seen) >= 2:
                assert seen == sorted(seen), f"the step counter went backwards: {seen}"
                return fields
        lab_page.page.wait_for_timeout(250)
    raise AssertionError(f"the readout did not reach step {min_step} live within {LIVE_TIMEOUT_S:.0f} s: {seen}")


def results_rows(dashboard) -> list[dict[str, str]]:
    """The results table under the plots, as {column: text} per run."""
    table = dashboard.locator(".labkit-results table").first
    heads = [h.strip() for h in table.locator("thead th").all_inner_texts()]
    return [dict(zip(heads, [c.strip() for c in row.locator("td").all_inner_texts()]))
            for row in table.locator("tbody tr").all()]


def run_once(lab_page: LabPage, dashboard, batch_size: int) -> dict[str, float]:
    """Move the slider to a batch size, press Run, watch the readout and the plots update, press Stop."""
    shown = move_slider(dashboard, "Batch size", batch_size)
    assert parse_numbers(shown)[0] == batch_size, shown
    before = dashboard.locator(".labkit-readout").first.inner_text()
    plot = dashboard.locator("img.widget-image").first
    plot_before = plot.get_attribute("src") if plot.count() else None
    pressed = time.monotonic()
    click_button(dashboard, "Run")
    if plot_before is not None:   # the accuracy, loss and throughput plots are a live view too
        lab_page.page.wait_for_function("([img, old]) => img.src !== old", timeout=LIVE_TIMEOUT_S * 1000,
                                        arg=[plot.element_handle(), plot_before], polling=50)
        print(f"batch {batch_size}: the plot changed in the browser {time.monotonic() - pressed:.2f} s after Run")
    live = wait_for_steps(lab_page, dashboard, min_step=8, before=before)
    click_button(dashboard, "Run")   # a second Run while one is going is refused, visibly
    expect_text(lab_page, dashboard, "already going", "a second Run while one runs was not refused")
    shot(dashboard, f"batch_size_dashboard_running_b{batch_size}.png")
    click_button(dashboard, "Stop")
    final_text = wait_until_stopped(lab_page, dashboard)
    final = readout_fields(final_text)
    assert final["step"] >= live["step"]
    assert re.search(rf"\bbs={batch_size}\b", final_text), f"the readout does not name batch {batch_size}: {final_text!r}"
    expect_text(lab_page, dashboard, re.compile(rf"stopped\b.*\bbs={batch_size}\b"),
                "Stop did not end the run early (no 'stopped' status shown)")
    return final


def expect_text(lab_page: LabPage, container, pattern, message: str) -> None:
    """Wait until the container's text contains ``pattern`` (a string or a compiled regex)."""
    found = (lambda t: pattern.search(t)) if isinstance(pattern, re.Pattern) else (lambda t: pattern in t)
    deadline = time.monotonic() + LIVE_TIMEOUT_S
    while not found(container.inner_text()) and time.monotonic() < deadline:
        lab_page.page.wait_for_timeout(250)
    assert found(container.inner_text()), f"{message}: {container.inner_text()[:600]!r}"


def test_batch_size_dashboard(lab_page: LabPage):
    """Open notebook 02, run the dashboard's cells, use it as a learner would: slider, Run, Stop, the table."""
    if not (REPO / "notebooks" / BATCH_NOTEBOOK).exists():
        pytest.fail(f"notebooks/{BATCH_NOTEBOOK} is missing")
    lab_page.open_notebook(f"notebooks/{BATCH_NOTEBOOK}")
    lab_page.run_cells(cells_to_run(REPO / "notebooks" / BATCH_NOTEBOOK, BATCH_CELLS), NOTEBOOK_TIMEOUT_S)
    lab_page.assert_widgets_rendered()
    lab_page.tidy_for_screenshots()
    dashboard = lab_page.page.locator(".labkit-dashboard").first
    assert dashboard.count(), "notebook 02 shows no .labkit-dashboard"
    demo_rows = len(results_rows(dashboard))
    set_control(dashboard, "Steps", 5000)     # long enough that Stop, not the end of the run, ends it
    largest = int(re.search(r"fits up to batch (\d+)", dashboard.locator(".labkit-limit").first.inner_text())[1])
    too_big = 1 << largest.bit_length()       # the slider's last stop: one power of two past what fits
    assert "won't fit" in move_slider(dashboard, "Batch size", too_big)
    expect_text(lab_page, dashboard, f"batch {too_big} would not fit", "no warning before running a batch too big")
    click_button(dashboard, "Run")
    lab_page.page.wait_for_timeout(1500)
    assert len(results_rows(dashboard)) == demo_rows, "a batch that does not fit was run"
    small = run_once(lab_page, dashboard, 8)
    large = run_once(lab_page, dashboard, 64)
    assert small["samples_per_s"] > 0 and large["samples_per_s"] > 0
    assert large["peak_mem_mb"] > small["peak_mem_mb"], (
        f"peak memory should grow with the batch (activations): bs=8 {small}, bs=64 {large}")
    rows = results_rows(dashboard)
    assert len(rows) == demo_rows + 2, rows
    for row, batch in zip(rows[-2:], (8, 64)):
        assert row["batch"] == str(batch) and row["state"] == "stopped", row
        assert float(row["samples/s"].replace(",", "")) > 0 and float(row["measured_MB"]) > 0, row
    bars = dashboard.locator(".labkit-memory-bar")
    assert bars.count() >= 2 and dashboard.locator(".labkit-measured-tick").count() >= 2
    path = shot(dashboard, "batch_size_dashboard.png")
    if os.environ.get("LABKIT_README_SCREENSHOTS") == "1":   # refresh the README's picture on purpose only
        shutil.copyfile(path, REPO / "docs" / "screenshots" / "batch_size_dashboard.png")
    lab_page.assert_widgets_rendered()


def caption_and_image(view) -> tuple[str, str]:
    """The ring view's caption text and the current image's blob URL."""
    return (view.locator(".widget-html-content").first.inner_text(),
            view.locator("img.widget-image").first.get_attribute("src") or "")


def test_ring_view_steps_through_the_all_reduce(lab_page: LabPage):
    """Open notebook 06, run the ring view's cells, move its step slider, press Play, watch it advance, Stop."""
    if not (REPO / "notebooks" / RING_NOTEBOOK).exists():
        pytest.fail(f"notebooks/{RING_NOTEBOOK} is missing")
    lab_page.open_notebook(f"notebooks/{RING_NOTEBOOK}")
    lab_page.run_cells(cells_to_run(REPO / "notebooks" / RING_NOTEBOOK, RING_CELLS), NOTEBOOK_TIMEOUT_S)
    lab_page.assert_widgets_rendered()
    lab_page.tidy_for_screenshots()
    view = lab_page.page.locator(".labkit-ring-view").first
    assert view.count(), "notebook 06 shows no .labkit-ring-view"
    start_caption, start_image = caption_and_image(view)
    assert "start" in start_caption, start_caption
    last_step = int(float(view.locator("[role=slider]").first.get_attribute("aria-valuemax")))
    mid = last_step // 2
    set_control(view, "step", mid)
    lab_page.page.wait_for_function(
        "([el, old]) => el.innerText !== old", arg=[view.locator(".widget-html-content").first.element_handle(),
                                                      start_caption], timeout=LIVE_TIMEOUT_S * 1000)
    lab_page.page.wait_for_function("([img, old]) => img.src !== old", timeout=LIVE_TIMEOUT_S * 1000,
                                    arg=[view.locator("img.widget-image").first.element_handle(), start_image])
    mid_caption, mid_image = caption_and_image(view)
    assert f"step {mid}/{last_step}" in mid_caption and mid_image != start_image, (mid_caption, mid_image)
    shot(view, "ring_view_mid.png")
    set_control(view, "step", 0)
    view.locator(".widget-play button").first.click()   # Play
    seen = {caption_and_image(view)[0]}
    deadline = time.monotonic() + LIVE_TIMEOUT_S
    while len(seen) < 3 and time.monotonic() < deadline:
        lab_page.page.wait_for_timeout(200)
        seen.add(caption_and_image(view)[0])
    assert len(seen) >= 3, f"Play did not advance the view live: {seen}"
    shot(view, "ring_view_playing.png")
    view.locator(".widget-play button").nth(1).click()   # Stop: ipywidgets' Play rewinds to the start and stays
    deadline = time.monotonic() + LIVE_TIMEOUT_S
    while "start" not in caption_and_image(view)[0] and time.monotonic() < deadline:
        lab_page.page.wait_for_timeout(200)
    assert "start" in caption_and_image(view)[0], f"Stop did not rewind the view: {caption_and_image(view)[0]!r}"
    lab_page.page.wait_for_timeout(2000)
    assert "start" in caption_and_image(view)[0], "the view kept playing after Stop"
    numbers = {tuple(parse_numbers(c)) for c in seen}
    assert len(numbers) >= 2, f"the captions carry no changing numbers: {seen}"
    lab_page.assert_widgets_rendered()


def test_widget_fallback_is_detected(lab_page: LabPage, lab):
    """The harness can fail: run (Run > Run All Cells) a notebook whose widget model does not exist; it is caught."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from IPython.display import display\n"
        "display({'application/vnd.jupyter.widget-view+json': {'model_id': 'no-such-model', 'version_major': 2, "
        "'version_minor': 0}, 'text/plain': 'IntSlider(value=0)'}, raw=True)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, lab.root_dir / "notebooks" / "fallback_probe.ipynb")
    lab_page.open_notebook("notebooks/fallback_probe.ipynb")
    lab_page.run_all(60)
    with pytest.raises(AssertionError, match="text fallback"):
        lab_page.assert_widgets_rendered(timeout_s=5)
    lab_page.watch.errors.clear()   # the missing model is logged on purpose here
