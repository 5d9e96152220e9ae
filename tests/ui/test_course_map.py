"""The course map's figure (notebook 00): a box per notebook in its part's column, an arrow per prerequisite."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch  # noqa: E402

from labkit.core.course import PARTS, course_rows  # noqa: E402
from labkit.ui.course_map import BOX_H, BOX_W, box_positions, course_figure, implied_prerequisites  # noqa: E402


def test_every_notebook_gets_a_box_and_every_prerequisite_an_arrow():
    rows = course_rows()
    fig = course_figure(rows)
    try:
        patches = fig.axes[0].patches
        boxes = sorted(p.get_gid() for p in patches if isinstance(p, FancyBboxPatch))
        arrows = sorted(p.get_gid() for p in patches if isinstance(p, FancyArrowPatch))
        dotted = {p.get_gid() for p in patches if isinstance(p, FancyArrowPatch) and p.get_linestyle() == ":"}
        texts = [t.get_text() for t in fig.axes[0].texts]
        fig.canvas.draw()                                  # the Agg renderer lays every arrow out without error
    finally:
        plt.close(fig)
    assert boxes == sorted(r.file for r in rows)
    assert arrows == sorted(f"{p}->{r.file}" for r in rows for p in r.prerequisite_files)
    assert dotted == {f"{a}->{b}" for a, b in implied_prerequisites(rows)}
    assert all(any(t.startswith(f"{r.order}. {r.lesson.number} ") for t in texts) for r in rows)
    assert sum(t.replace("\n", " ") in PARTS for t in texts) == len(PARTS)


def test_boxes_stand_in_their_parts_column_in_reading_order_and_never_overlap():
    rows = course_rows()
    where = box_positions(rows)
    column_of = {part: i for i, part in enumerate(PARTS)}
    xs = {r.lesson.part: set() for r in rows}
    for r in rows:
        xs[r.lesson.part].add(where[r.file][0])
    assert all(len(x) == 1 for x in xs.values())
    assert sorted(xs, key=lambda p: min(xs[p])) == sorted(xs, key=column_of.get)
    for part in PARTS:
        ys = [where[r.file][1] for r in rows if r.lesson.part == part]
        assert ys == sorted(ys, reverse=True) and all(a - b >= BOX_H for a, b in zip(ys, ys[1:]))
    left = sorted({x for x, _ in where.values()})
    assert all(b - a >= BOX_W for a, b in zip(left, left[1:]))


def test_a_prerequisite_already_needed_through_another_is_implied_and_a_direct_one_is_not():
    rows = {r.lesson.number: r for r in course_rows()}
    implied = implied_prerequisites(list(rows.values()))
    assert {(rows[n].file, rows["13"].file) for n in ("06", "07")} <= implied      # 13 needs 11 and 12, which need both
    assert (rows["11"].file, rows["13"].file) not in implied and (rows["12"].file, rows["13"].file) not in implied
    assert all(b != rows["00"].file for _, b in implied)
