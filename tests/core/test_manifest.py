"""The data manifest: validated field by field, every message naming the file (and the kit's loader using it)."""
import json

import pytest

from labkit.core import data
from labkit.core.manifest import ManifestError, read_manifest

GOOD = {"digits.csv.gz": {"sha256": "0" * 64, "source": "UCI", "licence": "CC BY 4.0", "description": "digits"}}


def write(tmp_path, text: str):
    (tmp_path / "manifest.json").write_text(text)
    return tmp_path / "manifest.json"


def test_a_good_manifest_reads_back(tmp_path):
    write(tmp_path, json.dumps(GOOD))
    assert read_manifest(tmp_path) == GOOD


@pytest.mark.parametrize("text, words", [
    (json.dumps(GOOD)[:40], "is not valid JSON"),                                  # cut short
    ("[1, 2]", "must hold one JSON object"),
    (json.dumps({"digits.csv.gz": "abc"}), "entry 'digits.csv.gz' must be an object"),
    (json.dumps({"digits.csv.gz": {**GOOD["digits.csv.gz"], "licence": ""}}), "lacks licence"),
    (json.dumps({"digits.csv.gz": {k: v for k, v in GOOD["digits.csv.gz"].items() if k != "sha256"}}), "lacks sha256"),
    (json.dumps({"digits.csv.gz": {**GOOD["digits.csv.gz"], "sha256": "xyz"}}), "not 64 lowercase hex"),
])
def test_each_broken_manifest_is_one_line_naming_the_file(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(ManifestError) as err:
        read_manifest(tmp_path)
    assert str(err.value).startswith(str(path)) and words in str(err.value) and "\n" not in str(err.value)


def test_the_loader_reports_a_broken_manifest_as_unavailable_data(tmp_path):
    write(tmp_path, '{"digits.csv.gz": {"sha256": ')
    with pytest.raises(data.DataUnavailableError, match="manifest.json is not valid JSON"):
        data.verify_data_file(data.DIGITS_FILE, tmp_path)
