"""`io.manifest`: one manifest for model directories and exports (size and SHA-256 of every
file), checked against hashlib's digests and with each way a file can go wrong."""

import hashlib
import json

import pytest

from d2l_transformer.io.manifest import ManifestError, build_manifest, check_manifest


@pytest.mark.parametrize("extra", [None, {"format": "some export 1", "note": "é"}])
def test_build_then_check_both_layouts(tmp_path, extra):
    (tmp_path / "a.bin").write_bytes(b"\x00\x01" * 1000)
    (tmp_path / "b.json").write_text('{"x": 1}')
    manifest = build_manifest(str(tmp_path), extra)
    assert json.loads((tmp_path / "manifest.json").read_text()) == manifest
    entries = manifest if extra is None else manifest["files"]
    if extra is not None:
        assert {k: manifest[k] for k in extra} == extra
    assert entries == {n: {"bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                       for n, d in (("a.bin", b"\x00\x01" * 1000), ("b.json", b'{"x": 1}'))}
    assert check_manifest(str(tmp_path)) == manifest
    (tmp_path / "a.bin").write_bytes(b"\x00\x01" * 999 + b"\x00\x02")  # same size, other bytes
    with pytest.raises(ManifestError, match=r"^a.bin is damaged or truncated \(2000 bytes, "
                                            r"saved 2000\)$"):
        check_manifest(str(tmp_path))
    (tmp_path / "a.bin").unlink()
    with pytest.raises(ManifestError, match="^a.bin is missing$"):
        check_manifest(str(tmp_path))
    (tmp_path / "manifest.json").unlink()
    with pytest.raises(ManifestError, match="^has no manifest.json$"):
        check_manifest(str(tmp_path))
    (tmp_path / "manifest.json").write_text("[1, 2")
    with pytest.raises(ManifestError, match="^cannot read manifest.json"):
        check_manifest(str(tmp_path))
