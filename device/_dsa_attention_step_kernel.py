"""The kernels of the DeepSeek-V3.2 layer step (op ``dsa_attention_step``): the four stage
kernels, launched one after the other by :mod:`tilesim.device.dsa_attention_step`. The step
has no ``@pypto.frontend.jit`` body of its own: each stage is its op's kernel, built once per
model configuration under that op's compile key, and PyPTO 0.2.0 runs separate kernels as
separate launches (no fusion across them), so the layer's cost-model time is the sum of the
four launches' times (``docs/ops/dsa_attention_step.md``, "Kernel")::

    stage               kernel module                                 ready on the host
    mla_prolog          tilesim.device._mla_prolog_kernel             slots
    dsa_indexer_prolog  tilesim.device._dsa_indexer_prolog_kernel     slot_mapping
    dsa_indexer         tilesim.device._dsa_indexer_kernel            block_table, seq_lens
    sparse_attention    tilesim.device._dsa_kernel                    block_table, kv_act_seqs

Every stage output the next stage reads (``q_norm``, the index queries and cache, the ids, the
queries and the latent cache) stays a device tensor; the host reads only these inputs, all of
them the caller's (``block_table``, ``seq_lens`` = ``kv_act_seqs``) or the slots the host's
slot rule gives (:func:`tilesim.shared.layouts.slots.slots_from_block_table`). Private;
importing it needs neither torch nor pypto.
"""

from __future__ import annotations


def ready_on_host() -> dict[str, tuple[str, ...]]:
    """``{stage: the names of the tensors its kernel's control flow reads on the host}``, in
    step order (each kernel module's ``READY_ON_HOST``, PyPTO's ``ready_on_host_tensors``
    runtime option); imports the kernel modules (the attention's needs pypto)."""
    from tilesim.device import (
        _dsa_indexer_kernel,
        _dsa_indexer_prolog_kernel,
        _dsa_kernel,
        _mla_prolog_kernel,
    )

    return {"mla_prolog": tuple(_mla_prolog_kernel.READY_ON_HOST),
            "dsa_indexer_prolog": tuple(_dsa_indexer_prolog_kernel.READY_ON_HOST),
            "dsa_indexer": tuple(_dsa_indexer_kernel.READY_ON_HOST),
            "sparse_attention": tuple(_dsa_kernel.READY_ON_HOST)}  # fmt: skip


__all__ = ["ready_on_host"]
