"""Your own model: ``spec.model.python.function``, a ``package.module:function`` that returns a model provider.

The module comes from the trainer image (an image built ``FROM`` ours with your package installed), or from the
directory ``PIPEFILL_MODEL_CODE_DIR`` names: a ConfigMap mounted read-only into the trainer, or a directory on the
job's fill storage (``spec.model.python.code``), imported as a private package (:mod:`pipefill.usercode`, as a
FillJob's code). The function is called with the keyword arguments ``seq_len`` and ``seed``; what it returns must have
every member of :class:`~pipefill_trainer.provider.ModelProvider`. Each failure — a module that does not import, a
function that raises, a result that is no provider — is one :class:`~pipefill_trainer.provider.ProviderError` naming
the provider, the field and the fix; the trainer exits 2 (permanent: the operator fails the job, no restarts).
"""

from __future__ import annotations

from pathlib import Path

from pipefill.usercode import directory_files, import_attr, import_installed, private_package
from pipefill_trainer.provider import ModelProvider, ProviderError

__all__ = ["load_provider"]

_FIELD = "spec.model.python.function"
_METHODS = ("build_stage", "activations", "loss", "tied_parameters", "analytic_costs", "flops_per_token")
_INTS = ("layers", "seq_len", "vocab_size")


def load_provider(function: str, *, code_dir: Path | None, seq_len: int, seed: int) -> ModelProvider:
    """The provider ``function`` returns, its members checked."""
    module_name, _, attr = function.partition(":")
    try:
        fn = _from_dir(code_dir, module_name, attr) if code_dir is not None else _from_image(module_name, attr)
    except ValueError as exc:
        raise ProviderError(str(exc)) from None
    if not callable(fn):
        raise ProviderError(f"{_FIELD}: {function!r} is a {type(fn).__name__}, not a function; name the function")
    try:
        provider = fn(seq_len=seq_len, seed=seed)
    except Exception as exc:
        raise ProviderError(
            f"{_FIELD}: model provider {function!r} raised ({type(exc).__name__}: {exc}); fix the function"
        ) from None
    return check_provider(provider, what=function)


def check_provider(obj: object, *, what: str) -> ModelProvider:
    """``obj`` if it has every member of a model provider, else a :class:`ProviderError` listing what it lacks."""
    missing = [m for m in _METHODS if not callable(getattr(obj, m, None))]
    missing += [m for m in _INTS if not isinstance(getattr(obj, m, None), int) or getattr(obj, m) < 1]
    if not isinstance(getattr(obj, "name", None), str):
        missing.append("name")
    if missing:
        raise ProviderError(
            f"{_FIELD}: model provider {what!r} returned a {type(obj).__name__}, which lacks {', '.join(missing)} "
            "(methods, positive integers, a str name); return an object with every member of "
            "pipefill_trainer.provider.ModelProvider"
        )
    return obj  # type: ignore[return-value]  # checked member by member above


def _from_image(module_name: str, attr: str) -> object:
    return import_installed(
        module_name, attr, field=_FIELD, noun="function", image="trainer image (an image built FROM ours)"
    )


def _from_dir(code_dir: Path, module_name: str, attr: str) -> object:
    field = "spec.model.python.code"
    files = directory_files(
        code_dir, field=field, base=code_dir, base_name="model code directory", fix="mount the code there"
    )
    package = private_package(files, doc="model provider code (pipefill_trainer.userprovider)")
    where = f"{field} ({code_dir})"
    return import_attr(package, files, module_name=module_name, attr=attr, field=_FIELD, where=where, noun="function")
