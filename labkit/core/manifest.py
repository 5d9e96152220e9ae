"""The data manifest (``data/manifest.json``), read and validated field by field, naming the file (torch-free).

Every file under ``data/`` is listed with its SHA-256, source, licence and description (STYLE rule 12); a
manifest that is cut short, not an object, or missing a field is one line that names the file and the entry.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

MANIFEST_NAME = "manifest.json"
REQUIRED_FIELDS = ("sha256", "source", "licence", "description")
SHA256_RE = re.compile(r"[0-9a-f]{64}")


class ManifestError(ValueError):
    """The manifest is unreadable or an entry lacks a field; the message names the file and what to fix."""


def _check_entry(path: Path, name: object, entry: object) -> None:
    """One entry: a file name mapping to an object with every required field, and a 64-hex-digit sha256."""
    if not isinstance(entry, dict):
        raise ManifestError(f"{path}: entry {name!r} must be an object with {', '.join(REQUIRED_FIELDS)}; "
                            f"got {type(entry).__name__}")
    missing = [f for f in REQUIRED_FIELDS if not isinstance(entry.get(f), str) or not entry[f].strip()]
    if missing:
        raise ManifestError(f"{path}: entry {name!r} lacks {', '.join(missing)} (every data file needs "
                            f"{', '.join(REQUIRED_FIELDS)}); restore the manifest or add the field")
    if not SHA256_RE.fullmatch(entry["sha256"]):
        raise ManifestError(f"{path}: entry {name!r} has sha256 {entry['sha256'][:20]!r}, not 64 lowercase hex "
                            "digits; write `sha256sum FILE`'s first column there")


def read_manifest(data_dir: str | Path) -> dict[str, dict]:
    """The manifest in ``data_dir``, every entry checked; one ManifestError naming the file otherwise."""
    path = Path(data_dir) / MANIFEST_NAME
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ManifestError(f"{path} cannot be read ({err.strerror}); restore it from the repository") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ManifestError(f"{path} is not valid JSON ({err}); it may be cut short: restore it, e.g. "
                            f"`git checkout -- data/{MANIFEST_NAME}`") from None
    if not isinstance(doc, dict):
        raise ManifestError(f"{path} must hold one JSON object (file name -> entry), got {type(doc).__name__}")
    for name, entry in doc.items():
        _check_entry(path, name, entry)
    return doc
