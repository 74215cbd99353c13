"""Benchmarks, behind ``pipefill bench NAME``: each module here has ``main(argv) -> int`` and prints one JSON object.

Orchestration lives here, in the torch-free core, so users run the same benchmarks on their own GPU nodes with the
``pipefill`` command. What must run inside an image is a worker started as a process: ``pipefill_trainer.bench_worker``
(one rank of ``pipefill bench trainer``) and ``pipefill_fill.bench_worker`` (the naive co-location runner of
``pipefill bench colocation``); the images' runtime never imports them. ``pipefill_operator.bench`` (``pipefill
bench operator``) runs as a child process too: the core never imports the operator. :mod:`pipefill.bench.synthetic_trainer` is a
channel producer standing in for a trainer (``pipefill bench fill`` and tests).
"""

BENCHMARKS: dict[str, str] = {
    "channel": "pipefill.bench.channel",
    "cluster": "pipefill.bench.cluster",
    "colocation": "pipefill.bench.colocation",
    "fill": "pipefill.bench.fill",
    "fill-queue": "pipefill.bench.fill_queue",
    "hook": "pipefill.bench.hook",
    "operator": "pipefill_operator.bench",
    "scheduler": "pipefill.queue.bench",
    "trainer": "pipefill.bench.trainer",
}
"""benchmark name → module with ``main(argv: list[str]) -> int``"""

__all__ = ["BENCHMARKS"]
