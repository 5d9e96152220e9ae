"""The planner widget's logic without a browser: the table and reason, errors as one line, the widget updates."""
from labkit.ui.plan_view import plan_summary, plan_view

ARGS = dict(layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, global_batch=64, gpu="NVIDIA H100 SXM",
            memory_gib=80, gpus_per_node=8, nodes=1)


def test_the_summary_lists_fitting_layouts_fastest_first_and_says_why():
    table, reason = plan_summary(**ARGS)
    assert 0 < len(table) <= 5 and (table.memory_GiB <= 80).all()
    assert list(table.step_s) == sorted(table.step_s)
    assert table.layout.iloc[0] in reason


def test_bad_input_is_one_line_not_a_traceback():
    table, reason = plan_summary(**{**ARGS, "heads": 7})
    assert table.empty and reason.startswith("cannot plan:") and "divisible" in reason


def test_moving_a_slider_replans():
    view = plan_view()
    before = view.children[1].value
    nodes = view.children[0].children[1].children[-2]
    assert nodes.description == "nodes"
    nodes.value = 4
    assert view.children[1].value != before
