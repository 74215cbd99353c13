"""User code from a directory, imported as a private package: what the fill executor (a FillJob's workload) and the
trainer (a model provider) share (docs/fill.md, "User code"; docs/trainer.md, "User code").

The code's ``.py`` files (a directory on the job's storage, or a mounted ConfigMap's keys) are written once per content
under a temporary directory and imported as a package named after a digest of them (``_pipefill_code_<digest>``),
never from ``sys.path``: two jobs whose modules share a name (``embed.py``) but not their contents each get their own,
and user code cannot shadow a module of ours. Its modules therefore import each other relatively
(``from . import helpers``). Every failure is one :class:`ValueError` naming the field, the value and the fix.
Standard library only: both images and the torch-free core use it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import shutil
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MAX_CODE_BYTES",
    "PACKAGE_PREFIX",
    "CodePackage",
    "directory_files",
    "import_attr",
    "import_installed",
    "private_package",
]

PACKAGE_PREFIX = "_pipefill_code_"
MAX_CODE_BYTES = 16 * 2**20
"""what one job's code may weigh (a ConfigMap holds at most 1 MiB)"""


@dataclass(frozen=True)
class CodePackage:
    """A private package: its module name and the directory its files were written to."""

    name: str
    root: Path


def directory_files(root: Path, *, field: str, base: Path, base_name: str, fix: str) -> dict[Path, bytes]:
    """The ``.py`` files under ``root`` (relative path → contents), which must lie inside ``base`` (``base_name``:
    what ``base`` is, for messages; ``fix``: how to put the code there)."""
    resolved = root.resolve()
    if not resolved.is_relative_to(base.resolve()):
        raise ValueError(f"{field} leads out of the {base_name} ({base}); give a directory under it")
    if not resolved.is_dir():
        raise ValueError(f"{field}: {resolved} is not a directory on the {base_name} ({base}); {fix} or fix the path")
    files = {p.relative_to(resolved): p.read_bytes() for p in sorted(resolved.rglob("*.py")) if p.is_file()}
    if sum(len(b) for b in files.values()) > MAX_CODE_BYTES:
        raise ValueError(f"{field}: its .py files weigh more than {MAX_CODE_BYTES} bytes; ship big code in an image")
    return files


def private_package(files: dict[Path, bytes], *, doc: str) -> CodePackage:
    """The private package holding ``files``, written once per content under a temporary directory."""
    digest = hashlib.sha256()
    for path, data in sorted(files.items()):
        digest.update(str(path).encode() + b"\0" + hashlib.sha256(data).digest())
    name = PACKAGE_PREFIX + digest.hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / "pipefill-code" / name
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root.parent))
        for path, data in files.items():
            (staging / path).parent.mkdir(parents=True, exist_ok=True)
            (staging / path).write_bytes(data)
        try:
            staging.rename(root)
        except OSError:  # another process wrote the same content first
            shutil.rmtree(staging, ignore_errors=True)
    if name not in sys.modules:
        spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
        spec.submodule_search_locations = [str(root)]
        module = types.ModuleType(name, doc)
        module.__spec__, module.__path__, module.__package__ = spec, [str(root)], name
        sys.modules[name] = module
    return CodePackage(name, root)


def import_attr(
    package: CodePackage, files: dict[Path, bytes], *, module_name: str, attr: str, field: str, where: str, noun: str
) -> object:
    """``module_name.attr`` from ``package`` (its ``files``); ``where`` names the code's source and ``noun`` what
    ``attr`` is (class, function) in messages about ``field``."""
    path = module_name.replace(".", "/")
    if not (package.root / f"{path}.py").is_file() and not (package.root / path / "__init__.py").is_file():
        listing = ", ".join(sorted(str(p) for p in files)[:20]) or "no .py files"
        raise ValueError(
            f"{field}: module {module_name!r} is not in {where} (it holds {listing}); add {path}.py there or fix "
            f"{field.rsplit('.', 1)[-1]}"
        )
    qualified = f"{package.name}.{module_name}"
    try:
        module = importlib.import_module(qualified)
    except BaseException as exc:  # SystemExit too: user code must not end the process that loads it
        if isinstance(exc, KeyboardInterrupt):
            raise
        for key in [k for k in sys.modules if k == qualified or k.startswith(qualified + ".")]:
            del sys.modules[key]
        raise ValueError(
            f"{field}: module {module_name!r} from {where} raised while importing ({type(exc).__name__}: {exc}); "
            "fix the code (its modules import each other relatively: from . import helpers)"
        ) from None
    found = getattr(module, attr, None)
    if found is None:
        raise ValueError(f"{field}: module {module_name!r} from {where} has no {noun} {attr!r}")
    return found


def import_installed(module_name: str, attr: str, *, field: str, noun: str, image: str) -> object:
    """``module_name.attr`` from what is installed (``image``: where to install it, for the message)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{field}: cannot import module {module_name!r} ({exc}); install it in the {image}") from None
    except Exception as exc:
        raise ValueError(
            f"{field}: module {module_name!r} raised while importing ({type(exc).__name__}: {exc}); fix the code"
        ) from None
    found = getattr(module, attr, None)
    if found is None:
        raise ValueError(f"{field}: module {module_name!r} has no {noun} {attr!r}")
    return found
