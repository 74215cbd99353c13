"""Builtin workloads: ``encoder-inference``, ``sentence-embedding`` and ``train-classifier`` (see docs/fill.md)."""

__all__: list[str] = []
