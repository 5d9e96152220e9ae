"""The ladder's report: Markdown, JSON and the chart, and a result that survives a round trip.
"""
import json

from labkit.ladder.report import LadderResult
from labkit.ladder.rungs import RUNGS


def test_reports_and_round_trip(fake_result, tmp_path):
    md = fake_result.to_markdown()
    assert md.startswith("Device: ") and "Mode:" in md and "(02_batch_size.ipynb)" in md and "Ceiling: 200.0" in md
    assert md.count("\n| ") == 1 + len(RUNGS)                                      # header + one line per rung
    assert "not carried forward" in md and "skipped" in md
    doc = json.loads(fake_result.to_json())
    assert [r["rung"] for r in doc["rows"]] == list(range(len(RUNGS)))
    assert doc["rows"][8]["samples_per_s"] is None and doc["ceiling_samples_per_s"] == 200.0
    json_path, md_path = fake_result.save(tmp_path / "out")
    back = LadderResult.from_dict(json.loads(json_path.read_text()))
    assert back.to_markdown() == fake_result.to_markdown() and "notebooks/" in md_path.read_text()
    import matplotlib.pyplot as plt

    fig = fake_result.plot()
    assert len(fig.axes) == 2
    plt.close(fig)
    assert list(fake_result.to_dataframe().index) == list(range(len(RUNGS)))
