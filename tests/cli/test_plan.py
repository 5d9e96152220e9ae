"""`labkit plan`: a ranked table and the winner's reason, JSON that matches the library, clear usage errors."""
import json

from tests.cli.support import labkit, usage_error


def test_plan_prints_the_ranked_layouts_and_why():
    proc = labkit("plan", "--preset", "7b", "--top", "3")
    assert proc.returncode == 0, proc.stderr
    assert "GiB/rank" in proc.stdout and "predicts" in proc.stdout and "best other mesh" in proc.stdout


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
