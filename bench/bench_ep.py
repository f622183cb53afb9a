"""Expert parallelism over real GPUs: mok's process world vs NCCL all_to_all + torch._grouped_mm.

    torchrun --nproc-per-node N bench/bench_ep.py [--quick]

One process per GPU, N = EP ranks. Each rank has its own tokens (2048 or
4096 per rank), routing over all E experts (uniform, or skewed: low expert
ids win more often, so the first ranks receive more rows) and its E/N
experts; one shared expert of width I (DeepSeek-V3 and Kimi K2 shapes: H
7168, I 2048, top-8, E 256 and 384).

The baseline is the usual pipeline: exchange counts (all_to_all_single, then
a host sync for the split sizes), send each (token, slot) row to the rank of
its expert (all_to_all_single), sort by local expert, torch._grouped_mm
gate/up, SwiGLU, torch._grouped_mm down, send the rows back, fp32 weighted
sum over the k slots, plus the shared expert as dense matmuls. mok runs the
same layer as one kernel per GPU (mok.distributed.FusedMoEWorld).

Timing: before every timed call all ranks meet (barrier + device sync); a
call's time is the slowest rank's (CUDA events), medians over alternating
rounds of mok and the baseline. Byte accounting: rows of (token, slot)
entries whose expert lives on another rank, H * 2 bytes each, counted once
for the dispatch and once for the combine; local entries are not counted.
"remote GB/s" divides those bytes by the whole layer time: a lower bound on
the transfer rate (both pipelines also compute in that time; mok overlaps the
two, so its transfer time cannot be isolated from outside).

NVLink multicast stays off (mok.distributed.NO_MULTICAST_ENV).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))

from mok.distributed import FusedMoEWorld, apply_no_multicast_env  # noqa: E402

apply_no_multicast_env()  # before torch.distributed starts NCCL

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from bench_timing import balanced_times, event_ms, upper_median  # noqa: E402

SHAPES = {  # name: (H, I, E, k, shared width)
    "deepseek-v3": (7168, 2048, 256, 8, 2048),
    "kimi-k2": (7168, 2048, 384, 8, 2048),
}


def rank_layer(T, H, I, E, k, S, R, rank, skew, device):
    """This rank's tokens, routing and experts (seeded by rank)."""
    g = torch.Generator(device=device).manual_seed(1000 + rank)
    x = (torch.rand(T, H, device=device, generator=g) * 2 - 1).bfloat16()
    scores = torch.rand(T, E, device=device, generator=g)
    if skew:
        scores = scores / torch.arange(1, E + 1, device=device).float()
    top = torch.topk(scores, k, dim=1)
    ids = top.indices.int().contiguous()
    w = torch.softmax(top.values, dim=1).float().contiguous()
    El = E // R
    w13 = ((torch.rand(El, 2 * I, H, device=device, generator=g) * 2 - 1) / H ** 0.5).bfloat16()
    w2 = ((torch.rand(El, H, I, device=device, generator=g) * 2 - 1) / I ** 0.5).bfloat16()
    # The shared expert is the same on every rank.
    gs = torch.Generator(device=device).manual_seed(7)
    sw13 = ((torch.rand(2 * S, H, device=device, generator=gs) * 2 - 1) / H ** 0.5).bfloat16()
    sw2 = ((torch.rand(H, S, device=device, generator=gs) * 2 - 1) / S ** 0.5).bfloat16()
    return x, ids, w, w13, w2, sw13, sw2


def nccl_pipeline(x, ids, w, w13, w2, sw13, sw2, E, R):
    T, k = ids.shape
    H = x.shape[1]
    El, I = w13.shape[0], w2.shape[2]
    flat = ids.reshape(-1).long()
    dest = flat // El
    order = torch.sort(dest, stable=True).indices  # (token, slot) entries grouped by destination rank
    send = torch.bincount(dest, minlength=R)
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    send_sizes, recv_sizes = send.tolist(), recv.tolist()  # the split sizes: a host sync
    rows = sum(recv_sizes)
    recv_x = torch.empty(rows, H, dtype=x.dtype, device=x.device)
    dist.all_to_all_single(recv_x, x[order // k], recv_sizes, send_sizes)
    recv_e = torch.empty(rows, dtype=torch.int32, device=x.device)
    dist.all_to_all_single(recv_e, (flat[order] % El).int(), recv_sizes, send_sizes)
    by_expert = torch.sort(recv_e, stable=True).indices
    offs = torch.cumsum(torch.bincount(recv_e, minlength=El), 0).to(torch.int32)
    gu = torch._grouped_mm(recv_x[by_expert], w13.transpose(-2, -1), offs=offs)
    h = F.silu(gu[:, :I]) * gu[:, I:]
    y = torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)
    y_recv = torch.empty_like(y)
    y_recv[by_expert] = y
    back = torch.empty(T * k, H, dtype=y.dtype, device=y.device)
    dist.all_to_all_single(back, y_recv, send_sizes, recv_sizes)
    y_slots = torch.empty_like(back)
    y_slots[order] = back
    out = (y_slots.view(T, k, H).float() * w.unsqueeze(-1)).sum(1)
    s = F.silu(x @ sw13[:sw2.shape[1]].t()) * (x @ sw13[sw2.shape[1]:].t())
    return (out + (s @ sw2.t()).float()).bfloat16()


def timed_ms(fn):
    dist.barrier()  # every rank starts the timed call together
    torch.cuda.synchronize()
    return event_ms(fn)


def paired_ms(fn_a, fn_b, cycles=3, iters=4):
    """Medians over balanced rounds (A B, B A, ...; bench_timing.balanced_times)
    of each call's slowest-rank time."""
    times = balanced_times([fn_a, fn_b], cycles, iters, timer=timed_ms)
    slowest = torch.tensor(times, device="cuda")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return tuple(upper_median(t) for t in slowest.tolist())


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="DeepSeek-V3, 4096 tokens per rank only")
    args = p.parse_args()
    rank, R = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    if rank == 0:
        print(f"EP {R}: {torch.cuda.get_device_name()} x {R}", flush=True)

    configs = [(name, T) for name in SHAPES for T in (2048, 4096)]
    if args.quick:
        configs = [("deepseek-v3", 4096)]
    rows = []
    for name, T in configs:
        H, I, E, k, S = SHAPES[name]
        world = FusedMoEWorld(dist.group.WORLD, [T] * R, H, I, E, k, S)
        for skew in (False, True):
            layer = rank_layer(T, H, I, E, k, S, R, rank, skew, device)
            ids = layer[1]
            remote = (ids.long() // (E // R) != rank).sum()
            dist.all_reduce(remote)  # entries that cross GPUs, all ranks
            ours = world(*layer, check_errors=True)
            ref = nccl_pipeline(*layer, E, R)
            err = ((ours.float() - ref.float()).norm() / ref.float().norm()).reshape(1)
            dist.all_reduce(err, op=dist.ReduceOp.MAX)
            t_nccl, t_mok = paired_ms(lambda: nccl_pipeline(*layer, E, R), lambda: world(*layer))
            world(*layer, check_errors=True)  # raises if a timed pass failed
            remote_bytes = remote.item() * H * 2 / R  # per GPU, each direction
            label = f"{name} T={T}/rank {'skewed' if skew else 'uniform'}"
            rows.append((label, t_nccl, t_mok, T / t_mok * 1e3, 2 * remote_bytes / t_mok / 1e6, err.item()))
            if rank == 0:
                print(f"{label}: nccl+grouped_mm {t_nccl:.3f} ms, mok {t_mok:.3f} ms, "
                      f"rel diff {err.item():.2e}", flush=True)
            del layer, ours, ref
        world.close()
        torch.cuda.empty_cache()

    if rank == 0:
        print()
        print(f"{'EP ' + str(R):<36} {'nccl ms':>8} {'mok ms':>8} {'ratio':>6} {'tok/s/GPU':>10} "
              f"{'remote GB/s':>12} {'rel diff':>9}")
        for label, tn, tm, tps, gbs, err in rows:
            print(f"{label:<36} {tn:>8.3f} {tm:>8.3f} {tn / tm:>6.2f} {tps:>10.0f} {gbs:>12.1f} {err:>9.2e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
