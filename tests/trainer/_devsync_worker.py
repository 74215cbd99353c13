"""One rank of the device-sync test: rank 1 waits through ``CudaSync.wait`` on a gloo all-reduce rank 0 joins late.

Run as ``python _devsync_worker.py DELAY_S`` with RANK, WORLD_SIZE (2), MASTER_ADDR, MASTER_PORT set; rank 1 prints
one JSON line: whether the all-reduce was done when it started waiting, the result, and the wall and CPU seconds
of its waiting thread.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
import torch.distributed as dist

from pipefill_trainer.devsync import CudaSync, WorkPending


def main() -> None:
    rank, delay_s = int(os.environ["RANK"]), float(sys.argv[1])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x = torch.full((3,), float(rank + 1))  # all-reduced: 1 + 2 on both ranks
    dist.barrier()
    if rank == 0:
        time.sleep(delay_s)
        dist.all_reduce(x)
    else:
        pending = WorkPending(dist.all_reduce(x, async_op=True))
        done_at_once = pending.done()
        wall0_s, cpu0_s = time.monotonic(), time.thread_time()
        CudaSync(torch.device("cuda")).wait(pending)  # polls is_completed(); touches no CUDA
        wall_s, cpu_s = time.monotonic() - wall0_s, time.thread_time() - cpu0_s
        print(json.dumps({"done_at_once": done_at_once, "x": x.tolist(), "wall_s": wall_s, "cpu_s": cpu_s}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
