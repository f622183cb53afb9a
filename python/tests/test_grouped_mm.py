"""torch.ops.mok.grouped_mm / grouped_mm_swiglu against fp32 torch math."""

import pytest
import torch

from conftest import skip_without_hopper  # noqa: E402

skip_without_hopper()

import mok  # noqa: E402


def _problem(counts, pad, n, k, w_rows, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    offsets, rows = [0], list(counts)
    for c, p in zip(counts, pad):
        offsets.append(offsets[-1] + c + p)
    m = offsets[-1]
    a = (torch.rand(m, k, generator=g) * 2 - 1).to(torch.bfloat16).cuda()
    b = ((torch.rand(len(counts), w_rows, k, generator=g) * 2 - 1) * (2 / k ** 0.5)).to(torch.bfloat16).cuda()
    off = torch.tensor(offsets, dtype=torch.int32, device="cuda")
    r = torch.tensor(rows, dtype=torch.int32, device="cuda")
    return a, b, off, r, offsets


COUNTS, PAD = [130, 0, 1, 128, 257], [3, 0, 17, 0, 5]


def test_grouped_mm_matches_fp32():
    n, k = 320, 576
    a, b, off, r, offsets = _problem(COUNTS, PAD, n, k, n, 1)
    out = mok.grouped_mm(a, b, off, r)
    assert out.shape == (a.shape[0], n) and out.dtype == torch.bfloat16
    for g, c in enumerate(COUNTS):
        if c == 0:
            continue
        rows = slice(offsets[g], offsets[g] + c)
        ref = a[rows].float() @ b[g].float().T
        torch.testing.assert_close(out[rows].float(), ref, atol=1e-2, rtol=1e-2)


def test_grouped_mm_swiglu_matches_fp32():
    n, k = 192, 320
    a, w13, off, r, offsets = _problem(COUNTS, PAD, n, k, 2 * n, 2)
    out = mok.grouped_mm_swiglu(a, w13, off, r)
    assert out.shape == (a.shape[0], n)
    for g, c in enumerate(COUNTS):
        if c == 0:
            continue
        rows = slice(offsets[g], offsets[g] + c)
        h = a[rows].float() @ w13[g].float().T
        gate, up = h[:, :n], h[:, n:]
        ref = gate / (1 + torch.exp(-gate)) * up
        torch.testing.assert_close(out[rows].float(), ref, atol=1e-2, rtol=1e-2)


def test_repeatable_bitwise():
    a, b, off, r, _ = _problem(COUNTS, PAD, 256, 256, 512, 3)
    first = mok.grouped_mm_swiglu(a, b, off, r)
    for _ in range(5):
        again = mok.grouped_mm_swiglu(a, b, off, r)
        real = torch.cat([again[o:o + c] for o, c in zip(off.tolist(), COUNTS)])
        ref = torch.cat([first[o:o + c] for o, c in zip(off.tolist(), COUNTS)])
        assert torch.equal(real.view(torch.int16), ref.view(torch.int16))


def test_rejects_bad_tensors():
    a, b, off, r, _ = _problem([64], [0], 128, 128, 128, 4)
    with pytest.raises(RuntimeError, match="bfloat16|BFloat16"):
        mok.grouped_mm(a.float(), b, off, r)
    with pytest.raises(RuntimeError, match="contiguous"):
        mok.grouped_mm(a.t().contiguous().t(), b, off, r)
    with pytest.raises(RuntimeError, match="CUDA"):
        mok.grouped_mm(a.cpu(), b, off, r)
    with pytest.raises(RuntimeError, match="K differs"):
        mok.grouped_mm(a[:, :64].contiguous(), b, off, r)
    with pytest.raises(RuntimeError, match="group_offset"):
        mok.grouped_mm(a, b, off[:1].contiguous(), r)
    with pytest.raises(RuntimeError, match="Int"):
        mok.grouped_mm(a, b, off.long(), r)
    a96 = torch.zeros(64, 96, dtype=torch.bfloat16, device="cuda")
    b96 = torch.zeros(1, 128, 96, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(RuntimeError, match="k = 96"):
        mok.grouped_mm(a96, b96, off, r)
