"""A model of the fused forward's memory traffic under its ticket order, for
choosing between m-tile and n-tile major gate/up blocks (forward_n_major_kinds).

Tasks are taken in ticket order (the pipeline: step s emits the down block of
minibatch s - lookahead, then the gate/up block of minibatch s); each task
reads its A panel (its m-tile's rows: x for gate/up, h for down) and its B
panel (its n-tile's weight rows) through an LRU cache the size of the L2's
usable part; a miss costs the panel's bytes from DRAM. The tasks running at
once (a wave of as many tickets as GEMM CTAs) share their panels: each is
read once per wave at most, and again in a later wave only if the L2 lost it
in between. Uniform routing, bf16, no shared expert. A model, not a measurement: it says which order reads less, and how
much, for a layer's shape.

  python3 tools/l2_order_model.py [--l2-mb 40] [--ctas 124]
"""
from __future__ import annotations

import argparse
from collections import OrderedDict

SHAPES = {  # name: T, H, I, E, k
    "deepseek-v3-ep8-slice": (4096, 7168, 2048, 32, 8),
    "glm-4.5-ep8-slice": (4096, 5120, 1536, 20, 8),
    "qwen3-235b-ep8-slice": (4096, 4096, 1536, 16, 8),
    "kimi-k2-ep8-slice": (4096, 7168, 2048, 48, 8),
    "mixtral-8x7b": (4096, 4096, 14336, 8, 2),
    "llama4-scout-ep2-slice": (4096, 5120, 8192, 8, 1),
}
TILE_M, GATE_UP_COLS, DOWN_COLS, MINIBATCH, LOOKAHEAD = 128, 128, 256, 2048, 2


def traffic(T, H, I, E, k, gate_up_n_major, l2_bytes, ctas):
    rows = T * k // E
    m_per_expert = -(-rows // TILE_M)
    expert_of_tile = [e for e in range(E) for _ in range(m_per_expert)]
    m_tiles = len(expert_of_tile)
    per_mb = MINIBATCH // TILE_M
    minibatches = -(-m_tiles // per_mb)
    n_gate_up, n_down = -(-I // GATE_UP_COLS), -(-H // DOWN_COLS)

    def block(kind, mb):
        tiles = list(range(mb * per_mb, min(m_tiles, (mb + 1) * per_mb)))
        n = n_gate_up if kind == "gate_up" else n_down
        if kind == "gate_up" and gate_up_n_major:
            return [(kind, m, j) for j in range(n) for m in tiles]
        return [(kind, m, j) for m in tiles for j in range(n)]

    order = []
    for s in range(minibatches + LOOKAHEAD):
        if 0 <= s - LOOKAHEAD < minibatches:
            order += block("down", s - LOOKAHEAD)
        if s < minibatches:
            order += block("gate_up", s)
    cache, used, dram = OrderedDict(), 0, 0

    def touch(key, size):
        nonlocal used, dram
        if key in cache:
            cache.move_to_end(key)
            return
        dram += size
        cache[key] = size
        used += size
        while used > l2_bytes:
            _, s = cache.popitem(last=False)
            used -= s

    def panels(kind, m, j):
        e = expert_of_tile[m]
        if kind == "gate_up":
            return [(("x", m), TILE_M * H * 2), (("w13", e, j), 2 * GATE_UP_COLS * H * 2)]
        return [(("h", m), TILE_M * I * 2), (("w2", e, j), DOWN_COLS * I * 2)]

    # The tasks running at once (a wave of `ctas` tickets) share their panels
    # through L2 as they stream them over K together: a panel is read from
    # DRAM once per wave at most, and again in a later wave only if the L2
    # lost it meanwhile.
    for w in range(0, len(order), ctas):
        wave = {}
        for task in order[w:w + ctas]:
            for key, size in panels(*task):
                wave[key] = size
        for key, size in wave.items():
            touch(key, size)
    weights = E * 3 * H * I * 2
    return dram, weights


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--l2-mb", type=float, default=40.0, help="the L2's usable megabytes (H200: 50 MB in all)")
    parser.add_argument("--ctas", type=int, default=124, help="GEMM CTAs: the tasks running at once")
    args = parser.parse_args()
    l2 = int(args.l2_mb * 2**20)
    print(f"{'layer':<24} {'weights GB':>10} {'m-major GB':>11} {'n-major GB':>11} {'n/m':>6}")
    for name, (T, H, I, E, k) in SHAPES.items():
        m_major, weights = traffic(T, H, I, E, k, False, l2, args.ctas)
        n_major, _ = traffic(T, H, I, E, k, True, l2, args.ctas)
        print(f"{name:<24} {weights / 1e9:>10.2f} {m_major / 1e9:>11.2f} {n_major / 1e9:>11.2f} {n_major / m_major:>6.2f}")


if __name__ == "__main__":
    main()
