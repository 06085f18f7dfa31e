"""4-bit weights for the native kernels (kernels/gemm_i4.c): group-wise codes with two-level scales, the layout of
GGUF's Q4_K, and activations quantized per row in the call as int8.py's dynamic forms do.

The form: for a weight W [N, K], K padded with zeros to G = ceil(K / 32) groups of 32 inputs, groups taken 8 at a
time into super-blocks; per output n and group g, codes q in [0, 15] and
    W[n, k] ~ s[n, g] * q[n, k] - m[n, g],   s = d[n, g // 8] * sc[n, g],   m = dmin[n, g // 8] * mn[n, g]
(fp32 products) with d, dmin fp32 per output and super-block, sc, mn u8 per output and group: 4.75 bits per
weight with the scales, 4.5 bits per weight in GGUF's Q4_K (6-bit sub-scales and fp16 super-scales, which this form
holds exactly: gguf_checkpoint.py). Asymmetric (a minimum per group) because a group's weights are rarely
centred on zero to within a level.

quantize(): per group a step and minimum fitted to its weights (the range [min(w, 0), max(w, 0)] in 15 steps, then
least-squares refits), the sub-scales rounded against the super-block's largest, then each code to the nearest
level of the scales as rounded. Lossy against fp32 (a weight within its group's levels moves by up to s / 2, one
past them to the nearest end; docs/models.md has the agreement with fp32 on a real model), exact with itself: the
kernel sums codes times quantized activations in integers per group, then applies the scales in a fixed order, so
a row's output is bitwise the same alone, batched or as a verify position (gemm_i4.c has the exact sequence,
reference() reproduces it).

Runner weights "int4" (int16 activations: two int8 digits) and "int4-dynamic8" (int8 activations), on any CPU the
kernels build for: VNNI where it has it (kernels.has_vnni), else three instructions for its one, same results.
"""

from __future__ import annotations

import dataclasses

import torch

GROUP, SUPER = 32, 8  # inputs per group; groups per super-block
LEVELS = 15
DTYPE = torch.quint4x2  # the weight dtype that stands for this form in NativeLinear (never a tensor's dtype here)
FORMS = {"int4": "int16", "int4-dynamic8": "int8"}  # runner weights -> the activations' form
CHUNK = 128  # rows quantized at a time: the float temporaries stay in cache (4096 rows: 2.8x slower)
FIT_ROUNDS = 2  # least-squares refits of each group's step and minimum (_fit)
ACT_LEVELS = {"int16": 32639, "int8": 127}  # gemm_i4.c's L per activation form


@dataclasses.dataclass
class Int4Weight:
    """One matrix in the form above: q u8 [N, 32 G] (codes, zero past K), sc, mn u8 [N, G], d, dmin fp32 [N, SB]."""

    q: torch.Tensor
    sc: torch.Tensor
    mn: torch.Tensor
    d: torch.Tensor
    dmin: torch.Tensor
    in_features: int

    def rows(self, index: torch.Tensor) -> Int4Weight:
        """These output rows only, in this order."""
        return Int4Weight(
            self.q[index], self.sc[index], self.mn[index], self.d[index], self.dmin[index], self.in_features
        )

    def scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (s, m) fp32 [N, G]: each group's step and minimum, as the kernel forms them."""
        idx = torch.arange(self.sc.shape[1]) // SUPER
        return self.d[:, idx] * self.sc.float(), self.dmin[:, idx] * self.mn.float()

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight [N, K] these codes stand for: s * q - m per element (two fp32 roundings)."""
        s, m = self.scales()
        n, g = self.sc.shape
        w = s[:, :, None] * self.q.view(n, g, GROUP).float() - m[:, :, None]
        return w.view(n, g * GROUP)[:, : self.in_features]


def cat(parts: list[Int4Weight]) -> Int4Weight:
    """Several matrices of the same inputs as one (rows appended in order: fused projections)."""
    if len(parts) == 1:
        return parts[0]
    fields = ("q", "sc", "mn", "d", "dmin")
    return Int4Weight(*(torch.cat([getattr(p, f) for p in parts]) for f in fields), parts[0].in_features)


def groups(k: int) -> tuple[int, int]:
    """K inputs -> (groups, super-blocks)."""
    g = -(-k // GROUP)
    return g, -(-g // SUPER)


def _two_level(v: torch.Tensor, sb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """v fp32 [n, G] >= 0 -> (u8 [n, G], fp32 [n, sb]) with v ~ top[:, g // 8] * sub (round to nearest)."""
    n, g = v.shape
    padded = torch.zeros(n, sb * SUPER)
    padded[:, :g] = v
    top = padded.view(n, sb, SUPER).amax(dim=2) / 255.0
    safe = torch.where(top > 0, top, torch.ones_like(top))
    sub = torch.round(padded.view(n, sb, SUPER) / safe[:, :, None]).clamp_(0, 255).view(n, -1)[:, :g]
    return sub.to(torch.uint8), top


def packed_bytes(n: int, k: int) -> int:
    """The bytes pack() makes of an [n, k] weight (its scales included)."""
    g, sb = groups(k)
    return -(-n // 32) * (sb * 256 + g * (64 + GROUP * 16))


def _codes(w: torch.Tensor, s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """w [n, G, 32], s, m [n, G] -> the nearest codes [n, G, 32] in [0, 15], as floats (0 where s = 0)."""
    inv = torch.where(s > 0, 1.0 / torch.where(s > 0, s, torch.ones_like(s)), torch.zeros_like(s))
    return (w + m[:, :, None]).mul_(inv[:, :, None]).round_().clamp_(0, LEVELS)


def _fit(w: torch.Tensor, rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [n, G, 32] -> each group's step and minimum (s, m >= 0) [n, G]: first the range [min(w, 0), max(w, 0)] in
    15 steps, then `rounds` times the least-squares line through (codes, weights) for the codes of the last one
    (kept where it has s > 0 and m >= 0, which the sub-scales hold). On Qwen2.5-Coder-1.5B's projections two rounds
    take the weights' relative error from 0.044 to 0.034."""
    lo, hi = w.amin(dim=2).clamp(max=0.0), w.amax(dim=2).clamp(min=0.0)
    s, m = (hi - lo) / LEVELS, -lo
    wm = w.mean(dim=2)
    for _ in range(rounds):
        q = _codes(w, s, m)
        qm = q.mean(dim=2)
        var = (q * q).mean(dim=2) - qm * qm
        cov = (q.mul_(w)).mean(dim=2) - qm * wm  # q is spent: q * w in place
        ns = cov / torch.where(var > 0, var, torch.ones_like(var))
        nm = ns * qm - wm
        ok = (var > 1e-6) & (ns > 0) & (nm >= 0)
        s, m = torch.where(ok, ns, s), torch.where(ok, nm, m)
    return s, m


def quantize(weight: torch.Tensor, rounds: int = FIT_ROUNDS) -> Int4Weight:
    """weight [N, K] (any float dtype) -> its Int4Weight (see the module's docstring; rounds: _fit's)."""
    n, k = weight.shape
    g, sb = groups(k)
    out = Int4Weight(
        torch.zeros(n, g * GROUP, dtype=torch.uint8),
        torch.empty(n, g, dtype=torch.uint8),
        torch.empty(n, g, dtype=torch.uint8),
        torch.empty(n, sb),
        torch.empty(n, sb),
        k,
    )
    for i in range(0, n, CHUNK):
        w = torch.zeros(min(CHUNK, n - i), g * GROUP)
        w[:, :k] = weight[i : i + CHUNK].detach().to("cpu", torch.float32)
        w = w.view(-1, g, GROUP)
        s, m = _fit(w, rounds)
        sc, d = _two_level(s, sb)
        mn, dmin = _two_level(m, sb)
        idx = torch.arange(g) // SUPER
        q = _codes(w, d[:, idx] * sc.float(), dmin[:, idx] * mn.float())  # against the scales as rounded
        out.q[i : i + CHUNK] = q.view(-1, g * GROUP).to(torch.uint8)
        out.q[i : i + CHUNK, k:] = 0  # padding: zero codes (their activations are zero too)
        out.sc[i : i + CHUNK], out.mn[i : i + CHUNK], out.d[i : i + CHUNK], out.dmin[i : i + CHUNK] = sc, mn, d, dmin
    return out


def pack(w: Int4Weight) -> torch.Tensor:
    """-> u8 [ceil(N / 32), block bytes]: gemm_i4.c's layout (per block of 32 outputs: per super-block its d and
    dmin, then per group sc, mn and the codes, two outputs to a byte)."""
    n = w.q.shape[0]
    g, sb = w.sc.shape[1], w.d.shape[1]
    nb = -(-n // 32)
    pad = lambda t: torch.cat([t, t.new_zeros(nb * 32 - n, *t.shape[1:])]) if nb * 32 > n else t  # noqa: E731
    q = pad(w.q).view(nb, 2, 16, g, GROUP // 4, 4)  # [block, half, j, group, k4, kk]
    codes = (q[:, 0] | (q[:, 1] << 4)).permute(0, 2, 3, 1, 4).reshape(nb, g, -1)  # [block, group, k4 * 64 + j * 4 + kk]
    per_group = torch.cat(
        [pad(w.sc).view(nb, 32, g).transpose(1, 2), pad(w.mn).view(nb, 32, g).transpose(1, 2), codes], dim=2
    )
    heads = (
        torch.cat(
            [pad(w.d).view(nb, 32, sb).transpose(1, 2).contiguous(), pad(w.dmin).view(nb, 32, sb).transpose(1, 2)],
            dim=2,
        )
        .contiguous()
        .view(torch.uint8)
    )  # [block, super-block, 256]
    parts = []
    for b in range(sb):
        parts += [heads[:, b], per_group[:, b * SUPER : (b + 1) * SUPER].reshape(nb, -1)]
    return torch.cat(parts, dim=1).contiguous()


def quantize_activations(x: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x fp32 [M, K] -> (xq int64 [M, K], xs fp32 [M]) as gemm_i4.c quantizes each row."""
    amax = x.abs().amax(dim=1)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    inv = torch.tensor(float(levels), dtype=torch.float32) / safe
    xq = torch.round(x * inv[:, None]).clamp_(-levels, levels)
    xq[amax == 0] = 0
    return xq.long(), torch.where(amax > 0, amax / levels, torch.zeros_like(amax))


def reference(x: torch.Tensor, w: Int4Weight, bias: torch.Tensor | None, activations: str = "int16") -> torch.Tensor:
    """The kernel's product, bitwise, in plain torch: x fp32 [M, K] -> y fp32 [M, N] (gemm_i4.c's sequence)."""
    m_rows, k = x.shape
    n, g = w.sc.shape
    xq, xs = quantize_activations(x.float(), ACT_LEVELS[activations])
    xp = torch.zeros(m_rows, g * GROUP, dtype=torch.int64)
    xp[:, :k] = xq
    integer = torch.einsum("mgk,ngk->mng", xp.view(m_rows, g, GROUP), w.q.long().view(n, g, GROUP))  # exact
    sums = xp.view(m_rows, g, GROUP).sum(dim=2).float()  # [M, G]
    s, m = w.scales()
    acc = torch.zeros(m_rows, n)
    for j in range(g):
        t = integer[:, :, j].float() * s[:, j]
        t = t - m[:, j] * sums[:, j : j + 1]
        acc = acc + t
    y = acc * xs[:, None]
    return y + bias.float() if bias is not None else y
