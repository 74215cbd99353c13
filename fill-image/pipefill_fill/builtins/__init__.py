"""Builtin workloads: ``encoder-inference`` and ``train-classifier`` (see docs/fill.md)."""

__all__: list[str] = []
