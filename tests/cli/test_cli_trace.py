"""`tilesim trace` and the plotter: the PNG is real, the records follow the one trace schema
(tilesim.shared.trace), and the recorded schedule is the kernel's loop nest."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from tilesim.cli.plot import save_trace_png
from tilesim.cli.plot_trace import lane_keys, stat_panels, summarize, tile_extent
from tilesim.shared.trace import TRACE_KEYS, check_record, trace_record

CASE = "m3_case_smoke_edge"  # counts [1, 0, 3, 4], unroll {1, 2, 4}


def _expected_moe_chunks(counts, unroll):
    """Greedy largest-first split, written independently of tilesim.shared.loop_unroll_chunks:
    (expert, first row of sorted_tokens, rows)."""
    out, row = [], 0
    for e, n in enumerate(counts):
        left, off = n, 0
        for f in sorted(set(unroll) | {1}, reverse=True):
            while left >= f:
                out.append((e, row + off, f))
                off += f
                left -= f
        row += n
    return out


# ---------------------------------------------------------------------------------------------
# the plotter on schema records (no op involved)


def _attention_records():
    """2 batches x 2 KV heads x 3 key tiles of 512; the last tile partly used."""
    rng = np.random.default_rng(0)
    recs = []
    for b in range(2):
        for h in range(2):
            for t in range(3):
                used = 512 if t < 2 else 100 + 50 * b
                recs.append(
                    trace_record(
                        "fake_attention",
                        {"batch": b, "kv_head": h},
                        t,
                        (512 * t, 512 * t + 512),
                        keys_used=used,
                        row_max=rng.normal(size=16).astype(np.float32),
                        row_sum=rng.uniform(1, used, size=16).astype(np.float32),
                        flop=2 * 16 * used * 256,
                    )
                )
    return recs


def test_summary_reads_lanes_and_extents_from_the_schema():
    recs = _attention_records()
    assert all(tuple(check_record(r)) == TRACE_KEYS for r in recs)
    assert lane_keys(recs) == ["batch", "kv_head"]
    info = summarize(recs)
    assert info["tiles"] == 12 and info["lanes"] == 4
    assert info["tile_sizes"] == [100, 150, 512]  # keys_used, not the range width
    assert info["flop"] == sum(2 * 16 * r["keys_used"] * 256 for r in recs)
    assert [tile_extent(r) for r in recs[:3]] == [(0, 512), (512, 512), (1024, 512)]
    assert [k for k, _ in stat_panels(recs)] == ["row_max", "row_sum"]


def test_empty_lane_is_one_lane_and_head_max_comes_from_extra():
    """Indexer-shaped records: lane {}, one key block each, slot and head_max in extra."""
    recs = [
        trace_record("fake_indexer", {}, j, (128 * j, 128 * j + 128), slot=j - 1, head_max=[j, 2])
        for j in range(5)
    ]
    assert lane_keys(recs) == [] and summarize(recs)["lanes"] == 1
    assert [k for k, _ in stat_panels(recs)] == ["head_max"]


def test_moe_shaped_records_use_the_generic_lanes():
    recs = [
        trace_record("fake_moe", {"expert": e}, s, (r0, r0 + n), flop=6 * n)
        for s, (e, r0, n) in enumerate(_expected_moe_chunks([1, 0, 3, 4], [1, 2, 4]))
    ]
    info = summarize(recs)
    assert info["lane_keys"] == ["expert"] and info["lanes"] == 3  # expert 1 ran no tile
    assert info["tile_sizes"] == [1, 2, 4] and stat_panels(recs) == []


def test_drawings_are_real_pngs(cli, tmp_path):
    png = tmp_path / "a.png"
    g = np.zeros((64, 128), np.float32)
    a = g.copy()
    a[10:12, :] = 1e-2
    recs = _attention_records()
    save_trace_png(png, title="synthetic", records=recs, actual=a, golden=g, atol=1e-3, rtol=0)
    w, h = cli.png_size(png)
    assert png.stat().st_size > 10_000 and h > w * 0.8  # schedule + error maps
    idx = [trace_record("i", {}, j, (j, j + 1), slot=j - 1) for j in range(4)]
    save_trace_png(tmp_path / "i.png", title="indexer", records=idx)
    assert cli.png_size(tmp_path / "i.png")[1] < h
    save_trace_png(tmp_path / "empty.png", title="none", records=[])
    assert (tmp_path / "empty.png").stat().st_size > 1_000


def test_plotter_ignores_legacy_lane_keys():
    """A record with top-level keys such as "expert" instead of ``lane`` is refused, not guessed."""
    legacy = {"op": "x", "expert": 0, "row0": 0, "chunk": 4}
    with pytest.raises(KeyError):
        summarize([legacy])


# ---------------------------------------------------------------------------------------------
# the command (runs the ops: depends on their trace records)


def test_trace_png_and_records(cli, tmp_path):
    png = tmp_path / "t.png"
    rec = tmp_path / "t.jsonl"
    code, out, err = cli("trace", CASE, "--png", png, "--records", rec)
    assert code == 0, err
    w, h = cli.png_size(png)
    assert 400 <= w <= 3000 and 300 <= h <= 3000
    assert png.stat().st_size > 5_000  # something was drawn
    rows = [json.loads(line) for line in rec.read_text().splitlines()]
    assert all(set(r) == set(TRACE_KEYS) for r in rows)
    got = [(r["lane"]["expert"], r["key_range"][0], r["keys_used"]) for r in rows]
    assert got == _expected_moe_chunks([1, 0, 3, 4], [1, 2, 4])
    assert all(r["key_range"][1] - r["key_range"][0] == r["keys_used"] for r in rows)
    assert all(r["op"] == "moe_grouped_gemm" for r in rows)
    assert [r["step"] for r in rows if r["lane"]["expert"] == 3] == [0]  # one chunk of 4
    assert "ran 4 tiles" in out and "tile sizes [1, 2, 4]" in out


def _golden_bf16(tmp_path):
    g = np.fromfile(tmp_path / CASE / "golden_out.bin", dtype=ml_dtypes.bfloat16)
    return g.reshape(8, 256)


def test_trace_with_actual_draws_error_map(cli, tmp_path):
    assert cli("golden", CASE, "-o", tmp_path, "--format", "bin")[0] == 0
    g = np.fromfile(tmp_path / CASE / "golden_out.bin", dtype=ml_dtypes.bfloat16)
    g = g.reshape(8, 256).astype(np.float32)
    g[5, 100] += 50
    np.save(tmp_path / "act.npy", g.astype(ml_dtypes.bfloat16))
    code, out, err = cli(
        "trace", CASE, "--png", tmp_path / "e.png", "--actual", tmp_path / "act.npy"
    )
    assert code == 1, err  # a failing --actual is a failing trace, as in compare
    assert "FAIL, 1 failing" in out and (tmp_path / "e.png").exists()
    np.save(tmp_path / "same.npy", _golden_bf16(tmp_path))
    code, out, _ = cli("trace", CASE, "--actual", tmp_path / "same.npy")
    assert code == 0 and "PASS, 0 failing" in out
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


def test_msa_decode_trace_is_the_kernels_chunk_loop(cli, tmp_path):
    """16 selected blocks x 128 keys in NTILE = 512 chunks, per (batch, KV head)
    (docs/ops/msa.md): 4 lanes x 4 chunks, each with 16 query-head row statistics."""
    rec = tmp_path / "r.jsonl"
    code, out, err = cli("trace", "msa_decode_partial_nb17", "--png", tmp_path / "d.png",
                         "--records", rec)  # fmt: skip
    assert code == 0, err
    rows = [json.loads(line) for line in rec.read_text().splitlines()]
    assert [(r["lane"], tuple(r["key_range"])) for r in rows] == [
        ({"batch": 0, "kv_head": h}, (c * 512, c * 512 + 512)) for h in range(4) for c in range(4)
    ]
    assert all(len(r["row_max"]) == 16 and len(r["row_sum"]) == 16 for r in rows)
    # a row sum of exp(S - m) over at most 512 keys lies in [1, 512]
    assert all(1.0 <= v <= 512.0 for r in rows for v in r["row_sum"])
    assert "4 lanes (batch, kv_head)" in out


def test_indexer_panel_names_its_scores_not_a_softmax():
    """The indexer's row_max is the per-head max of a block's index scores (no softmax); its
    extra head_max holds the same values, so one panel shows them."""
    from tilesim.reference import msa_indexer

    rng = np.random.default_rng(3)
    q = rng.standard_normal((4, 128)).astype(ml_dtypes.bfloat16)
    k = rng.standard_normal((17 * 128, 128)).astype(ml_dtypes.bfloat16)
    recs: list = []
    msa_indexer(q, k, 17, trace=recs.append)
    panels = stat_panels(recs)
    assert [key for key, _ in panels] == ["row_max"]
    title = panels[0][1]
    assert "softmax" not in title and "index scores" in title and "head" in title


def test_masked_rows_are_left_out_of_the_softmax_panels():
    """A row with every key of the tile masked has m = score - 1e9 and l = the tile's key
    count; both are left out and the title says how many were."""
    from tilesim.cli.plot_trace import tile_stat

    recs = [
        trace_record("msa_main_branch", {"head": 0, "kv_head": 0}, 0, (0, 512),
                     row_max=[-1e9 + 2.0, 1.5, 3.0], row_sum=[512.0, 4.0, 6.0]),
        trace_record("msa_main_branch", {"head": 0, "kv_head": 0}, 1, (512, 1024),
                     row_max=[-1e9, -1e9 - 1.0, -1e9], row_sum=[512.0, 512.0, 512.0]),
    ]  # fmt: skip
    panels = dict(stat_panels(recs))
    assert set(panels) == {"row_max", "row_sum"}
    assert all("4 rows seeing no key" in t and "left out" in t for t in panels.values())
    assert tile_stat(recs[0], "row_max", drop_masked=True) == (1.5, 2.25, 3.0)
    assert tile_stat(recs[0], "row_sum", drop_masked=True) == (4.0, 5.0, 6.0)
    assert tile_stat(recs[1], "row_max", drop_masked=True) is None  # nothing left to draw


def test_main_branch_row_max_panel_is_not_swamped(cli, tmp_path):
    """msa_main_unaligned_100 has rows that see no key in some tiles (their m is near -1e9);
    the drawn row maxima stay in the range of real scaled scores."""
    from tilesim.cli.plot_trace import tile_stat

    rec = tmp_path / "r.jsonl"
    assert cli("trace", "msa_main_unaligned_100", "--records", rec)[0] == 0
    rows = [json.loads(line) for line in rec.read_text().splitlines()]
    raw = np.concatenate([np.asarray(r["row_max"], dtype=np.float64) for r in rows])
    assert raw.min() < -1e8  # the mask value is in the records
    panels = dict(stat_panels(rows))
    assert "left out" in panels["row_max"]
    drawn = [s for r in rows if (s := tile_stat(r, "row_max", drop_masked=True)) is not None]
    assert drawn and min(s[0] for s in drawn) > -100.0


def test_the_deepseek_indexer_panel_is_no_softmax():
    """The DeepSeek indexer's ``row_max`` is each query row's max index score over a block
    (``-inf`` for a row that sees none of it): its panel says so and leaves such rows out."""
    recs = [
        trace_record("dsa_indexer", {"b": 0}, j, (128 * j, 128 * j + 128), keys_used=128,
                     row_max=np.array([0.5, -np.inf if j == 2 else 0.25], np.float32),
                     flop=1, extra={"block": j, "rows": [0, 2]})
        for j in range(3)
    ]  # fmt: skip
    ((key, title),) = stat_panels(recs)
    assert key == "row_max" and "softmax" not in title and "mask" not in title
    assert title.startswith("per-block max of the FP32 index scores per query row")
    assert "1 rows seeing none of the block (-inf) left out" in title


# ---------------------------------------------------------------------------------------------
# the prologs and the layer step: drawn by stage, an error map per output

#: DeepSeek-V3.2's MLA dimensions (the published config.json: hidden_size 7168, q_lora_rank
#: 1536, 128 heads of qk_nope 128 + qk_rope 64, kv_lora_rank 512)
HIDDEN, Q_LORA, HEADS, NOPE, ROPE, KV_LORA = 7168, 1536, 128, 128, 64, 512
MLA_STAGES = ["q_a", "q_norm", "q_quant", "q_b", "absorb", "q_rope", "kv_a", "kv_norm",
              "kv_quant", "k_rope", "cache_write"]  # fmt: skip
MLA_CASE = "mla_prolog_int8_pad"


def _figure():
    from tilesim.cli.plot_figure import pyplot

    return pyplot().figure(figsize=(11, 8))


def _titles(fig) -> list[str]:
    """Every axes title and sub-figure title of ``fig``."""
    out = [ax.get_title() for ax in fig.get_axes()]
    subs = [fig, *fig.subfigs]
    while subs:
        f = subs.pop()
        subs += list(getattr(f, "subfigs", []))
        if f._suptitle is not None:
            out.append(f._suptitle.get_text())
    return out


@pytest.fixture(scope="module")
def mla_run(tmp_path_factory):
    """The records of one traced MLA prolog case and its golden outputs."""
    from tilesim.__main__ import main
    from tilesim.cli.tensorio import read_npz

    d = tmp_path_factory.mktemp("mla")
    assert main(["golden", MLA_CASE, "-o", str(d)]) == 0
    assert main(["trace", str(d / MLA_CASE), "--records", str(d / "r.jsonl")]) == 0
    recs = [json.loads(line) for line in (d / "r.jsonl").read_text().splitlines()]
    return recs, read_npz(d / MLA_CASE / "golden.npz"), read_npz(d / MLA_CASE / "inputs.npz")


def test_the_mla_prologs_records_are_its_stages_in_pipeline_order(mla_run):
    from tilesim.cli.plot_stages import stage_rows

    recs, gold, ins = mla_run
    rows = stage_rows(recs)
    assert [r["name"] for r in rows] == MLA_STAGES  # the INT8 path quantizes q_norm
    t = gold["query_nope"].shape[0]
    want = {
        "q_a": 2 * t * HIDDEN * Q_LORA,
        "q_b": 2 * t * Q_LORA * HEADS * (NOPE + ROPE),
        "absorb": 2 * t * HEADS * NOPE * KV_LORA,
        "kv_a": 2 * t * HIDDEN * (KV_LORA + ROPE),
    }
    assert {r["name"]: r["flop"] for r in rows if r["flop"]} == want  # fmt: skip
    by = {r["name"]: r for r in rows}
    # each stage's per-token max |result| is the golden output's where the stage is one
    q_rope = np.abs(gold["query_rope"].astype(np.float64)).reshape(t, -1).max(axis=1)
    assert np.array_equal(by["q_rope"]["amax"], q_rope)
    scale = np.abs(gold["q_norm_scale"].astype(np.float64)).reshape(t)
    assert np.array_equal(by["q_quant"]["amax"], scale)
    slots = np.asarray(ins["slot_mapping"]).reshape(-1)
    assert by["cache_write"]["slots"].tolist() == slots.tolist()
    assert by["cache_write"]["written"].tolist() == (slots >= 0).tolist()
    assert (slots < 0).any() and (slots >= 0).any()  # the case skips padding tokens


def test_the_prolog_picture_names_its_stages_not_a_softmax(mla_run):
    from tilesim.cli.plot_stages import is_staged
    from tilesim.cli.plot_trace import draw_schedule

    recs = mla_run[0]
    assert is_staged(recs)
    fig = _figure()
    draw_schedule(fig, recs)
    titles = " | ".join(_titles(fig))
    assert "softmax" not in titles and "dropped" not in titles
    assert "mla_prolog by stage" in titles and "matmul FLOPs per stage" in titles
    assert "grey = skipped (slot -1)" in titles
    labels = [t.get_text() for t in fig.get_axes()[0].get_yticklabels()]
    assert [lb.split(":")[0] for lb in labels] == MLA_STAGES
    n_written = int(sum(r["keys_used"] for r in recs if r["extra"]["stage"] == "cache_write"))
    assert labels[-1] == f"cache_write: {n_written} of 6 tokens written"


def test_a_nonfinite_stage_result_is_named_in_the_title():
    from tilesim.cli.plot_stages import stage_rows, stage_title
    from tilesim.shared.trace import emit_stage

    recs: list = []
    emit_stage(recs.append, "p", 0, "norm", np.array([[1.0, 2.0], [np.nan, 0.0]], np.float32))
    ((row,),) = [stage_rows(recs)]
    assert row["amax"][0] == 2.0 and np.isnan(row["amax"][1])
    assert "red = NaN / inf (1 token rows)" in stage_title("p", [row])
    emit_stage(None, "p", 0, "norm", object())  # no hook: the value is never read


def test_the_layer_step_is_one_panel_per_stage_in_order(cli, tmp_path):
    from tilesim.cli.plot_stages import stage_rows, stage_title
    from tilesim.cli.plot_trace import draw_schedule, op_groups

    rec = tmp_path / "r.jsonl"
    assert cli("trace", "dsa_attention_step_short_int8", "--records", rec)[0] == 0
    recs = [json.loads(line) for line in rec.read_text().splitlines()]
    ops = [op for op, _ in op_groups(recs)]
    assert ops[:3] == ["mla_prolog", "dsa_indexer_prolog", "dsa_indexer"]
    assert len(ops) == 4 and ops[3].startswith("sparse_attention")
    fig = _figure()
    draw_schedule(fig, recs)
    titles = _titles(fig)
    for j, op in enumerate(ops):
        assert any(t.startswith(f"stage {j + 1} of 4: {op}") for t in titles), (op, titles)
    # the softmax statistics are the attention's alone; the indexer's scores are no softmax
    soft = [t for t in titles if "softmax" in t]
    assert len(soft) == 2 and all(t.startswith("per-tile softmax row") for t in soft)
    assert any(t.startswith("per-block max of the FP32 index scores per query row") for t in titles)
    ip = stage_rows(dict(op_groups(recs))["dsa_indexer_prolog"])
    assert [r["name"] for r in ip] == ["q_linear", "q_rope", "q_hadamard", "q_quant", "k_linear",
                                       "k_layernorm", "k_rope", "k_hadamard", "k_quant",
                                       "weights", "cache_write"]  # fmt: skip
    assert stage_title("dsa_indexer_prolog", ip).startswith("dsa_indexer_prolog by stage, 11")


def test_distance_map_counts_ulps_and_code_steps():
    from tilesim.cli.plot_errors import distance_map

    g = np.array([[1.0, 2.0], [-1.0, 0.5]], ml_dtypes.bfloat16)
    bits = g.view(np.uint16).copy()
    bits[0, 1] += 3  # three BF16 steps away from 2.0 (same sign: magnitude bits)
    a = bits.view(ml_dtypes.bfloat16)
    a[1, 0] = np.nan
    d, unit = distance_map(a, g)
    assert d.tolist() == [[0, 3], [-1, 0]] and unit == "ULP in bfloat16"
    c = np.array([[5, -7, 127]], np.int8)
    d, unit = distance_map(c + np.array([[0, 2, -4]], np.int8), c)
    assert d.tolist() == [[0, 2, 4]] and unit.startswith("code steps")


def test_trace_actual_of_a_prolog_draws_an_error_map_per_output(cli, tmp_path, monkeypatch):
    """A dump with ``query_rope`` wrong on one token and two heads and one written
    ``kv_cache`` row off by 3 codes: one map per output, each named by stage and output, the
    errors where they were put."""
    import tilesim.cli.plot as plot
    from tilesim.cli import plot_errors
    from tilesim.cli.tensorio import read_npz, write_npz

    got = {}

    def spy(path, **kw):
        got.update(kw)
        return save(path, **kw)

    save = plot.save_trace_png
    monkeypatch.setattr(plot, "save_trace_png", spy)
    assert cli("golden", MLA_CASE, "-o", tmp_path)[0] == 0
    gold = read_npz(tmp_path / MLA_CASE / "golden.npz")
    d = {k: np.array(v) for k, v in gold.items() if v is not None}
    q = d["query_rope"].astype(np.float32)
    q[2, 5:7, :] *= 1.5
    d["query_rope"] = q.astype(ml_dtypes.bfloat16)
    slots = np.asarray(read_npz(tmp_path / MLA_CASE / "inputs.npz")["slot_mapping"]).reshape(-1)
    row = int(slots[slots >= 0][1])
    kv = d["kv_cache"].reshape(-1, KV_LORA)
    kv[row, 10:20] = np.clip(kv[row, 10:20].astype(np.int16) + 3, -128, 127).astype(np.int8)
    write_npz(tmp_path / "dump.npz", d)
    png = tmp_path / "e.png"
    code, out, err = cli("trace", tmp_path / MLA_CASE, "--actual", tmp_path / "dump.npz",
                         "--png", png)  # fmt: skip
    assert code == 1 and "first failing stage mla_prolog" in out, err
    n = int((slots >= 0).sum())
    assert f"traced 11 stages in pipeline order ({', '.join(MLA_STAGES)}); cache rows " \
        f"written for {n} of {slots.size} tokens" in out  # fmt: skip
    maps = {m.title.split(":")[0]: m for m in got["error_maps"]}
    assert set(maps) == {f"stage mla_prolog, {n}" for n in gold if gold[n] is not None}
    m = maps["stage mla_prolog, query_rope"]
    assert "FAIL" in m.title and m.unit == "ULP in bfloat16"
    assert m.values.shape == (6, HEADS * ROPE)
    bad = np.argwhere(m.values != 0)
    assert set(bad[:, 0]) == {2} and bad[:, 1].min() >= 5 * ROPE and bad[:, 1].max() < 7 * ROPE
    c = maps["stage mla_prolog, kv_cache"]
    assert c.row_label == "written slot" and c.row_names == sorted(slots[slots >= 0].tolist())
    r = c.row_names.index(row)
    assert np.flatnonzero(c.values[r]).tolist() == [j for j in range(10, 20)
                                                    if kv[row, j] != gold["kv_cache"].reshape(
                                                        -1, KV_LORA)[row, j]]  # fmt: skip
    assert not np.delete(c.values, r, axis=0).any()
    assert "PASS" in maps["stage mla_prolog, query_nope"].title
    assert not maps["stage mla_prolog, query_nope"].values.any()
    fig = _figure()
    plot_errors.draw_error_maps(fig, got["error_maps"])
    assert sum("ULP in bfloat16" in t for t in _titles(fig)) >= 2
    assert png.exists()
