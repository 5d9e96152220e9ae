"""The kit's environment variables: every bad value named by its variable, stale launcher variables caught."""
import pytest

from labkit.core.envcheck import (EnvironmentProblem, check_environment, environment_problems,
                                  stale_launcher_variables)


@pytest.mark.parametrize("env, words", [
    ({"LABKIT_MODE": "turbo"}, "LABKIT_MODE must be one of ('fast', 'full')"),
    ({"LABKIT_DATASET": "imagenet"}, "LABKIT_DATASET must be one of"),
    ({"LABKIT_OFFLINE": "maybe"}, "LABKIT_OFFLINE must be 1"),
    ({"LABKIT_RUN_DIR": ""}, "LABKIT_RUN_DIR is set but empty"),
    ({"LABKIT_DATA_DIR": " "}, "LABKIT_DATA_DIR is set but empty"),
    ({"RANK": "one"}, "RANK='one' is not a whole number"),
    ({"MASTER_PORT": "99999"}, "MASTER_PORT='99999' is not a port"),
])
def test_each_bad_value_is_named_by_its_variable(env, words):
    problems = environment_problems(env)
    assert len(problems) == 1 and words in problems[0]
    with pytest.raises(EnvironmentProblem, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_environment(env)


def test_run_dir_that_is_a_file_or_unwritable_is_blamed_on_the_variable(tmp_path):
    a_file = tmp_path / "f"
    a_file.write_text("")
    assert environment_problems({"LABKIT_RUN_DIR": str(a_file)}) == [
        f"LABKIT_RUN_DIR={a_file} is a file, not a folder; point LABKIT_RUN_DIR at a folder you can write to, "
        "or unset it"]
    assert "cannot be created" in environment_problems({"LABKIT_RUN_DIR": str(a_file / "sub")})[0]
    assert environment_problems({"LABKIT_RUN_DIR": str(tmp_path / "new" / "deeper")}) == []


def test_lesson_log_in_a_missing_folder_is_refused(tmp_path):
    assert "LABKIT_LESSON_LOG" in environment_problems({"LABKIT_LESSON_LOG": str(tmp_path / "no" / "log.jsonl")})[0]


def test_stale_launcher_variables_are_caught_only_for_launch():
    stale = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "29500"}
    assert stale_launcher_variables(stale) == ["RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    assert environment_problems(stale, command="sweep") == []
    (problem,) = environment_problems(stale, command="launch")
    assert "no launcher started this process" in problem and "unset RANK WORLD_SIZE MASTER_ADDR MASTER_PORT" in problem


@pytest.mark.parametrize("mark", ["TORCHELASTIC_RUN_ID", "PMI_RANK", "OMPI_COMM_WORLD_RANK"])
def test_variables_a_real_launcher_set_are_not_stale(mark):
    env = {"RANK": "1", "WORLD_SIZE": "2", mark: "1"}
    assert stale_launcher_variables(env) == [] and environment_problems(env, command="launch") == []


def test_a_clean_environment_has_no_problems():
    assert environment_problems({"LABKIT_MODE": "fast", "LABKIT_OFFLINE": "1", "LABKIT_DATASET": "digits"}) == []
