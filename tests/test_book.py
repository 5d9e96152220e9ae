"""scripts/book.py, book_pages.py and book_widgets.py: a failing notebook stops the build with its cell and error,
a passing one becomes a page with the measured header, and the pieces that write the pages say only what ran."""
from __future__ import annotations

import base64
import errno
import json
import os
import signal
import subprocess
import sys
import time
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


# ---------------------------------------------------------------- stopping the book (issue 53)
SLEEPS = "import os, pathlib, time\npathlib.Path({mark!r}).write_text(str(os.getpid()))\ntime.sleep(100000)"


def old_site(out: Path) -> Path:
    """A previous complete book in ``out``: the page a stopped or failed build must leave as it was."""
    (out / "html").mkdir(parents=True)
    page = out / "html" / "index.html"
    page.write_text("the previous book")
    return page


def gone(pid: int) -> bool:
    """True when the process has ended (a zombie waiting for init to reap it has ended too)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def leftovers(folder: Path) -> list[str]:
    """Hidden build folders the book left beside its output."""
    return [p.name for p in folder.iterdir() if p.name.startswith(".out.")]


def sleeping_notebook(tmp_path: Path) -> tuple[Path, Path]:
    mark = tmp_path / "kernel.pid"
    folder = tmp_path / "notebooks"
    write(folder, "01_sleeps.ipynb", notebook(nbformat.v4.new_markdown_cell("# 01 · sleeps"),
                                              nbformat.v4.new_code_cell(SLEEPS.format(mark=str(mark)))))
    return folder, mark


def test_a_cell_that_outlives_book_cell_timeout_s_is_stopped_in_one_line(tmp_path):
    """Found: a notebook with time.sleep(100000) was still building at 1,100 s (the blocking kernel manager's
    client waits in one call that nbclient's timeout never reaches)."""
    folder, mark = sleeping_notebook(tmp_path)
    page = old_site(tmp_path / "out")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "book.py"), "build", "--folder", str(folder),
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=240, cwd=REPO,
                          env={**os.environ, "BOOK_CELL_TIMEOUT_S": "3"})
    wall_s = time.perf_counter() - start
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [done.stderr.strip()], done.stderr
    assert "01_sleeps.ipynb failed in cell 1 (still running after the cell timeout of 3 s" in done.stderr
    assert wall_s < 120, f"took {wall_s:.0f} s"        # kernel start-up on a busy 2-core machine, 3 s, shutdown
    assert gone(int(mark.read_text())), "the timed-out notebook's kernel is still running"
    assert page.read_text() == "the previous book" and not leftovers(tmp_path)
    assert (tmp_path / "out" / "failed" / "01_sleeps.ipynb").is_file()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_sleeping_cell_stops_the_book_at_once_in_one_line(tmp_path, signum):
    """Found: SIGTERM/SIGINT were ignored while a cell ran; Ctrl-C then gave a 27-line nbclient traceback and left
    the previous site beside half-replaced notebooks."""
    folder, mark = sleeping_notebook(tmp_path)
    page = old_site(tmp_path / "out")
    (tmp_path / "out" / "notebooks").mkdir()
    (tmp_path / "out" / "notebooks" / "01_sleeps.ipynb").write_text("the previous copy")
    sockets = tmp_path / "tmp"            # the book's temp folder, where its kernel's Unix sockets live
    sockets.mkdir()
    book_run = subprocess.Popen([sys.executable, str(REPO / "scripts" / "book.py"), "build", "--folder", str(folder),
                                 "--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=REPO, env={**os.environ, "TMPDIR": str(sockets)})
    try:
        waited = time.perf_counter()
        while not (mark.is_file() and mark.read_text()) and book_run.poll() is None:
            assert time.perf_counter() - waited < 180, "the notebook's cell never started"
            time.sleep(0.2)
        assert book_run.poll() is None, book_run.communicate()
        book_run.send_signal(signum)
        start = time.perf_counter()
        out, err = book_run.communicate(timeout=30)
        wall_s = time.perf_counter() - start
    finally:
        if book_run.poll() is None:
            book_run.kill()
            book_run.wait()
    assert book_run.returncode == 128 + signum, out + err
    assert wall_s < 5, f"the book took {wall_s:.1f} s to answer {signum.name}"
    assert err.strip().splitlines() == [f"book: stopped by {signum.name} while running 01_sleeps.ipynb (cell 1); "
                                        f"{tmp_path / 'out'} holds the last complete book, unchanged"], err
    assert gone(int(mark.read_text())), "the stopped notebook's kernel is still running"
    assert page.read_text() == "the previous book"
    assert (tmp_path / "out" / "notebooks" / "01_sleeps.ipynb").read_text() == "the previous copy"
    assert not leftovers(tmp_path)
    assert not list(sockets.glob("labkit-kernel-*")), "the stopped kernel's sockets are left behind"


def test_each_notebooks_kernel_is_shut_down_when_that_notebook_ends(tmp_path):
    """Found: every finished notebook's kernel stayed alive until the whole book ended (433 + 462 + 801 MB)."""
    folder, pid_file = tmp_path / "notebooks", tmp_path / "first.pid"
    write(folder, "00_first.ipynb", notebook(nbformat.v4.new_code_cell(
        f"import os, pathlib\npathlib.Path({str(pid_file)!r}).write_text(str(os.getpid()))")))
    write(folder, "01_second.ipynb", notebook(nbformat.v4.new_code_cell(
        f"import pathlib, psutil\npid = int(pathlib.Path({str(pid_file)!r}).read_text())\n"
        "alive = psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE\n"
        "assert not alive, f'the first notebook kernel {pid} is still running'")))
    done = run_book("execute", "--folder", str(folder), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    runs = json.loads((tmp_path / "out" / "runs.json").read_text())
    assert [e["log"] for e in runs["notebooks"]] == ["logs/00_first.jsonl", "logs/01_second.jsonl"]
    assert not leftovers(tmp_path)


def test_a_full_disk_is_one_short_line_and_the_previous_site_stays(tmp_path, monkeypatch, capsys):
    """Found: a full disk printed one 255,362-character shutil.Error line. The disk fills the way a real one does:
    os.sendfile (what shutil copies with on Linux) raises ENOSPC once a few files are written."""
    out = tmp_path / "out"
    page = old_site(out)
    write(out / "notebooks", "00_tiny.ipynb", notebook(nbformat.v4.new_markdown_cell("# 00 · Tiny")))
    entry = {"notebook": "00_tiny.ipynb", "started": "2026-11-27T10:00:00+00:00", "wall_s": 1.0,
             "log": "logs/00_tiny.jsonl"}
    (out / "runs.json").write_text(json.dumps({"notebooks": [entry], "doctor": DOCTOR}))
    real_sendfile, written = os.sendfile, []

    def full_disk(*args):
        if len(written) >= 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written.append(args)
        return real_sendfile(*args)

    monkeypatch.setattr(os, "sendfile", full_disk)
    assert book.main(["html", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and len(err) < 400, err[:1000]
    assert "No space left on device" in err
    assert page.read_text() == "the previous book" and not leftovers(tmp_path)
    assert not (out / "src").exists()


def test_a_bad_book_cell_timeout_is_refused_in_one_line():
    assert book.cell_timeout_s({}) == 900 and book.cell_timeout_s({"BOOK_CELL_TIMEOUT_S": "2.5"}) == 2.5
    for bad in ("0", "-3", "soon", "inf", "nan"):
        with pytest.raises(SystemExit, match="BOOK_CELL_TIMEOUT_S must be a positive number"):
            book.cell_timeout_s({"BOOK_CELL_TIMEOUT_S": bad})


def test_build_folders_of_a_killed_book_are_swept_and_a_live_ones_kept(tmp_path):
    """SIGKILL gives a book no chance to clean up: the next build removes what the dead one left beside OUT."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    for name in (f".out.building-{dead_pid}-abc", f".out.old-{dead_pid}", f".out.building-{os.getpid()}-xyz",
                 ".other.building-1-q", "out"):
        (tmp_path / name).mkdir()
    assert sorted(book.sweep_stale_stages(tmp_path / "out")) == [f".out.building-{dead_pid}-abc",
                                                                  f".out.old-{dead_pid}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f".out.building-{os.getpid()}-xyz", ".other.building-1-q", "out"])
