"""`pipefill local`: the same manifests a cluster takes, run as local processes (see runner.py)."""
