"""The CPU forward on our own kernels (kernels/*.c): a Llama-family decoder step as one native call for all layers.

Per layer:  x = rmsnorm(h) -> qkv = x W_qkv -> rotary + cache write -> attention (reads the cache in place)
            -> h += attn W_o; x = rmsnorm(h) -> gu = x W_gate|up -> a = silu(gate) * up -> h += a W_down
Why: a decode or verify step at small batch is bound by streaming the weights once; PyTorch's eager path
spends as long again on ~40 small ops per layer and on gathering whole cache rows for attention. Here the
matmuls run at the memory bound (gemm.c), everything between them is one kernel per concern, and the whole
stack runs in one OpenMP region (forward.c): no call, fork or join between the kernels.

Exactness: every kernel computes each token row on its own, in an order that does not depend on the batch,
the row's width or the cache length of other rows, so a token's logits are bitwise the same alone, batched,
or as one of k + 1 verify positions. Against transformers' eager float32 forward the logits agree to about
1e-5 (summation order of matmuls, softmax and norms; tests/unit/test_native.py measures it).

Weights: the matmuls' weights are packed in the model's dtype (float32 or bfloat16), or with weights="int8"
quantized to int8 with a scale per output channel (int8.py: q/k/v/o, gate/up/down and the lm_head; the
embedding, norms and rotary stay as loaded). Int8 is lossy against the checkpoint but exact with itself:
the same kernels, the same fixed orders, so the invariance above holds for an int8 model too.
weights="int8-dynamic" / "int8-dynamic8": the same int8 weights, and every matmul's input quantized per row in
the call to int16 / int8 (on VNNI, kernels/gemm_i8a8.c: exact integer sums, so just as invariant); the residual
stream, norms, attention and the KV cache stay float32.

Shapes: N new tokens (the rows' real tokens, padding dropped), hidden size E, H query heads and Hkv KV
heads of size D, intermediate size I; per layer the cache holds K as [S slots, Hkv, D, P positions] and V as
[S, Hkv, P, D], float32, or bfloat16 (each value rounded to nearest even as it is written, widened exactly as it
is read: lossy against float32, but the same for a token alone or batched, so the invariance holds; the int8
draft copy's cache, where attention over 8 streams reads as many bytes as the weights).
"""
from __future__ import annotations

import ctypes

import torch

from .int8 import ACTIVATIONS
from .kernels import abi
from .linear import make_linear

SUPPORTED_ACTS = ("silu",)
KV_DTYPES = (torch.float32, torch.bfloat16)     # the KV cache: exact, or half the bytes for attention to read


def supports(model: torch.nn.Module) -> str | None:
    """None if the native forward can run this model, else the reason it cannot."""
    cfg = model.config
    if getattr(cfg, "hidden_act", None) not in SUPPORTED_ACTS:
        return f"activation {getattr(cfg, 'hidden_act', None)!r}"
    layer = model.model.layers[0]
    for norm in (layer.input_layernorm, layer.post_attention_layernorm, model.model.norm):
        if not hasattr(norm, "variance_epsilon") or getattr(norm, "bias", None) is not None:
            return f"norm {type(norm).__name__}"
    if getattr(layer.self_attn.o_proj, "bias", None) is not None:
        return "o_proj bias"
    return None


class _Layer:
    __slots__ = ("qkv", "o", "gate_up", "down", "w_in", "eps_in", "w_post", "eps_post")


def _norm_weight(norm: torch.nn.Module) -> tuple[torch.Tensor, float]:
    return norm.weight.detach().float().contiguous(), float(norm.variance_epsilon)


class NativeForward:
    def __init__(self, model: torch.nn.Module, lib, weights: str = "auto"):
        """weights: "auto" = the matmul weights keep the model's dtype (float32 or bfloat16); "int8" = every
        matmul's weight (the lm_head's too) quantized per output channel (int8.py); "int8-dynamic" /
        "int8-dynamic8" = those int8 weights times activations quantized per row to int16 / int8 (needs VNNI:
        kernels.has_vnni)."""
        cfg = model.config
        inner = model.model
        wdt = torch.int8 if weights == "int8" or weights in ACTIVATIONS else next(model.parameters()).dtype
        act = ACTIVATIONS.get(weights, "float32")
        linear = lambda ws, bs: make_linear(ws, bs, lib, wdt, act)  # noqa: E731
        self.lib, self.weights = lib, weights
        self.embed, self.rotary = inner.embed_tokens, inner.rotary_emb
        self.H, self.Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.D = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.E, self.inter = cfg.hidden_size, cfg.intermediate_size
        self.scaling = float(inner.layers[0].self_attn.scaling)
        self.layers = []
        for layer in inner.layers:
            a, mlp, L = layer.self_attn, layer.mlp, _Layer()
            qkv = [a.q_proj, a.k_proj, a.v_proj]
            L.qkv = linear([m.weight for m in qkv], [m.bias for m in qkv])
            L.o = linear([a.o_proj.weight], [None])
            gu = [mlp.gate_proj, mlp.up_proj]
            L.gate_up = linear([m.weight for m in gu], [m.bias for m in gu])
            L.down = linear([mlp.down_proj.weight], [mlp.down_proj.bias])
            L.w_in, L.eps_in = _norm_weight(layer.input_layernorm)
            L.w_post, L.eps_post = _norm_weight(layer.post_attention_layernorm)
            self.layers.append(L)
        self.w_final, self.eps_final = _norm_weight(inner.norm)
        self.lm_head = linear([model.lm_head.weight], [model.lm_head.bias])
        self._layer_structs, self._decoder = self._describe()
        self._head = self.lm_head.descriptor()

    def _describe(self) -> tuple[ctypes.Array, abi.Decoder]:
        """The decoder as forward.c reads it: per layer its four products and its norms (the post-attention one,
        then the next layer's input norm, the final norm after the last), addresses into this object's tensors."""
        n = len(self.layers)
        structs = (abi.Layer * n)()
        for i, L in enumerate(self.layers):
            w_next, eps_next = ((self.layers[i + 1].w_in, self.layers[i + 1].eps_in) if i + 1 < n
                                else (self.w_final, self.eps_final))
            structs[i] = abi.Layer(L.qkv.descriptor(), L.o.descriptor(), L.gate_up.descriptor(), L.down.descriptor(),
                                   L.w_post.data_ptr(), w_next.data_ptr(), L.eps_post, eps_next)
        first = self.layers[0]
        decoder = abi.Decoder(n, self.E, self.H, self.Hkv, self.D, self.inter, first.w_in.data_ptr(), first.eps_in,
                              self.scaling, structs)
        return structs, decoder

    def linear_layers(self) -> list[torch.nn.Module]:
        return [m for L in self.layers for m in (L.qkv, L.o, L.gate_up, L.down)] + [self.lm_head]

    @torch.inference_mode()
    def __call__(self, cache, tokens: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor, num_new: torch.Tensor,
                 last_only: bool, window: int | None) -> torch.Tensor:
        """The runner's forward() on padded tensors: tokens [B, T] long (right-padded), slots/starts/num_new [B]
        long, all on the CPU. Padding is dropped first: the layers see only the N real tokens."""
        B, T = tokens.shape
        valid = torch.arange(T)[None, :] < num_new[:, None]                                    # [B, T]
        positions = (starts[:, None] + torch.arange(T)[None, :])[valid]                         # [N]
        tok_slots = slots[:, None].expand(B, T)[valid]                                          # [N]
        head_rows = num_new.cumsum(0) - 1 if last_only else None
        logits = self._run(cache, tokens[valid], tok_slots.contiguous(), positions.contiguous(), window, head_rows)
        return logits if last_only else self._per_token(logits, num_new)

    @torch.inference_mode()
    def forward_rows(self, cache, rows: list[list[int]], slots: list[int], starts: list[int], last_only: bool,
                     window: int | None) -> torch.Tensor:
        """The runner's forward_rows, built straight from the lists (no padded [B, T] tensors): row b appends
        rows[b] to slot slots[b] from position starts[b]."""
        lengths = torch.tensor([len(r) for r in rows])
        logits = self._run(cache, *self._flatten(rows, slots, starts), window,
                           lengths.cumsum(0) - 1 if last_only else None)
        return logits if last_only else self._per_token(logits, lengths)

    @torch.inference_mode()
    def forward_split(self, cache, rows: list[list[int]], slots: list[int], starts: list[int], n_last: int,
                      window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """forward_rows over all rows in one pass over the weights -> (logits [n_last, V] at the last token of
        rows[:n_last], logits [B - n_last, T, V] at every token of the rest). Each row's results are bitwise
        what a forward of that row alone gives (the kernels never mix rows)."""
        lengths = torch.tensor([len(r) for r in rows])
        n, total = int(lengths[:n_last].sum()), int(lengths.sum())
        head_rows = torch.cat([lengths[:n_last].cumsum(0) - 1, torch.arange(n, total)])
        logits = self._run(cache, *self._flatten(rows, slots, starts), window, head_rows)
        return logits[:n_last], self._per_token(logits[n_last:], lengths[n_last:])

    @staticmethod
    def _flatten(rows: list[list[int]], slots: list[int], starts: list[int]) -> tuple[torch.Tensor, ...]:
        """-> tokens, slots, positions [N] long: the rows one after another."""
        flat_tokens, flat_slots, flat_pos = [], [], []
        for row, slot, start in zip(rows, slots, starts):
            flat_tokens += row
            flat_slots += [slot] * len(row)
            flat_pos += range(start, start + len(row))
        as_long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
        return as_long(flat_tokens), as_long(flat_slots), as_long(flat_pos)

    def _per_token(self, logits: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """logits [N, V] at every token of rows of `lengths` [B] tokens, one row after another -> [B, T, V] with T
        the longest row (zeros past a row's end)."""
        B, T = lengths.shape[0], int(lengths.max())
        if bool((lengths == T).all()):
            return logits.view(B, T, -1)
        out = torch.zeros(B, T, logits.shape[-1])
        out[torch.arange(T)[None, :] < lengths[:, None]] = logits
        return out

    def check_batch(self, cache, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> None:
        """ValueError unless the kernels can run this batch on `cache` without reading or writing out of bounds:
        tokens, slots, positions contiguous int64 [N]; every slot in [0, S) and position in [0, P); the tokens
        of one slot adjacent and in consecutive positions (the attention kernel's rows); the cache float32 of
        this model's shape. Once per forward (every layer's kernels see the same batch): a few reductions over
        [N], microseconds."""
        L, S, Hkv, P, D = cache.v.shape
        if (cache.v.dtype not in KV_DTYPES or cache.k.dtype != cache.v.dtype or not cache.k_positions_last
                or cache.k.shape != (L, S, Hkv, D, P) or (L, Hkv, D) != (len(self.layers), self.Hkv, self.D)
                or not (cache.k.is_contiguous() and cache.v.is_contiguous())):
            raise ValueError(f"KV cache K {tuple(cache.k.shape)} / V {tuple(cache.v.shape)} {cache.v.dtype} does "
                             f"not fit the native forward ({len(self.layers)} layers, {self.Hkv} KV heads of "
                             f"{self.D}, float32 or bfloat16, K positions last)")
        N = tokens.shape[0]
        for name, t in (("tokens", tokens), ("slots", slots), ("positions", positions)):
            if t.dtype != torch.long or t.shape != (N,) or not t.is_contiguous():
                raise ValueError(f"{name}: expected a contiguous int64 tensor of shape ({N},), got "
                                 f"{t.dtype} {tuple(t.shape)}")
        if N == 0:
            return
        lo, hi = (int(v) for v in torch.aminmax(slots))
        if lo < 0 or hi >= S:
            raise ValueError(f"slot {lo if lo < 0 else hi} out of range: the cache has {S} slots")
        lo, hi = (int(v) for v in torch.aminmax(positions))
        if lo < 0 or hi >= P:
            raise ValueError(f"position {lo if lo < 0 else hi} out of range: the cache holds {P} positions")
        if N > 1:
            same = slots[1:] == slots[:-1]
            if bool((same & (positions[1:] != positions[:-1] + 1)).any()):
                raise ValueError("tokens of one slot must be adjacent and in consecutive positions")

    def layers_forward(self, cache, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                       window: int | None) -> torch.Tensor:
        """tokens, slots, positions: [N] long -> final-normed hidden states [N, E]; KV written to `cache`."""
        return self._run(cache, tokens, slots, positions, window, head_rows=False)

    def _run(self, cache, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, window: int | None,
             head_rows: torch.Tensor | None | bool) -> torch.Tensor:
        """tokens, slots, positions: [N] long; KV written to `cache` -> float32 logits [R, V] at the hidden rows
        head_rows [R] long (None: all N), or with head_rows False the final-normed hidden states [N, E]. The
        embedding and the rotary tables here (torch: the checkpoint's own modules, rope scaling included), every
        layer and the lm_head in one native call (kernels/forward.c)."""
        self.check_batch(cache, tokens, slots, positions)
        N = tokens.shape[0]
        h = self.embed(tokens).float().contiguous()                      # [N, E] residual stream, in place
        cos, sin = self.rotary(h[None], position_ids=positions[None])                          # [1, N, D]
        cos, sin = cos[0].float().contiguous(), sin[0].float().contiguous()
        x = torch.empty(N, self.E)
        head, rows_ptr, R, logits = None, None, 0, None
        if head_rows is not False:
            if head_rows is not None:
                head_rows = head_rows.contiguous()
                rows_ptr = head_rows.data_ptr()
            R = N if head_rows is None else head_rows.shape[0]
            head, logits = ctypes.byref(self._head), torch.empty(R, self.lm_head.out_features)
        self.lib.specgram_decoder_forward(
            ctypes.byref(self._decoder), h.data_ptr(), x.data_ptr(), cos.data_ptr(), sin.data_ptr(),
            cache.k.data_ptr(), cache.v.data_ptr(), int(cache.v.dtype == torch.bfloat16), cache.v.shape[1],
            cache.v.shape[3], slots.data_ptr(),
            positions.data_ptr(), N, window or 0, head, rows_ptr, R, None if logits is None else logits.data_ptr(),
            torch.get_num_threads())
        return x if logits is None else logits
