"""The OCI archive the real node imports its pause image from: a valid image layout, the same bytes every time."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

from pipefill.devcluster.oci import write_image_archive


def _members(archive: Path) -> dict[str, bytes]:
    with tarfile.open(archive) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def test_archive_is_a_valid_layout_named_for_containerd_and_reproducible(tmp_path: Path) -> None:
    program = tmp_path / "pause"
    program.write_bytes(b"\x7fELF not really")
    digest = write_image_archive(tmp_path / "a.tar", name="pipefill.local/pause:1", files={"/pause": program},
                                 entrypoint=["/pause"])  # fmt: skip
    again = write_image_archive(tmp_path / "b.tar", name="pipefill.local/pause:1", files={"/pause": program},
                                entrypoint=["/pause"])  # fmt: skip
    assert digest == again and (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()

    files = _members(tmp_path / "a.tar")
    assert json.loads(files["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    for name, content in files.items():  # every blob is stored under its own digest
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(content).hexdigest() == name.rsplit("/", 1)[1]
    [entry] = json.loads(files["index.json"])["manifests"]
    assert entry["digest"] == digest
    assert entry["annotations"]["io.containerd.image.name"] == "pipefill.local/pause:1"
    manifest = json.loads(files[f"blobs/sha256/{digest[7:]}"])
    config = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    assert config["config"]["Entrypoint"] == ["/pause"] and config["os"] == "linux"
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}"]
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]  # uncompressed: diff ID = digest
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        [member] = tar.getmembers()
        assert member.name == "pause" and member.mode == 0o755 and member.uid == 0
        assert tar.extractfile(member).read() == program.read_bytes()  # type: ignore[union-attr]
