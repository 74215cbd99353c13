"""A one-layer OCI image archive from files on disk, with the standard library alone.

The real node's sandbox (pause) image cannot be pulled here (no registry is reachable), so it is made from our own
static binary: one uncompressed layer, an image config, a manifest and an ``index.json`` in an OCI image layout, packed
as the tar archive that ``ctr images import`` takes. The archive is byte-for-byte the same for the same files (fixed
times and owners), so its digest names its content.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

__all__ = ["write_image_archive"]

_EPOCH = "1970-01-01T00:00:00Z"


def _tar(entries: dict[str, tuple[bytes, int]]) -> bytes:
    """A tar of ``path -> (content, mode)``, owned by root, dated 0, in sorted order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in sorted(entries):
            content, mode = entries[name]
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(content), mode, 0
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], content: bytes, media_type: str) -> dict[str, object]:
    digest = "sha256:" + hashlib.sha256(content).hexdigest()
    blobs[f"blobs/sha256/{digest[7:]}"] = content
    return {"mediaType": media_type, "digest": digest, "size": len(content)}


def write_image_archive(
    out: Path, *, name: str, files: dict[str, Path], entrypoint: list[str], arch: str = "amd64"
) -> str:
    """Write the image ``name`` (a full reference, ``pipefill.local/pause:1``) holding ``files`` (path in the image
    -> file here, kept executable) with ``entrypoint`` to the OCI archive ``out``; returns the manifest's digest."""
    layer = _tar({path.lstrip("/"): (src.read_bytes(), 0o755) for path, src in files.items()})
    config = {
        "created": _EPOCH,
        "architecture": arch,
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/"]},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
        "history": [{"created": _EPOCH, "created_by": "pipefill devcluster"}],
    }
    blobs: dict[str, bytes] = {}
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": _blob(blobs, json.dumps(config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json"),
        "layers": [_blob(blobs, layer, "application/vnd.oci.image.layer.v1.tar")],
    }
    descriptor = _blob(blobs, json.dumps(manifest, sort_keys=True).encode(), str(manifest["mediaType"]))
    # containerd names the imported image by the first annotation; other tools read the second.
    descriptor["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
    descriptor["platform"] = {"architecture": arch, "os": "linux"}
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [descriptor]}
    entries = {path: (content, 0o644) for path, content in blobs.items()}
    entries["oci-layout"] = (json.dumps({"imageLayoutVersion": "1.0.0"}).encode(), 0o644)
    entries["index.json"] = (json.dumps(index, sort_keys=True).encode(), 0o644)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(_tar(entries))
    return str(descriptor["digest"])
