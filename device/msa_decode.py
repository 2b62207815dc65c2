"""MiniMax-M3 MSA block-sparse decode on Ascend — PyPTO kernel + wrapper.

Same name and arguments as the golden ``msa_sparse_decode`` (``reference/msa_decode.py``),
plus ``gather`` / ``backend`` / ``soc``; NumPy arrays or torch tensors in, the same kind out
(:mod:`tilesim.device.backend`). The arguments are checked by the op's contract
:mod:`tilesim.shared.msa_decode` (``check_meta``, then ``check_int_values`` -- the integer
``block_ids`` / ``seq_len`` -- unless ``validate=False``: metadata only, no host copy), the
functions the reference uses; the
keep-mask and the page table are its torch twins
(``keep_mask_torch``, ``page_table_torch``), built on the inputs' device. The jit kernel
builder is :mod:`tilesim.device._msa_decode_kernel`.

Kernel loop nest (one compile per model configuration and tiling: batch and ``nb`` are
runtime values): a ``pypto.loop_unroll`` over the batch rows (bodies of :data:`BATCH_UNROLL`
rows, run side by side in a body), per batch row ``b`` and KV head ``h`` (``outer = b*HKV +
h``, static inside a body), the ``G = HQ/HKV`` (16) query heads of the group on the cube M
axis::

    for each split range of chunks (MsaTiling.kv_splits; one range = the plain loop):
      for c in the range's NTILE-wide chunks of the topk*128 keys (the last may be partial):
        K_c, V_c = the chunk's keys/values            "device": K as page views, V by
                                                      gather_in_ub; "host": compact copy
        S   = fp32(Q[G,128] @ K_c^T)                  cube, FP32 out, one matmul per page
                                                      (page_pieces): the same dot products
        S   = S * SCALE                               FP32, SCALE = fp32(1/sqrt(128))
        S   = where(keep, S, -3e38)                   FP32 select, keep = bool keep-mask
                                                      (built on the device: keep_mask_torch)
        m_c = rowmax(S); P = exp(S - m_c); l_c = rowsum(P)     FP32, P unrounded
        V_c = where(keep, V_c, 0)                     "paged"/"host": dropped keys' V rows
                                                      zeroed ("device": never read, below)
        O_c = fp32(bf16(P) @ V_c)                     cube, FP32 accumulation
        the range's first chunk is its state (m, l, O); later chunks merge online (FP32)
    fold ranges 1, 2, .. into range 0's state, in order (the same online merge)
    out = bf16(O / l)                                 +0 where the batch row keeps no key

The merges run after the chunks, in ONE vector task per pair (:func:`_merge`): every chunk
writes ``m_c`` / ``l_c`` into the pair's ``[2*n*G, 1]`` column tensor and ``O_c`` into its
``[n*G, D]`` tensor; the task brings both in with one copy each, computes the merge tree's
``(m, l)`` half and weights (:func:`tilesim.device._msa_tiles.merge_tree`), then the ``O``
half (one multiply of every ``O_c`` by its weight, then the chained sums) -- the same
operations on the same values as merging chunk by chunk.

C1 reads K where it lies: one matmul per page piece of the chunk
(:func:`tilesim.device._msa_tiles.page_pieces`; a whole 128-key page at the default NTILE),
its K operand a view of the page's rows, the products assembled into the chunk's ``S`` by
columns. Each score is the same one dot product over D as in a single matmul over the chunk,
so the numbers do not change; what changes is that no gather task stands between the root
and C1 (docs/ops/msa_decode.md#kernel).

The rounding points are the reference's one for one (split-KV included:
:mod:`tilesim.shared.msa_decode`), and so is the NaN-robust masking: a dropped key's score is
SET to -3e38 (a select, not the seeds' ``S*m + (1-m)*(-3e38)``, where ``0*NaN = NaN``), and
its V row is either SET to zero (``"paged"``, ``"host"``: the rows
:func:`tilesim.shared.msa_decode.decode_read_mask` says P.V does not read) or never read
(``"device"``: the gather position of a dropped key is the row's first kept key,
:func:`_redirected`; its P is exactly 0, and a row that keeps no key -- the row whose final
max is the mask value -3e38 -- is set to +0 by a final per-row select). So whatever a
dropped slot holds -- the tail of the current block past ``seq_len``, a selected future
block, garbage or NaN in unwritten cache rows -- never reaches the output (blocks that are
not selected are never read). On finite inputs both forms give the bits of the multiply
form (``tests/device/test_sim_nan_poison.py``).

Three ways to bring the selected blocks in:

* ``gather="device"`` (default): the kernel reads the paged cache itself. ``k_blocks`` and
  ``v_blocks`` are viewed as rows ``[(b*HKV + h)*nb*128 + blk*128 + t]``, addressed through the
  global page table (``page_table_torch``: ``(b*HKV + h)*nb + block_ids[b]``, built on the
  inputs' device). K: C1 takes each page piece as a view whose row offset comes from the page
  table (read by the control flow). V: per chunk ``gather_in_ub`` takes the chunk's logical
  key positions (``slot*128 + t``) and the pair's page-table row and fetches the rows into UB
  (:func:`_gather_chunk`). No K/V copy.
* ``gather="paged"``: K as in ``"device"``; V's page pieces are read the same way and
  assembled into the chunk's V tile -- no gather instruction, pages are contiguous.
* ``gather="host"``: the seeds' scheme — the wrapper copies the selected blocks into compact
  ``[B*HKV*topk*128, 128]`` K/V buffers (a torch gather of ``2*B*HKV*topk*32 KB`` on the
  inputs' device) and the kernel views them.

All three give identical bits (tested); the cost-model comparison is in
``docs/ops/msa_decode.md#kernel``.

Where the seeds' kernel is wrong at the edges, this one is right (and the tests check it): a
last partial chunk is processed when ``topk*128`` is not a multiple of NTILE (the seeds floor
the chunk count and drop those keys; with ``topk < 4`` they write nothing); ``seq_len`` may be
one int per batch row; a batch row whose every key is masked returns zeros (the seeds' kernel
returns the mean of the gathered V there).

Tiling: ``MsaTiling.from_env()`` (``MSA_NTILE``, default 512, same on both SoCs because it
changes the numbers; ``kv_splits`` by :func:`tilesim.shared.msa_decode.resolve_tiling` when
``tiling=None``, the reference's rule), the per-SoC V-gather tile :data:`V_GATHER_ROWS`
(``MSA_V_GATHER_ROWS``) and the V-select tile of ``"paged"`` / ``"host"``, :data:`GATHER_ROWS`
(``MSA_GATHER_ROWS``, which, set alone, also sets the V-gather tile).
Importing this module needs neither torch nor pypto.
"""

from typing import NamedTuple

from tilesim.device import backend as _backend
from tilesim.device._lazy import require_torch
from tilesim.device._msa_decode_kernel import (
    BATCH_UNROLL,
    JIT,
    SEED_JIT,
    SPREAD_ROWS,
    build_kernel,
)
from tilesim.device._msa_tiles import L1_REUSE_BY_ROWS
from tilesim.shared.env import env_mapping
from tilesim.shared.models import MINIMAX_M3
from tilesim.shared.msa_decode import (
    RECORD,
    check_meta,
    keep_mask_torch,
    page_table_torch,
    resolve_tiling,
)
from tilesim.shared.soc import DEFAULT_SOC, MSA_DEVICE_TILES, get_soc, msa_device_tile
from tilesim.shared.tiling import MsaTiling
from tilesim.shared.validate import check_choice, is_array

OP_NAME = "msa_sparse_decode"
GATHERS = ("device", "paged", "host")
_CFG = MINIMAX_M3.msa
BY = _CFG.block_size  # 128 keys per block


#: the V-select tile of ``gather="paged"`` / ``"host"`` per SoC (rows; set alone, the env
#: override also sets the V-gather tile); defaults and override in :mod:`tilesim.shared.soc`
GATHER_ROWS = MSA_DEVICE_TILES["MSA_GATHER_ROWS"][0]


def gather_rows(soc=DEFAULT_SOC, env=None) -> int:
    """GATHER_ROWS of ``soc`` (``MSA_GATHER_ROWS`` overrides; see
    :func:`tilesim.shared.soc.msa_device_tile`)."""
    return msa_device_tile("MSA_GATHER_ROWS", soc, env)


#: rows of one ``gather="device"`` V-gather tile per SoC family (``MSA_V_GATHER_ROWS`` of
#: :data:`~tilesim.shared.soc.MSA_DEVICE_TILES`): V is needed only by P.V, so its gather may
#: move a whole 512-key chunk in few, large tiles: few gather tasks leave the root
#: (docs/ops/msa_decode.md#kernel)
V_GATHER_ROWS = MSA_DEVICE_TILES["MSA_V_GATHER_ROWS"][0]


def v_gather_rows(soc=DEFAULT_SOC, env=None) -> int:
    """The V-gather tile of ``soc``: ``MSA_V_GATHER_ROWS`` (env, else :data:`V_GATHER_ROWS`);
    when only ``MSA_GATHER_ROWS`` is set, that one."""
    env = env_mapping(env)
    if "MSA_GATHER_ROWS" in env and "MSA_V_GATHER_ROWS" not in env:
        return gather_rows(soc, env)
    return msa_device_tile("MSA_V_GATHER_ROWS", soc, env)


# ----------------------------------------------------------------------------- host side
def _cache_rows(k_blocks, v_blocks, ids, gather: str, dim: int):
    """K / V as the kernel reads them: the paged cache as rows (``"device"``, ``"paged"``) or
    the seeds' compact copy of the selected blocks (``"host"``, a device-side gather),
    ``[rows, D]``."""
    torch = require_torch()
    if gather in ("device", "paged"):  # the paged cache as rows; the kernel gathers
        return k_blocks.contiguous().reshape(-1, dim), v_blocks.contiguous().reshape(-1, dim)
    dev = k_blocks.device
    bi = torch.arange(k_blocks.shape[0], device=dev)[:, None, None]
    hi = torch.arange(k_blocks.shape[1], device=dev)[None, :, None]
    sel = ids.to(torch.int64)[:, None, :]
    return k_blocks[bi, hi, sel].reshape(-1, dim), v_blocks[bi, hi, sel].reshape(-1, dim)


def _seq_tensor(seq_len, batch: int, dev):
    """``seq_len`` (one int, or an integer array / tensor of ``B`` values) as int64 ``[B]`` on
    ``dev`` (a tensor on ``dev`` is used as it is: no host copy)."""
    torch = require_torch()
    if is_array(seq_len):
        (s,) = _backend.to_tensors(seq_len)
        return s.to(device=dev, dtype=torch.int64).reshape(-1).expand(batch)
    return torch.full((batch,), int(seq_len), dtype=torch.int64, device=dev)


class CallShape(NamedTuple):
    """The sizes of a call and the compile key's shape part."""

    batch: int
    hq: int
    hkv: int
    nb: int
    dim: int
    topk: int


def decode_launch(q, k_blocks, v_blocks, ids, seq, sh: CallShape, tiling: MsaTiling | int,
                  gather: str, soc: str):  # fmt: skip
    """``(kernel, inputs, outputs)`` of one call, built on the inputs' device (no host copy):
    the page table (:func:`tilesim.shared.msa_decode.page_table_torch`), the positions
    ``0 .. topk*128-1``, the keep-mask (:func:`tilesim.shared.msa_decode.keep_mask_torch`) as
    bool ``[B, topk*128]`` and the same data as a ``[B*topk*128, 1]`` column (the V select's;
    the rows P.V reads, as
    :func:`tilesim.shared.msa_decode.decode_read_mask` without ``seeds_compat``), K / V as the
    ``gather`` variant reads them, and the zeroed BF16 ``[B*HQ, D]`` output. ``soc``: the
    gather tile's SoC; ``tiling``: an :class:`MsaTiling` (NTILE, kv_splits) or an int NTILE
    (unsplit)."""
    torch = require_torch()
    if not isinstance(tiling, MsaTiling):
        tiling = MsaTiling(ntile=tiling)
    dev = q.device
    keep = keep_mask_torch(ids, seq) > 0
    table = page_table_torch(ids, sh.hkv, sh.nb)
    positions = _redirected(keep)
    k2, v2 = _cache_rows(k_blocks, v_blocks, ids, gather, sh.dim)
    # the V select's tile: MSA_GATHER_ROWS, capped at the SoC's default (a larger override
    # may still fit a gather, not a [rows, 128] select: 256 fails on the 910B)
    vrows = min(gather_rows(soc), GATHER_ROWS[soc])
    kernel = build_kernel(sh.hq, sh.hkv, sh.topk, sh.dim, tiling.ntile, gather, vrows, JIT,
                          tiling.kv_splits, BATCH_UNROLL, v_gather_rows(soc),
                          L1_REUSE_BY_ROWS, SPREAD_ROWS[get_soc(soc).arch])  # fmt: skip
    q2 = q.contiguous().reshape(-1, sh.dim)
    out = torch.zeros(sh.batch * sh.hq, sh.dim, dtype=torch.bfloat16, device=dev)
    return kernel, [q2, k2, v2, table, positions, keep, keep.reshape(-1, 1)], [out]


def _redirected(keep):
    """INT32 ``[B, topk*128]`` V-gather positions of ``gather="device"``: key ``i`` of a row
    where it is kept, else the row's first kept key (0 in a row that keeps none) -- a dropped
    key's V row is never read (its K row is, and its score is selected away), so whatever it
    holds (NaN, garbage) cannot reach P.V, and no V row needs zeroing. Its ``P`` is exactly 0,
    so the stand-in row adds ``+-0`` to a partly kept chunk; a chunk with no kept key enters
    the merge with weight exactly 0."""
    torch = require_torch()
    idx = torch.arange(keep.shape[1], dtype=torch.int64, device=keep.device).expand_as(keep)
    first = keep.to(torch.int8).argmax(dim=1, keepdim=True)  # 0 when the row keeps nothing
    return torch.where(keep, idx, first).to(torch.int32)


def _check(q, k_blocks, v_blocks, block_ids, seq_len, gather, validate, soc):
    """The shared contract: :func:`tilesim.shared.msa_decode.check_meta` (metadata only),
    then :func:`~tilesim.shared.msa_decode.check_int_values` when ``validate`` and the inputs hold
    data. Returns ``(CallShape, shape_only)``."""
    check_choice(gather, "gather", GATHERS)
    _backend.validate_level(validate)
    get_soc(soc)  # TypeError / ValueError naming soc
    args = check_meta(q, k_blocks, v_blocks, block_ids, seq_len, block_size=BY)
    shape_only = _backend.is_shape_only(q, k_blocks, v_blocks, block_ids, seq_len,
                                        names=("q", "k_blocks", "v_blocks", "block_ids",
                                               "seq_len"))  # fmt: skip
    _backend.value_checks(RECORD, args, validate, shape_only=shape_only)
    sh = CallShape(args.batch, args.hq, args.hkv, args.nb, args.dim, args.topk)
    return sh, shape_only


@_backend.graph_safe
def msa_sparse_decode(
    q,
    k_blocks,
    v_blocks,
    block_ids,
    seq_len,
    *,
    tiling: MsaTiling | None = None,
    gather: str = "device",
    backend: str = "auto",
    soc: str = DEFAULT_SOC,
    validate: bool = True,
):
    """Block-sparse decode attention over the selected key blocks (PyPTO kernel).

    Args:
        q: ``[B, HQ, 128]`` BF16 (HQ = 64 in M3); k_blocks, v_blocks: ``[B, HKV, nb, 128, 128]``
            BF16 paged cache; block_ids: ``[B, topk]`` integer ids, unique per row, in
            ``[0, nb)``; seq_len: KV length incl. the current token, one int or an integer
            array / tensor of ``B`` values. NumPy arrays or torch tensors; checked by
            :func:`tilesim.shared.msa_decode.check_meta` and ``check_values`` as in the reference.
        tiling: :class:`MsaTiling` (``ntile``, ``kv_splits``); ``None`` =
            ``MsaTiling.from_env()`` with ``kv_splits`` by the shared rule
            (:func:`tilesim.shared.msa_decode.resolve_tiling` for this shape and ``soc``, the
            reference's rule: the same call gives the same bits). An explicit tiling is used
            as given.
        gather: ``"device"`` (gather_in_ub + block table in the kernel), ``"paged"`` (page
            views at block-table offsets) or ``"host"`` (the seeds' compact K/V copies, made
            by a device-side gather); same numbers, different data movement.
        backend, soc: :func:`tilesim.device.backend.resolve` (``"auto"``: NPU tensors ->
            ``"npu"``, else an error naming both; ``"sim"``: PyPTO's CPU simulator for ``soc``).
        validate: ``True`` (default; ``"full"`` is the same: this op has no float scan) copies
            ``block_ids`` and a ``seq_len`` array to the host for the value checks (range,
            unique per row, ``1 <= seq_len <= nb*128``);
            ``False`` checks metadata only -- no host copy at all (the keep-mask and the page
            table are built on the inputs' device); out-of-range ids are then undefined.

    Returns:
        BF16 ``[B, HQ, 128]`` of the kind of ``q``; ``backend="sim"`` returns
        ``(out, cost_us)``. FakeTensor / ``meta`` inputs (torch.compile tracing): an empty
        ``[B, HQ, 128]`` BF16 tensor, no data read. Inputs are never modified. Budget against
        the reference: ``docs/ops/msa_decode.md#kernel``.
    """
    sh, shape_only = _check(q, k_blocks, v_blocks, block_ids, seq_len, gather, validate, soc)
    tiling = resolve_tiling(tiling, batch=sh.batch, hkv=sh.hkv, topk=sh.topk, soc=soc)
    if shape_only:
        check_choice(backend, "backend", _backend.BACKENDS)
        return q.new_empty((sh.batch, sh.hq, sh.dim))
    target = _backend.resolve(backend, soc, q)
    qt, kt, vt, ids = _backend.to_tensors(q, k_blocks, v_blocks, block_ids)
    seq = _seq_tensor(seq_len, sh.batch, qt.device)
    kernel, ins, outs = decode_launch(qt, kt, vt, ids.to(qt.device), seq, sh, tiling, gather,
                                      target.soc)  # fmt: skip
    us = _backend.launch(kernel, ins, outs, target)
    return _backend.finish(outs[0].reshape(sh.batch, sh.hq, sh.dim), us, target)


__all__ = [
    "BATCH_UNROLL",
    "GATHERS",
    "GATHER_ROWS",
    "CallShape",
    "JIT",
    "L1_REUSE_BY_ROWS",
    "SEED_JIT",
    "V_GATHER_ROWS",
    "build_kernel",
    "decode_launch",
    "gather_rows",
    "msa_sparse_decode",
    "v_gather_rows",
]
