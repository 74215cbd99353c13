"""``python -m pipefill_hook.install DIR``: copy the hook and what it imports into ``DIR`` (the operator's init
container, from our trainer image, into an emptyDir the user's trainer container mounts).

``DIR/lib`` gets the packages (the core ``pipefill``, ``pipefill_hook``, ``prometheus_client`` and the four trainer
modules the hook imports), ``DIR/boot`` the ``sitecustomize`` that activates it; the trainer container runs with
``PYTHONPATH=DIR/boot:DIR/lib`` (:data:`pipefill.pods` sets it). Found where this Python has them installed, so the
image layout does not matter. Standard library only; nothing is imported from the packages copied.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

__all__ = ["PACKAGES", "TRAINER_MODULES", "install"]

PACKAGES = ("pipefill", "pipefill_hook", "prometheus_client")
TRAINER_MODULES = ("__init__", "instrument", "metrics", "devsync", "baseline")
"""of ``pipefill_trainer``: the hook's import contract (pyproject.toml)"""

_SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(f"pipefill_hook.install: package {name!r} is not installed in {sys.executable}")
    return Path(next(iter(spec.submodule_search_locations)))


def install(target: Path) -> None:
    lib, boot = target / "lib", target / "boot"
    lib.mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        shutil.copytree(_package_dir(name), lib / name, ignore=_SKIP, dirs_exist_ok=True)
    trainer = lib / "pipefill_trainer"
    trainer.mkdir(exist_ok=True)
    for module in TRAINER_MODULES:
        shutil.copy2(_package_dir("pipefill_trainer") / f"{module}.py", trainer / f"{module}.py")
    boot.mkdir(exist_ok=True)
    shutil.copy2(_package_dir("pipefill_hook") / "boot" / "sitecustomize.py", boot / "sitecustomize.py")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pipefill_hook.install DIR", file=sys.stderr)
        return 2
    install(Path(args[0]))
    print(f"pipefill hook installed in {args[0]} (PYTHONPATH={args[0]}/boot:{args[0]}/lib)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
