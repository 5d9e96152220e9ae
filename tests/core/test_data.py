import json
import shutil

import pytest
import torch

from labkit.core import data


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


def test_a_folder_where_the_data_file_belongs_is_one_line(offline, tmp_path):
    """The probe: digits.csv.gz a folder gave a 32-38-line IsADirectoryError traceback."""
    shutil.copy(data.DATA_DIR / "manifest.json", tmp_path / "manifest.json")
    (tmp_path / "digits.csv.gz").mkdir()
    with pytest.raises(data.DataUnavailableError) as err:
        data.load_data("digits", root=tmp_path)
    assert str(err.value) == (f"{tmp_path / 'digits.csv.gz'} is a folder where the data file belongs; remove it "
                              f"and copy the kit's good one over it: `cp {data.REPO_DATA_DIR / 'digits.csv.gz'} "
                              f"{tmp_path / 'digits.csv.gz'}`")


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
    with pytest.raises(ValueError, match=r"^batch_size must be an integer >= 1, got "):
        data.validate_batch_size(bad)


def test_batch_larger_than_dataset_and_bad_workers(offline):
    d = data.load_data("digits", train_limit=50)
    with pytest.raises(ValueError, match=r"^batch_size must be an integer between 1 and 50, got 64; it cannot be "
                                         r"larger than the dataset \(50 samples\)$"):
        data.make_loader(d.train, 64)
    with pytest.raises(ValueError, match=r"num_workers must be an integer between 0 and \d+, got -1"):
        data.make_loader(d.train, 8, num_workers=-1)
    with pytest.raises(ValueError, match="need num_workers >= 1"):
        data.make_loader(d.train, 8, prefetch_factor=2)


def test_loader_batches_and_seeded_shuffle(offline):
    d = data.load_data("digits", train_limit=64)
    first = [next(iter(data.make_loader(d.train, 16, shuffle=True, seed=5)))[1] for _ in range(2)]
    assert torch.equal(first[0], first[1])
    batches = list(data.make_loader(d.train, 10, drop_last=True))
    assert len(batches) == 6 and batches[0][0].shape == (10, 3, 32, 32)


# ---------------------------------------------------------------------------- GPU-resident data
def test_device_loader_matches_the_dataloader(offline):
    d = data.load_data("digits", train_limit=100)
    ref = list(data.make_loader(d.train, 32))
    dev = data.make_device_loader(d.train, 32, device="cpu")
    got = list(dev)
    assert len(dev) == len(ref) == 4 and dev.batch_size == 32 and dev.dataset is d.train
    for (x, y), (rx, ry) in zip(got, ref):
        assert torch.allclose(x, rx, atol=1e-6) and torch.equal(y, ry)        # same normalisation, same order
    assert len(data.make_device_loader(d.train, 32, device="cpu", drop_last=True)) == 3


def test_device_loader_shuffle_is_seeded_and_changes_per_epoch(offline):
    d = data.load_data("digits", train_limit=64)
    a = data.make_device_loader(d.train, 16, device="cpu", shuffle=True, seed=3)
    b = data.make_device_loader(d.train, 16, device="cpu", shuffle=True, seed=3)
    first_a, first_b = next(iter(a))[1], next(iter(b))[1]
    assert torch.equal(first_a, first_b)
    assert not torch.equal(first_a, next(iter(a))[1])                          # next epoch, new order
    labels = torch.cat([y for _, y in a])
    assert torch.equal(labels.sort().values, d.train.labels.sort().values)    # every sample once per epoch


def test_load_data_on_a_device_and_training_from_it(offline):
    from labkit.core.device import get_device
    from labkit.training.config import TrainConfig
    from labkit.training.loop import train
    from labkit.core.models import MLP

    device = get_device()
    d = data.load_data("digits", train_limit=64, image_size=8, device=device)
    assert d.train.images.device.type == device.type and d.train.images.dtype == torch.uint8
    loader = data.make_device_loader(d.train, 16, device=device, shuffle=True)
    x, _ = next(iter(loader))
    assert x.device.type == device.type and x.dtype == torch.float32
    res = train(MLP(10, in_features=3 * 8 * 8, hidden=16), loader,
                TrainConfig(steps=4, progress=False, evaluate=False, profile_model=False))
    assert len(res.steps) == 4


def test_device_loader_works_on_tensor_datasets_and_rejects_others():
    ds = torch.utils.data.TensorDataset(torch.randn(10, 3), torch.arange(10))
    x, y = next(iter(data.make_device_loader(ds, 4, device="cpu")))
    assert torch.equal(y, torch.arange(4)) and x.shape == (4, 3)
    sub = torch.utils.data.Subset(ds, [5, 6, 7])
    assert torch.equal(next(iter(data.make_device_loader(sub, 3, device="cpu")))[1], torch.tensor([5, 6, 7]))
    with pytest.raises(ValueError, match="needs a labkit image dataset or a TensorDataset"):
        data.make_device_loader(list(range(10)), 2, device="cpu")
    with pytest.raises(ValueError, match="larger than the dataset"):
        data.make_device_loader(ds, 11, device="cpu")


# ---------------------------------------------------------------------------- bad input (issue 15)
def test_missing_data_dir_is_one_clear_error(offline, monkeypatch, tmp_path):
    missing = tmp_path / "nope"
    monkeypatch.setenv(data.DATA_DIR_ENV_VAR, str(missing))
    with pytest.raises(data.DataUnavailableError) as err:
        data.load_data("digits", root=missing)
    assert str(err.value) == (f"data folder {missing} (from LABKIT_DATA_DIR={missing}) does not exist; point "
                              f"LABKIT_DATA_DIR at a copy of the kit's data folder ({data.REPO_DATA_DIR}), "
                              "or unset it to use that folder")
    assert err.value.__context__ is None or err.value.__suppress_context__ is False


def test_a_folder_where_the_manifest_belongs_is_named_as_such(offline, monkeypatch, tmp_path):
    (tmp_path / "manifest.json").mkdir()
    monkeypatch.setenv(data.DATA_DIR_ENV_VAR, str(tmp_path))
    with pytest.raises(data.DataUnavailableError, match=f"^data folder {tmp_path} \\(from LABKIT_DATA_DIR=.*\\) has a "
                       "folder named manifest.json where the file belongs; point LABKIT_DATA_DIR at a copy"):
        data.load_data("digits", root=tmp_path)


def test_missing_data_dir_from_the_environment_in_a_fresh_process(tmp_path):
    """What a user sees: one line, not a 31-line traceback."""
    import subprocess
    import sys

    code = ("from labkit.core.data import DataUnavailableError, load_data\ntry:\n    load_data('digits')\n"
            "except DataUnavailableError as e:\n    print('ERR', e)")
    env = {"LABKIT_DATA_DIR": str(tmp_path / "missing"), "LABKIT_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.startswith(f"ERR data folder {tmp_path / 'missing'} (from LABKIT_DATA_DIR=")
    assert "does not exist" in out.stdout


def test_checksum_fix_names_the_right_path(tmp_path):
    shutil.copy(data.DATA_DIR / "manifest.json", tmp_path / "manifest.json")
    (tmp_path / "digits.csv.gz").write_bytes(b"tampered")
    with pytest.raises(data.DataUnavailableError) as err:
        data.verify_data_file("digits.csv.gz", tmp_path)
    assert str(err.value).endswith(f"copy the kit's good one over it: `cp {data.REPO_DATA_DIR / 'digits.csv.gz'} "
                                   f"{tmp_path / 'digits.csv.gz'}`")
    (tmp_path / "digits.csv.gz").unlink()
    with pytest.raises(data.DataUnavailableError, match="is missing; copy the kit's good one over it"):
        data.verify_data_file("digits.csv.gz", tmp_path)


def test_repo_data_restore_hint_is_git_in_the_repo():
    assert data._restore_hint("digits.csv.gz", data.REPO_DATA_DIR) == (
        f"restore it with `git -C {data.REPO_DATA_DIR.parent} checkout -- data/digits.csv.gz`")


def test_load_data_with_a_non_string_name():
    with pytest.raises(ValueError, match=r"dataset name must be a string, one of \('auto', 'cifar10', 'digits', "
                                         r"'synthetic'\), got 42 \(int\)"):
        data.load_data(42)


def test_absurd_num_workers_is_rejected_with_a_hint(offline, monkeypatch):
    monkeypatch.setattr(data.os, "cpu_count", lambda: 2)
    d = data.load_data("digits", train_limit=50)
    with pytest.raises(ValueError) as err:
        data.make_loader(d.train, 8, num_workers=100000)
    assert str(err.value) == ("num_workers must be an integer between 0 and 8, got 100000; 0 loads in the main "
                              "process; this machine has 2 CPUs, and more workers than 4x that only add start-up "
                              "time and memory")
    assert data.validate_num_workers(8) == 8


def test_make_loader_pins_memory_only_where_there_is_a_cuda_copy(monkeypatch):
    """pin_memory=True is kept with CUDA and dropped without it (notebook 04 prints the value; this checks it)."""
    dataset = data.synthetic_data(n_train=8, n_val=4, image_shape=(1, 4, 4)).train
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert data.make_loader(dataset, 4, pin_memory=True).pin_memory is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert data.make_loader(dataset, 4, pin_memory=True).pin_memory is True
    assert data.make_loader(dataset, 4, pin_memory=False).pin_memory is False
