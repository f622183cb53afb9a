"""torch.compile on a Hopper GPU, with its default backend (Inductor): a
function that calls mok.fused_forward and reduces its output, compiled with
fullgraph=True, gives eager mode's bits -- the output and every gradient
(x, the routing weights, the expert and shared weights) -- in save and
recompute mode, with and without a shared expert, and the same bits again on
a second call. (test_compile.py traces the same code on the CPU with fake
tensors; this runs it.)"""

import pytest
import torch

from conftest import skip_without_hopper

skip_without_hopper()

import mok  # noqa: E402
from mok.testing import random_global_layer  # noqa: E402


def _layer_loss(x, ids, w, w13, w2, sw13, sw2, dout, save: bool):
    out = mok.fused_forward([x], [ids], [w], [w13], [w2], sw13, sw2, num_experts=w13.shape[0],
                            save_activations=save)[0]
    # A reduction Inductor compiles around the op: dout's weighted sum in fp32.
    return (out.float() * dout).sum(), out


def _run(fn, layer, dout, save):
    x, ids, w, w13, w2, sw13, sw2 = (None if t is None else t.clone() for t in layer)
    leaves = [t.requires_grad_() for t in (x, w, w13, w2, sw13, sw2) if t is not None]
    loss, out = fn(x, ids, w, w13, w2, sw13, sw2, dout, save)
    grads = torch.autograd.grad(loss, leaves)
    return [loss.detach(), out.detach(), *grads]


def _same_bits(a, b):
    # reshape(-1): a 0-dim tensor (the loss) has no byte view of its own
    return a.dtype == b.dtype and a.shape == b.shape and \
        torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


@pytest.mark.parametrize("save", [True, False], ids=["save", "recompute"])
@pytest.mark.parametrize("shared", [128, 0], ids=["shared", "no shared"])
def test_inductor_gives_eager_bits_forward_and_backward(save, shared):
    T, H, I, E, k = 256, 256, 128, 8, 2
    layer = random_global_layer(T, H, I, E, k, shared, seed=60, device="cuda")
    dout = torch.randn(T, H, device="cuda", generator=torch.Generator(device="cuda").manual_seed(61))
    eager = _run(_layer_loss, layer, dout, save)
    torch._dynamo.reset()
    compiled_fn = torch.compile(_layer_loss, fullgraph=True)
    compiled = _run(compiled_fn, layer, dout, save)
    again = _run(compiled_fn, layer, dout, save)
    assert all(torch.isfinite(t).all() for t in eager)
    names = ["loss", "out", "dx", "dweights", "dw13", "dw2"] + (["dshared_w13", "dshared_w2"] if shared else [])
    for name, a, b, c in zip(names, eager, compiled, again):
        if name == "loss":  # Inductor's own reduction may sum in another order
            torch.testing.assert_close(b, a, rtol=1e-5, atol=0)
            assert _same_bits(b, c), name
            continue
        assert _same_bits(a, b), name
        assert _same_bits(b, c), name
