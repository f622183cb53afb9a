"""The fused MoE forward as a process world under torchrun, checked bitwise
against the virtual world.

    torchrun --nproc-per-node N tools/torchrun_forward.py [--tokens 4096] [--passes 10]

Every process builds the same global batch and experts from a seed, keeps its
own tokens and its E/N experts, and runs `--passes` forward passes of
mok.distributed.FusedMoEWorld on its GPU (no host synchronisation between
passes; the GPUs order the passes themselves). Rank 0 then computes the same
global batch as a virtual world of N ranks on its own GPU (mok.fused_forward)
and compares the gathered outputs bit for bit. Prints one line per check and
exits nonzero on a mismatch. Needs N Hopper GPUs, one per process.

The library is found as in python/mok (build/python/libmok_torch.so, or
$MOK_LIB_DIR). NVLink multicast stays off (mok.distributed.NO_MULTICAST_ENV).
"""

import argparse
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

from mok.distributed import NO_MULTICAST_ENV, FusedMoEWorld, apply_no_multicast_env  # noqa: E402

apply_no_multicast_env()  # before torch.distributed starts NCCL

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import mok  # noqa: E402
from mok.testing import random_global_layer, rank_slice, split_world  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=1024, help="global tokens (split evenly over the ranks)")
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--top-k", type=int, default=4)
    p.add_argument("--shared", type=int, default=512, help="shared expert width (0: none)")
    p.add_argument("--passes", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.tokens % world or args.experts % world:
        sys.exit("--tokens and --experts must be multiples of the world size %d" % world)
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    if rank == 0:
        print("mok process world: %d ranks, env %s" % (world, NO_MULTICAST_ENV), flush=True)

    layer = random_global_layer(args.tokens, args.hidden, args.intermediate, args.experts, args.top_k,
                                args.shared, args.seed)
    expected = None
    if rank == 0:  # the virtual world on rank 0's GPU, before the process world runs there
        expected = torch.cat(mok.fused_forward(*split_world(layer, world, device), num_experts=args.experts,
                                               check_errors=True))

    fused = FusedMoEWorld(dist.group.WORLD, [args.tokens // world] * world, args.hidden, args.intermediate,
                          args.experts, args.top_k, args.shared)
    mine = rank_slice(layer, rank, world, device)
    fused(*mine, check_errors=True)  # warm-up, checked
    torch.cuda.synchronize()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.passes):
        out = fused(*mine)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    fused(*mine, check_errors=True)  # raises if this pass failed or the world's barrier broke

    gathered = [torch.empty_like(out) for _ in range(world)]
    dist.all_gather(gathered, out)
    ok = True
    if rank == 0:
        got = torch.cat(gathered)
        ok = torch.equal(got.view(torch.int16), expected.view(torch.int16))
        differ = (got.view(torch.int16) != expected.view(torch.int16)).sum().item()
        print("rank 0: %d passes in %.3f ms each; process world vs virtual world: %s"
              % (args.passes, 1e3 * elapsed / max(args.passes, 1),
                 "bitwise equal" if ok else "%d elements differ" % differ), flush=True)
    fused.close()
    status = torch.tensor([0 if ok else 1], device=device)
    dist.broadcast(status, 0)
    dist.destroy_process_group()
    sys.exit(int(status.item()))


if __name__ == "__main__":
    main()
