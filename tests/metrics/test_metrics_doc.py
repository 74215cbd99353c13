"""docs/metrics.md against the registries: every metric with its type and label names, and every value of a
fixed-set label, both ways. A stale page fails with the line to write.

The page has one section (``## ``) per component; each has a table ``| `name` | type | labels | meaning |`` and a
paragraph starting ``Label values:`` that lists ``\\`label\\`: \\`value\\`, …`` (or ``\\`label\\` of \\`metric\\`: …``
where two metrics of a section share a label name with different values), separated by ``;``, ending at the first
full stop outside parentheses. The registry's side of a label's values is what the code pre-initialises from its
fixed sets (a fresh registry); the labels in :data:`RUNTIME_LABELS` take names given at run time instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from registries import COMPONENTS, EXAMPLE, every_label, fresh

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "metrics.md"
SECTIONS = {"Trainer": "trainer", "Fill executor": "fill", "Operator": "operator", "Local endpoint": "local"}
RUNTIME_LABELS = {"fill_job", "batch_size", "rank", "container", "method"}
"""Labels whose values are names given at run time (FillJobs, batch sizes, ranks, containers, HTTP methods)."""
GPU_ONLY = "**only on GPU**"
"""A row whose meaning says this is registered only where NVML answers, so a CPU registry lacks it."""

_ROW = re.compile(r"^\| `(?P<name>[a-z_:]+)` \| (?P<type>\w+) \|(?P<labels>[^|]*)\| (?P<meaning>.*) \|$")
_PAREN = re.compile(r"\([^()]*\)")
_LABEL_VALUES = re.compile(r"^`(?P<label>\w+)`(?: of `(?P<metric>\w+)`)?:\s*(?P<values>.*)$")


@dataclass
class Section:
    rows: dict[str, tuple[str, set[str], str]] = field(default_factory=dict)
    """metric name → (type, label names, meaning)"""
    values: dict[tuple[str, str | None], set[str]] = field(default_factory=dict)
    """(label, metric or None) → the values listed"""


def _label_values(paragraph: str) -> dict[tuple[str, str | None], set[str]]:
    text = paragraph.removeprefix("Label values:").strip()
    while _PAREN.search(text):
        text = _PAREN.sub("", text)
    text = re.split(r"\.(?:\s|$)", text, maxsplit=1)[0]
    out = {}
    for chunk in text.split(";"):
        m = _LABEL_VALUES.match(chunk.strip())
        assert m, f"{DOC.name}: cannot read {chunk.strip()!r} in 'Label values:' (write `label`: `v1`, `v2`)"
        out[(m["label"], m["metric"])] = set(re.findall(r"`([^`]+)`", m["values"]))
    return out


def parse(text: str) -> dict[str, Section]:
    sections: dict[str, Section] = {}
    current: Section | None = None
    for paragraph in re.split(r"\n\s*\n", text):
        for line in paragraph.splitlines():
            if line.startswith("## "):
                title = re.sub(r"\s*\(.*\)$", "", line[3:]).strip()
                current = sections[SECTIONS[title]] = Section() if title in SECTIONS else None
            elif current is not None and (row := _ROW.match(line)):
                labels = set(re.findall(r"`(\w+)`", row["labels"]))
                current.rows[row["name"]] = (row["type"], labels, row["meaning"])
        if current is not None and paragraph.startswith("Label values:"):
            current.values.update(_label_values(" ".join(paragraph.split())))
    return sections


def exported(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    """Metric name as documented (a counter's with ``_total``) → (type, label names)."""
    out = {}
    for family in every_label(registry).collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = {k for s in family.samples for k in s.labels} - {"le", "quantile"}
        out[name] = (family.type, labels)
    return out


def preinitialised(registry: CollectorRegistry) -> dict[str, dict[str, set[str]]]:
    """Label → metric → the values a fresh registry carries (what the code sets up from its fixed sets)."""
    out: dict[str, dict[str, set[str]]] = {}
    for family in registry.collect():
        name = family.name + "_total" if family.type == "counter" else family.name
        for s in family.samples:
            for k, v in s.labels.items():
                if k not in ("le", "quantile") and v != EXAMPLE:
                    out.setdefault(k, {}).setdefault(name, set()).add(v)
    return out


def _row(name: str, kind: str, labels: set[str]) -> str:
    return f"| `{name}` | {kind} | {', '.join(f'`{x}`' for x in sorted(labels))} | <meaning> |"


def metric_problems(component: str, section: Section, registry: CollectorRegistry) -> list[str]:
    found = []
    have = exported(registry)
    for name, (kind, labels) in sorted(have.items()):
        if name not in section.rows:
            found.append(f"{component}: {name} is exported but not documented: add {_row(name, kind, labels)}")
        elif section.rows[name][:2] != (kind, labels):
            found.append(
                f"{component}: {name} is documented as {section.rows[name][:2]}: write {_row(name, kind, labels)}"
            )
    for name, (_, _, meaning) in sorted(section.rows.items()):
        if name not in have and GPU_ONLY not in meaning:
            found.append(f"{component}: {name} is documented but not exported: remove its row (or mark it {GPU_ONLY})")
    return found


def value_problems(component: str, section: Section, registry: CollectorRegistry) -> list[str]:
    found = []
    fixed = preinitialised(registry)
    labels = {label for _, labels in exported(registry).values() for label in labels} - RUNTIME_LABELS
    for label in sorted(labels):
        by_metric = fixed.get(label, {})
        if not by_metric:
            found.append(
                f"{component}: label {label!r} has no pre-initialised values: set them up from a fixed set in the "
                f"code, or add it to RUNTIME_LABELS if its values are names given at run time"
            )
            continue
        qualified = {metric for (lbl, metric) in section.values if lbl == label and metric is not None}
        rest = set().union(*(v for m, v in by_metric.items() if m not in qualified))
        wanted = {**{(label, m): by_metric.get(m, set()) for m in qualified}, **({(label, None): rest} if rest else {})}
        for key, values in sorted(wanted.items(), key=str):
            listed = section.values.get(key)
            where = f"`{label}`" + (f" of `{key[1]}`" if key[1] else "")
            if listed != values:
                fix = f"{where}: " + ", ".join(f"`{v}`" for v in sorted(values))
                found.append(
                    f"{component}: {where} lists {sorted(listed or [])}, the registry {sorted(values)}: write {fix}"
                )
    for lbl, _ in section.values:
        if lbl not in labels:
            found.append(
                f"{component}: 'Label values' lists `{lbl}`, which no metric of this section carries with fixed values: remove it"
            )
    return found


@pytest.mark.parametrize("component", COMPONENTS)
def test_docs_list_every_metric_its_type_and_labels(component: str) -> None:
    section = parse(DOC.read_text())[component]
    problems = metric_problems(component, section, fresh()[component])
    assert not problems, "docs/metrics.md is stale:\n" + "\n".join(problems)


@pytest.mark.parametrize("component", COMPONENTS)
def test_docs_list_every_value_of_every_fixed_label(component: str) -> None:
    section = parse(DOC.read_text())[component]
    problems = value_problems(component, section, fresh()[component])
    assert not problems, "docs/metrics.md is stale:\n" + "\n".join(problems)


def test_the_check_names_the_fix_for_a_stale_page() -> None:
    """Take a correct page apart: a missing row, a wrong type, a stale row and a missing label value all fail, each
    with the line to write."""
    text = DOC.read_text()
    text = text.replace(
        "| `pipefill_fill_busy_seconds_total` | counter |", "| `pipefill_fill_busy_seconds_total` | gauge |"
    )
    text = "\n".join(line for line in text.splitlines() if not line.startswith("| `pipefill_fill_items_total`"))
    text = text.replace(
        "| `pipefill_fill_commits_total`",
        "| `pipefill_fill_gone_total` | counter | | x |\n| `pipefill_fill_commits_total`",
    )
    text = text.replace("`done` (the slice was done already), ", "")
    section, registry = parse(text)["fill"], fresh()["fill"]
    problems = metric_problems("fill", section, registry) + value_problems("fill", section, registry)
    assert any(
        "pipefill_fill_items_total is exported but not documented: add | `pipefill_fill_items_total` | counter | `fill_job` |"
        in p
        for p in problems
    )
    assert any("pipefill_fill_busy_seconds_total is documented as ('gauge', set()): write" in p for p in problems)
    assert any("pipefill_fill_gone_total is documented but not exported: remove its row" in p for p in problems)
    assert any("`reason` lists" in p and "`done`" in p.split("write")[1] for p in problems)
    assert len(problems) == 4, problems
