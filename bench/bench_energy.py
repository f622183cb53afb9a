"""Energy per call of the backward's kernels, the training forward and whole
steps, against the dense bf16 matmul, on the DeepSeek-V3 slice (one GPU).

The H200 holds its power cap by lowering its clocks, so a sustained pass is
as fast as its energy per useful FLOP allows (docs/perf-notes.md, "The power
cap"). Each item runs back to back for about a second; NVML's energy
counter (read through ctypes: no package needed) gives joules per call, a
sampler thread the mean SM clock. Printed per item: time per call, joules,
mean watts and clock, and pJ per useful FLOP (GEMMs) or per byte moved (row
copies). An item that needs less energy per FLOP than another runs at a
higher clock under the cap: this table says which kernels to make leaner,
where time tables alone say only which are long.

--weight-grad-k instead measures the weight-gradient GEMM per clock against
its K (an expert's rows): the same 32768 rows as 32 groups of 1024, 8 of
4096 and 2 of 16384, beside dx's grouped_mm_kn and the dense matmul. If the
TFLOP/s per GHz climbs to dx's as K grows, what the weight gradient loses
per clock is paid per tile (drain, epilogue, the tail's clearing), not in
its K loop.

--fp8 instead sets the FP8 forward beside the bf16 one under the cap: the
dense bf16 matmul and the dense FP8 one (torch._scaled_mm, e4m3, 8192^3, one
scale per row and per column, fast accumulation: cuBLAS's own FP8 rate) back
to back, then mok's bf16 and FP8 forwards on the DeepSeek-V3 slice; and what
the two dense rates make of the layer (its routed FLOPs at the FP8 rate, the
bf16 shared expert's at the bf16 rate, against all of it at the bf16 rate):
the FP8-over-bf16 ratio a layer running at the dense rates would reach, to
read issue 16's 1.45x against.

The default table ends with the backward's and the forward+backward's
bound under the cap: native's energy per call over what the same useful
FLOPs cost at the dense matmul's energy per FLOP (what an implementation as
lean as the matmul would reach against native, sustained), beside native's
energy over mok's.

usage: python3 bench/bench_energy.py [--seconds 1.0] [--weight-grad-k | --fp8]
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fused_forward import forward_flops, make_layer, torch_native  # noqa: E402
import mok  # noqa: E402  (bench_fused_forward put python/ on the path)
from mok import staged_backward  # noqa: E402


class Nvml:
    """NVML's energy counter (mJ) and SM clock for the current CUDA device."""

    def __init__(self):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit_v2 failed")
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        bus = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0".encode()
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(self.handle)) != 0:
            raise RuntimeError(f"no NVML device at bus id {bus.decode()}")

    def energy_mj(self) -> int:
        e = ctypes.c_ulonglong()
        if self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle, ctypes.byref(e)) != 0:
            raise RuntimeError("nvmlDeviceGetTotalEnergyConsumption failed")
        return e.value

    def sm_mhz(self) -> int:
        mhz = ctypes.c_uint()
        self.lib.nvmlDeviceGetClockInfo(self.handle, 1, ctypes.byref(mhz))  # NVML_CLOCK_SM
        return mhz.value


def measure(nvml: Nvml, fn, seconds: float):
    """(ms per call, J per call, mean W, mean SM MHz) of fn run back to back."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    calls = 0
    while time.perf_counter() - start < 0.2:  # calls per second, roughly
        fn()
        calls += 1
    torch.cuda.synchronize()
    n = max(3, int(calls * seconds / (time.perf_counter() - start)))
    clocks, done = [], threading.Event()

    def sample():
        while not done.is_set():
            clocks.append(nvml.sm_mhz())
            time.sleep(0.005)
    sampler = threading.Thread(target=sample)
    e0, t0 = nvml.energy_mj(), time.perf_counter()
    sampler.start()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    t1, e1 = time.perf_counter(), nvml.energy_mj()
    done.set()
    sampler.join()
    joules = (e1 - e0) / 1e3
    return (t1 - t0) * 1e3 / n, joules / n, joules / (t1 - t0), sum(clocks) / max(1, len(clocks))


def print_row(name, flops, nbytes, ms, joules, watts, mhz):
    rate = f"{flops / ms / 1e9:8.0f}" if flops else f"{'':>8}"
    per_flop = f"{joules / flops * 1e12:8.3f}" if flops else f"{'':>8}"
    per_ghz = f"{flops / ms / 1e6 / mhz:8.0f}" if flops else f"{'':>8}"
    per_byte = f"{joules / nbytes * 1e12:6.1f}" if nbytes else f"{'':>6}"
    print(f"{name:<36} {ms:8.3f} {joules:8.4f} {watts:6.0f} {mhz:6.0f} {rate} {per_ghz} {per_flop} {per_byte}",
          flush=True)


HEADER = (f"{'item':<36} {'ms':>8} {'J':>8} {'W':>6} {'MHz':>6} {'TFLOP/s':>8} {'per GHz':>8} {'pJ/FLOP':>8} "
          f"{'pJ/B':>6}")


def weight_grad_against_k(nvml, seconds):
    """dW13's GEMM on 32768 rows cut into groups of 1024, 4096 and 16384."""
    M, H, I, E = 32768, 7168, 2048, 32
    g = torch.Generator(device="cuda").manual_seed(1)

    def rand(*shape, scale=1.0):
        return ((torch.rand(*shape, device="cuda", generator=g) * 2 - 1) * scale).bfloat16()
    d13, x_rows, w13 = rand(M, 2 * I), rand(M, H), rand(E, 2 * I, H, scale=H ** -0.5)
    a, b = torch.randn(8192, 8192, device="cuda").bfloat16(), torch.randn(8192, 8192, device="cuda").bfloat16()

    def tables(groups, rows):
        return (torch.arange(groups + 1, dtype=torch.int32, device="cuda") * rows,
                torch.full((groups,), rows, dtype=torch.int32, device="cuda"))
    print(HEADER)
    print_row("dense matmul 8192^3", 2 * 8192**3, None, *measure(nvml, lambda: a @ b, seconds))
    off, counts = tables(E, M // E)
    print_row(f"dx grouped_mm_kn {E} x {M // E}", 4 * M * I * H, None,
              *measure(nvml, lambda: mok.grouped_mm_kn(d13, w13, off, counts), seconds))
    for groups in (32, 8, 2):
        off, counts = tables(groups, M // groups)
        print_row(f"dW13 {groups} groups x {M // groups} rows", 4 * M * I * H, None, *measure(
            nvml, lambda: mok.weight_grad_mm(d13, x_rows, off, counts, groups, torch.bfloat16), seconds))


def fp8_against_bf16(nvml, seconds):
    """The dense FP8 and bf16 rates under the cap, mok's two forwards, and the
    layer ratio the dense rates allow (module docstring, --fp8)."""
    from bench_fused_forward_fp8 import mok_bf16, mok_fp8  # noqa: E402
    n = 8192
    a, b = torch.randn(n, n, device="cuda").bfloat16(), torch.randn(n, n, device="cuda").bfloat16()
    qa = (torch.rand(n, n, device="cuda") * 2 - 1).to(torch.float8_e4m3fn)
    qb = (torch.rand(n, n, device="cuda") * 2 - 1).to(torch.float8_e4m3fn).t()  # column-major, as cuBLAS wants
    sa = torch.ones(n, 1, device="cuda")
    sb = torch.ones(1, n, device="cuda")
    T, H, I, E, k, S = 4096, 7168, 2048, 32, 8, 2048
    layer = make_layer(T, H, I, E, k, S)
    fwd = forward_flops(T, H, I, k, S)
    shared = fwd - forward_flops(T, H, I, k, 0)  # the shared expert's part: 6 T H S
    print(f"device: {torch.cuda.get_device_name()}; each item back to back for ~{seconds:.1f} s", flush=True)
    print(HEADER)
    rows = {}
    for name, fn, flops in (
            ("dense bf16 matmul 8192^3", lambda: a @ b, 2 * n**3),
            ("dense FP8 _scaled_mm 8192^3", lambda: torch._scaled_mm(qa, qb, sa, sb, out_dtype=torch.bfloat16,
                                                                    use_fast_accum=True), 2 * n**3),
            ("mok forward bf16 (DeepSeek-V3 slice)", mok_bf16(layer), fwd),
            ("mok forward FP8 (DeepSeek-V3 slice)", mok_fp8(layer), fwd)):
        rows[name] = measure(nvml, fn, seconds)
        print_row(name, flops, None, *rows[name])
    bf16_rate = 2 * n**3 / rows["dense bf16 matmul 8192^3"][0]
    fp8_rate = 2 * n**3 / rows["dense FP8 _scaled_mm 8192^3"][0]
    ceiling = (fwd / bf16_rate) / ((fwd - shared) / fp8_rate + shared / bf16_rate)
    mok_ratio = rows["mok forward bf16 (DeepSeek-V3 slice)"][0] / rows["mok forward FP8 (DeepSeek-V3 slice)"][0]
    print(f"dense FP8 over dense bf16, sustained: {fp8_rate / bf16_rate:.3f}x; the layer at those rates "
          f"(shared expert bf16, {shared / fwd:.1%} of its FLOPs): {ceiling:.3f}x; mok's FP8 over its bf16 "
          f"forward, sustained: {mok_ratio:.3f}x", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=1.0, help="back-to-back stretch per item")
    parser.add_argument("--weight-grad-k", action="store_true", help="the weight gradient per clock against K")
    parser.add_argument("--fp8", action="store_true",
                        help="the dense FP8 and bf16 rates under the cap against mok's FP8 and bf16 forwards")
    args = parser.parse_args()
    nvml = Nvml()
    if args.fp8:
        fp8_against_bf16(nvml, args.seconds)
        return
    if args.weight_grad_k:
        weight_grad_against_k(nvml, args.seconds)
        return
    T, H, I, E, k, S = 4096, 7168, 2048, 32, 8, 2048
    x, ids, w, w13, w2, sw13, sw2 = make_layer(T, H, I, E, k, S)
    s = staged_backward.routed_schedule(ids, E)
    M = T * k
    g = torch.Generator(device="cuda").manual_seed(1)

    def rand(*shape):
        return (torch.rand(*shape, device="cuda", generator=g) * 2 - 1).bfloat16()
    dout, preact, d13, hw = rand(T, H), rand(M, 2 * I), rand(M, 2 * I), rand(M, I)
    dout_rows, x_rows = mok.scatter_rows([dout, x], s.row_of_entry.view(T, k), s.entry_of_row)
    w_rows = w.reshape(-1).index_select(0, s.entry_of_row).contiguous()
    off, rows = s.group_offset, s.group_rows
    dx_rows = mok.grouped_mm_kn(d13, w13, off, rows)
    slot_rows = s.row_of_entry.view(T, k).to(torch.int32)
    a = torch.randn(8192, 8192, device="cuda").bfloat16()
    b = torch.randn(8192, 8192, device="cuda").bfloat16()
    fwd = forward_flops(T, H, I, k, S)

    def fresh_leaves():
        return [t.detach().requires_grad_() for t in (x, w, w13, w2, sw13, sw2)]

    def mok_forward(leaves):
        return mok.fused_forward([leaves[0]], [ids], [leaves[1]], [leaves[2]], [leaves[3]], leaves[4], leaves[5],
                                 num_experts=E, save_activations=True)[0]

    def native_forward(leaves):
        return torch_native(leaves[0], ids, *leaves[1:])

    def mok_step():
        leaves = fresh_leaves()
        torch.autograd.grad(mok_forward(leaves), leaves, dout)

    def native_step():
        leaves = fresh_leaves()
        torch.autograd.grad(native_forward(leaves), leaves, dout)

    # The backwards alone, each on a graph recorded once (retain_graph):
    # their energy per useful FLOP against the matmul's bounds the backward's
    # ratio under the cap, as the steps' bound the forward+backward's.
    mok_leaves, native_leaves = fresh_leaves(), fresh_leaves()
    mok_out, native_out = mok_forward(mok_leaves), native_forward(native_leaves)

    # (name, fn, useful FLOP or None, bytes moved or None)
    items = [
        ("dense matmul 8192^3", lambda: a @ b, 2 * 8192**3, None),
        ("training forward (save mode)", lambda: mok.fused_forward(
            [x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E, save_activations=True), fwd, None),
        ("scatter_rows x, dout", lambda: mok.scatter_rows([dout, x], s.row_of_entry.view(T, k), s.entry_of_row),
         None, 2 * (T + M) * H * 2),
        ("swiglu_backward_mm (routed)", lambda: mok.swiglu_backward_mm(dout_rows, w2, preact, w_rows, off, rows),
         2 * M * H * I, None),
        ("grouped_mm_kn dx (routed)", lambda: mok.grouped_mm_kn(d13, w13, off, rows), 4 * M * I * H, None),
        ("weight_grad_mm dW13 (routed, bf16)", lambda: mok.weight_grad_mm(d13, x_rows, off, rows, E, torch.bfloat16),
         4 * M * I * H, None),
        ("weight_grad_mm dW2 (routed, bf16)", lambda: mok.weight_grad_mm(dout_rows, hw, off, rows, E, torch.bfloat16),
         2 * M * H * I, None),
        ("row_combine dx", lambda: mok.row_combine(dx_rows, slot_rows, dout), None, (M + 2 * T) * H * 2),
        ("mok backward (save mode)", lambda: torch.autograd.grad(mok_out, mok_leaves, dout, retain_graph=True),
         2 * fwd, None),
        ("native backward", lambda: torch.autograd.grad(native_out, native_leaves, dout, retain_graph=True),
         2 * fwd, None),
        ("mok forward+backward (save mode)", mok_step, 3 * fwd, None),
        ("native forward+backward", native_step, 3 * fwd, None),
    ]
    print(f"device: {torch.cuda.get_device_name()}; DeepSeek-V3 slice (T {T}, H {H}, I {I}, {E} experts, top-{k}, "
          f"shared {S}); each item back to back for ~{args.seconds:.1f} s", flush=True)
    print(HEADER)
    joules = {}
    for name, fn, flops, nbytes in items:
        result = measure(nvml, fn, args.seconds)
        joules[name] = result[1]
        print_row(name, flops, nbytes, *result)
    # Under the cap a sustained call's time is its energy over the cap's
    # watts, so native's energy over mok's is the sustained time ratio, and
    # native's over what the same FLOPs cost at the matmul's energy per FLOP
    # is the most any implementation can reach against native there.
    matmul_pj = joules["dense matmul 8192^3"] / (2 * 8192**3)
    for what, flops, m, n in (("backward", 2 * fwd, "mok backward (save mode)", "native backward"),
                              ("forward+backward", 3 * fwd, "mok forward+backward (save mode)",
                               "native forward+backward")):
        print(f"{what}: native / mok energy {joules[n] / joules[m]:.3f}x; native / the same FLOPs at the "
              f"matmul's energy per FLOP {joules[n] / (flops * matmul_pj):.3f}x (the bound under the cap)")


if __name__ == "__main__":
    main()
