"""PipeFill's Grafana dashboards as code: Fleet, Training job and Fill jobs.

Written with grafana-foundation-sdk's typed builders (the ``dashboards`` extra) and rendered to JSON into
``charts/pipefill/dashboards/`` by ``make dashboards`` (``python -m pipefill.dashboards --write DIR``); ``make lint``
fails when the files there differ from what this package renders (``--check``). Every query uses only metrics the
trainer, the fill executor and ``pipefill local`` export today (``docs/metrics.md``); tests/dashboards evaluates each
one against a real Prometheus scraping a real local run. ``docs/dashboards.md`` describes the panels.

The rest of the core never imports this package, so it stays importable without the Grafana SDK.
"""

from __future__ import annotations

from pipefill.dashboards.queries import NOT_LOCAL, UIDS

__all__ = ["NOT_LOCAL", "UIDS"]
