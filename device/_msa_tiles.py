"""PyPTO building blocks shared by the MSA kernels (lightning indexer, decode, main branch).

Private to the MSA kernel modules: each function emits PyPTO tensor operations inside a
``@pypto.frontend.jit`` body and takes the ``pypto`` module as its first argument, so that
importing this module needs no pypto.
"""

from __future__ import annotations

#: the runtime options the seeds set on every MSA kernel (indexer, decode, main branch:
#: hicann/pypto-gym:src/pypto_gym/ops/pypto_tensor/minimax/*msa*_impl.py), the common head of
#: each kernel's ``SEED_JIT`` spec (:func:`jit_options`)
SEED_RUNTIME = (
    ("runtime", "device_sched_mode", 1),
    ("runtime", "stitch_function_max_num", 64),
)


def l0_tile(w: int, cap: int) -> int:
    """Largest of 256/128/64/32/16 (at most ``cap``) dividing ``w``: PyPTO wants L1 % L0 == 0."""
    return next(t for t in (256, 128, 64, 32, 16) if t <= cap and w % t == 0)


#: ``cube_l1_reuse_setting`` of each body of the batch loop in the ``"device"`` and ``"paged"``
#: variants, ``((rows per body, N), ...)``, set at the start of the body (PyPTO 0.2.0 reads a
#: loop body's pass options when the body's function ends): the L1ReuseMerge pass may put N
#: matmuls that read the same GM data into one task -- here C1's page matmuls, which all read
#: the pair's Q. 4: one C1 task per 512-key chunk (the latency of B 1); 16 in the 4-row body:
#: one C1 task per pair, 16 per body instead of 64, the fewest tasks for the batches that run
#: many 4-row bodies one after another (B 64: 910B 581 -> 537 us with 16 instead of 8, B 4
#: 46.7 -> 49.8; docs/device.md, block-sparse decode, change 6)
L1_REUSE_BY_ROWS = ((4, 16), (2, 4), (1, 4))


def page_pieces(c0: int, w: int, block: int) -> tuple:
    """``((slot, t0, n), ...)``: the keys ``c0 .. c0+w-1`` of a row's selected ``topk*block``
    keys (slot ``s`` holds keys ``s*block ..``) cut at the page edges, in key order: keys
    ``t0 .. t0+n-1`` of slot ``slot``'s page, whose rows are contiguous in the paged cache.
    The decode's C1 issues one matmul per piece (a whole page for the default NTILE)."""
    pieces, pos = [], c0
    while pos < c0 + w:
        slot, t0 = divmod(pos, block)
        n = min(block - t0, c0 + w - pos)
        pieces.append((slot, t0, n))
        pos += n
    return tuple(pieces)


def c1_cube_tiles(g: int, n: int) -> tuple:
    """Cube tiles (M, K, N lists) of one C1 piece ``S = Q[g, 128] @ K[n, 128]^T``."""
    return [g, g], [128, 128], [l0_tile(n, 256), n]


def c2_cube_tiles(g: int, w: int) -> tuple:
    """Cube tiles (M, K, N lists) of one chunk's ``O_c = P[g, w] @ V_c[w, 128]``."""
    return [g, g], [l0_tile(w, 128), w], [128, 128]


def jit_options(spec: tuple) -> dict:
    """``pypto.frontend.jit`` keyword arguments from a hashable option ``spec`` (part of a
    compile key): ``(("runtime", name, value), ("pass", name, ((scope, n), ...)), ...)``; pass
    settings become ``{scope: n}`` dicts. ``("operation", "combine_axis", True)`` entries are
    not jit arguments (the kernel body sets them; see :func:`operation_options`)."""
    kw: dict = {}
    for kind, name, value in spec:
        if kind == "runtime":
            kw.setdefault("runtime_options", {})[name] = value
        elif kind == "pass":
            kw.setdefault("pass_options", {})[name] = dict(value)
        elif kind != "operation":
            raise ValueError(f"jit option kind: expected runtime/pass/operation, got {kind!r}")
    return kw


def operation_options(spec: tuple) -> dict:
    """The ``set_operation_options`` keywords of an option ``spec`` (see :func:`jit_options`)."""
    return {name: value for kind, name, value in spec if kind == "operation"}


def without(spec: tuple, *names: str) -> tuple:
    """``spec`` without the options called ``names`` (the cost-model sweep's variants)."""
    return tuple(o for o in spec if o[1] not in names)


def merge_chunk(pypto, m, l, o, m_c, l_c, o_c, *, first: bool) -> None:
    """Online-softmax merge of one key chunk into the running ``m, l, o`` (FP32), in the order
    of operations of the reference (``reference/arith.py``, ``SoftmaxMerge``, mode
    ``"online"``): the first chunk is copied; later ones do ``m' = max(m, m_c)``,
    ``a = exp(m - m')``, ``b = exp(m_c - m')``, ``l = a*l + b*l_c``, ``o = o*a + o_c*b``.
    Shared by decode and the main branch."""
    if first:
        m[:] = m_c
        l[:] = l_c
        o[:] = o_c
        return
    m_new = pypto.maximum(m, m_c)
    a = pypto.exp(m - m_new)
    b = pypto.exp(m_c - m_new)
    l[:] = a * l + b * l_c
    o[:] = o * a + o_c * b
    m[:] = m_new


def fold_stats(pypto, state: tuple, part: tuple) -> tuple:
    """The ``(m, l)`` half of one online merge (:func:`merge_chunk`'s formulas, same order):
    ``m' = max(m, m_c)``, ``a = exp(m - m')``, ``b = exp(m_c - m')``, ``l' = a*l + b*l_c``.
    Returns ``((m', l'), (a, b))``: the weights the ``O`` half multiplies by. The max is a
    compare and a select (``m_c`` where ``m < m_c``, else ``m``): the value of ``max`` on
    numbers (which of two zeros it keeps changes no later value: ``m`` only enters ``exp`` of
    a difference and the next max), at a tenth of the cost model's ``maximum``. A NaN ``m_c``
    may be dropped from ``m'``, but its ``b`` is NaN, so ``l'`` (and ``O``) stay NaN."""
    m, l = state
    m_c, l_c = part
    m_new = pypto.where(pypto.lt(m, m_c), m_c, m)
    a = pypto.exp(m - m_new)
    b = pypto.exp(m_c - m_new)
    return (m_new, a * l + b * l_c), (a, b)


class MergePlan:
    """The online-merge tree of one (batch row, KV head) split into its two halves.

    The ``(m, l)`` half needs only the chunks' row maxima and sums, so it is computed first
    (:func:`merge_plan`); the ``O`` half then needs one weight per chunk (``pre[c]``: every
    chunk's ``O_c`` is multiplied by exactly one weight -- ``b`` of the merge that folds it in,
    or ``a`` of the first merge when it is the state a range starts from) and the ``a``
    weights of merges whose state is already a sum (``chained``). ``tree``: ``("p", c)`` =
    ``O_c * pre[c]``, ``("*", x, k)`` = ``x * chained[k]``, ``("+", x, y)``. Evaluating it
    gives the values, operation for operation, of the plain chunk loop and split combine
    (:func:`merge_chunk` in order)."""

    def __init__(self, chunks: int):
        self.pre = [None] * chunks
        self.chained: list = []
        self.tree = ("p", 0)
        self.m = self.l = None

    def mul(self, x, weight):
        """``x * weight``: a chunk's own ``O_c`` takes it as its ``pre`` weight."""
        if x[0] == "c":
            self.pre[x[1]] = weight
            return ("p", x[1])
        self.chained.append(weight)
        return ("*", x, len(self.chained) - 1)


def merge_plan(pypto, m_c: list, l_c: list, ranges) -> MergePlan:
    """The :class:`MergePlan` of the chunks' ``m_c`` / ``l_c`` (FP32 ``[G, 1]``) for the
    split ``ranges`` (``[(first, stop), ...]``, :func:`tilesim.shared.msa_decode.split_ranges`):
    each range folds its chunks in order, then ranges ``1, 2, ..`` fold into range 0's
    state -- the reference's order (``reference/msa_decode.py``)."""
    plan = MergePlan(len(m_c))
    states, trees = [], []
    for first, stop in ranges:
        st, tree = (m_c[first], l_c[first]), ("c", first)
        for c in range(first + 1, stop):
            st, (a, b) = fold_stats(pypto, st, (m_c[c], l_c[c]))
            tree = ("+", plan.mul(tree, a), plan.mul(("c", c), b))
        states.append(st)
        trees.append(tree)
    st, tree = states[0], trees[0]
    for other, t in zip(states[1:], trees[1:], strict=True):
        st, (a, b) = fold_stats(pypto, st, other)
        tree = ("+", plan.mul(tree, a), plan.mul(t, b))
    plan.m, plan.l = st
    plan.tree = ("p", 0) if tree == ("c", 0) else tree
    return plan


def eval_tree(tree, products: list, chained: list):
    """The ``O`` half of a :class:`MergePlan`: ``products[c]`` = ``O_c * pre[c]`` (or ``O_0``
    for a single chunk), ``chained[k]`` = the plan's ``k``-th chained weight."""
    if tree[0] == "p":
        return products[tree[1]]
    if tree[0] == "*":
        return eval_tree(tree[1], products, chained) * chained[tree[2]]
    return eval_tree(tree[1], products, chained) + eval_tree(tree[2], products, chained)


__all__ = [
    "SEED_RUNTIME",
    "jit_options",
    "l0_tile",
    "MergePlan",
    "eval_tree",
    "fold_stats",
    "merge_chunk",
    "merge_plan",
    "operation_options",
    "without",
]
