"""``python -m pipefill_trainer``: the trainer container's entry point (the same in a pod and locally).

Reads the environment of :mod:`pipefill.env` plus torch.distributed's RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
Options override for benchmarks and tests; ``--replay-stage S`` runs pipeline rank S of the job alone, its peers
replaced by the modeled timeline (see ``docs/trainer.md``).
"""

from __future__ import annotations

import argparse
import os
import sys

from pipefill import env
from pipefill.parent import stop_with_parent

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipefill_trainer", description=__doc__.splitlines()[0])
    p.add_argument("--spec", help=f"PipelineTrainingJob manifest (default: ${env.SPEC_FILE})")
    p.add_argument("--steps", type=int, help="optimizer steps to run (default: spec.steps)")
    p.add_argument("--replay-stage", type=int, metavar="S", help="replay pipeline rank S alone, peers modeled")
    p.add_argument("--profile-steps", type=int, default=3, help="steps before announcing bubbles (first is warm-up)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    stop_with_parent()  # started by pipefill local: ends with it (a no-op in a container)
    # imported late: --help answers without loading torch
    import torch.distributed as dist

    from pipefill_trainer.config import ConfigError, TrainerConfig
    from pipefill_trainer.failure import peer_failure_message
    from pipefill_trainer.provider import ProviderError

    try:
        cfg = TrainerConfig.from_env(
            spec_path=args.spec,
            steps=args.steps,
            replay_stage=args.replay_stage,
            profile_steps=max(2, args.profile_steps),
        )
    except ConfigError as exc:
        print(f"invalid configuration: {exc}", file=sys.stderr, flush=True)
        return env.EXIT_INVALID_CONFIG
    from pipefill_trainer.runtime import build_rank
    from pipefill_trainer.train import Trainer

    trainer = None
    try:
        trainer = Trainer(build_rank(cfg))
        if cfg.replay_stage is not None:
            print(
                f"[replay] REPLAY MODE: pipeline rank {cfg.replay_stage} of {cfg.pp} runs its real compute; its peers "
                "are replaced by the modeled timeline — results are a replay, not a multi-device run",
                flush=True,
            )
        trainer.resume()
        code = trainer.train()
        _leave_group()
        return code
    except (ConfigError, ProviderError) as exc:  # a model provider's: permanent, as a bad spec
        print(f"invalid configuration: {exc}", file=sys.stderr, flush=True)
        return env.EXIT_INVALID_CONFIG
    except (RuntimeError, dist.DistError, ConnectionError, TimeoutError) as exc:
        where = "starting up (rendezvous)"
        peers: list[int] = []
        if trainer is not None:
            where = trainer.waiting_what or ""
            peers = trainer.parts.peers.dead_peers()
            if not where and not peers and not isinstance(exc, dist.DistError | ConnectionError | TimeoutError):
                # not in a wait, no peer gone, not a distributed error: a bug, reported as such (exit 1); a
                # RuntimeError while a peer died (gloo's "Connection reset" in a collective such as the profile's
                # all_gather) is the peer's failure
                raise
        message = peer_failure_message(rank=cfg.rank, peers=peers, where=where or "communicating", error=exc)
        print(message, file=sys.stderr, flush=True)
        return env.EXIT_RETRYABLE
    finally:
        if trainer is not None:
            trainer.parts.close()


def _leave_group() -> None:
    """A run that finished leaves its process group before the interpreter exits. Left to the interpreter's
    teardown, a gloo group's threads can outlive their owner and abort the process ("terminate called without an
    active exception", exit -6, seen once in the co-location benchmark after the last step). Not on the error
    paths: a group whose peer is gone is left as it is."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    # Returned, finished or with a failure's exit code: checkpoints are written, the event log and channel closed
    # (main's finally), a finished run's group left. Exit without the interpreter's teardown, where a torch.distributed
    # object still referenced (a store, a group's threads) can abort the process in C++ ("terminate called without an
    # active exception", exit -6: seen twice after a finished run, once with nothing left to train) and turn the exit
    # code into a failure. An exception raised out of main still ends the usual way.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
