"""Runnable test cases of the MSA goldens: the seeds' test matrices (``op-facts`` §2.8, §3.8, §4.8).

``msa_make_case(name)`` returns ``{"name", "op", "inputs", "params", "tolerance", "meta"}``
such that ``getattr(tilesim.reference, case["op"])(**case["inputs"], **case["params"])`` runs
the golden. ``tolerance`` is the seeds' pass rule for a device result against that golden
(``{"compare": "set"}`` for block ids, else ``atol``/``rtol``/``ratio`` for
:func:`tilesim.reference.compare`). ``meta`` carries what the case was built from (seed,
selected block ids, ...).

Data: NumPy ``default_rng(seed)`` normal samples. The seeds drew theirs with ``torch.randn``
after ``torch.manual_seed``; the streams differ, so tensors (not distributions) differ from
the seeds' runs. The main branch's block ids follow the seeds' procedure exactly (Python
``random.Random(seed)``, :func:`seeds_topk_indices`) and reproduce the ids of ``op-facts``
§4.8.
"""

from __future__ import annotations

import math
import random

import numpy as np
from tilesim.shared.casts import to_bf16
from tilesim.shared.models import MINIMAX_M3

_CFG = MINIMAX_M3.msa

#: name -> case spec: "op", "seed", builder "params", "tolerance", optional "slow"
MSA_CASES: dict[str, dict] = {
    # lightning indexer (op-facts §2.8): set equality of the selected ids
    "msa_indexer_nb8": dict(
        op="msa_indexer", seed=8, params=dict(nb=8), tolerance={"compare": "set"}
    ),
    "msa_indexer_nb17": dict(
        op="msa_indexer", seed=17, params=dict(nb=17), tolerance={"compare": "set"}
    ),
    # block-sparse decode (op-facts §3.8): max |out - golden| < 5e-2
    "msa_decode_e2e_nb17": dict(
        op="msa_sparse_decode",
        seed=17,
        params=dict(batch=1, nb=17, seq_len=2176),
        tolerance={"atol": 5e-2, "rtol": 0.0, "ratio": 0.0},
    ),
    "msa_decode_partial_nb17": dict(
        op="msa_sparse_decode",
        seed=17,
        params=dict(batch=1, nb=17, seq_len=16 * 128 + 37),
        tolerance={"atol": 5e-2, "rtol": 0.0, "ratio": 0.0},
    ),
}

# main branch (op-facts §4.8): every element |a - e| <= 1e-3 + 1e-3*|e|
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
        tolerance={"atol": 1e-3, "rtol": 1e-3, "ratio": 0.0},
        slow=_n >= 1024,
    )


def seeds_topk_indices(n: int, seed: int, *, bk: int = 128, topk: int = 16) -> np.ndarray:
    """The seeds' main-branch block choice (``op-facts`` §4.7 step 2), INT32 ``[min(topk, nb)]``.

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


def _indexer_case(rng, *, nb, seq_len=None, head_reduce="max", scale=0.1):
    by = _CFG.block_size
    idx_q = to_bf16(_normal(rng, (_CFG.num_index_heads, _CFG.index_dim), scale))
    idx_k32 = _normal(rng, (nb * by, _CFG.index_dim), scale)
    if seq_len is not None:
        idx_k32[seq_len:] = 0.0  # the cache holds zeros past the true length
    inputs = dict(idx_q=idx_q, idx_k=to_bf16(idx_k32))
    params = dict(nb=nb, seq_len=seq_len, head_reduce=head_reduce)
    return inputs, params, {}


def _decode_case(rng, *, batch=1, nb=17, seq_len=None, select="indexer", scale=0.05, idx_scale=0.1):
    from tilesim.reference.msa_lightning_indexer import msa_indexer

    by, hkv, hq, d = _CFG.block_size, _CFG.num_kv_heads, _CFG.num_q_heads, _CFG.head_dim
    seq_len = nb * by if seq_len is None else seq_len
    seqs = np.broadcast_to(np.asarray(seq_len, dtype=np.int64), (batch,))
    ids, idx_inputs = [], []
    for b in range(batch):
        nb_b = math.ceil(int(seqs[b]) / by)
        if select == "indexer":  # the model's glue: indexer over the row's own blocks
            iq = to_bf16(_normal(rng, (_CFG.num_index_heads, _CFG.index_dim), idx_scale))
            ik = _normal(rng, (nb_b * by, _CFG.index_dim), idx_scale)
            ik[int(seqs[b]) :] = 0.0
            ik = to_bf16(ik)
            idx_inputs.append(dict(idx_q=iq, idx_k=ik, nb=nb_b, seq_len=int(seqs[b])))
            ids.append(msa_indexer(iq, ik, nb_b, seq_len=int(seqs[b]))[0])
        elif select == "random":  # random unique past blocks plus the current block last
            k = min(_CFG.topk_blocks, nb_b)
            past = rng.permutation(nb_b - 1)[: k - 1]
            ids.append(np.concatenate([past, [nb_b - 1]]).astype(np.int32))
        else:
            raise ValueError(f"select: expected 'indexer' or 'random', got {select!r}")
    if len({len(x) for x in ids}) != 1:
        raise ValueError(
            "seq_len: every batch row must select the same number of blocks "
            f"(min(16, ceil(seq_len/128))), got {[len(x) for x in ids]}"
        )
    block_ids = np.stack(ids).astype(np.int32)
    q = to_bf16(_normal(rng, (batch, hq, d), scale))
    k32 = _normal(rng, (batch, hkv, nb, by, d), scale)
    v32 = _normal(rng, (batch, hkv, nb, by, d), scale)
    for b in range(batch):  # cache rows past the row's length are zeros
        flat_k = k32[b].reshape(hkv, nb * by, d)
        flat_v = v32[b].reshape(hkv, nb * by, d)
        flat_k[:, int(seqs[b]) :] = 0.0
        flat_v[:, int(seqs[b]) :] = 0.0
    sl = int(seqs[0]) if np.ndim(seq_len) == 0 else seqs.copy()
    inputs = dict(q=q, k_blocks=to_bf16(k32), v_blocks=to_bf16(v32), block_ids=block_ids)
    meta = dict(block_ids=block_ids.copy())
    if idx_inputs:  # the indexer call of each batch row (msa_indexer(**meta["indexer"][b]))
        meta["indexer"] = idx_inputs
    return inputs, dict(seq_len=sl), meta


def _main_case(
    rng,
    seed,
    *,
    n,
    max_n=None,
    dtype="fp32",
    topk=16,
    bk=128,
    hq=64,
    hkv=4,
    dh=128,
    topk_indices=None,
):
    from tilesim.reference.msa_main import build_msa_block_mask

    nb = math.ceil(n / bk)
    ids = (
        seeds_topk_indices(n, seed, bk=bk, topk=topk)
        if topk_indices is None
        else np.asarray(topk_indices, dtype=np.int32)
    )
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
    max_n = max(2048, nb * bk) if max_n is None else max_n
    return inputs, dict(dtype=dtype, max_n=max_n), dict(topk_indices=ids.copy())


_OPS = ("msa_indexer", "msa_sparse_decode", "msa_main_branch")


def msa_make_case(name: str | None = None, *, seed: int | None = None, **params) -> dict:
    """Build one case: a named entry of :data:`MSA_CASES` (``params`` override its builder
    parameters) or, with ``name=None``, an ad-hoc case from ``op=...`` plus builder parameters.

    Builder parameters per op:

    * ``msa_indexer``: ``nb``, ``seq_len=None``, ``head_reduce="max"``, ``scale=0.1``.
    * ``msa_sparse_decode``: ``batch=1``, ``nb=17``, ``seq_len`` (int or per row; default
      ``nb*128``), ``select="indexer"|"random"``, ``scale=0.05``, ``idx_scale=0.1``.
    * ``msa_main_branch``: ``n``, ``max_n=None`` (``max(2048, ceil(n/bk)*bk)``),
      ``dtype="fp32"``, ``topk=16``, ``bk=128``, ``hq=64``, ``hkv=4``, ``dh=128``,
      ``topk_indices=None`` (seeds' procedure with ``seed``).

    Returns ``{"name", "op", "inputs", "params", "tolerance", "meta"}``; identical arguments
    give identical arrays.
    """
    if name is not None:
        if name not in MSA_CASES:
            raise ValueError(f"name: expected one of {sorted(MSA_CASES)}, got {name!r}")
        spec = MSA_CASES[name]
        op = spec["op"]
        if "op" in params and params.pop("op") != op:
            raise ValueError(f"op: case {name!r} runs {op!r}")
        build = {**spec["params"], **params}
        seed = spec["seed"] if seed is None else seed
        tolerance = dict(spec["tolerance"])
    else:
        op = params.pop("op", None)
        if op not in _OPS:
            raise ValueError(f"op: expected one of {_OPS} when name is None, got {op!r}")
        build = params
        seed = 0 if seed is None else seed
        tolerance = {
            "msa_indexer": {"compare": "set"},
            "msa_sparse_decode": {"atol": 5e-2, "rtol": 0.0, "ratio": 0.0},
            "msa_main_branch": {"atol": 1e-3, "rtol": 1e-3, "ratio": 0.0},
        }[op]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed: expected a non-negative int, got {seed!r}")
    rng = np.random.default_rng(seed)
    try:
        if op == "msa_indexer":
            inputs, op_params, meta = _indexer_case(rng, **build)
        elif op == "msa_sparse_decode":
            inputs, op_params, meta = _decode_case(rng, **build)
        else:
            inputs, op_params, meta = _main_case(rng, seed, **build)
    except TypeError as e:  # unknown builder parameter
        raise ValueError(f"params: {e}") from None
    meta = {"seed": seed, "builder_params": dict(build), **meta}
    return dict(name=name, op=op, inputs=inputs, params=op_params, tolerance=tolerance, meta=meta)
