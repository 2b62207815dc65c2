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


def merge_state(pypto, state: tuple, part: tuple) -> tuple:
    """The online merge of :func:`merge_chunk` in functional form: ``state = (m, l, o)`` and
    ``part = (m_c, l_c, o_c)`` (FP32 tensors) -> the merged ``(m', l', o')`` as new tensors,
    same operations in the same order (``m' = max(m, m_c)``, ``a = exp(m - m')``,
    ``b = exp(m_c - m')``, ``l' = a*l + b*l_c``, ``o' = o*a + o_c*b``). No accumulator
    workspace and no copies into one: the first chunk's tensors are the state as they are.
    Used by the decode for its chunks and for the split combine."""
    m, l, o = state
    m_c, l_c, o_c = part
    m_new = pypto.maximum(m, m_c)
    a = pypto.exp(m - m_new)
    b = pypto.exp(m_c - m_new)
    return m_new, a * l + b * l_c, o * a + o_c * b


__all__ = [
    "SEED_RUNTIME",
    "jit_options",
    "l0_tile",
    "merge_chunk",
    "merge_state",
    "operation_options",
    "without",
]
