"""The metric names and label names a PromQL expression mentions (enough of PromQL's grammar for our dashboards).

Prometheus parses the expression itself when the test evaluates it; this only has to find the names, so that a
query cannot pass on an ``or vector(0)`` or on a label no series carries.
"""

from __future__ import annotations

import re

__all__ = ["mentions", "substitute"]

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{([^}]*)\}")
_MATCHER_NAME = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_BRACKETS = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}


def mentions(expr: str) -> tuple[set[str], set[str]]:
    """(metric names, label names) in ``expr``; functions, keywords and numbers are neither."""
    text = _STRING.sub('""', expr)
    labels: set[str] = set()
    for body in _MATCHERS.findall(text):
        labels.update(_MATCHER_NAME.findall(body))
    text = _MATCHERS.sub(" ", text)
    text = _BRACKETS.sub(" ", text)
    for body in _GROUPING.findall(text):
        labels.update(name.strip() for name in body.split(",") if name.strip())
    text = _GROUPING.sub(" ", text)
    metrics = set()
    for match in _IDENT.finditer(text):
        rest = text[match.end() :].lstrip()
        name = match.group()
        if rest.startswith("(") or name.lower() in _KEYWORDS:
            continue  # a function call or an operator keyword
        metrics.add(name)
    return metrics, labels


def substitute(expr: str, values: dict[str, str]) -> str:
    """Grafana's variable substitution for ``$name`` and ``${name}`` (longest names first, so ``$namespace`` is not
    taken for a ``$name`` variable)."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return expr
