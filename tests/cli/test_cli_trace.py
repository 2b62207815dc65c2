"""`tilesim trace`: the PNG is real, the recorded schedule is the kernel's loop nest."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
from tilesim.cli.plot import lane_keys, save_trace_png, summarize

CASE = "m3_case_smoke_edge"  # counts [1, 0, 3, 4], unroll {1, 2, 4}


def _expected_moe_chunks(counts, unroll):
    """Greedy largest-first split, written independently of tilesim.shared.loop_unroll_chunks."""
    out, row = [], 0
    for e, n in enumerate(counts):
        left, off = n, 0
        for f in sorted(set(unroll) | {1}, reverse=True):
            while left >= f:
                out.append((e, off, f, row + off))
                off += f
                left -= f
        row += n
    return out


def test_trace_png_and_records(cli, tmp_path):
    png = tmp_path / "t.png"
    rec = tmp_path / "t.jsonl"
    code, out, err = cli("trace", CASE, "--png", png, "--records", rec)
    assert code == 0, err
    w, h = cli.png_size(png)
    assert 400 <= w <= 3000 and 300 <= h <= 3000
    assert png.stat().st_size > 5_000  # something was drawn
    rows = [json.loads(line) for line in rec.read_text().splitlines()]
    got = [(r["expert"], r["token_offset"], r["chunk"], r["row0"]) for r in rows]
    assert got == _expected_moe_chunks([1, 0, 3, 4], [1, 2, 4])
    assert all(r["op"] == "moe_grouped_gemm" for r in rows)
    assert "ran 4 tiles" in out and "tile sizes [1, 2, 4]" in out


def test_trace_with_actual_draws_error_map(cli, tmp_path):
    assert cli("golden", CASE, "-o", tmp_path, "--format", "bin")[0] == 0
    g = np.fromfile(tmp_path / CASE / "golden_out.bin", dtype=ml_dtypes.bfloat16)
    g = g.reshape(8, 256).astype(np.float32)
    g[5, 100] += 50
    np.save(tmp_path / "act.npy", g.astype(ml_dtypes.bfloat16))
    code, out, err = cli(
        "trace", CASE, "--png", tmp_path / "e.png", "--actual", tmp_path / "act.npy"
    )
    assert code == 0, err
    assert "FAIL, 1 failing" in out
    _, h_err = cli.png_size(tmp_path / "e.png")
    assert cli("trace", CASE, "--png", tmp_path / "n.png")[0] == 0
    _, h_plain = cli.png_size(tmp_path / "n.png")
    assert h_err > h_plain  # the error panel adds height
    np.save(tmp_path / "wrong.npy", g[:4].astype(ml_dtypes.bfloat16))
    code, _, err = cli(
        "trace", CASE, "--png", tmp_path / "w.png", "--actual", tmp_path / "wrong.npy"
    )
    assert code == 2 and "mismatched file" in err and not (tmp_path / "w.png").exists()


def test_trace_refuses_to_overwrite_and_bad_paths(cli, tmp_path):
    png = tmp_path / "t.png"
    png.write_bytes(b"keep")
    code, _, err = cli("trace", CASE, "--png", png)
    assert code == 2 and "--force" in err and png.read_bytes() == b"keep"
    assert cli("trace", CASE, "--png", png, "--force")[0] == 0
    assert png.read_bytes()[:4] == b"\x89PNG"
    code, _, err = cli("trace", CASE, "--png", tmp_path / "nodir" / "x.png")
    assert code == 2 and "does not exist" in err
    code, _, err = cli("trace", CASE, "--png", tmp_path / "x.jpg")
    assert code == 2 and ".png" in err
    code, _, err = cli("trace", "no_such_case", "--png", tmp_path / "y.png")
    assert code == 2 and "unknown case" in err


def _attention_records():
    """Synthetic records shaped like an attention op's (2 batches x 2 heads x 3 KV tiles)."""
    rng = np.random.default_rng(0)
    recs = []
    for b in range(2):
        for h in range(2):
            for t in range(3):
                kv_len = 512 if t < 2 else 100 + 50 * b
                recs.append(
                    {
                        "op": "fake_attention",
                        "batch": b,
                        "kv_head": h,
                        "tile": t,
                        "kv_start": 512 * t,
                        "kv_len": kv_len,
                        "row_max": rng.normal(size=16).astype(np.float32),
                        "row_sum": rng.uniform(1, kv_len, size=16).astype(np.float32),
                    }
                )
    return recs


def test_attention_schedule_drawing(tmp_path):
    recs = _attention_records()
    assert lane_keys(recs) == ["batch", "kv_head"]
    info = summarize(recs)
    assert info["tiles"] == 12 and info["lanes"] == 4
    assert info["tile_sizes"] == [100, 150, 512]
    png = tmp_path / "a.png"
    g = np.zeros((64, 128), np.float32)
    a = g.copy()
    a[10:12, :] = 1e-2
    save_trace_png(png, title="synthetic", records=recs, actual=a, golden=g, atol=1e-3, rtol=0)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    save_trace_png(tmp_path / "empty.png", title="none", records=[])
    assert (tmp_path / "empty.png").stat().st_size > 1_000


def test_msa_decode_trace_is_the_kernels_chunk_loop(cli, tmp_path):
    """16 selected blocks x 128 keys in NTILE = 512 chunks, per (batch, KV head) (op-facts
    3.4): 4 lanes x 4 chunks, each with 16 query-head row statistics."""
    rec = tmp_path / "r.jsonl"
    code, out, err = cli("trace", "msa_decode_partial_nb17", "--png", tmp_path / "d.png",
                         "--records", rec)  # fmt: skip
    assert code == 0, err
    rows = [json.loads(line) for line in rec.read_text().splitlines()]
    assert [(r["batch"], r["kv_head"], r["kv_start"], r["kv_len"]) for r in rows] == [
        (0, h, c * 512, 512) for h in range(4) for c in range(4)
    ]
    assert all(len(r["row_max"]) == 16 and len(r["row_sum"]) == 16 for r in rows)
    # a row sum of exp(S - m) over 512 keys lies in [1, 512]
    assert all(1.0 <= v <= 512.0 for r in rows for v in r["row_sum"])
    assert "4 lanes (batch, kv_head)" in out
