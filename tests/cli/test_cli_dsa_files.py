"""A DeepSeek golden read back the way a C++/Ascend harness would: raw .bin files, shapes and
dtypes from manifest.json only, packed cache rows decoded from their byte offsets (the PyPTO
row layout of docs/sources.md, "DeepSeek sparse attention"), and the golden checked against a
dense float64 attention written here."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np

CASE = "sfa_bf16_b4_s2_seq64K_total_fp8_d"  # b 4, s1 2, act [65536, 16381, 666, 15]


def _read(d, entry, dtype):
    a = np.fromfile(d / entry["file"], dtype=np.dtype(dtype).newbyteorder("<"))
    assert a.size * a.itemsize == entry["nbytes"]
    return a.reshape(entry["shape"])


def test_dsa_bin_golden_against_a_dense_float64_oracle(cli, tmp_path):
    code, _, err = cli("golden", CASE, "-o", tmp_path, "--format", "bin")
    assert code == 0, err
    assert err == ""  # the op's own progress bar is switched off without a terminal
    d = tmp_path / CASE
    m = json.loads((d / "manifest.json").read_text())
    t = {e["name"]: e for e in m["tensors"]}
    assert t["nope_cache"]["dtype"] == "float8_e4m3fn" and t["nope_cache"]["shape"][1] == 656
    assert m["tiling"]["s_kv_tile"] == 2048 and m["tiling"]["softmax"] == "per_tile"
    # the manifest documents the packed row (decoded below by its byte offsets)
    fields = t["nope_cache"]["row_fields"]
    assert [f.split(":")[0] for f in fields] == ["bytes 0..511", "bytes 512..639", "bytes 640..655"]
    assert "rope" in fields[1] and "scales" in fields[2] and t["nope_cache"]["row_bytes"] == 656
    cache = _read(d, t["nope_cache"], np.uint8)  # raw bytes
    qn = _read(d, t["query_nope"], np.uint16).view(ml_dtypes.bfloat16)
    qr = _read(d, t["query_rope"], np.uint16).view(ml_dtypes.bfloat16)
    ti = _read(d, t["topk_indices"], np.int32)
    bt = _read(d, t["block_table"], np.int32)
    acts = _read(d, t["kv_act_seqs"], np.int32)
    out = _read(d, t["out"], np.uint16).view(ml_dtypes.bfloat16).astype(np.float64)
    assert acts.tolist() == [65536, 16381, 666, 15]
    scale = m["params"]["softmax_scale"]
    nq, s1, bs = 128, 2, 128
    for b, s in ((3, 0), (3, 1), (2, 1), (0, 0)):
        r = b * s1 + s
        cur = min(max(int(acts[b]) - s1 + 1 + s, 0), 2048)
        idx = ti[r, :cur].astype(np.int64)
        phys = bt[b, idx // bs].astype(np.int64) * bs + idx % bs
        rows = cache[phys]
        nope = rows[:, :512].copy().view(ml_dtypes.float8_e4m3fn).astype(np.float32)
        rope = rows[:, 512:640].copy().view("<u2").view(ml_dtypes.bfloat16).astype(np.float64)
        sc = rows[:, 640:656].copy().view("<f4")
        kn = (nope.reshape(cur, 4, 128) * sc[:, :, None]).reshape(cur, 512)
        kn = kn.astype(ml_dtypes.bfloat16).astype(np.float64)  # dequantized BF16 latent
        k = np.concatenate([kn, rope], axis=1)
        q = np.concatenate([qn[r * nq : (r + 1) * nq], qr[r * nq : (r + 1) * nq]], axis=1)
        sc64 = q.astype(np.float64) @ k.T * scale
        p = np.exp(sc64 - sc64.max(axis=1, keepdims=True))
        pn = p / p.sum(axis=1, keepdims=True)
        o = pn @ kn
        g = out[r * nq : (r + 1) * nq]
        # budget (BF16 unit roundoff u = 2^-8): normalised P rounded to BF16 (each term off by
        # <= u relative, the sum by <= u * sum P|V|), the output rounded to BF16 (u |o|), and
        # FP32 noise in scores/exp
        u = 2.0**-8
        bound = u * (pn @ np.abs(kn)) + u * np.abs(o) + 1e-6
        assert np.all(np.abs(g - o) <= bound), (b, s, float((np.abs(g - o) / bound).max()))
        assert np.corrcoef(g.ravel(), o.ravel())[0, 1] > 0.9999


def test_progress_flag_reaches_the_deepseek_builder_and_op():
    from tilesim.cli.registry import get_case
    from tilesim.cli.runner import build_case

    spec = get_case(CASE)
    assert build_case(spec).op_args["progress"] is False  # default: silent
    assert build_case(spec, progress=True).op_args["progress"] is True
