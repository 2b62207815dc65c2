"""Wrong outputs built from small reference goldens: each mutation class of the judge's
calibration, on every op it applies to (docs/numerics.md, "Judging an output").

:func:`float_mutations` returns ``{class name: wrong output}`` for one op's golden dict
(:mod:`judge.goldens`); classes that need the op's inputs re-run the reference with one input
changed (a wrong softmax scale, a dropped mask, a missed tail chunk).

:func:`small_mutations` returns the smallest faults a user would call a bug: one row, one head
of every token, one block of rows (a KV group's heads, a token's heads, an expert's tokens) or
the whole output scaled by ``1 + 2u``, ``1.01`` or ``1.02`` (``u`` the unit roundoff of the
rounding the output carries: BF16 ``2^-8``). One element a few ULPs off is not among them
(a correct kernel can do that).
"""

from __future__ import annotations

import numpy as np


def _like(x64: np.ndarray, g: np.ndarray) -> np.ndarray:
    return x64.astype(np.float32).astype(g.dtype)


def _rows(g: np.ndarray) -> np.ndarray:
    return g.astype(np.float64).reshape(-1, g.shape[-1])


def _big_row(g: np.ndarray) -> int:
    """The row with the largest golden norm (a deterministic, meaningful target)."""
    return int(np.argmax(np.linalg.norm(_rows(g), axis=1)))


def generic(g: np.ndarray) -> dict:
    """The classes that need only the golden."""
    r64 = _rows(g)
    rms = float(np.sqrt(np.mean(r64**2)))
    out = {"all zeros": np.zeros_like(g), "constant": _like(np.full(g.shape, rms), g)}
    b = _big_row(g)
    x = r64.copy()
    x[b] *= 1.25
    out["one row scaled x1.25"] = _like(x.reshape(g.shape), g)
    x = r64.copy()
    x[b] += 0.25 * float(np.sqrt(np.mean(r64[b] ** 2)))
    out["one row shifted"] = _like(x.reshape(g.shape), g)
    out["rows off by one"] = _like(np.roll(r64, 1, axis=0).reshape(g.shape), g)
    for what, val in (("single NaN", np.nan), ("single Inf", np.inf)):
        x = g.copy()
        x.reshape(-1)[g.size // 2] = val
        out[what] = x
    return out


def _swap_heads(g: np.ndarray, axis: int, other: int) -> np.ndarray:
    """Heads 0 and ``other`` swapped (``other`` in another KV group where the op has groups:
    the decode case's small query scale makes its softmax near uniform, so the heads of one
    group agree to about one BF16 ULP and a swap inside a group is no error at that dtype)."""
    x = g.copy()
    i0, i1 = [slice(None)] * g.ndim, [slice(None)] * g.ndim
    i0[axis], i1[axis] = 0, other
    x[tuple(i0)], x[tuple(i1)] = g[tuple(i1)], g[tuple(i0)]
    return x


def msa_decode(d: dict) -> dict:
    g, case = d["golden"], d["case"]
    q = case["inputs"]["q"]
    seq = int(case["params"]["seq_len"])
    x = g.astype(np.float64)
    x[:, 5] *= 1.25
    return {
        "one head scaled x1.25": _like(x, g),
        "two heads swapped": _swap_heads(g, 1, g.shape[1] - 1),
        "wrong softmax scale (x2)": d["rerun"](q=(q.astype(np.float32) * 2).astype(q.dtype)),
        "dropped mask (future keys of the current block read)": d["rerun"](seq_len=17 * 128),
        "missed tail chunk": d["rerun"](seq_len=seq - seq % 128),
    }


def msa_main(d: dict) -> dict:
    g, i = d["golden"], d["case"]["inputs"]
    x = g.astype(np.float64)
    x[:, 3] *= 1.25
    tail = g.copy()
    tail[64:] = 0  # the last query chunk never written
    return {
        "one head scaled x1.25": _like(x, g),
        "two heads swapped": _swap_heads(g, 1, g.shape[1] - 1),
        "wrong softmax scale (x2)": d["rerun"](query=i["query"] * np.float32(2)),
        "dropped mask (future tokens read)": d["rerun"](block_mask=np.ones_like(i["block_mask"])),
        "missed tail chunk": tail,
    }


def dsa(d: dict) -> dict:
    g, case = d["golden"], d["case"]
    i, p = case["inputs"], case["params"]
    x = g.astype(np.float64)
    b = _big_row(g) // 4 * 4
    x[b : b + 4, 128:256] = x[b : b + 4, 128:256] * 1.25 + 1
    topk, seqs = i["topk_indices"], i["kv_act_seqs"]
    tok_batch = np.arange(topk.shape[0]) // (topk.shape[0] // len(seqs))
    unmasked = topk.copy()
    cols = np.arange(topk.shape[1])
    for t, bb in enumerate(tok_batch):
        gone = unmasked[t] == -1
        unmasked[t, gone] = cols[gone] % int(seqs[bb])
    tail = topk.copy()
    for t, bb in enumerate(tok_batch):
        cut = int(seqs[bb]) // 64 * 64
        tail[t, tail[t] >= max(cut, 1)] = -1
    return {
        "one 4x128 block scaled x1.25 + 1": _like(x, g),
        "two heads swapped": _swap_heads(g, 0, p["nq"] - 1),
        "wrong softmax scale (x2)": d["rerun"](softmax_scale=2 * p["softmax_scale"]),
        "dropped mask (masked keys read)": d["rerun"](topk_indices=unmasked),
        "missed tail chunk": d["rerun"](topk_indices=tail),
    }


def moe(d: dict) -> dict:
    g, cs = d["golden"], np.asarray(d["case"]["inputs"]["expert_cumsum"])
    e = int(np.argmax(np.diff(cs)))
    x = g.astype(np.float64)
    x[cs[e] : cs[e + 1]] *= 1.25
    tail = g.copy()
    tail[cs[e + 1] - 1 : cs[e + 1]] = 0  # the expert's last row chunk never written
    return {"one expert scaled x1.25": _like(x, g), "missed tail chunk": tail}


SPECIFIC = {"msa_decode": msa_decode, "msa_main": msa_main, "dsa": dsa, "moe": moe}


def float_mutations(d: dict) -> dict:
    return {**generic(d["golden"]), **SPECIFIC[d["op"]](d)}


def id_mutations(ids: np.ndarray, scores: np.ndarray, r: int = 0) -> dict:
    """Wrong id outputs of a ``[rows, k]`` selection with golden ``scores [rows, n]``, on row
    ``r``: one wrong id (the lowest-scored unselected visible candidate -- finite score --
    replaces the highest-scored selected one), a duplicate id, and a selection cut short (one
    id replaced by the -1 padding)."""
    out = {}
    sel = [int(i) for i in ids[r] if i >= 0]
    chosen = set(sel)
    unsel = [int(c) for c in np.flatnonzero(np.isfinite(scores[r])) if int(c) not in chosen]
    top = max(sel, key=lambda c: float(scores[r, c]))
    low = min(unsel, key=lambda c: float(scores[r, c]))
    x = ids.copy()
    x[r, list(ids[r]).index(top)] = low
    out["one wrong id"] = x
    x = ids.copy()
    x[r, 1] = x[r, 0]
    out["duplicate id"] = x
    x = ids.copy()
    x[r, 0] = -1
    out["missing id (padding)"] = x
    return out


#: the scale factors of the small mutations, by name (``u``: the output's unit roundoff)
SMALL_SCALES = {"1+2u": None, "1.01": 1.01, "1.02": 1.02}


def _scaled(g: np.ndarray, where, factor: float) -> np.ndarray:
    """``g`` with ``g[where]`` scaled by ``factor`` (in float64, rounded once to ``g``'s dtype)."""
    x = g.astype(np.float64)
    x[where] *= factor
    return _like(x, g)


def _targets(d: dict) -> dict:
    """``{target name: index}`` of the small mutations of one op's golden: one row (the
    largest), one head / row block, one head of every token, and the whole output."""
    g = d["golden"]
    op = d["op"]
    if op == "moe":
        cs = np.asarray(d["case"]["inputs"]["expert_cumsum"])
        e = int(np.argmax(np.diff(cs)))
        b = _big_row(g)
        return {"one token": (b,), f"expert {e}'s {cs[e + 1] - cs[e]} tokens":
                (slice(int(cs[e]), int(cs[e + 1])),), "every token": (slice(None),)}  # fmt: skip
    if op == "dsa":
        nq = int(d["case"]["params"]["nq"])
        b = _big_row(g)
        t = b // nq
        return {f"one head (row {b})": (b,), f"token {t}'s {nq} heads":
                (slice(t * nq, (t + 1) * nq),), "head 5 of every token": (slice(5, None, nq),),
                "every head": (slice(None),)}  # fmt: skip
    # MSA decode [B, H, D], main branch [n, H, D]: 16 query heads share a KV head
    rows = g.reshape(-1, g.shape[1], g.shape[-1]).astype(np.float64)
    tok = int(np.argmax(np.linalg.norm(rows[:, 5], axis=-1)))
    return {f"head 5 of token {tok}": (tok, 5), f"token {tok}'s KV-group 1 heads (16..31)":
            (tok, slice(16, 32)), "head 5 of every token": (slice(None), 5),
            "every head": (slice(None),)}  # fmt: skip


def small_mutations(d: dict, u: float) -> dict:
    """``{"<target> x<scale>": wrong output}``: each target of :func:`_targets` scaled by each
    factor of :data:`SMALL_SCALES` (``1 + 2u`` with the given unit roundoff ``u``)."""
    out = {}
    for target, where in _targets(d).items():
        for label, f in SMALL_SCALES.items():
            out[f"{target} x{label}"] = _scaled(d["golden"], where, 1 + 2 * u if f is None else f)
    return out


def ulp_flips(g: np.ndarray, fraction: float, mantissa: int, seed: int = 0) -> np.ndarray:
    """``g`` with ``fraction`` of the nonzero elements of each row moved by one ULP of a
    ``mantissa``-bit significand (BF16 7, FP16 10, FP32 23: the rounding the output carries),
    up or down at random: what rounding flips of a correct kernel do (a value near a rounding
    midpoint rounded the other way)."""
    r = g.reshape(-1, g.shape[-1]).astype(np.float64)
    rng = np.random.default_rng(seed)
    k = max(1, int(round(fraction * r.shape[1])))
    for i in range(r.shape[0]):
        cols = rng.choice(r.shape[1], size=k, replace=False)
        cols = cols[r[i, cols] != 0]
        ulp = np.ldexp(1.0, np.frexp(np.abs(r[i, cols]))[1] - 1 - mantissa)
        r[i, cols] += rng.choice(np.array([-1.0, 1.0]), size=cols.size) * ulp
    return r.reshape(g.shape).astype(np.float32).astype(g.dtype)
