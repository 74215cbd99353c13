"""The pipeline's shape has one home, ``pipefill/spec/shape.py``: this walks the source (AST) of every package and fails
if another module divides the global batch or builds a schedule itself instead of asking the shape for it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ["pipefill", "trainer-image/pipefill_trainer", "fill-image/pipefill_fill", "operator/pipefill_operator"]
HOME = "pipefill/spec/shape.py"
BUILDER_PACKAGE = "pipefill/schedules/"  # defines the builder (and may use it on plain numbers)
GLOBAL_BATCH = {"global_batch", "globalBatch"}
DIVIDING = (ast.Div, ast.FloorDiv, ast.Mod)


def _mentions_global_batch(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in GLOBAL_BATCH:
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in GLOBAL_BATCH:
            return True
        if isinstance(sub, ast.Constant) and sub.value in GLOBAL_BATCH:
            return True
    return False


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def violations(source: str, filename: str) -> list[str]:
    """Where ``source`` divides the global batch or calls the schedule builder (``file:line: what``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.BinOp) and isinstance(node.op, DIVIDING):
            if _mentions_global_batch(node.left) or _mentions_global_batch(node.right):
                found.append(f"{where}: divides the global batch; take microbatch_size/replica_batch from the shape")
        elif isinstance(node, ast.AugAssign) and isinstance(node.op, DIVIDING):
            if _mentions_global_batch(node.target) or _mentions_global_batch(node.value):
                found.append(f"{where}: divides the global batch; take microbatch_size/replica_batch from the shape")
        elif isinstance(node, ast.Call) and _called_name(node) == "divmod":
            if any(_mentions_global_batch(arg) for arg in node.args):
                found.append(f"{where}: divides the global batch; take microbatch_size/replica_batch from the shape")
        elif (
            isinstance(node, ast.Call)
            and _called_name(node) == "build_schedule"
            and not filename.startswith(BUILDER_PACKAGE)
        ):
            found.append(f"{where}: builds a schedule; use pipefill.spec.shape.from_spec (or derive_shape)")
    return found


def test_only_the_shape_module_divides_the_global_batch_or_builds_the_schedule() -> None:
    files = [path for package in PACKAGES for path in (ROOT / package).rglob("*.py")]
    assert any(p.relative_to(ROOT).as_posix() == HOME for p in files)
    found = [
        v
        for path in files
        if (name := path.relative_to(ROOT).as_posix()) != HOME
        for v in violations(path.read_text(encoding="utf-8"), name)
    ]
    assert not found, "the pipeline's shape is derived outside pipefill/spec/shape.py:\n" + "\n".join(found)


def test_the_walk_finds_each_kind_of_violation() -> None:
    """The check above is not vacuous: each way of deriving the shape elsewhere is caught."""
    bad = """
mb = pipe.global_batch // (pipe.data_parallel * m)
per, rest = divmod(job["globalBatch"], dp)
x = global_batch % 4
y /= spec.pipeline.global_batch
s = build_schedule(str(pipe.schedule), ranks=pipe.stages, microbatches=pipe.microbatches)
t = generators.build_schedule("1f1b", ranks=2, microbatches=4)
ok = shape.global_batch * seq_len
"""
    found = violations(bad, "pipefill/elsewhere.py")
    assert sorted(int(v.split(":")[1]) for v in found) == [2, 3, 4, 5, 6, 7]
    assert violations(bad.splitlines()[-1], "pipefill/elsewhere.py") == []  # multiplying is fine
    assert violations("s = build_schedule('gpipe', ranks=2, microbatches=2)", "pipefill/schedules/x.py") == []
