"""scripts/book.py, book_pages.py and book_widgets.py: a failing notebook stops the build with its cell and error,
a passing one becomes a page with the measured header, and the pieces that write the pages say only what ran."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import book  # noqa: E402
import book_pages  # noqa: E402
import book_widgets  # noqa: E402

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\nfake").decode()
DOCTOR = {"python": "3.11.7", "platform": "Linux-x86_64", "packages": {"torch": "2.14.1"}, "missing_required": [],
          "cpu_cores": 2, "ram_bytes": 8 * 1024 ** 3, "gpus": [], "nccl": False, "mode": "fast",
          "mode_reason": "no CUDA GPU found", "dataset": "digits", "dataset_reason": "offline", "ok": True}


def notebook(*cells: nbformat.NotebookNode) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(cells=list(cells))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return nb


def write(folder: Path, name: str, nb: nbformat.NotebookNode) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / name)
    return folder / name


def run_book(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "book.py"), *args], capture_output=True, text=True,
                          timeout=600, cwd=REPO)


def test_a_failing_notebook_stops_the_build_naming_its_cell_and_error(tmp_path):
    folder = tmp_path / "notebooks"
    write(folder, "01_fails.ipynb", notebook(nbformat.v4.new_markdown_cell("# 01 · fails"),
                                             nbformat.v4.new_code_cell("print('fine so far')"),
                                             nbformat.v4.new_code_cell("raise ValueError('the lesson broke')"),
                                             nbformat.v4.new_code_cell("print('never runs')")))
    done = run_book("build", "--folder", str(folder), "--out", str(tmp_path / "out"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "01_fails.ipynb failed in cell 2 (ValueError: the lesson broke)" in done.stderr
    assert not (tmp_path / "out" / "html").exists(), "a site was built although a notebook failed"
    kept = nbformat.read(tmp_path / "out" / "failed" / "01_fails.ipynb", as_version=4)
    assert kept.cells[1].outputs[0]["text"] == "fine so far\n"


def test_a_tagged_raising_cell_is_allowed_and_the_page_source_shows_the_run(tmp_path):
    """Execute + page sources on a tiny notebook: its tally read from its own log (Sphinx itself runs in
    tests/test_book_site.py on real notebooks)."""
    folder = tmp_path / "notebooks"
    tally = ("from labkit.core.lessons import LessonLog\nlog = LessonLog('00_tiny')\n"
             "log.check('tiny sums are exact', 1 + 1 == 2)\nlog.not_checked('a GPU claim', 'no GPU here')\n"
             "log.tally()")
    write(folder, "00_tiny.ipynb", notebook(
        nbformat.v4.new_markdown_cell("# 00 · Tiny"),
        nbformat.v4.new_code_cell("1 / 0", metadata={"tags": ["raises-exception"]}),
        nbformat.v4.new_code_cell(tally)))
    out = tmp_path / "out"
    done = run_book("execute", "--folder", str(folder), "--out", str(out))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    runs = json.loads((out / "runs.json").read_text())
    assert runs["notebooks"][0]["notebook"] == "00_tiny.ipynb" and runs["doctor"]["cpu_cores"] >= 1
    items = book_pages.write_sources(runs, out / "notebooks", out / "src", REPO)
    assert items[0]["title"] == "00 · Tiny" and items[0]["record"]["checked"] == ["tiny sums are exact"]
    page = nbformat.read(out / "src" / "notebooks" / "00_tiny.ipynb", as_version=4)
    assert page.cells[1].metadata["tags"] == ["book-header"]
    assert "1 of 2 lessons checked on this run" in page.cells[1].source
    assert "NOT CHECKED: a GPU claim (no GPU here)" in page.cells[1].source
    assert page.cells[2].outputs[0]["ename"] == "ZeroDivisionError"
    assert "00_tiny" in (out / "src" / "index.md").read_text()
    assert 'mathjax_path = "mathjax/MathJax.js' in (out / "src" / "conf.py").read_text()
    assert (out / "src" / "_static" / "mathjax" / "MathJax.js").is_file(), "MathJax is not served from the site"


def test_pick_notebooks_takes_every_numbered_one_and_refuses_a_missing_name(tmp_path):
    for name in ("01_b.ipynb", "00_a.ipynb", "notes.ipynb", "02b_c.ipynb"):
        write(tmp_path, name, notebook())
    assert [p.name for p in book.pick_notebooks(tmp_path, None)] == ["00_a.ipynb", "01_b.ipynb", "02b_c.ipynb"]
    with pytest.raises(SystemExit, match="no such notebook .*99_x.ipynb"):
        book.pick_notebooks(tmp_path, ["00_a.ipynb", "99_x.ipynb"])
    with pytest.raises(SystemExit, match="no numbered notebooks"):
        book.pick_notebooks(tmp_path / "empty", None)


def test_the_header_carries_machine_time_tally_reasons_and_links():
    entry = {"notebook": "03_x.ipynb", "started": "2026-11-27T10:00:00+00:00", "wall_s": 12.4}
    record = {"checked": ["a_b claim"], "not_checked": {"needs *two* GPUs": "one here"},
              "inconclusive": {"faster": "rank 0 got 0.4 of a core"}}
    text = book_pages.header_markdown(entry, DOCTOR, record, "https://mybinder.org/v2/gh/o/r/main")
    assert "2026-11-27 10:00:00 UTC, 12 s, on Linux-x86_64 (2 CPU cores, 8.0 GiB RAM, no GPU)" in text
    assert "1 of 3 lessons checked on this run" in text
    assert r"NOT CHECKED: needs \*two\* GPUs (one here)" in text and "INCONCLUSIVE: faster (rank 0 got 0" in text
    assert "https://mybinder.org/v2/gh/o/r/main?urlpath=lab/tree/notebooks/03_x.ipynb" in text
    assert "http://localhost:8888/lab/tree/03_x.ipynb" in text and "Training Performance Lab — doctor" in text
    assert "wrote no lesson tally" in book_pages.header_markdown(entry, DOCTOR, None, "")


def test_the_header_goes_under_the_title_and_outputs_stay_as_printed():
    out = nbformat.v4.new_output("stream", name="stdout", text="42\n")
    nb = notebook(nbformat.v4.new_markdown_cell("# 05 · T"), nbformat.v4.new_code_cell("print(42)", outputs=[out]))
    before = json.dumps(nb.cells[1], sort_keys=True)
    book_pages.with_header(nb, "HEADER")
    assert [c.source for c in nb.cells[:2]] == ["# 05 · T", "HEADER"]
    assert json.dumps(nb.cells[2], sort_keys=True) == before


def test_key_figure_prefers_the_tagged_cell_else_the_first_image():
    first = nbformat.v4.new_output("display_data", data={"image/png": PNG})
    other = base64.b64encode(b"\x89PNG\r\n\x1a\nkey").decode()
    tagged = nbformat.v4.new_output("display_data", data={"image/png": other})
    nb = notebook(nbformat.v4.new_code_cell("a", outputs=[first]),
                  nbformat.v4.new_code_cell("b", outputs=[tagged], metadata={"tags": ["book-thumbnail"]}))
    assert book_pages.key_figure(nb) == b"\x89PNG\r\n\x1a\nkey"
    nb.cells[1].metadata["tags"] = []
    assert book_pages.key_figure(nb) == b"\x89PNG\r\n\x1a\nfake"
    assert book_pages.key_figure(notebook(nbformat.v4.new_code_cell("c"))) is None


def test_front_page_lists_every_notebook_in_order_with_its_thumbnail():
    items = [{"file": "00_a.ipynb", "title": "00 · A", "thumb": False, "record": None, "wall_s": 3.0},
             {"file": "01_b.ipynb", "title": "01 · B", "thumb": True,
              "record": {"checked": ["x"], "not_checked": {}}, "wall_s": 9.0}]
    text = book_pages.front_page(items, DOCTOR)
    assert text.index("notebooks/00_a.ipynb") < text.index("notebooks/01_b.ipynb")
    assert "thumbs/01_b.png" in text and "thumbs/00_a.png" not in text
    assert "1 of 1 lessons checked on this run; ran in 9 s." in text
    assert text.rstrip().endswith("notebooks/00_a\nnotebooks/01_b\n```")


def test_links_between_notebooks_go_to_their_pages_or_to_binder(tmp_path):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "01_b.html").write_text("")
    page = tmp_path / "notebooks" / "00_a.html"
    page.write_text('<a href="01_b.ipynb">B</a> <a href="07_c.ipynb">C</a> <a href="../_sources/x.ipynb">src</a>')
    index = tmp_path / "index.html"
    index.write_text('<a href="01_b.ipynb">B</a>')
    assert book_pages.link_notebooks(tmp_path, "https://binder/x") == 3
    assert page.read_text() == ('<a href="01_b.html">B</a> <a href="https://binder/x?urlpath=lab/tree/notebooks/'
                                '07_c.ipynb">C</a> <a href="../_sources/x.ipynb">src</a>')
    assert index.read_text() == '<a href="notebooks/01_b.html">B</a>'


def test_binder_base_is_read_from_the_readme_badge():
    assert book_pages.binder_base((REPO / "README.md").read_text()).startswith("https://mybinder.org/v2/gh/")
    assert book_pages.binder_base("no badge") == ""


def test_a_saved_progress_bar_is_drawn_from_its_final_state():
    models = {"box": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_l", "IPY_MODEL_p", "IPY_MODEL_r"]}},
              "l": {"model_name": "HTMLModel", "state": {"value": "training: 100%"}},
              "p": {"model_name": "FloatProgressModel", "state": {"value": 14.0, "max": 14.0}},
              "r": {"model_name": "HTMLModel", "state": {"value": " 14/14 [00:01]"}},
              "s": {"model_name": "IntSliderModel", "state": {"description": "batch", "value": 64}},
              "d": {"model_name": "DropdownModel", "state": {"description": "Model", "index": 1,
                                                             "_options_labels": ["mlp", "small_cnn"]}},
              "i": {"model_name": "ImageModel", "state": {"format": "png"},
                    "buffers": [{"path": ["value"], "encoding": "base64", "data": PNG}]},
              "b": {"model_name": "ButtonModel", "state": {"description": "Run"}}}
    view = {"application/vnd.jupyter.widget-view+json": {"model_id": "box"}, "text/plain": "training:   0%"}
    gone = {"application/vnd.jupyter.widget-view+json": {"model_id": "unsaved"}, "text/plain": "x"}
    cells = [{"cell_type": "code", "outputs": [{"output_type": "display_data", "data": dict(view)},
                                               {"output_type": "display_data", "data": dict(gone)}]}]
    assert book_widgets.static_widget_outputs(cells, models) == 1
    drawn = cells[0]["outputs"][0]["data"]
    assert "training: 100%" in drawn["text/html"] and '<progress value="14.0" max="14.0">' in drawn["text/html"]
    assert "application/vnd.jupyter.widget-view+json" not in drawn and drawn["text/plain"] == "training:   0%"
    assert cells[0]["outputs"][1]["data"] == gone, "a widget without saved state is left as printed"
    assert book_widgets.widget_html("s", models) == '<span class="book-widget-control">batch: 64</span>'
    assert book_widgets.widget_html("d", models) == '<span class="book-widget-control">Model: small_cnn</span>'
    assert book_widgets.widget_html("i", models) == f'<img alt="figure" src="data:image/png;base64,{PNG}">'
    assert book_widgets.widget_html("b", models) == '<button class="book-widget-control" disabled>Run</button>'


def test_the_kernel_is_this_python_even_when_a_user_installed_another_python3(tmp_path, monkeypatch):
    spec = tmp_path / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({"argv": ["/usr/bin/false", "{connection_file}"],
                                                  "display_name": "other", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    assert book.current_env_kernel().kernel_spec.argv[0] == sys.executable


def test_a_partial_book_links_left_out_notebooks_to_binder_and_keeps_the_rest():
    nb = notebook(nbformat.v4.new_markdown_cell("see [09](09_x.ipynb#pitfall-3) and [01](01_b.ipynb), not `x.ipynb`"),
                  nbformat.v4.new_code_cell("print('[09](09_x.ipynb)')"))
    assert book_pages.point_left_out_notebooks(nb, {"01_b.ipynb"}, "https://binder/x") == 1
    assert nb.cells[0].source == ("see [09](https://binder/x?urlpath=lab/tree/notebooks/09_x.ipynb) and "
                                  "[01](01_b.ipynb), not `x.ipynb`")
    assert nb.cells[1].source == "print('[09](09_x.ipynb)')"
