"""mok.quantize_weights: the block-scaled FP8 weight quantizer, on the CPU:
the scale rule, the values' rounding, the transposed copy, bad input."""

import pytest
import torch

import mok
from conftest import has_hopper
from mok.quant import scale_exponents


def test_scale_is_the_smallest_power_of_two_that_keeps_the_block_in_range():
    amax = torch.tensor([0.0, 448.0, 448.00003, 224.0, 1.0, 3.0, 1e-40, 3e38])
    assert scale_exponents(amax).tolist() == [0, 0, 1, -1, -8, -7, -127, 120]


def test_values_are_the_e4m3_rounding_of_the_scaled_weight():
    torch.manual_seed(0)
    w = torch.randn(2, 256, 384) * 0.02
    w[0, 3, 5] = 3.0
    q = mok.quantize_weights(w.bfloat16())
    assert q.values.dtype == torch.float8_e4m3fn and q.scales.dtype == torch.uint8
    assert q.values.shape == (2, 256, 384) and q.scales.shape == (2, 2, 3)
    assert q.values_t.shape == (2, 384, 256) and q.scales_t.shape == (2, 3, 2)
    # The block of the 3.0: scale 2^-7 (3 * 2^7 = 384 <= 448), the 3.0 itself exact.
    assert int(q.scales[0, 0, 0]) == 127 - 7
    assert float(q.values[0, 3, 5].float()) == 384.0
    # Every value within half an e4m3 step of the weight, relative to its block's scale.
    back = q.dequantize()
    wb = w.bfloat16().float()
    exponent = q.scales.int().repeat_interleave(128, 1).repeat_interleave(128, 2) - 127 - 10
    step = torch.maximum(wb.abs() * 2.0 ** -4, torch.exp2(exponent.float()))
    assert bool(((back - wb).abs() <= step).all())
    # No element saturates: |w| / scale <= 448 everywhere.
    assert float(q.values.float().abs().max()) <= 448.0


def test_the_transposed_copy_is_the_quantization_of_the_transposed_weight():
    torch.manual_seed(1)
    w = torch.randn(3, 128, 256)
    q, qt = mok.quantize_weights(w), mok.quantize_weights(w.transpose(-1, -2).contiguous())
    assert torch.equal(q.values_t.view(torch.uint8), qt.values.view(torch.uint8))
    assert torch.equal(q.scales_t, qt.scales)
    assert torch.equal(q.values.view(torch.uint8), qt.values_t.view(torch.uint8))


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="multiples of 128"):
        mok.quantize_weights(torch.zeros(64, 128))
    w = torch.zeros(128, 128)
    w[1, 2] = float("inf")
    with pytest.raises(ValueError, match=r"w\[1, 2\] is not finite"):
        mok.quantize_weights(w)


def test_the_shared_test_weight_quantizes_to_the_golden_bytes_of_the_cpp_quantizer():
    # The same weight and hash as tests/cpu/test_fp8.cpp: the C++ quantizer
    # produces this constant, so equal hashes mean equal bytes.
    n = 2 * 256 * 384
    i = torch.arange(n, dtype=torch.int64)
    num = ((i * 7919) % 2003 - 1001).to(torch.float32)
    w = torch.ldexp(num / 977.0, ((i // (128 * 384)) % 5 - 2).to(torch.float32)).reshape(2, 256, 384)
    q = mok.quantize_weights(w)
    h = 1469598103934665603
    for part in (q.values.view(torch.uint8), q.scales, q.values_t.view(torch.uint8), q.scales_t):
        for b in part.flatten().tolist():
            h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    assert h == 0x58D5A7AB2986F80D


def test_rows_are_quantized_per_1x128_block_with_the_weights_rule():
    from mok.quant import quantize_rows
    torch.manual_seed(1)
    x = torch.randn(5, 384) * torch.tensor([1e-3, 1.0, 300.0]).repeat_interleave(128)
    values, scales = quantize_rows(x.bfloat16())
    assert values.dtype == torch.float8_e4m3fn and values.shape == (5, 384)
    assert scales.dtype == torch.uint8 and scales.shape == (5, 3)
    amax = x.bfloat16().float().reshape(5, 3, 128).abs().amax(2)
    assert torch.equal(scales.int() - 127, scale_exponents(amax))
    # The same rounding as the weights': a row block is a weight block's row.
    block = torch.zeros(128, 128)
    block[0] = x.bfloat16().float()[2, 128:256]
    q = mok.quantize_weights(block)
    assert torch.equal(values[2, 128:256].view(torch.uint8), q.values[0].view(torch.uint8))
    with pytest.raises(ValueError, match="multiple of 128"):
        quantize_rows(torch.zeros(2, 100))
    with pytest.raises(ValueError, match="not finite"):
        quantize_rows(torch.full((1, 128), float("inf")))


@pytest.mark.skipif(not has_hopper() or not hasattr(torch.ops.mok, "quantize_rows_fp8"),
                    reason="needs a Hopper GPU and a library with the row quantizer kernel")
def test_the_row_quantizer_kernel_gives_the_bytes_of_the_torch_code():
    g = torch.Generator(device="cuda").manual_seed(9)
    x = (torch.randn(333, 1024, device="cuda", generator=g) *
         torch.exp2(torch.randint(-60, 60, (333, 8, 1), device="cuda", generator=g).float()).repeat_interleave(128, 2)
         .view(333, 1024)).bfloat16()
    x[5, :128] = 0  # an all-zero block
    values, scales = mok.quantize_rows(x)        # bf16 on the GPU: the kernel
    want_v, want_s = mok.quantize_rows(x.float())  # fp32: the torch code
    assert torch.equal(scales, want_s)
    assert torch.equal(values.view(torch.uint8), want_v.view(torch.uint8))
