"""mok.grouped_mm_fp8, the block-scaled FP8 grouped GEMM: shapes and argument
errors on meta tensors (CPU), and on a Hopper GPU the result against fp32
torch over the dequantized operands, bitwise repeatable."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
mok = pytest.importorskip("mok")
if not hasattr(torch.ops.mok, "grouped_mm_fp8"):
    pytest.skip("the loaded library predates grouped_mm_fp8", allow_module_level=True)

from conftest import has_hopper  # noqa: E402


def _meta(*shape, dtype):
    return torch.empty(*shape, dtype=dtype, device="meta")


def _blocky_weights(G, N, K, g):
    """Random weights [G, N, K] whose 128 x 128 blocks differ in magnitude by
    powers of two, so that their scales differ: a kernel reading another
    block's scale (gate for up, another group or n-tile) is far off."""
    octaves = torch.randint(-4, 5, (G, N // 128, 1, K // 128, 1), device="cuda", generator=g).float()
    w = torch.randn(G, N // 128, 128, K // 128, 128, device="cuda", generator=g) * torch.exp2(octaves)
    return w.reshape(G, N, K) / K ** 0.5


def test_shapes_and_errors_on_meta_tensors():
    M, K, G, N = 300, 256, 3, 384
    a, a_s = _meta(M, K, dtype=torch.float8_e4m3fn), _meta(M, K // 128, dtype=torch.uint8)
    b, b_s = _meta(G, N, K, dtype=torch.float8_e4m3fn), _meta(G, N // 128, K // 128, dtype=torch.uint8)
    off, rows = _meta(G + 1, dtype=torch.int32), _meta(G, dtype=torch.int32)
    out = torch.ops.mok.grouped_mm_fp8(a, a_s, b, b_s, off, rows)
    assert out.shape == (M, N) and out.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="b_scales must be"):
        torch.ops.mok.grouped_mm_fp8(a, a_s, b, _meta(G, N // 128, 1, dtype=torch.uint8), off, rows)
    with pytest.raises(RuntimeError, match="a must be"):
        torch.ops.mok.grouped_mm_fp8(a.to(torch.bfloat16), a_s, b, b_s, off, rows)
    # SwiGLU: b is w13 [G, 2I, K]; out [M, I].
    assert torch.ops.mok.grouped_mm_fp8_swiglu(a, a_s, b, b_s, off, rows).shape == (M, N // 2)


@pytest.mark.skipif(not has_hopper(), reason="needs a Hopper GPU")
def test_matches_the_dequantized_product_and_repeats_bitwise():
    g = torch.Generator(device="cuda").manual_seed(3)
    counts, K, N = [200, 0, 77, 300], 512, 256
    M, G = sum(counts), len(counts)
    x = torch.randn(M, K, device="cuda", generator=g) * torch.exp2(torch.randint(-4, 5, (M, 1), device="cuda",
                                                                                   generator=g).float())
    w = _blocky_weights(G, N, K, g)
    a, a_s = mok.quantize_rows(x)
    q = mok.quantize_weights(w)
    off, rows = mok.layout_from_counts(counts, device="cuda")
    out = mok.grouped_mm_fp8(a, a_s, q.values, q.scales, off, rows)
    a_deq = a.float() * torch.exp2(a_s.float() - 127).repeat_interleave(128, 1)
    b_deq = q.dequantize()
    group = torch.repeat_interleave(torch.arange(G, device="cuda"), torch.tensor(counts, device="cuda"))
    want = torch.einsum("mk,mnk->mn", a_deq, b_deq[group])
    err = float((out.float() - want).norm() / want.norm())
    assert err < 4e-3, err  # bf16 output rounding
    assert all(torch.equal(out, mok.grouped_mm_fp8(a, a_s, q.values, q.scales, off, rows)) for _ in range(3))
    # The SwiGLU twin over the same weights read as w13 (gate: the first N/2 rows, up: the rest).
    h = mok.grouped_mm_fp8_swiglu(a, a_s, q.values, q.scales, off, rows)
    gate, up = want[:, :N // 2], want[:, N // 2:]
    want_h = torch.nn.functional.silu(gate) * up
    err = float((h.float() - want_h).norm() / want_h.norm())
    assert err < 1e-2, err


@pytest.mark.skipif(not has_hopper() or not hasattr(torch.ops.mok, "grouped_mm_fp8_swiglu_quantize"),
                    reason="needs a Hopper GPU and a library with the quantizing gate/up")
def test_the_quantizing_gate_up_matches_the_reference_and_the_scale_rule():
    g = torch.Generator(device="cuda").manual_seed(4)
    counts, K, I = [200, 0, 77, 300], 512, 256
    M, G = sum(counts), len(counts)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    w13 = _blocky_weights(G, 2 * I, K, g)
    a, a_s = mok.quantize_rows(x)
    q = mok.quantize_weights(w13)
    off, rows = mok.layout_from_counts(counts, device="cuda")
    hq, hs = torch.ops.mok.grouped_mm_fp8_swiglu_quantize(a, a_s, q.values, q.scales, off, rows)
    assert hq.shape == (M, I) and hq.dtype == torch.float8_e4m3fn and hs.shape == (M, I // 128)
    h = hq.float() * torch.exp2(hs.float() - 127).repeat_interleave(128, 1)
    # The reference: fp32 h over the dequantized operands.
    a_deq = a.float() * torch.exp2(a_s.float() - 127).repeat_interleave(128, 1)
    group = torch.repeat_interleave(torch.arange(G, device="cuda"), torch.tensor(counts, device="cuda"))
    gu = torch.einsum("mk,mnk->mn", a_deq, q.dequantize()[group])
    want = torch.nn.functional.silu(gu[:, :I]) * gu[:, I:]
    err = float((h - want).norm() / want.norm())
    assert err < 4e-2, err  # e4m3 rounding of h (about 2-3% per value)
    # The scale rule, exactly: each block's largest |value| / 2^e is in [224, 448].
    peak = hq.float().abs().view(M, I // 128, 128).amax(2)
    assert bool(((peak >= 224) & (peak <= 448)).all())
    again = torch.ops.mok.grouped_mm_fp8_swiglu_quantize(a, a_s, q.values, q.scales, off, rows)
    assert torch.equal(again[0].view(torch.uint8), hq.view(torch.uint8)) and torch.equal(again[1], hs)
