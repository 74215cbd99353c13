"""An example fill workload package (docs/fill.md, "User code"): installed into a fill image built FROM ours, it
registers ``word-stats`` in the entry point group ``pipefill.workloads`` (pyproject.toml)."""
