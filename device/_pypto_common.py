"""PyPTO building blocks every kernel family shares: the device counterpart of
:mod:`tilesim.reference.util.arith`.

* the JIT-option spec: a kernel's options as a hashable tuple (part of its compile key),
  ``(("runtime", name, value), ("pass", name, ((scope, n), ...)), ("operation", name, value))``
  turned into ``pypto.frontend.jit`` arguments (:func:`jit_options`), its operation options
  (:func:`operation_options`, :func:`combine_axis`) and the variants of a spec (:func:`without`,
  :func:`replaced`);
* the online-softmax merge of key chunks (:func:`merge_chunk`) and its split form, the merge
  tree (:func:`fold_stats`, :class:`MergeTree`, :func:`merge_tree`, :func:`eval_tree`): the
  operations, in order, of ``tilesim.reference.util.arith.SoftmaxMerge("online")`` (tested bit for
  bit against it in ``tests/device/test_msa_decode_sim.py``).

Each PyPTO function takes the ``pypto`` module as its first argument, so importing this module
needs no pypto.
"""

from __future__ import annotations


def jit_options(spec: tuple, *, ready_on_host: tuple | None = None) -> dict:
    """``pypto.frontend.jit`` keyword arguments from a hashable option ``spec`` (part of a
    compile key): ``(("runtime", name, value), ("pass", name, ((scope, n), ...)), ...)``; pass
    settings become ``{scope: n}`` dicts. ``("operation", "combine_axis", True)`` entries are
    not jit arguments (the kernel body sets them; see :func:`operation_options`).
    ``ready_on_host``: the names of the tensors the kernel's control flow reads on the host
    (the ``ready_on_host_tensors`` runtime option; both option dicts are then always given)."""
    kw: dict = {} if ready_on_host is None else {"pass_options": {}, "runtime_options": {}}
    for kind, name, value in spec:
        if kind == "runtime":
            kw.setdefault("runtime_options", {})[name] = value
        elif kind == "pass":
            kw.setdefault("pass_options", {})[name] = dict(value)
        elif kind != "operation":
            raise ValueError(f"jit option kind: expected runtime/pass/operation, got {kind!r}")
    if ready_on_host is not None:
        kw["runtime_options"]["ready_on_host_tensors"] = list(ready_on_host)
    return kw


def operation_options(spec: tuple) -> dict:
    """The ``set_operation_options`` keywords of an option ``spec`` (see :func:`jit_options`)."""
    return {name: value for kind, name, value in spec if kind == "operation"}


def combine_axis(spec: tuple) -> bool:
    """The spec's ``combine_axis`` operation option (``False``, 0.2.0's default, if absent)."""
    return bool(operation_options(spec).get("combine_axis", False))


def without(spec: tuple, *names: str) -> tuple:
    """``spec`` without the options called ``names`` (the cost-model sweep's variants)."""
    return tuple(o for o in spec if o[1] not in names)


def replaced(spec: tuple, *options: tuple) -> tuple:
    """``spec`` with each of ``options`` (``(kind, name, value)`` entries) in place of the
    entry of the same name, appended where ``spec`` has none (a build's variant of a spec)."""
    names = [o[1] for o in options]
    return (*without(spec, *names), *options)


def merge_chunk(pypto, m, l, o, m_c, l_c, o_c, *, first: bool) -> None:
    """Online-softmax merge of one key chunk into the running ``m, l, o`` (FP32), in the order
    of operations of the reference (``reference/util/arith.py``, ``SoftmaxMerge``, mode
    ``"online"``): the first chunk is copied; later ones do ``m' = max(m, m_c)``
    (``pypto.maximum``), then :func:`fold_stats`' ``a``, ``b`` and ``l = a*l + b*l_c``, and
    ``o = o*a + o_c*b``. Shared by decode, the main branch and the DeepSeek kernels."""
    if first:
        m[:] = m_c
        l[:] = l_c
        o[:] = o_c
        return
    (m_new, l_new), (a, b) = fold_stats(pypto, (m, l), (m_c, l_c), maximum=True)
    l[:] = l_new
    o[:] = o * a + o_c * b
    m[:] = m_new


def fold_stats(
    pypto, state: tuple, part: tuple, *, maximum: bool = False, weighted: bool = False
) -> tuple:
    """The ``(m, l)`` half of one online merge (:func:`merge_chunk`'s formulas, same order):
    ``m' = max(m, m_c)``, ``a = exp(m - m')``, ``b = exp(m_c - m')``, ``l' = a*l + b*l_c``.
    Returns ``((m', l'), (a, b))``: the weights the ``O`` half multiplies by;
    ``weighted=True``: ``((m', l'), (a*l, b*l_c))``, the two terms of ``l'`` (the weights of
    a merge of normalised outputs, ``O' = (O*a*l + O_c*b*l_c) / l'``: the DeepSeek per-tile
    kernel). The same operations in the same order either way. The max is a
    compare and a select (``m_c`` where ``m < m_c``, else ``m``): the value of ``max`` on
    numbers (which of two zeros it keeps changes no later value: ``m`` only enters ``exp`` of
    a difference and the next max), at a tenth of the cost model's ``maximum``. A NaN ``m_c``
    may be dropped from ``m'``, but its ``b`` is NaN, so ``l'`` (and ``O``) stay NaN.
    ``maximum=True``: ``pypto.maximum`` instead (:func:`merge_chunk`; the DeepSeek kernels'
    choice, whose NaN rows keep the bits they always had)."""
    m, l = state
    m_c, l_c = part
    m_new = pypto.maximum(m, m_c) if maximum else pypto.where(pypto.lt(m, m_c), m_c, m)
    a = pypto.exp(m - m_new)
    b = pypto.exp(m_c - m_new)
    wl, wl_c = a * l, b * l_c
    return (m_new, wl + wl_c), ((wl, wl_c) if weighted else (a, b))


class MergeTree:
    """The online-merge tree of one (batch row, KV head) split into its two halves.

    The ``(m, l)`` half needs only the chunks' row maxima and sums, so it is computed first
    (:func:`merge_tree`); the ``O`` half then needs one weight per chunk (``pre[c]``: every
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


def merge_tree(pypto, m_c: list, l_c: list, ranges, *, maximum: bool = False) -> MergeTree:
    """The :class:`MergeTree` of the chunks' ``m_c`` / ``l_c`` (FP32 ``[G, 1]``) for the
    split ``ranges`` (``[(first, stop), ...]``,
    :func:`tilesim.shared.layouts.splitkv.split_ranges`): each range folds its chunks in order, then
    ranges ``1, 2, ..`` fold into range 0's state -- the reference's order
    (``reference/msa_decode.py``). ``maximum``: as in :func:`fold_stats`."""
    merge = MergeTree(len(m_c))
    states, trees = [], []
    for first, stop in ranges:
        st, tree = (m_c[first], l_c[first]), ("c", first)
        for c in range(first + 1, stop):
            st, (a, b) = fold_stats(pypto, st, (m_c[c], l_c[c]), maximum=maximum)
            tree = ("+", merge.mul(tree, a), merge.mul(("c", c), b))
        states.append(st)
        trees.append(tree)
    st, tree = states[0], trees[0]
    for other, t in zip(states[1:], trees[1:], strict=True):
        st, (a, b) = fold_stats(pypto, st, other, maximum=maximum)
        tree = ("+", merge.mul(tree, a), merge.mul(t, b))
    merge.m, merge.l = st
    merge.tree = ("p", 0) if tree == ("c", 0) else tree
    return merge


def eval_tree(tree, products: list, chained: list):
    """The ``O`` half of a :class:`MergeTree`: ``products[c]`` = ``O_c * pre[c]`` (or ``O_0``
    for a single chunk), ``chained[k]`` = the tree's ``k``-th chained weight."""
    if tree[0] == "p":
        return products[tree[1]]
    if tree[0] == "*":
        return eval_tree(tree[1], products, chained) * chained[tree[2]]
    return eval_tree(tree[1], products, chained) + eval_tree(tree[2], products, chained)


__all__ = [
    "MergeTree",
    "combine_axis",
    "eval_tree",
    "fold_stats",
    "jit_options",
    "merge_chunk",
    "merge_tree",
    "operation_options",
    "replaced",
    "without",
]
