"""mok.fused_forward (the fused MoE forward megakernel) against a torch fp32
computation of the same layer, its determinism across world sizes, and its
input checks."""

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
    pytest.skip("needs a Hopper (sm_90) GPU", allow_module_level=True)

import mok  # noqa: E402

H, I, E, K = 256, 128, 8, 2


def _layer(T, seed, shared=True):
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = (torch.rand(T, H, generator=g) * 2 - 1).bfloat16().cuda()
    scores = torch.rand(T, E, generator=g)
    top = torch.topk(scores, K, dim=1)
    ids = top.indices.int().cuda()
    w = torch.softmax(top.values, dim=1).float().cuda()
    w13 = ((torch.rand(E, 2 * I, H, generator=g) * 2 - 1) / H ** 0.5).bfloat16().cuda()
    w2 = ((torch.rand(E, H, I, generator=g) * 2 - 1) / I ** 0.5).bfloat16().cuda()
    sw13 = ((torch.rand(2 * I, H, generator=g) * 2 - 1) / H ** 0.5).bfloat16().cuda() if shared else None
    sw2 = ((torch.rand(H, I, generator=g) * 2 - 1) / I ** 0.5).bfloat16().cuda() if shared else None
    return x, ids, w, w13, w2, sw13, sw2


def _reference(x, ids, w, w13, w2, sw13, sw2):
    xf = x.float()
    out = torch.zeros_like(xf)
    for j in range(K):
        g13 = w13.float()[ids[:, j].long()]  # [T, 2I, H]
        gu = torch.einsum("th,tnh->tn", xf, g13)
        h = (F.silu(gu[:, :I]) * gu[:, I:]).bfloat16().float()
        y = torch.einsum("ti,thi->th", h, w2.float()[ids[:, j].long()]).bfloat16().float()
        out += w[:, j:j + 1] * y
    if sw13 is not None:
        s = F.silu(xf @ sw13.float()[:I].t()) * (xf @ sw13.float()[I:].t())
        out += (s.bfloat16().float() @ sw2.float().t()).bfloat16().float()
    return out


def _split(R, x, ids, w, w13, w2):
    t, e = x.shape[0] // R, E // R
    parts = lambda a, n: [a[r * n:(r + 1) * n].contiguous() for r in range(R)]  # noqa: E731
    return parts(x, t), parts(ids, t), parts(w, t), parts(w13, e), parts(w2, e)


@pytest.mark.parametrize("shared", [True, False])
def test_matches_fp32_torch(shared):
    x, ids, w, w13, w2, sw13, sw2 = _layer(300, 1, shared)
    out = mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E, check_errors=True)[0]
    ref = _reference(x, ids, w, w13, w2, sw13, sw2)
    assert torch.isfinite(out.float()).all()
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    assert rel < 1e-2, rel


def test_bitwise_identical_across_world_sizes_and_rings():
    x, ids, w, w13, w2, sw13, sw2 = _layer(256, 2)
    outs = []
    # 0: the library's defaults (FusedForwardOptions).
    for R, minibatch, slots in [(1, 0, 0), (1, 1024, 4), (2, 128, 1), (4, 256, 2), (8, 128, 3)]:
        xs, idss, ws, w13s, w2s = _split(R, x, ids, w, w13, w2)
        out = mok.fused_forward(xs, idss, ws, w13s, w2s, sw13, sw2, num_experts=E, minibatch_rows=minibatch,
                                ring_slots=slots, check_errors=True)
        outs.append(torch.cat(out))
    for o in outs[1:]:
        assert torch.equal(o.view(torch.int16), outs[0].view(torch.int16))


def test_rejects_bad_input():
    x, ids, w, w13, w2, sw13, sw2 = _layer(64, 3)
    with pytest.raises(RuntimeError, match="must be contiguous"):
        mok.fused_forward([x.t().contiguous().t()], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E)
    with pytest.raises(RuntimeError, match="weights\\[0\\] must be Float"):
        mok.fused_forward([x], [ids], [w.double()], [w13], [w2], sw13, sw2, num_experts=E)
    with pytest.raises(RuntimeError, match="w13\\[0\\] must be"):
        mok.fused_forward([x], [ids], [w], [w13[:4]], [w2], sw13, sw2, num_experts=E)
    with pytest.raises(RuntimeError, match="minibatch_rows"):
        mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E, minibatch_rows=100)
    with pytest.raises(RuntimeError, match="ring_slots"):
        mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E, ring_slots=-1)
    with pytest.raises(RuntimeError, match="minibatch_rows = 4294969344 is out of range"):
        mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=E, minibatch_rows=2**32 + 2048)
    bad = ids.clone()
    bad[7, 1] = E
    with pytest.raises(RuntimeError, match="rank 0, token 7, slot 1: expert id 8"):
        mok.fused_forward([x], [bad], [w], [w13], [w2], sw13, sw2, num_experts=E, check_errors=True)
