"""Helpers of the DeepSeek-V3.2 case builders shared by the lightning indexer
(:mod:`~tilesim.reference.cases.dsa_indexer`), the two prologs
(:mod:`~tilesim.reference.cases.dsa_indexer_prolog`, :mod:`~tilesim.reference.cases.mla_prolog`)
and the layer step (:mod:`~tilesim.reference.cases.dsa_attention_step`):

* :func:`builder_arguments` -- a builder's ``seed`` and ``progress`` checked, and its
  parameters: the defaults, then the named table entry's, then the caller's overrides;
* :func:`table_case_info` -- the :class:`~tilesim.shared.registry.case_schema.CaseInfo` of a table
  entry ``(builder params, size, status, summary)`` (an FP8 path runs on the 950 only);
* :func:`new_token_rows` -- the sequences' lengths and new tokens (decode ``s1`` or prefill
  ``q_lens``), every sequence holding its new tokens;
* :func:`yarn_rope_inputs` -- the YaRN ``cos``/``sin`` table at the new tokens' positions in the
  path's form;
* :func:`index_key_cache` -- the paged index-key cache of the earlier tokens, one sequence at a
  time, with the slots no token occupies poisoned.
"""

from __future__ import annotations

import numpy as np
from tilesim.reference.util.progress import progress_bar
from tilesim.shared.layouts.index_cache import (
    FP8_TOKEN_BYTES,
    INDEX_DIM,
    fp8_page_views,
    scatter_tokens,
)
from tilesim.shared.quant import quantize_index_fp8, quantize_index_int8
from tilesim.shared.registry.case_schema import CaseInfo
from tilesim.shared.rope import halves_table, yarn_rope_table
from tilesim.shared.soc import SIM_SOCS, fp8_socs
from tilesim.shared.validate import (
    INT32_MAX,
    check_bool,
    check_choice,
    check_elements,
    check_int,
    check_int_sequence,
)

MODEL = "DeepSeek-V3.2"


# ----------------------------------------------------------------------------- parameters
def builder_arguments(builder: str, name, seed, progress, params: dict, defaults: dict,
                      table: dict) -> tuple[int, dict]:  # fmt: skip
    """``(seed, parameters)`` of one call of ``builder`` (its name, for the messages):
    ``seed`` an int ``>= 0``, ``progress`` a bool or None, ``name`` ``None`` or a key of
    ``table`` (name -> ``(builder params, ...)``), ``params`` keys of ``defaults``. The
    parameters are a new dict: ``defaults``, then the named entry's, then ``params``."""
    seed = check_int(seed, "seed", lo=0)
    if progress is not None:
        check_bool(progress, "progress")
    unknown = sorted(set(params) - set(defaults))
    if unknown:
        raise TypeError(f"{builder}: unknown parameter(s) {unknown}; expected some of "
                        f"{sorted(defaults)}")  # fmt: skip
    p = dict(defaults)
    if name is not None:
        check_choice(name, "name", sorted(table))
        p.update(table[name][0])
    p.update(params)
    return seed, p


def new_token_rows(p: dict, *, unit: str, seq_lo: int, seq_hi: int | None = None,
                   s1_hi: int | None = None, q_lo: int) -> tuple[int, ...]:  # fmt: skip
    """The new tokens of every sequence (``unit``: the word for one in the messages) of the
    builder parameters ``p``: ``s1`` each (decode, ``q_lens`` None) or ``q_lens`` (prefill).
    Checks, and stores back into ``p``, ``seq_lens`` (ints in ``[seq_lo, seq_hi]``, at least
    one) and ``s1`` (in ``[1, s1_hi]``); ``q_lens``: one int ``>= q_lo`` per sequence. Every
    sequence holds its new tokens (``seq_lens`` counts them); with no ``s1_hi``, ``s1`` is at
    most the longest sequence."""
    p["seq_lens"] = check_int_sequence(p["seq_lens"], "seq_lens", lo=seq_lo, hi=seq_hi)
    if not p["seq_lens"]:
        raise ValueError(f"seq_lens: expected at least one {unit}, got ()")
    n_b = len(p["seq_lens"])
    if p["q_lens"] is None:
        hi = max(p["seq_lens"]) if s1_hi is None else s1_hi
        p["s1"] = check_int(p["s1"], "s1", lo=1, hi=hi)
        rows = (p["s1"],) * n_b
    else:
        rows = check_int_sequence(p["q_lens"], "q_lens", lo=q_lo)
        if len(rows) != n_b:
            raise ValueError(f"q_lens: expected {n_b} values (one per {unit}), got {len(rows)}")
    for b, (n, ln) in enumerate(zip(rows, p["seq_lens"], strict=True)):
        if n > ln:
            raise ValueError(f"seq_lens[{b}]: expected >= {n} (the new tokens), got {ln}")
    return rows


def check_paged_cache(p: dict, width: int, what: str) -> int:
    """``block_size`` (``1 .. INT32_MAX``) and, where the builder takes it, ``spare_blocks``
    (``>= 0``) of the builder parameters ``p``, stored back, and the paged cache they size:
    every sequence's blocks and the spare ones, ``width`` values a row, at most
    ``MAX_ELEMENTS`` values (``ValueError`` naming the parameters and ``what``, the cache).
    Returns the cache's blocks."""
    p["block_size"] = bs = check_int(p["block_size"], "block_size", lo=1, hi=INT32_MAX)
    names, spare = "seq_lens, block_size", 0
    if "spare_blocks" in p:
        p["spare_blocks"] = spare = check_int(p["spare_blocks"], "spare_blocks", lo=0)
        names += ", spare_blocks"
    blocks = sum(-(-int(n) // bs) for n in p["seq_lens"]) + spare
    check_elements((blocks, bs, width), names, what)
    return blocks


# ----------------------------------------------------------------------------- registry
def table_case_info(name: str, table: dict, *, op: str, builder: str, tolerance: dict,
                    rule: str) -> CaseInfo:  # fmt: skip
    """The registry's description of ``table[name] = (builder params, size, status,
    summary)``, a case of family and op ``op`` with seed 0; SoC marks: the SoCs with FP8
    (:func:`tilesim.shared.soc.fp8_socs`) for ``path="fp8"``, else every simulated SoC;
    ``rule``: the note on the tolerance."""
    build, size, status, summary = table[name]
    fp8 = build.get("path") == "fp8"
    return CaseInfo(
        name=name, family=op, op=op, model=MODEL, summary=summary, seed=0, size=size,
        tolerance=tolerance, builder=builder, soc=fp8_socs() if fp8 else SIM_SOCS,
        status=status, notes={"rule": rule},
    )  # fmt: skip


# ----------------------------------------------------------------------------- inputs
def yarn_rope_inputs(path: str, positions: np.ndarray, max_seq_len: int) -> dict:
    """``{"cos", "sin"}``: the YaRN table of :mod:`tilesim.shared.rope` at ``positions``
    (``[T]``, each ``< max_seq_len``): FP32 ``[T, 32]`` on the ``"fp8"`` path, else BF16 halves
    ``[T, 64]`` (:func:`~tilesim.shared.rope.halves_table`)."""
    cos, sin = yarn_rope_table(positions, max_seq_len=max_seq_len)
    if path == "fp8":
        return {"cos": cos, "sin": sin}
    c2, s2 = halves_table(cos, sin)
    return {"cos": c2, "sin": s2}


def index_key_cache(path: str, keys_per_batch, table: np.ndarray, n_blocks: int,
                    block_size: int, rng, *, ue8m0: bool, poison: bool, progress, desc: str,
                    unit: str, all_tie: bool = False) -> dict:  # fmt: skip
    """The paged index-key cache holding the first ``keys_per_batch[b]`` tokens of every
    sequence ``b`` (block-table row ``table[b]``): standard normal FP32 keys ``[n, 128]``
    drawn from ``rng`` one sequence at a time, quantized by
    :func:`~tilesim.shared.quant.quantize_index_int8` (``path="int8"``: int8 codes ``[n_blocks,
    block_size, 128]``, FP16 scales ``[n_blocks, block_size]``) or
    :func:`~tilesim.shared.quant.quantize_index_fp8` (``ue8m0``; uint8 pages ``[n_blocks,
    block_size * 132]``). ``all_tie``: every key of sequence 0 is its first one. ``poison``:
    every slot no token occupies holds NaN scales and the code 0x7F (the E4M3 NaN; INT8 127).
    ``progress``, ``desc``, ``unit``: the bar of
    :func:`tilesim.reference.util.progress.progress_bar`. Returns ``{"k_cache", "k_scale"}`` (INT8)
    or ``{"k_cache"}`` (FP8 pages)."""
    int8 = path == "int8"
    if int8:
        codes = np.zeros((n_blocks, block_size, INDEX_DIM), dtype=np.int8)
        scales = np.zeros((n_blocks, block_size), dtype=np.float16)
    else:  # written in place into the pages
        pages = np.zeros((n_blocks, block_size * FP8_TOKEN_BYTES), dtype=np.uint8)
        codes, scales = fp8_page_views(pages, block_size=block_size)
    used = np.zeros((n_blocks, block_size), dtype=bool)
    bar = progress_bar(len(keys_per_batch), progress, desc, unit=unit)
    try:
        for b, n in enumerate(keys_per_batch):
            x = rng.standard_normal((n, INDEX_DIM), dtype=np.float32)
            if b == 0 and all_tie and n:
                x[:] = x[0]
            c, s = quantize_index_int8(x) if int8 else quantize_index_fp8(x, ue8m0=ue8m0)
            scatter_tokens(c, table[b], block_size, codes)
            scatter_tokens(s, table[b], block_size, scales)
            scatter_tokens(np.ones(n, dtype=bool), table[b], block_size, used)
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    if poison:
        scales[~used] = np.nan
        codes.view(np.uint8)[~used] = 0x7F
    return {"k_cache": codes, "k_scale": scales} if int8 else {"k_cache": pages}


__all__ = ["MODEL", "builder_arguments", "new_token_rows", "index_key_cache",
           "table_case_info", "yarn_rope_inputs"]  # fmt: skip
