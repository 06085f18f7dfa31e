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

Runner weights "int4": the activations quantized to int8 per row and per block of 256 inputs in the call (one scale
each, as llama.cpp's Q8_K does for its k-quants), on any CPU the kernels build for: VNNI where it has it
(kernels.has_vnni), else three instructions for its one, same results.
"""

from __future__ import annotations

import dataclasses

import torch

GROUP, SUPER = 32, 8  # inputs per group; groups per super-block
LEVELS = 15
DTYPE = torch.quint4x2  # the weight dtype that stands for this form in NativeLinear (never a tensor's dtype here)
ACTIVATIONS = "int8-blocks"  # the activations' form: int8, a scale per row and per block of BLOCK inputs
FORMS = {"int4": ACTIVATIONS}  # runner weights -> the activations' form
BLOCK = GROUP * SUPER  # inputs per activation scale: one super-block
CHUNK = 128  # rows quantized at a time: the float temporaries stay in cache (4096 rows: 2.8x slower)
FIT_ROUNDS = 2  # least-squares refits of each group's step and minimum (_fit)
ACT_LEVELS = 127  # int8 activations: [-127, 127]


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
    return -(-n // 32) * (sb * 768 + g * GROUP * 16)


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
    """-> u8 [ceil(N / 32), block bytes]: gemm_i4.c's layout (per block of 32 outputs and super-block: d, dmin, the
    8 groups' sc, the mins in pairs of groups, then each group's codes, two outputs to a byte)."""
    n = w.q.shape[0]
    g, sb = w.sc.shape[1], w.d.shape[1]
    nb = -(-n // 32)
    pad = lambda t: torch.cat([t, t.new_zeros(nb * 32 - n, *t.shape[1:])]) if nb * 32 > n else t  # noqa: E731
    q = pad(w.q).view(nb, 2, 16, g, GROUP // 4, 4)  # [block, half, j, group, k4, kk]
    codes = (q[:, 0] | (q[:, 1] << 4)).permute(0, 2, 3, 1, 4).reshape(nb, g, -1)  # [block, group, k4 * 64 + j * 4 + kk]

    def per_super(t: torch.Tensor) -> torch.Tensor:  # u8 [N, G] -> [block, super-block, 8 groups, 32 outputs]
        full = torch.zeros(nb * 32, sb * SUPER, dtype=torch.uint8)
        full[:n, :g] = t
        return full.view(nb, 32, sb, SUPER).permute(0, 2, 3, 1)

    sc = per_super(w.sc).reshape(nb, sb, -1)  # [block, super-block, group * 32 + j]
    mn = per_super(w.mn).reshape(nb, sb, SUPER // 2, 2, 32).transpose(3, 4).reshape(nb, sb, -1)  # pair, j, 2
    scales = torch.cat(
        [pad(w.d).view(nb, 32, sb).transpose(1, 2).contiguous(), pad(w.dmin).view(nb, 32, sb).transpose(1, 2)],
        dim=2,
    ).contiguous()
    heads = torch.cat([scales.view(torch.uint8), sc, mn], dim=2)  # [block, super-block, 768]
    parts = []
    for b in range(sb):
        parts += [heads[:, b], codes[:, b * SUPER : (b + 1) * SUPER].reshape(nb, -1)]
    return torch.cat(parts, dim=1).contiguous()


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x fp32 [M, K] -> (xq int64 [M, SB * 256], zero past K; xs fp32 [M, SB]) as gemm_i4.c quantizes each row: per
    block of 256 inputs, xs = amax / 127 and xq = round(x * (127 / amax)) (0 where amax is 0)."""
    m_rows, k = x.shape
    sb = groups(k)[1]
    xp = torch.zeros(m_rows, sb * BLOCK)
    xp[:, :k] = x
    xb = xp.view(m_rows, sb, BLOCK)
    amax = xb.abs().amax(dim=2)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    inv = torch.tensor(float(ACT_LEVELS), dtype=torch.float32) / safe
    xq = torch.round(xb * inv[:, :, None]).clamp_(-ACT_LEVELS, ACT_LEVELS)
    xq[amax == 0] = 0
    return xq.view(m_rows, -1).long(), torch.where(amax > 0, amax / ACT_LEVELS, torch.zeros_like(amax))


def reference(x: torch.Tensor, w: Int4Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """The kernel's product, bitwise, in plain torch: x fp32 [M, K] -> y fp32 [M, N] (gemm_i4.c's sequence)."""
    m_rows = x.shape[0]
    n, g = w.sc.shape
    sb = w.d.shape[1]
    xq, xs = quantize_activations(x.float())
    xg = xq[:, : g * GROUP].view(m_rows, g, GROUP)
    integer = torch.einsum("mgk,ngk->mng", xg, w.q.long().view(n, g, GROUP))  # I_g, exact
    sums = xg.sum(dim=2)  # A [M, G]
    pad = sb * SUPER - g
    scaled = torch.nn.functional.pad(integer * w.sc.long()[None], (0, pad)).view(m_rows, n, sb, SUPER).sum(dim=3)
    mins = torch.nn.functional.pad(sums[:, None, :] * w.mn.long()[None], (0, pad)).view(m_rows, n, sb, SUPER).sum(3)
    acc = torch.zeros(m_rows, n)
    for b in range(sb):
        t = scaled[:, :, b].float() * w.d[:, b]
        t = t - mins[:, :, b].float() * w.dmin[:, b]
        t = t * xs[:, b : b + 1]
        acc = acc + t
    return acc + bias.float() if bias is not None else acc
