"""Driving a JupyterLab page in headless Chromium (Playwright): open and run notebooks, use widgets, watch the console.

Widgets are used the way a person uses them (typing into a slider's readout, picking from a drop-down,
clicking buttons); the notebook is run from the Run menu. JupyterLab's app object (exposed by the
server flag `expose_app_in_browser`) is only read to know when the kernel is done and which outputs errored.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.browser_support import CHROMIUM_FLAGS, FALLBACK_TEXTS, WIDGET_MIME, LabServer, parse_numbers

# Reads the state of the notebook in the main area: kernel status, cells still running, error outputs.
NOTEBOOK_STATE_JS = """() => {
  const app = window.jupyterapp;
  const panel = app && app.shell.currentWidget;
  if (!panel || !panel.content || !panel.sessionContext) return null;
  const session = panel.sessionContext.session;
  const kernel = session && session.kernel;
  let running = 0; const executed = [], errors = [];
  panel.content.widgets.forEach((cell, index) => {
    if (cell.model.type !== 'code') return;
    const prompt = cell.node.querySelector('.jp-InputPrompt');
    if (prompt && prompt.textContent.includes('*')) running++;
    if (cell.model.executionCount !== null) executed.push(index);
    for (const out of cell.model.outputs.toJSON()) {
      if (out.output_type === 'error') errors.push(`cell ${index}: ${out.ename}: ${out.evalue}`);
    }
  });
  return {kernel: kernel ? kernel.status : 'none', running, executed, errors, cells: panel.content.widgets.length};
}"""

# Every widget output in the notebook model, and how the page rendered it: by the widget manager (a
# .jupyter-widgets view), by another renderer (the text fallback when the manager is missing), or as an empty
# node (a widget closed since, e.g. a finished tqdm bar). Plus any text saying a widget could not be shown.
WIDGET_DOM_JS = """(fallbacks) => {
  const panel = window.jupyterapp.shell.currentWidget;
  let rendered = 0, closed = 0; const wrong = [];
  panel.content.widgets.forEach((cell, index) => {
    if (cell.model.type !== 'code') return;
    const children = cell.outputArea ? cell.outputArea.widgets : [];
    cell.model.outputs.toJSON().forEach((out, j) => {
      if (!(out.data && out.data['%s'])) return;
      const node = children[j] && children[j].node.querySelector('.jp-OutputArea-output');
      const mime = node && node.getAttribute('data-mime-type');
      if (!node) wrong.push(`cell ${index} output ${j}: not in the page`);
      else if (mime) wrong.push(`cell ${index} output ${j}: shown as ${mime}: ${node.innerText.slice(0, 120)}`);
      else if (node.querySelector('.jupyter-widgets')) rendered++;
      else closed++;
    });
  });
  const texts = [...document.querySelectorAll('.jp-OutputArea-output')].map(n => n.innerText);
  const bad = texts.filter(t => fallbacks.some(f => t.includes(f))).map(t => t.slice(0, 200));
  return {rendered, closed, wrong, bad};
}""" % WIDGET_MIME


def launch_chromium(playwright, executable: str, user_data_dir: Path):
    """Headless system Chromium with an empty profile (nothing is downloaded); returns a browser context."""
    return playwright.chromium.launch_persistent_context(
        str(user_data_dir), executable_path=executable, headless=True, args=list(CHROMIUM_FLAGS),
        viewport={"width": 1280, "height": 1600}, device_scale_factor=1)


@dataclass
class ConsoleWatch:
    """Collects JavaScript errors: uncaught exceptions and console messages of type error."""

    errors: list[str] = field(default_factory=list)
    messages: list[str] = field(default_factory=list)

    def attach(self, page) -> "ConsoleWatch":
        page.on("console", self._on_console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        return self

    def _on_console(self, msg) -> None:
        self.messages.append(f"{msg.type}: {msg.text}")
        if msg.type == "error":
            self.errors.append(f"console.error: {msg.text} ({msg.location.get('url', '')})")


class LabPage:
    """One JupyterLab tab showing one notebook."""

    def __init__(self, page, server: LabServer, watch: ConsoleWatch | None = None) -> None:
        self.page, self.server, self.watch = page, server, watch

    def open_notebook(self, rel_path: str, timeout_s: float = 90.0) -> None:
        """Open the notebook and wait until its kernel is ready."""
        self.page.goto(self.server.url(f"lab/tree/{rel_path}?reset"), wait_until="domcontentloaded",
                       timeout=timeout_s * 1000)
        self.page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=timeout_s * 1000)
        self.wait_for(lambda s: s and s["kernel"] == "idle", timeout_s, "the kernel to start")

    def state(self) -> dict | None:
        return self.page.evaluate(NOTEBOOK_STATE_JS)

    def wait_for(self, predicate, timeout_s: float, what: str, poll_s: float = 0.5) -> dict:
        """Poll the notebook state until `predicate(state)` holds; fail with the state on timeout."""
        deadline = time.monotonic() + timeout_s
        state = None
        while time.monotonic() < deadline:
            state = self.state()
            if predicate(state):
                return state
            self.page.wait_for_timeout(poll_s * 1000)
        raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}; notebook state: {state}")

    def run_all(self, timeout_s: float) -> dict:
        """Run > Run All Cells from the menu bar, then wait until no cell is running and the kernel is idle."""
        self.page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
        self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
        return self.wait_until_done(timeout_s)

    def run_cells(self, indices: list[int], timeout_s: float) -> dict:
        """Run only the given cells, in order (click a cell, Shift+Enter), then wait until the kernel is idle."""
        cells = self.page.locator(".jp-Notebook .jp-Cell")
        for index in indices:
            cells.nth(index).locator(".jp-InputPrompt").click()
            self.page.keyboard.press("Shift+Enter")
        state = self.wait_until_done(timeout_s)
        missed = sorted(set(indices) - set(state["executed"]))
        assert not missed, f"cells {missed} did not run (executed: {state['executed']})"
        return state

    def wait_until_done(self, timeout_s: float) -> dict:
        """Wait until no cell shows [*] and the kernel is idle twice in a row; fail on error outputs."""
        self.page.wait_for_timeout(500)
        done = lambda s: s and s["running"] == 0 and s["kernel"] == "idle"  # noqa: E731
        state = self.wait_for(done, timeout_s, "the cells to finish")
        self.page.wait_for_timeout(1000)
        state = self.wait_for(done, timeout_s, "the cells to finish")
        assert not state["errors"], "cells raised in the browser run:\n" + "\n".join(state["errors"])
        return state

    def widget_report(self) -> dict:
        """How the page rendered every widget output of the notebook (see WIDGET_DOM_JS)."""
        return self.page.evaluate(WIDGET_DOM_JS, list(FALLBACK_TEXTS))

    def assert_widgets_rendered(self, timeout_s: float = 30.0) -> dict:
        """Fail when a widget shows as text ("Loading widget...", model not found, its repr) or not at all."""
        deadline = time.monotonic() + timeout_s
        report = self.widget_report()
        while time.monotonic() < deadline and (report["bad"] or report["wrong"] or not report["rendered"]):
            self.page.wait_for_timeout(500)  # views render asynchronously after the cell finishes
            report = self.widget_report()
        assert not report["bad"], f"widgets rendered as a text fallback: {report['bad']}"
        assert not report["wrong"], f"widget outputs not rendered by the widget manager: {report['wrong']}"
        assert report["rendered"] > 0, f"the notebook shows no live widget at all: {report}"
        return report

    def tidy_for_screenshots(self) -> None:
        """Collapse the file browser so the notebook fills the page."""
        self.page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
        self.page.wait_for_timeout(300)


def labelled_control(container, description: str):
    """The ipywidgets control whose description label reads `description` inside `container`."""
    label = container.page.locator("label.widget-label", has_text=re.compile(rf"^\s*{re.escape(description)}\s*$"))
    control = container.locator(".widget-inline-hbox", has=label)
    assert control.count() >= 1, f"no widget described {description!r} found"
    return control.first


def set_control(container, description: str, value: object) -> None:
    """Set a slider / drop-down / text box / toggle buttons the way a person would."""
    control = labelled_control(container, description)
    page = container.page
    if control.locator("select").count():
        control.locator("select").select_option(label=str(value))
    elif control.locator("input").count():
        control.locator("input").first.fill(str(value))
        control.locator("input").first.press("Enter")
    elif control.locator(".widget-readout[contenteditable='true']").count():
        readout = control.locator(".widget-readout")
        readout.click()
        page.keyboard.press("Control+A")
        page.keyboard.type(str(value))
        page.keyboard.press("Enter")
    elif control.get_by_role("button", name=str(value), exact=True).count():
        control.get_by_role("button", name=str(value), exact=True).click()
    else:
        raise AssertionError(f"do not know how to set the widget {description!r}: {control.inner_html()[:300]}")
    page.wait_for_timeout(300)


def control_value(container, description: str) -> str:
    """What the control shows as its value now (readout, selected option or input text)."""
    control = labelled_control(container, description)
    if control.locator("select").count():
        return control.locator("select").evaluate("s => s.options[s.selectedIndex].text")
    if control.locator("input").count():
        return control.locator("input").first.input_value()
    return control.locator(".widget-readout").inner_text().strip()


def click_button(container, text: str) -> None:
    """Press the ipywidgets button labelled `text`."""
    button = container.get_by_role("button", name=text, exact=True)
    assert button.count() >= 1, f"no button {text!r} found"
    button.first.click()


def readout_numbers(container, selector: str = ".labkit-readout") -> tuple[str, list[float]]:
    """The readout's visible text and the numbers in it."""
    text = container.locator(selector).first.inner_text()
    return text, parse_numbers(text)


def move_slider(container, description: str, value: int | str, max_presses: int = 40) -> str:
    """Move a slider with the keyboard, as a person would (focus its handle, arrow keys) until its readout
    shows ``value`` (a readout may carry a note after the number, e.g. "512 (won't fit)"); returns the readout."""
    control = labelled_control(container, description)
    handle = control.locator("[role=slider]").first
    readout = control.locator(".widget-readout")
    target = re.compile(rf"^\s*{re.escape(str(value))}\b")
    handle.focus()
    for _ in range(max_presses):
        text = readout.inner_text().strip()
        if target.search(text):
            container.page.wait_for_timeout(300)
            return text
        now = parse_numbers(text)
        key = "ArrowRight" if not now or now[0] < float(value) else "ArrowLeft"
        handle.press(key)
        container.page.wait_for_timeout(150)
    raise AssertionError(f"the slider {description!r} did not reach {value}: it shows {readout.inner_text()!r}")
