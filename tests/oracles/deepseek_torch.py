"""DeepSeek-V3.2's reference inference pieces restated in torch for the prolog tests, written
independently of tilesim (no tilesim import): ``apply_rotary_emb`` of
deepseek-ai/DeepSeek-V3.2-Exp inference/model.py."""

from __future__ import annotations


def ds_rope(x, cos, sin):
    """``apply_rotary_emb(x, freqs_cis, interleaved=False)``: the last axis of ``x`` as two
    halves (real, imaginary), rotated by ``cos + i sin`` in FP32, back in ``x``'s dtype."""
    import torch

    shape = x.shape
    y = x.view(*shape[:-1], 2, -1).transpose(-1, -2).contiguous()
    y = torch.view_as_complex(y.float().view(*shape[:-1], -1, 2))
    f = torch.complex(cos, sin)
    while f.dim() < y.dim():
        f = f.unsqueeze(1)
    y = torch.view_as_real(y * f).flatten(-2)
    return torch.cat([y[..., 0::2], y[..., 1::2]], dim=-1).to(x.dtype)
