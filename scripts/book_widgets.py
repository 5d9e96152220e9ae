"""Widgets on a static page: each widget output drawn from the state the kernel saved at the end of the run.

A widget output's ``text/plain`` is its repr when it was created (a tqdm bar reads "0%"); what it finally showed
lives in the notebook's saved widget state (``metadata.widgets``, written by nbclient). ipywidgets' own page script
would draw it, but loads from a CDN; this draws the same state as plain HTML at build time instead: boxes, HTML and
labels, progress bars, Output widgets' text and images; any other control as its description and value. Nothing is
typed: every word comes from the saved state.
"""
from __future__ import annotations

import html
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
MODEL_PREFIX = "IPY_MODEL_"
MAX_DEPTH = 20


def saved_state(metadata: dict) -> dict:
    """model id -> {model_name, state} from a notebook's metadata ({} when none was saved)."""
    return ((metadata.get("widgets") or {}).get(WIDGET_STATE) or {}).get("state") or {}


def _output_html(out: dict) -> str:
    """One output kept by an Output widget: its text, or its PNG as an image."""
    data = out.get("data") or {}
    if "image/png" in data:
        png = data["image/png"]
        return f'<img alt="figure" src="data:image/png;base64,{"".join(png) if isinstance(png, list) else png}">'
    text = out.get("text") or data.get("text/plain") or ""
    return f"<pre>{html.escape(''.join(text) if isinstance(text, list) else text)}</pre>" if text else ""


def _image_html(model: dict, state: dict) -> str:
    """An Image widget's picture: its bytes travel base64-encoded in the model's saved buffers."""
    for buffer in model.get("buffers") or []:
        if buffer.get("path") == ["value"] and buffer.get("encoding") == "base64":
            kind = html.escape(str(state.get("format", "png")))
            return f'<img alt="figure" src="data:image/{kind};base64,{buffer.get("data", "")}">'
    return ""


def _control_html(name: str, state: dict) -> str:
    """A control (slider, drop-down, box, button) as its description and the value it was left at."""
    label = html.escape(str(state.get("description") or name.removesuffix("Model")))
    if name == "ButtonModel":
        return f'<button class="book-widget-control" disabled>{label}</button>'
    value = state.get("value", "")
    labels, index = state.get("_options_labels"), state.get("index")
    if isinstance(labels, list) and isinstance(index, int) and 0 <= index < len(labels):
        value = labels[index]
    shown = html.escape(str(value)) if isinstance(value, (str, int, float, bool)) and value != "" else ""
    return f'<span class="book-widget-control">{label}{": " + shown if shown else ""}</span>'


def _leaf_html(model: dict) -> str:
    """A widget that holds no other widgets."""
    name, state = model.get("model_name", ""), model.get("state") or {}
    if name in ("HTMLModel", "HTMLMathModel"):
        return f"<span>{state.get('value', '')}</span>"
    if name == "LabelModel":
        return f"<span>{html.escape(str(state.get('value', '')))}</span>"
    if name in ("FloatProgressModel", "IntProgressModel"):
        return f'<progress value="{state.get("value", 0)}" max="{state.get("max", 100)}"></progress>'
    if name == "OutputModel":
        return "".join(_output_html(o) for o in state.get("outputs", []))
    if name == "ImageModel":
        return _image_html(model, state)
    return _control_html(name, state)


def widget_html(model_id: str, models: dict, depth: int = 0) -> str:
    """HTML for one saved widget and its children ('' for a model the state does not hold)."""
    model = models.get(model_id.removeprefix(MODEL_PREFIX))
    if model is None or depth > MAX_DEPTH:
        return ""
    name, state = model.get("model_name", ""), model.get("state") or {}
    children = state.get("children")
    if isinstance(children, list):
        inner = "".join(widget_html(str(c), models, depth + 1) for c in children)
        kind = "row" if name == "HBoxModel" else "column"
        return f'<div class="book-widget-{kind}">{inner}</div>'
    return _leaf_html(model)


def static_widget_outputs(cells: list, models: dict) -> int:
    """Give each widget output whose state was saved an HTML form of that state; return how many got one."""
    drawn = 0
    for cell in cells:
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            view = (out.get("data") or {}).get(WIDGET_VIEW)
            if not view:
                continue
            body = widget_html(str(view.get("model_id", "")), models)
            if body:
                out["data"]["text/html"] = f'<div class="book-widget">{body}</div>'
                del out["data"][WIDGET_VIEW]
                drawn += 1
    return drawn
