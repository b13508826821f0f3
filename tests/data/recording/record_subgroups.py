"""Makes the recording in this folder: 4 gloo ranks, two subgroups, one profiled step, one stall.

Run from the repository root (see README.md in this folder)::

    comm2perfetto record -o tests/data/recording/subgroups --overwrite --stall-after 2 --profile-steps 2-2 -- \
        python -m torch.distributed.run --standalone --nproc_per_node 4 tests/data/recording/record_subgroups.py

Ranks 0, 1 form group ``pair_a``, ranks 2, 3 group ``pair_b``. After a barrier (start-up skew), each of 3
steps all-reduces on the default group and on the rank's pair, then steps an optimizer. Then rank 1 sleeps 4 s
before the last all-reduce on ``pair_a`` while rank 0 waits in it: a stall (stack files from ranks 0 and 1;
ranks 2 and 3 have finished) that resolves, on ``pair_a`` only.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pair_a = dist.new_group([0, 1], group_desc="pair_a")
    pair_b = dist.new_group([2, 3], group_desc="pair_b")
    mine = pair_a if rank < 2 else pair_b
    weight = torch.nn.Parameter(torch.ones(8))
    opt = torch.optim.SGD([weight], lr=0.1)
    dist.barrier()  # start-up skew (imports, group creation) stays out of the measured steps
    for _step in range(3):
        loss = (weight * 2).sum()
        loss.backward()
        dist.all_reduce(weight.grad)
        dist.all_reduce(weight.grad, group=mine)
        opt.step()
        opt.zero_grad()
    if rank == 1:
        time.sleep(4)  # rank 0 waits for this one on pair_a: the stall
    if rank < 2:
        dist.all_reduce(torch.ones(4), group=pair_a)
    else:
        dist.all_reduce(torch.ones(4), group=pair_b)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
