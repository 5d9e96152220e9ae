"""`labkit plan`: a ranked table and the winner's reason, JSON that matches the library, clear usage errors."""
import json

import pytest

from tests.cli.support import labkit, usage_error


def test_plan_prints_the_ranked_layouts_and_why():
    proc = labkit("plan", "--preset", "7b", "--top", "3")
    assert proc.returncode == 0, proc.stderr
    assert "GiB/rank" in proc.stdout and "predicts" in proc.stdout and "best other mesh" in proc.stdout


def test_plan_help_prints_its_percent_sign_once():
    proc = labkit("plan", "--help")
    assert proc.returncode == 0 and "within 10 %, a tie" in proc.stdout and "%%" not in proc.stdout, proc.stdout


def test_plan_json_matches_the_library_and_nothing_fitting_exits_1():
    from labkit.plan.planner import plan
    from labkit.plan.specs import ClusterSpec, DeviceSpec, ModelSpec

    proc = labkit("plan", "--layers", "4", "--hidden", "256", "--heads", "4", "--seq-len", "128", "--vocab", "1000",
                  "--global-batch", "8", "--gpus-per-node", "4", "--json", "--top", "2")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    want = plan(ModelSpec(4, 256, 4, 128, 1000, global_batch=8, name="7b"),
                DeviceSpec.from_table("NVIDIA H100 SXM", 80), ClusterSpec(4, 1))[0]
    assert data["layouts"][0]["layout"] == want.layout.label()
    assert abs(data["layouts"][0]["step_s"] - want.step_s) < 1e-12
    assert labkit("plan", "--preset", "70b", "--memory-gib", "1", "--top", "1").returncode == 1


def test_plan_usage_errors_exit_2(capsys):
    assert "divisible by heads" in usage_error(["plan", "--heads", "7"], capsys)
    assert "PEAK_TABLE" in usage_error(["plan", "--gpu", "Foo"], capsys)


# ---- hostile inputs (issue 53): one line and exit 2, never a traceback, a spin or 'nan s'
def test_absurd_sizes_and_links_are_one_line_usage_errors(capsys):
    assert "parameters is past what the planner takes" in usage_error(["plan", "--hidden", "1" + "0" * 200], capsys)
    assert "1,000,000 nodes) is past" in usage_error(["plan", "--nodes", "1000000"], capsys)
    slow = usage_error(["plan", "--nodes", "2", "--inter-gb-s", "1e-320"], capsys)     # printed 'nan s' before
    assert "--inter-gb-s" in slow and "is slower than any network" in slow
    assert "--intra-alpha-us 1e+300 is over a second" in usage_error(["plan", "--intra-alpha-us", "1e300"], capsys)


def _plan_in_process(capsys, *argv: str) -> tuple[int, str]:
    from labkit.cli import main as cli

    code = cli.main(["plan", *argv])
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    return code, out.out


def test_an_odd_sequence_is_planned_without_context_parallelism(capsys):
    code, out = _plan_in_process(capsys, "--seq-len", "2047", "--top", "3")
    assert code == 0 and "cp1" in out and "cp2" not in out and "nan" not in out


def test_a_custom_shape_is_called_custom_and_a_plain_preset_keeps_its_name(capsys):
    code, out = _plan_in_process(capsys, "--layers", "24", "--hidden", "2048", "--heads", "16", "--top", "1")
    assert code == 0 and out.splitlines()[0].startswith("custom (24 layers, hidden 2048, 16 heads, seq 4096")
    assert "7b" not in out.splitlines()[0]
    code, out = _plan_in_process(capsys, "--layers", "24", "--top", "1", "--json")
    assert json.loads(out)["model"]["name"] == "custom" and json.loads(out)["model"]["layers"] == 24
    code, out = _plan_in_process(capsys, "--layers", "32", "--top", "1", "--json")     # the preset's own value
    assert json.loads(out)["model"]["name"] == "7b"
    code, out = _plan_in_process(capsys, "--preset", "70b", "--top", "1")
    assert out.splitlines()[0].startswith("70b: ")


# ---- issue 54's faults and issue 55's ep axis on the command line -------------------------------------------------
def test_the_table_shows_every_time_term_so_its_columns_add_up_to_the_step(capsys):
    """The CP-ring, PP-send and EP columns were missing: the printed terms did not sum to the step time."""
    from labkit.cli.plan import TIME_COLUMNS, table_columns
    from labkit.plan.planner import predict
    from labkit.plan.specs import ClusterSpec, DeviceSpec, Layout, ModelSpec

    p = predict(ModelSpec(4, 256, 4, 128, 1000), DeviceSpec("x", 1e9, 1e12), ClusterSpec(4, 1), Layout(dp=4))
    assert [term for term, _ in TIME_COLUMNS] == list(p.time)
    keys = {key for key, _, _ in table_columns()}
    assert all(f"{term} s" in keys for term in p.time)
    code, out = _plan_in_process(capsys, "--preset", "mixtral-8x7b", "--nodes", "2", "--json", "--top", "3")
    for row in json.loads(out)["layouts"]:
        assert sum(row[f"{term} s"] for term, _ in TIME_COLUMNS) == pytest.approx(row["step_s"], rel=1e-12)
    code, out = _plan_in_process(capsys, "--top", "2")
    assert all(header in out.splitlines()[1] for header in ("CP s", "PP s", "EP s"))


def test_an_moe_preset_is_planned_with_its_ep_axis(capsys):
    code, out = _plan_in_process(capsys, "--preset", "mixtral-8x7b", "--nodes", "2", "--top", "40")
    assert out.splitlines()[0].startswith("mixtral-8x7b: 46.7 B parameters (12.9 B active)")
    assert " ep" in out
    code, out = _plan_in_process(capsys, "--experts", "8", "--top-k", "2", "--top", "1")
    assert out.splitlines()[0].startswith("custom (") and "8 experts top-2" in out.splitlines()[0]


def test_moe_flags_without_experts_and_bad_shapes_are_one_line_usage_errors(capsys):
    assert "give --experts too" in usage_error(["plan", "--top-k", "2"], capsys)
    assert "--kv-heads=5 must divide heads=32" in usage_error(["plan", "--kv-heads", "5"], capsys)
    assert "--top-k=9 must be at most experts=8" in usage_error(["plan", "--experts", "8", "--top-k", "9"], capsys)


def test_cp_is_capped_only_when_asked(capsys):
    long = ("--seq-len", "131072", "--nodes", "16", "--layers", "8", "--global-batch", "16", "--json", "--top", "100000")
    code, out = _plan_in_process(capsys, *long)
    cps = {int(r["layout"].split()[3][2:]) for r in json.loads(out)["layouts"]}
    code, out = _plan_in_process(capsys, *long, "--max-cp", "8")
    capped = {int(r["layout"].split()[3][2:]) for r in json.loads(out)["layouts"]}
    assert max(cps) > 8 and max(capped) <= 8


def test_plan_for_16384_gpus_takes_under_five_cpu_seconds():
    """The whole command, start-up included, in CPU seconds of the child (wall time on the shared 2-core machine
    measures the neighbours)."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = labkit("plan", "--nodes", "2048", "--top", "3")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(f"labkit plan on 16,384 GPUs: {cpu_s:.2f} CPU s")
    assert proc.returncode == 0, proc.stderr
    assert cpu_s < 5.0


def test_the_table_and_json_show_the_top_group_and_mfu(capsys):
    code, out = _plan_in_process(capsys, "--preset", "7b", "--nodes", "2", "--json", "--top", "400")
    data = json.loads(out)
    marked = [r["layout"] for r in data["layouts"] if r["group"] == "top"]
    assert marked == data["top_group"][:len(marked)] and 0 < len(marked) < len(data["layouts"])
    assert all(0 < r["MFU"] < data["efficiency"] for r in data["layouts"])    # an output, below the GEMM rate
    assert "a tie" in data["reason"]
