"""PyTorch references that more than one oracle test uses."""
import numpy as np
import torch


def torch_attention(q, k, v, heads, causal, scale):
    """Multi-head self-attention over [B, T, heads x head size] q, k, v, heads packed along the
    last axis (ctrain's layout), the scores [B, H, T, T] held whole: the textbook form."""
    b, t, w = q.shape
    split = [a.reshape(b, t, heads, w // heads).permute(0, 2, 1, 3) for a in (q, k, v)]
    s = split[0] @ split[1].transpose(-1, -2) * scale
    if causal:
        s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
    return (torch.softmax(s, -1) @ split[2]).permute(0, 2, 1, 3).reshape(b, t, w)


def torch_rotary(x, heads, base=10000.0):
    """Rotary position embeddings over [B, T, heads x D] in the "rotate half" layout (GPT-NeoX,
    LLaMA), the angles computed in float64 as ctrain does."""
    b, t, w = x.shape
    d = w // heads
    i = np.arange(d) % (d // 2)
    angle = np.arange(t)[:, None] * base ** (-2.0 * i / d)[None, :]
    cos = torch.tensor(np.cos(angle), dtype=x.dtype)[:, None, :]
    sin = torch.tensor(np.sin(angle), dtype=x.dtype)[:, None, :]
    h = x.reshape(b, t, heads, d)
    rotated = torch.cat([-h[..., d // 2:], h[..., :d // 2]], -1)
    return (h * cos + rotated * sin).reshape(b, t, w)
