"""The manifest of a directory the package writes: size and SHA-256 of every file, in
``manifest.json``, so that a reader tells a damaged or truncated file from a good one.

Two layouts, one function each way:

* a model directory (`checkpoint`): ``{file name: {"bytes": n, "sha256": hex}}``, the layout
  every model directory written so far has;
* an export (`inference.export`): ``{"format": ..., <what the export says about itself>,
  "files": {file name: {"bytes": n, "sha256": hex}}}``.

`build_manifest` writes either (atomically, `atomic.write_text`); `check_manifest` reads either.
"""

import hashlib
import json
import os

from . import atomic

MANIFEST = "manifest.json"


class ManifestError(ValueError):
    """A file does not match the manifest, or the manifest cannot be read; one line, naming
    the file (the caller adds which directory)."""


def file_entries(directory):
    """``{name: {"bytes": n, "sha256": hex}}`` for every file of `directory` but the manifest,
    sorted by name."""
    entries = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        if name != MANIFEST and os.path.isfile(path):
            entries[name] = {"bytes": os.path.getsize(path), "sha256": atomic.sha256(path)}
    return entries


def build_manifest(directory, extra=None):
    """Write `directory`'s ``manifest.json`` (after every other file is written) and return it:
    the model-directory layout when `extra` is None, else ``{**extra, "files": entries}``."""
    entries = file_entries(directory)
    manifest = entries if extra is None else {**extra, "files": entries}
    atomic.write_text(os.path.join(directory, MANIFEST),
                      json.dumps(manifest, indent=2, ensure_ascii=False))
    return manifest


def read_manifest(directory):
    """The manifest of `directory` as a dict (ManifestError when missing or unreadable)."""
    try:
        with open(os.path.join(directory, MANIFEST), encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise ManifestError(f"has no {MANIFEST}") from None
    except (OSError, ValueError) as e:
        raise ManifestError(f"cannot read {MANIFEST}: {e}") from None
    if not isinstance(manifest, dict):
        raise ManifestError(f"{MANIFEST} is not a JSON object")
    return manifest


def read_checked(directory, name, entry):
    """The bytes of the file `name` of `directory`, read once and checked against its manifest
    `entry` (size and SHA-256): what a caller parses afterwards is what was checked.
    ManifestError when it is missing, damaged or truncated."""
    try:
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ManifestError(f"{name} is missing") from None
    try:
        saved, digest = entry["bytes"], entry["sha256"]
    except (TypeError, KeyError):
        raise ManifestError(f"{MANIFEST} is malformed at {name}") from None
    if len(data) != saved or hashlib.sha256(data).hexdigest() != digest:
        raise ManifestError(f"{name} is damaged or truncated ({len(data)} bytes, saved {saved})")
    return data


def entries_of(manifest):
    """The ``{file name: {"bytes", "sha256"}}`` part of a manifest of either layout."""
    return manifest["files"] if "format" in manifest else manifest


def listed_files(directory):
    """The names of the files the manifest of `directory` lists, and the manifest's own: what
    this package wrote there (empty when it has no manifest of either layout)."""
    try:
        return {*entries_of(read_manifest(directory)), MANIFEST}
    except (ManifestError, KeyError, TypeError):
        return set()


def check_manifest(directory):
    """Check every file the manifest of `directory` lists (either layout); returns the
    manifest. ManifestError names the first missing, damaged or truncated file."""
    manifest = read_manifest(directory)
    for name, entry in entries_of(manifest).items():
        read_checked(directory, name, entry)
    return manifest
