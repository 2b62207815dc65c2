"""Independent oracles of the MoE family, written once for the tests (and the bench).

None of them calls ``tilesim.reference.moe*``:

* :func:`oracle64` — float64 per-expert NumPy, full-K matmuls, the activation formulas in
  float64; :func:`oracle_bound` the per-element error bound the golden's rounding points
  allow against it (derivation in ``docs/ops/moe.md``, "The derived bound");
  :func:`assert_within_oracle` both together.
* :func:`torch_seed_golden` — the seeds' golden procedure in torch ``F.linear`` on the
  checkpoint layout (hicann/pypto-gym, tests/ops/minimax_m27/test_minimax_m27_grouped_gemm.py,
  tests/ops/minimax_m3/test_minimax_m3_grouped_gemm.py).
* :func:`torch_seed_routing`, :func:`torch_host_combine` — the seeds' host routing and
  combine in torch (hicann/pypto-gym,
  src/pypto_gym/transformers/minimax_m3/modeling_minimax_m3.py).
* :func:`dense_layer_oracle64` — a whole routed layer in float64, one token and slot at a time.
* :func:`chunk_loop_golden` — the kernel's loop nest written out chunk by chunk with
  ``math.fsum`` tile partials (pure Python; small shapes only).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

BF = ml_dtypes.bfloat16
U32 = 2.0**-24


def _f64(a):
    return np.asarray(a).astype(np.float32).astype(np.float64)


def _split(gu, layout, i):
    if layout == "halves":
        return gu[:, :i], gu[:, i:]
    return gu[:, 0::2], gu[:, 1::2]


def _act64(gate, up, d):
    """(a, relative FP32 rounding budget, |d a / d gate| bound, g) of the activation, float64."""
    if d.activation == "silu":
        a = gate * up / (1.0 + np.exp(-gate))
        return a, 8.0 + 0.0 * gate, 1.1 * np.abs(up), gate
    g = np.minimum(gate, d.limit)
    u = np.clip(up, -d.limit, d.limit)
    with np.errstate(over="ignore"):
        a = (u + d.beta) * g / (1.0 + np.exp(-d.alpha * g))
    rel = 2.0 * np.abs(d.alpha * g) + 8.0
    dg = (np.abs(u) + abs(d.beta)) * (1.0 + d.alpha * np.abs(g) / 4.0)
    return a, rel, dg, g


def oracle64(case, round_activation=None):
    """Float64 per-expert reference of a MoE case. Returns (D64 [N, H], per-expert parts for
    :func:`oracle_bound`)."""
    inp, p = case["inputs"], case["params"]
    d = p["dims"]
    rnd = p["round_activation"] if round_activation is None else round_activation
    x = _f64(inp["sorted_tokens"])
    w13, w2 = (_f64(w) for w in inp["weights"])
    cs = np.asarray(inp["expert_cumsum"]).astype(np.int64)
    h, i = d.hidden_size, d.intermediate_size
    out = np.zeros((x.shape[0], h))
    parts = []
    for e in range(d.num_experts):
        if cs[e + 1] == cs[e]:
            continue
        rows = slice(cs[e], cs[e + 1])
        xe = x[rows]
        w13e, w2e = w13[e * h : (e + 1) * h], w2[e * i : (e + 1) * i]
        gate, up = _split(xe @ w13e, d.gate_up_layout, i)
        s1g, s1u = _split(np.abs(xe) @ np.abs(w13e), d.gate_up_layout, i)
        a, rel, dg, g = _act64(gate, up, d)
        parts.append((rows, a, rel, dg, np.abs(g) + 1.0, s1g, s1u, w2e))
        a_used = a.astype(BF).astype(np.float64) if rnd else a
        out[rows] = a_used @ w2e
    return out, parts


def oracle_bound(case, parts, round_activation=None):
    """Per-element bound on ``|D32 - D64|`` (``docs/ops/moe.md``, "The derived bound")."""
    p = case["params"]
    d, t = p["dims"], p["tiling"]
    rnd = p["round_activation"] if round_activation is None else round_activation
    nk1 = math.ceil(d.hidden_size / t.mm1_k)
    nk2 = math.ceil(d.intermediate_size / t.mm2_k)
    g1, g2 = (nk1 + 1) * U32 * 1.01, (nk2 + 1) * U32 * 1.01
    n = case["inputs"]["sorted_tokens"].shape[0]
    bound = np.zeros((n, d.hidden_size))
    for rows, a, rel, dg, dup, s1g, s1u, w2e in parts:
        da = rel * U32 * np.abs(a) + 1.1 * g1 * (dg * s1g + dup * s1u) + 1e-30
        if rnd:
            lo = (a - da).astype(BF).astype(np.float64)
            hi = (a + da).astype(BF).astype(np.float64)
            da = hi - lo  # 0 unless a BF16 rounding boundary lies within a +- da
            a_used = a.astype(BF).astype(np.float64)
        else:
            a_used = a
        s2 = (np.abs(a_used) + da) @ np.abs(w2e)  # >= |A_golden| @ |W2|
        bound[rows] = da @ np.abs(w2e) + g2 * s2
    return bound


def half_bf16_spacing(y: np.ndarray) -> np.ndarray:
    """Half the BF16 spacing at |y| (>= half the smallest subnormal)."""
    m = np.abs(np.asarray(y).astype(np.float64))
    e = np.floor(np.log2(np.maximum(m, 2.0**-126)))
    return 0.5 * 2.0 ** np.maximum(e - 7, -133)


def assert_within_oracle(case, y, round_activation=None):
    """``y`` within half a BF16 spacing plus :func:`oracle_bound` of :func:`oracle64`."""
    d64, parts = oracle64(case, round_activation)
    bound = oracle_bound(case, parts, round_activation)
    err = np.abs(np.asarray(y).astype(np.float64) - d64)
    allowed = half_bf16_spacing(y) + bound
    bad = err > allowed
    worst = np.unravel_index(np.argmax(err - allowed), err.shape)
    assert not bad.any(), (
        f"{int(bad.sum())} elements outside the bound; worst excess "
        f"{float((err - allowed).max()):.3g} at {worst}"
    )
    return d64


def chunk_loop_golden(case, chunks_of):
    """The kernel's loop nest written out in Python: per expert and chunk (``chunks_of(n)``
    gives ``[(offset, size), ...]``), mm1 / mm2 with one ``math.fsum`` per K tile rounded to
    FP32 and FP32 adds in K order, the activation one NumPy FP32 operation at a time, BF16
    roundings where the kernel rounds. Slow: small shapes only."""
    inp, p = case["inputs"], case["params"]
    d, t = p["dims"], p["tiling"]
    x = np.asarray(inp["sorted_tokens"]).astype(np.float32)
    w13, w2 = (np.asarray(w).astype(np.float32) for w in inp["weights"])
    cs = [int(c) for c in inp["expert_cumsum"]]
    h, i = d.hidden_size, d.intermediate_size
    out = np.zeros(x.shape, dtype=BF)

    def mm(a, b, kt):
        res = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for r in range(a.shape[0]):
            for c in range(b.shape[1]):
                acc = None
                for k0 in range(0, a.shape[1], kt):
                    terms = [
                        float(a[r, j]) * float(b[j, c]) for j in range(k0, min(k0 + kt, a.shape[1]))
                    ]
                    part = np.float32(math.fsum(terms))
                    acc = part if acc is None else np.float32(acc + part)
                res[r, c] = acc
        return res

    f = np.float32
    for e in range(d.num_experts):
        for tok, tb in chunks_of(cs[e + 1] - cs[e]):
            rows = slice(cs[e] + tok, cs[e] + tok + tb)
            gu = mm(x[rows], w13[e * h : (e + 1) * h], t.mm1_k)
            gate, up = _split(gu, d.gate_up_layout, i)
            if d.activation == "silu":
                a = (gate / (np.exp((gate * f(-1)).astype(np.float64)).astype(f) + f(1))) * up
            else:
                g = np.minimum(gate, f(d.limit))
                u = np.clip(up, -f(d.limit), f(d.limit))
                z = f(d.alpha) * g
                sig = f(1) / (np.exp((-z).astype(np.float64)).astype(f) + f(1))
                a = (u + f(d.beta)) * (g * sig)
            if p["round_activation"]:
                a = a.astype(BF).astype(np.float32)
            out[rows] = mm(a, w2[e * i : (e + 1) * i], t.mm2_k).astype(BF)
    return out


# ----------------------------------------------------------------------------- torch oracles
def torch_seed_golden(case, round_activation):
    """The seeds' golden procedure in torch ``F.linear``, checkpoint layout -> BF16 NumPy."""
    import torch
    import torch.nn.functional as F
    from tilesim.shared import unconvert_minimax_weights
    from tilesim.shared.interop import to_numpy, to_torch

    inp, d = case["inputs"], case["params"]["dims"]
    gate_up, down = unconvert_minimax_weights(*inp["weights"], d.num_experts)
    x = to_torch(inp["sorted_tokens"]).float()
    gu_t, dn_t = to_torch(gate_up).float(), to_torch(down).float()
    cs = np.asarray(inp["expert_cumsum"]).tolist()
    out = torch.zeros(x.shape, dtype=torch.bfloat16)
    i = d.intermediate_size
    for e in range(d.num_experts):
        if cs[e + 1] == cs[e]:
            continue
        gu = F.linear(x[cs[e] : cs[e + 1]], gu_t[e])
        gate, up = gu[:, :i], gu[:, i:]
        if d.activation == "silu":
            act = F.silu(gate) * up
        else:
            g = gate.clamp(max=d.limit)
            u = up.clamp(-d.limit, d.limit)
            act = (u + d.beta) * (g * torch.sigmoid(d.alpha * g))
        if round_activation:
            act = act.to(torch.bfloat16).float()
        out[cs[e] : cs[e + 1]] = F.linear(act, dn_t[e]).to(torch.bfloat16)
    return to_numpy(out)


def torch_seed_routing(logits, bias, k, normalize):
    """The seeds' ``route_tokens_to_experts`` in torch: (ids [N, k], weights [N, k]) tensors."""
    import torch

    w = torch.sigmoid(torch.from_numpy(logits).float())
    choice = w + torch.from_numpy(bias)
    _, idx = torch.topk(choice, k, dim=-1, sorted=False)
    tw = w.gather(1, idx)
    if normalize:
        tw = tw / tw.sum(dim=-1, keepdim=True)
    return idx, tw


def torch_host_combine(out_sorted, topk_weights, inv_perm, factor, shared):
    """The seeds' host post-processing in torch -> BF16 NumPy ``[N, H]``."""
    import torch
    from tilesim.shared.interop import to_numpy, to_torch

    n, k = topk_weights.shape
    o = to_torch(out_sorted)[: n * k]
    w = torch.from_numpy(topk_weights).to(torch.bfloat16)  # top_k_weights.to(hidden dtype)
    inv = torch.from_numpy(inv_perm)
    y = o[inv].view(n, k, -1).type(w.dtype).mul_(w.reshape(n, k).unsqueeze(-1)).sum(dim=1)
    y = y.type(torch.bfloat16) * factor
    if shared is not None:
        y = y + to_torch(shared)
    return to_numpy(y)


def dense_layer_oracle64(x, gate_up, down, topk_ids, topk_weights, dims, scale):
    """A whole routed swigluoai layer in float64, per token and slot (checkpoint layout
    ``gate_up [E, 2I, H]``, ``down [E, H, I]``). Returns (y64 [N, H], magnitude sum [N, H])."""
    i = dims.intermediate_size
    xf = _f64(x)
    gu_w, dn_w = _f64(gate_up), _f64(down)
    ref = np.zeros_like(xf)
    mag = np.zeros_like(xf)
    for t in range(xf.shape[0]):
        for j in range(topk_ids.shape[1]):
            e = topk_ids[t, j]
            gu = gu_w[e] @ xf[t]
            g = np.minimum(gu[:i], dims.limit)
            u = np.clip(gu[i:], -dims.limit, dims.limit)
            a = (u + dims.beta) * g / (1.0 + np.exp(-dims.alpha * g))
            wt = float(topk_weights[t, j])
            ref[t] += wt * (dn_w[e] @ a)
            mag[t] += abs(wt) * (np.abs(dn_w[e]) @ np.abs(a))
    return ref * scale, mag * abs(scale)
