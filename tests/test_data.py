import json
import shutil

import pytest
import torch

from labkit import data


@pytest.fixture()
def offline(monkeypatch):
    monkeypatch.setenv(data.OFFLINE_ENV_VAR, "1")
    monkeypatch.delenv(data.DATASET_ENV_VAR, raising=False)


def test_offline_fallback_is_real_digits(offline, tmp_path):
    for f in ("manifest.json", "digits.csv.gz"):
        shutil.copy(data.DATA_DIR / f, tmp_path / f)
    name, reason = data.resolve_dataset(root=tmp_path)
    assert name == "digits" and "no internet" in reason
    d = data.load_data(root=tmp_path)
    assert d.name == "digits" and not d.synthetic and "UCI handwritten digits" in d.description
    assert len(d.train) + len(d.val) == 1797 and d.image_shape == (3, 32, 32)
    x, y = d.train[0]
    assert x.shape == (3, 32, 32) and 0 <= int(y) < 10
    labels = torch.stack([d.train[i][1] for i in range(len(d.train))])
    assert len(labels.unique()) == 10


def test_split_and_normalisation_are_deterministic(offline):
    a, b = data.load_data("digits", seed=0), data.load_data("digits", seed=0)
    assert torch.equal(a.val.labels, b.val.labels)
    xs = torch.stack([a.train[i][0] for i in range(len(a.train))])
    assert xs.mean().abs() < 0.05 and (xs.std() - 1).abs() < 0.05
    c = data.load_data("digits", seed=1)
    assert not torch.equal(a.val.labels, c.val.labels)


def test_limits_and_image_size(offline):
    d = data.load_data("digits", train_limit=100, val_limit=20, image_size=48)
    assert len(d.train) == 100 and len(d.val) == 20 and d.train[0][0].shape == (3, 48, 48)


def test_cifar_explicit_offline_says_what_to_do(offline, tmp_path):
    with pytest.raises(data.DataUnavailableError, match="could not be downloaded.*dataset='digits'"):
        data.load_data("cifar10", root=tmp_path)


def test_unknown_dataset_name():
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'; choose one of"):
        data.load_data("imagenet")


def test_checksum_is_verified(tmp_path):
    shutil.copy(data.DATA_DIR / "manifest.json", tmp_path / "manifest.json")
    (tmp_path / "digits.csv.gz").write_bytes(b"tampered")
    with pytest.raises(data.DataUnavailableError, match="fails its checksum"):
        data.verify_data_file("digits.csv.gz", tmp_path)
    with pytest.raises(data.DataUnavailableError, match="not listed"):
        data.verify_data_file("nope.csv", tmp_path)


def test_every_file_in_data_is_listed_with_provenance():
    manifest = json.loads((data.DATA_DIR / "manifest.json").read_text())
    for path in data.DATA_DIR.iterdir():
        if path.name in ("manifest.json", "README.md") or path.name.startswith("cifar-10"):
            continue
        assert path.name in manifest, f"{path.name} is not listed in data/manifest.json"
    for name, entry in manifest.items():
        assert {"sha256", "source", "licence", "description"} <= set(entry), name
        data.verify_data_file(name)


def test_synthetic_is_labelled():
    d = data.synthetic_data(16, 8)
    assert d.synthetic and "SYNTHETIC" in str(d)


@pytest.mark.parametrize("bad", [0, -1, 2.5, "32", True, None])
def test_bad_batch_size_is_clear(bad):
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        data.validate_batch_size(bad)


def test_batch_larger_than_dataset_and_bad_workers(offline):
    d = data.load_data("digits", train_limit=50)
    with pytest.raises(ValueError, match="larger than the dataset"):
        data.make_loader(d.train, 64)
    with pytest.raises(ValueError, match="num_workers must be an integer >= 0"):
        data.make_loader(d.train, 8, num_workers=-1)
    with pytest.raises(ValueError, match="need num_workers >= 1"):
        data.make_loader(d.train, 8, prefetch_factor=2)


def test_loader_batches_and_seeded_shuffle(offline):
    d = data.load_data("digits", train_limit=64)
    first = [next(iter(data.make_loader(d.train, 16, shuffle=True, seed=5)))[1] for _ in range(2)]
    assert torch.equal(first[0], first[1])
    batches = list(data.make_loader(d.train, 10, drop_last=True))
    assert len(batches) == 6 and batches[0][0].shape == (10, 3, 32, 32)
