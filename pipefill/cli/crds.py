"""Write the CRDs (crds/*.yaml), the Helm chart's CRD templates and the API reference (docs/api.md) from the spec
models, or check they are current.

The chart renders its CRDs as templates (not from a ``crds/`` folder, which Helm installs once and never upgrades) so
that ``helm upgrade`` upgrades them; each is the plain CRD of ``crds/`` wrapped in ``crds.install`` and given the
release's labels and, with ``crds.keep``, ``helm.sh/resource-policy: keep`` (docs/operations.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from pipefill.spec import KINDS, crd
from pipefill.spec.docs import api_reference

__all__ = ["add_arguments", "render", "render_chart", "run"]

_NOTICE = "Generated from pipefill/spec by `make crds`. Do not edit: change the models and regenerate."
_HEADER = f"# {_NOTICE}\n"


def _dump(obj: object) -> str:
    return yaml.safe_dump(obj, sort_keys=False, width=10_000, allow_unicode=True)


def render() -> dict[str, str]:
    """File name -> content of every generated CRD."""
    return {info.file_name: _HEADER + _dump(crd(kind)) for kind, info in KINDS.items()}


def render_chart() -> dict[str, str]:
    """File name -> the chart's template of every CRD: the same spec as :func:`render`, Helm metadata around it."""
    out = {}
    for kind, info in KINDS.items():
        obj = crd(kind)
        meta = obj.pop("metadata")
        spec = _dump({"spec": obj.pop("spec")})
        if "{{" in spec:  # Helm would parse it as an action
            raise ValueError(f"the {kind} CRD contains '{{{{', which Helm cannot render verbatim; change that text")
        labels = "".join(f"    {k}: {v}\n" for k, v in meta.get("labels", {}).items())
        head = f"{{{{- /* {_NOTICE} */}}}}\n{{{{- if .Values.crds.install }}}}\n" + _dump(obj)
        metadata = (
            f"metadata:\n  name: {meta['name']}\n  labels:\n{labels}"
            '    {{- include "pipefill.labels" . | nindent 4 }}\n'
            "  {{- if .Values.crds.keep }}\n"
            "  annotations:\n"
            "    helm.sh/resource-policy: keep\n"
            "  {{- end }}\n"
        )
        out[info.file_name] = head + metadata + spec + "{{- end }}\n"
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", metavar="DIR", type=Path, nargs="+", help="write the CRDs into each DIR")
    mode.add_argument(
        "--check", metavar="DIR", type=Path, nargs="+", help="fail if a DIR's CRDs differ from the models"
    )
    parser.add_argument(
        "--chart", metavar="DIR", type=Path, default=None, help="also write or check the chart's CRD templates in DIR"
    )
    parser.add_argument(
        "--docs", metavar="FILE", type=Path, default=None, help="also write or check this API reference"
    )


def run(args: argparse.Namespace) -> int:
    wanted = {folder / name: text for folder in (args.write or args.check) for name, text in render().items()}
    if args.chart is not None:
        wanted.update({args.chart / name: text for name, text in render_chart().items()})
    if args.docs is not None:
        wanted[args.docs] = api_reference()
    if args.write:
        for path, text in wanted.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
        return 0
    stale = [str(p) for p, text in wanted.items() if not p.exists() or p.read_text(encoding="utf-8") != text]
    for path in stale:
        print(f"{path} is out of date with pipefill/spec: run `make crds` and commit the result")
    # A template of a kind the spec no longer has would still be installed by the chart.
    extra = sorted(set(args.chart.glob("*.yaml")) - set(wanted)) if args.chart is not None else []
    for path in extra:
        print(f"{path} is not generated from pipefill/spec: remove it")
    return 1 if stale or extra else 0
