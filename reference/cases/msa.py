"""Runnable test cases of the MSA goldens: the seeds' test matrices (``docs/ops/msa.md``, "Cases").

``msa_make_case(name)`` returns a :func:`tilesim.shared.registry.case_schema.make_case` dict such
that ``getattr(tilesim.reference, case["op"])(**case["inputs"], **case["params"])`` runs the golden.
``tolerance`` is the seeds' pass rule for a device result against that golden: mode ``"set"``
for block ids (each row holds the same set of ids), else mode ``"compare"`` with ``atol`` /
``rtol`` and ``ratio = 0`` (every element must pass). ``meta`` carries what the case was built
from (seed, builder parameters, selected block ids, ...). :data:`CASE_INFO` describes every
named MSA case for the registry.

Source of the matrices: ``hicann/pypto-gym`` (the MiniMax-M3 indexer, decode and main-branch
tests; ``docs/sources.md``). Data: NumPy ``default_rng(seed)`` normal samples. The seeds drew
theirs with ``torch.randn`` after ``torch.manual_seed``; the streams differ, so tensors (not
distributions) differ from the seeds' runs. The main branch's block ids follow the seeds'
procedure exactly (Python ``random.Random(seed)``, :func:`seeds_topk_indices`) and reproduce
the seeds' published ids.
"""

from __future__ import annotations

import math
import random

import numpy as np
from tilesim.shared.casts import to_bf16
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.msa_indexer import HEAD_REDUCES, check_indexer_seq_len
from tilesim.shared.msa_main import MAX_PREFILL_ROWS, build_msa_block_mask
from tilesim.shared.registry.case_schema import CaseInfo, make_case, tolerance
from tilesim.shared.registry.ops import golden_calls
from tilesim.shared.tiling import MSA_DTYPES
from tilesim.shared.validate import (
    check_bool,
    check_choice,
    check_elements,
    check_float,
    check_int,
    host_ints,
    is_array,
)

_CFG = MINIMAX_M3.msa
BY = _CFG.block_size
#: the ops a case of this family calls (the registry of ops)
_OPS = golden_calls("msa")
_SELECTS = ("indexer", "random")
BUILDER = "tilesim.reference.cases.msa:msa_make_case"

#: the seeds' pass rule per op (mode "set": id sets; "compare": every element within atol/rtol)
TOLERANCES = {
    "msa_indexer": tolerance(mode="set"),
    "msa_sparse_decode": tolerance(5e-2, 0.0, 0.0, "compare"),
    "msa_main_branch": tolerance(1e-3, 1e-3, 0.0, "compare"),
}

#: name -> case spec: "op", "seed", builder "params", "tolerance", optional "slow"
MSA_CASES: dict[str, dict] = {
    "msa_indexer_nb8": dict(op="msa_indexer", seed=8, params=dict(nb=8)),
    "msa_indexer_nb17": dict(op="msa_indexer", seed=17, params=dict(nb=17)),
    "msa_decode_e2e_nb17": dict(
        op="msa_sparse_decode", seed=17, params=dict(batch=1, nb=17, seq_len=2176)
    ),
    "msa_decode_partial_nb17": dict(
        op="msa_sparse_decode", seed=17, params=dict(batch=1, nb=17, seq_len=16 * 128 + 37)
    ),
}

_MAIN_TABLE = [  # name, n, seed, max_n
    ("msa_main_aligned_4096", 4096, 55, 4096),
    ("msa_main_aligned_2048", 2048, 42, 2048),
    ("msa_main_aligned_1024", 1024, 43, 2048),
    ("msa_main_unaligned_1500", 1500, 45, 2048),
    ("msa_main_unaligned_500", 500, 47, 2048),
    ("msa_main_unaligned_1", 1, 52, 2048),
    ("msa_main_unaligned_64", 64, 53, 2048),
    ("msa_main_unaligned_100", 100, 54, 2048),
]
for _name, _n, _seed, _max_n in _MAIN_TABLE:
    MSA_CASES[_name] = dict(
        op="msa_main_branch",
        seed=_seed,
        params=dict(n=_n, max_n=_max_n, dtype="fp32"),
        slow=_n >= 1024,
    )
for _spec in MSA_CASES.values():
    _spec["tolerance"] = dict(TOLERANCES[_spec["op"]])


def seeds_topk_indices(n: int, seed: int, *, bk: int = 128, topk: int = 16) -> np.ndarray:
    """The seeds' main-branch block choice, INT32 ``[min(topk, nb)]``.

    ``random.Random(seed)`` shuffles ``range(nb)``; the first ``ksel`` are taken; if the last
    block is missing, the position ``randrange(ksel)`` is overwritten with it.
    """
    nb = math.ceil(n / bk)
    ksel = min(topk, nb)
    rng = random.Random(seed)
    blocks = list(range(nb))
    rng.shuffle(blocks)
    sel = blocks[:ksel]
    if nb - 1 not in sel:
        sel[rng.randrange(ksel)] = nb - 1
    return np.asarray(sel, dtype=np.int32)


def _normal(rng: np.random.Generator, shape, scale: float) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)


def _scale(v, name: str) -> float:
    return check_float(v, name, positive=True, fp32=True)


# ----------------------------------------------------------------------------- indexer
def _indexer_case(rng, *, nb, seq_len=None, head_reduce="max", scale=0.1):
    nb = check_int(nb, "nb", lo=1)
    if seq_len is not None:
        seq_len = check_indexer_seq_len(seq_len, nb)
    check_choice(head_reduce, "head_reduce", HEAD_REDUCES)
    scale = _scale(scale, "scale")
    idx_q = to_bf16(_normal(rng, (_CFG.num_index_heads, _CFG.index_dim), scale))
    idx_k32 = _normal(rng, (nb * BY, _CFG.index_dim), scale)
    if seq_len is not None:
        idx_k32[seq_len:] = 0.0  # the cache holds zeros past the true length
    inputs = dict(idx_q=idx_q, idx_k=to_bf16(idx_k32))
    params = dict(nb=nb, seq_len=seq_len, head_reduce=head_reduce)
    return inputs, params, {}


# ----------------------------------------------------------------------------- decode
def _decode_lengths(seq_len, batch: int, nb: int) -> tuple[np.ndarray, bool]:
    """Builder ``seq_len`` (an int, a list/tuple of ints or an integer array) -> int64
    ``[batch]`` in ``[1, nb*128]`` and whether it was one int."""
    if isinstance(seq_len, (list, tuple)):
        for i, v in enumerate(seq_len):
            check_int(v, f"seq_len[{i}]")
        seq_len = np.asarray(seq_len, dtype=np.int64)
    if is_array(seq_len):
        seqs = host_ints(seq_len, "seq_len", ndim=1)
        if seqs.shape != (batch,):
            raise ValueError(f"seq_len: expected one int or {batch} values, got {seqs.shape}")
        one = False
    else:
        seqs = np.full(batch, check_int(seq_len, "seq_len"), dtype=np.int64)
        one = True
    bad = (seqs < 1) | (seqs > nb * BY)
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise ValueError(f"seq_len: expected 1 <= seq_len <= nb*{BY} = {nb * BY}, got {seqs[b]}")
    return seqs, one


def _decode_ids(rng, seqs, select: str, idx_scale: float):
    """Each batch row's selected block ids (and its indexer call when ``select="indexer"``)."""
    from tilesim.reference.msa_indexer import msa_indexer

    ids, idx_inputs = [], []
    for s in seqs.tolist():
        nb_b = math.ceil(s / BY)
        if select == "indexer":  # the model's glue: indexer over the row's own blocks
            iq = to_bf16(_normal(rng, (_CFG.num_index_heads, _CFG.index_dim), idx_scale))
            ik = _normal(rng, (nb_b * BY, _CFG.index_dim), idx_scale)
            ik[s:] = 0.0
            ik = to_bf16(ik)
            idx_inputs.append(dict(idx_q=iq, idx_k=ik, nb=nb_b, seq_len=s))
            ids.append(msa_indexer(iq, ik, nb_b, seq_len=s)[0])
        else:  # random unique past blocks plus the current block last
            k = min(_CFG.topk_blocks, nb_b)
            past = rng.permutation(nb_b - 1)[: k - 1]
            ids.append(np.concatenate([past, [nb_b - 1]]).astype(np.int32))
    if len({len(x) for x in ids}) != 1:
        raise ValueError(
            "seq_len: every batch row must select the same number of blocks "
            f"(min(16, ceil(seq_len/128))), got {[len(x) for x in ids]}"
        )
    return np.stack(ids).astype(np.int32), idx_inputs


def _decode_case(rng, *, batch=1, nb=17, seq_len=None, select="indexer", scale=0.05, idx_scale=0.1):
    batch = check_int(batch, "batch", lo=1)
    nb = check_int(nb, "nb", lo=1)
    check_elements((batch, _CFG.num_kv_heads, nb, BY, _CFG.head_dim), "batch, nb", "k_blocks")
    seqs, one = _decode_lengths(nb * BY if seq_len is None else seq_len, batch, nb)
    check_choice(select, "select", _SELECTS)
    scale, idx_scale = _scale(scale, "scale"), _scale(idx_scale, "idx_scale")
    hkv, hq, d = _CFG.num_kv_heads, _CFG.num_q_heads, _CFG.head_dim
    block_ids, idx_inputs = _decode_ids(rng, seqs, select, idx_scale)
    q = to_bf16(_normal(rng, (batch, hq, d), scale))
    k32 = _normal(rng, (batch, hkv, nb, BY, d), scale)
    v32 = _normal(rng, (batch, hkv, nb, BY, d), scale)
    for b in range(batch):  # cache rows past the row's length are zeros
        k32[b].reshape(hkv, nb * BY, d)[:, int(seqs[b]) :] = 0.0
        v32[b].reshape(hkv, nb * BY, d)[:, int(seqs[b]) :] = 0.0
    sl = int(seqs[0]) if one else seqs.copy()
    inputs = dict(q=q, k_blocks=to_bf16(k32), v_blocks=to_bf16(v32), block_ids=block_ids)
    meta = dict(block_ids=block_ids.copy())
    if idx_inputs:  # the indexer call of each batch row (msa_indexer(**meta["indexer"][b]))
        meta["indexer"] = idx_inputs
    return inputs, dict(seq_len=sl), meta


# ----------------------------------------------------------------------------- main branch
def _main_sizes(n, max_n, dtype, topk, bk, hq, hkv, dh) -> dict:
    sizes = {
        name: check_int(v, name, lo=1)
        for name, v in (("topk", topk), ("bk", bk), ("hq", hq), ("hkv", hkv), ("dh", dh))
    }
    sizes["n"] = check_int(n, "n", lo=1, hi=MAX_PREFILL_ROWS)
    if sizes["hq"] % sizes["hkv"]:
        raise ValueError(f"hq: expected a multiple of hkv={sizes['hkv']}, got {sizes['hq']}")
    check_choice(dtype, "dtype", MSA_DTYPES)
    n, topk, bk, hq, hkv, dh = (sizes[k] for k in ("n", "topk", "bk", "hq", "hkv", "dh"))
    check_elements((n, hq, dh), "n, hq, dh", "query")
    check_elements((topk * bk, hkv, dh), "topk, bk, hkv, dh", "key_blocks")
    check_elements((math.ceil(n / bk), topk, bk, bk), "n, topk, bk", "block_mask")
    nb = math.ceil(sizes["n"] / sizes["bk"])
    lo = nb * sizes["bk"]
    if max_n is None:
        sizes["max_n"] = max(2048, lo)
    else:
        sizes["max_n"] = check_int(max_n, "max_n", lo=lo, hi=MAX_PREFILL_ROWS)
    return sizes


def _main_case(rng, seed, *, n, max_n=None, dtype="fp32", topk=16, bk=128, hq=64, hkv=4, dh=128,
               topk_indices=None):  # fmt: skip
    z = _main_sizes(n, max_n, dtype, topk, bk, hq, hkv, dh)
    n, topk, bk, hq, hkv, dh = (z[k] for k in ("n", "topk", "bk", "hq", "hkv", "dh"))
    nb = math.ceil(n / bk)
    if topk_indices is None:
        ids = seeds_topk_indices(n, seed, bk=bk, topk=topk)
    else:
        ids = host_ints(topk_indices, "topk_indices", ndim=1).astype(np.int32)
    ksel = ids.size
    query = _normal(rng, (n, hq, dh), 1.0)
    key = _normal(rng, (n, hkv, dh), 1.0)
    value = _normal(rng, (n, hkv, dh), 1.0)

    def gather(x):  # pad to whole blocks, take the selected blocks, append zero slots
        pad = np.zeros((nb * bk, hkv, dh), dtype=np.float32)
        pad[:n] = x
        blocks = np.zeros((topk, bk, hkv, dh), dtype=np.float32)
        blocks[:ksel] = pad.reshape(nb, bk, hkv, dh)[ids]
        return blocks.reshape(topk * bk, hkv, dh)

    inputs = dict(
        query=query,
        key_blocks=gather(key),
        value_blocks=gather(value),
        block_mask=build_msa_block_mask(n, ids, bk=bk, topk=topk),
    )
    return inputs, dict(dtype=dtype, max_n=z["max_n"]), dict(topk_indices=ids.copy())


# ----------------------------------------------------------------------------- entry point
_BUILDERS = {
    "msa_indexer": (_indexer_case, ("nb", "seq_len", "head_reduce", "scale")),
    "msa_sparse_decode": (
        _decode_case,
        ("batch", "nb", "seq_len", "select", "scale", "idx_scale"),
    ),
    "msa_main_branch": (
        _main_case,
        ("n", "max_n", "dtype", "topk", "bk", "hq", "hkv", "dh", "topk_indices"),
    ),
}


def _resolve(name, seed, params: dict) -> tuple[str, dict, int]:
    """``(op, builder parameters, seed)`` of a named or ad-hoc request, checked."""
    params = dict(params)
    if name is not None:
        check_choice(name, "name", sorted(MSA_CASES))
        spec = MSA_CASES[name]
        op = spec["op"]
        if "op" in params and params.pop("op") != op:
            raise ValueError(f"op: case {name!r} runs {op!r}")
        build = {**spec["params"], **params}
        seed = spec["seed"] if seed is None else seed
    else:
        op = check_choice(params.pop("op", None), "op", _OPS)
        build = params
        seed = 0 if seed is None else seed
    seed = check_int(seed, "seed", lo=0)
    known = _BUILDERS[op][1]
    unknown = sorted(set(build) - set(known))
    if unknown:
        raise ValueError(f"params: {op!r} takes builder parameters {known}, got unknown {unknown}")
    return op, build, seed


def msa_make_case(
    name: str | None = None, *, seed: int | None = None, progress: bool | None = None, **params
) -> dict:
    """Build one case: a named entry of :data:`MSA_CASES` (``params`` override its builder
    parameters) or, with ``name=None``, an ad-hoc case from ``op=...`` plus builder parameters.

    Builder parameters per op:

    * ``msa_indexer``: ``nb``, ``seq_len=None``, ``head_reduce="max"``, ``scale=0.1``.
    * ``msa_sparse_decode``: ``batch=1``, ``nb=17``, ``seq_len`` (int or one per row; default
      ``nb*128``), ``select="indexer"|"random"``, ``scale=0.05``, ``idx_scale=0.1``.
    * ``msa_main_branch``: ``n``, ``max_n=None`` (``max(2048, ceil(n/bk)*bk)``),
      ``dtype="fp32"``, ``topk=16``, ``bk=128``, ``hq=64``, ``hkv=4``, ``dh=128``,
      ``topk_indices=None`` (seeds' procedure with ``seed``).

    ``progress``: ``True`` / ``False`` / ``None``, accepted for the common builder interface
    (these builders draw no progress bar). Every argument is checked (``ValueError`` /
    ``TypeError`` naming it). Returns the :func:`tilesim.shared.registry.case_schema.make_case`
    dict; identical arguments give identical arrays.
    """
    if progress is not None:
        check_bool(progress, "progress")
    op, build, seed = _resolve(name, seed, params)
    rng = np.random.default_rng(seed)
    builder = _BUILDERS[op][0]
    if op == "msa_main_branch":
        inputs, op_params, meta = builder(rng, seed, **build)
    else:
        inputs, op_params, meta = builder(rng, **build)
    return make_case(
        name=name,
        op=op,
        inputs=inputs,
        params=op_params,
        tolerance=dict(TOLERANCES[op]),
        meta={"seed": seed, "builder_params": dict(build), **meta},
    )


# ----------------------------------------------------------------------------- registry
_RULES = {
    "msa_indexer": "set equality of block ids (order ignored); tilesim fixes the order: "
    "score descending, local block last",
    "msa_sparse_decode": "max |a-g| < 5e-2",
    "msa_main_branch": "every element |a-g| <= 1e-3 + 1e-3*|g|",
}
_KINDS = {"msa_indexer": "indexer", "msa_sparse_decode": "decode", "msa_main_branch": "main_branch"}


def _info(name, op, seed, size, summary, *, status="runs", soc=(), builder_params=None, **notes):
    return CaseInfo(
        name=name,
        family="msa",
        op=op,
        model="MiniMax-M3",
        summary=summary,
        seed=seed,
        size=size,
        tolerance=dict(TOLERANCES[op]),
        builder=BUILDER,
        kind=_KINDS[op],
        soc=tuple(soc),
        status=status,
        builder_params=dict(builder_params or {}),
        notes={"rule": _RULES[op], **notes},
    )


def _case_info() -> dict[str, CaseInfo]:
    dec = "msa_sparse_decode"
    infos = [
        _info("msa_indexer_nb8", "msa_indexer", 8, "small",
              "nb 8 (short-context guard: arange), randn*0.1"),
        _info("msa_indexer_nb17", "msa_indexer", 17, "small",
              "nb 17 (shortest sparse path), randn*0.1"),
        _info("msa_decode_e2e_nb17", dec, 17, "small",
              "B 1, nb 17, seq_len 2176 (aligned), topk 16 from the indexer, q/k/v randn*0.05",
              status="skip: large (needs a full free die)"),
        _info("msa_decode_partial_nb17", dec, 17, "small",
              "B 1, nb 17, seq_len 2085 (current block holds 37 of 128 keys), topk 16, "
              "q/k/v randn*0.05", status="tilesim extra",
              status_note="the partial current block the seeds' docstring mentions but never "
              "tests"),
        _info("msa_decode_b64_nb17", dec, 0, "medium",
              "B 64, nb 17, seq_len 2176, topk 16 (indexer selection per row), q/k/v randn*0.05",
              status="tilesim extra", status_note="the speed case: a decode batch of 64",
              builder_params={"case": None, "op": dec, "batch": 64, "nb": 17, "seq_len": 2176}),
    ]  # fmt: skip
    for name, n, seed, max_n in _MAIN_TABLE:
        nb = math.ceil(n / 128)
        size = "large" if n >= 2048 else "medium" if n >= 500 else "small"
        summary = f"n {n}, max_n {max_n}, {nb} blocks, {min(16, nb)} selected, fp32"
        infos.append(
            _info(name, "msa_main_branch", seed, size, summary, soc=("950", "910b"),
                  soc_note="one stored revision marks 950 only")
        )  # fmt: skip
    return {i.name: i for i in infos}


#: every named MSA case (the :data:`MSA_CASES` entries and ``msa_decode_b64_nb17``, an ad-hoc
#: build registered by name: ``builder_params["case"] = None`` tells the CLI runner to call
#: ``msa_make_case(None, seed=info.seed, **other builder_params)``)
CASE_INFO: dict[str, CaseInfo] = _case_info()

__all__ = ["CASE_INFO", "MSA_CASES", "TOLERANCES", "msa_make_case", "seeds_topk_indices"]
