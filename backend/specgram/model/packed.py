"""A model as forward.c reads it: its matmul weights packed for the native products (linear.py: fused q|k|v and
gate|up, in the model's dtype or an int8 form), its norms, and the specgram.h structs that point into them.

Built once at load. The structs hold raw addresses of these tensors: this object keeps every tensor they point
into for as long as it lives.
"""

from __future__ import annotations

import ctypes

import torch

from ..errors import ModelLoadError
from . import int4, kernels
from .checkpoint import ModuleTensors, release_freed_memory
from .families import describe
from .gguf_checkpoint import STORED
from .int8 import ACTIVATIONS, BLOCKS
from .kernels import abi
from .linear import NativeLinear, data_ptr, make_linear


class _Layer:
    """One layer's packed products (qkv, o, gate_up, down) and norm weights, set by PackedDecoder."""


def _norm_weight(norm: torch.nn.Module, offset: float = 0.0, read=None) -> tuple[torch.Tensor, float]:
    """An RMSNorm's weight as the kernels scale by it (gemma's (1 + w), summed in float32 as gemma does) and its
    epsilon (transformers names it variance_epsilon or eps). read: the module's weight as stored (ModuleTensors)."""
    w = (norm.weight.detach() if read is None else read(norm)).float()
    eps = norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps
    return (w + offset if offset else w).contiguous(), float(eps)


class PackedDecoder:
    """The weights, norms and structs of one model as forward.c reads them."""

    def __init__(
        self,
        model: torch.nn.Module,
        lib,
        weights: str = "auto",
        head_ids: torch.Tensor | None = None,
        tensors: ModuleTensors | None = None,
    ):
        """weights: "auto" = the matmul weights keep the model's dtype (float32 or bfloat16); "int8" = every matmul's
        weight (the lm_head's too) quantized per output channel (int8.py); "int8-dynamic" / "int8-dynamic8" = those int8
        weights times activations quantized per row to int16 / int8 (needs VNNI: kernels.has_vnni); "int4" = 4-bit
        weights in groups (int4.py) times int8 activations with a scale per 256 inputs; "gguf" = a GGUF file's forms
        (gguf_checkpoint.py: int4 where its blocks are Q4_K, as "int4"; else int8, as "int8-blocks" on VNNI).
        head_ids [V'] long: the lm_head computes the logits of these vocabulary entries only, in this order (a draft's
        reduced vocabulary: speculation/draft_vocab.py); each is bitwise the full head's entry (a row of the product,
        its own per-channel scale). tensors: where each module's weights are read (checkpoint.py: one at a time from the
        files of a skeleton model); None: the model's own parameters."""
        cfg = model.config
        inner = model.model
        src = tensors or ModuleTensors(model)
        wdt = torch.int8 if weights == "int8" or weights in ACTIVATIONS else next(model.parameters()).dtype
        wdt = int4.DTYPE if weights in int4.FORMS else wdt
        act = {**ACTIVATIONS, **int4.FORMS}.get(weights, "float32")

        def linear(modules: list[torch.nn.Module], rows: torch.Tensor | None = None) -> NativeLinear:
            """The product of these modules (fused), each weight read, packed, then let go; rows: only these
            output rows (one module)."""
            pick = (lambda t: t) if rows is None else (lambda t: None if t is None else t[rows])  # noqa: E731
            stored = src.int4(modules) if weights in (*int4.FORMS, STORED) else None  # a file's Q4_K blocks
            biases = [pick(src.bias(m)) for m in modules]
            if stored is not None:  # kept exactly: no float weight read
                form = (int4.DTYPE, int4.ACTIVATIONS) if weights == STORED else (wdt, act)
                stored = stored if rows is None else stored.rows(rows)
                return make_linear([pick(m.weight) for m in modules], biases, lib, *form, stored=stored)
            # STORED: any other type in int8, its activations as the Q4_K blocks' (int8 per 256 inputs) on VNNI
            stored_int8 = (torch.int8, ACTIVATIONS[BLOCKS] if kernels.has_vnni(lib) else "float32")
            form = stored_int8 if weights == STORED else (wdt, act)
            # a quantized form of one matrix reads it by blocks of rows (a GGUF head is never float32 whole)
            read = src.weight_rows if len(modules) == 1 and form[0] in (torch.int8, int4.DTYPE) else src.weight
            return make_linear([pick(read(m)) for m in modules], biases, lib, *form)

        self.lib, self.weights = lib, weights
        self._embed_weight = src.embedding()  # read by forward.c
        arch = self.arch = describe(cfg)
        self.H, self.Hkv, self.D = cfg.num_attention_heads, cfg.num_key_value_heads, arch.head_dim
        self.E, self.inter = cfg.hidden_size, cfg.intermediate_size
        self.scaling = arch.attn_scale if arch.attn_scale is not None else self.D**-0.5
        if any(float(layer.self_attn.scaling) != self.scaling for layer in inner.layers):
            raise ModelLoadError(
                f"{arch.family}: the attention modules' score scale is not the family's {self.scaling} (the native "
                "forward reads the family's): serve this checkpoint with linear torch"
            )
        self.rotary_dims = int(self.D * arch.rotary_fraction)  # the rotating dimensions of a head (transformers' own)
        norm = lambda m: _norm_weight(m, arch.norm_offset, lambda n: src.weight(n, own=True))  # noqa: E731
        self.layers = []
        for i, layer in enumerate(inner.layers):
            a, mlp, L = layer.self_attn, layer.mlp, _Layer()
            fused = arch.fused_projections  # phi3: q|k|v and gate|up are one matrix each in the checkpoint
            qkv = [a.qkv_proj] if fused else [a.q_proj, a.k_proj, a.v_proj]
            L.qkv = linear(qkv)
            L.o = linear([a.o_proj])  # a bias where attention_bias sets one (llama, qwen3)
            L.gate_up = linear([mlp.gate_up_proj] if fused else [mlp.gate_proj, mlp.up_proj])
            L.down = linear([mlp.down_proj])
            L.w_in, L.eps_in = norm(layer.input_layernorm)
            (L.w_attn_out, L.eps_attn_out), (L.w_mlp_out, L.eps_mlp_out) = (None, 0.0), (None, 0.0)
            if arch.sandwich_norms:  # gemma3: the branch outputs normed; the MLP's input norm is its own
                L.w_attn_out, L.eps_attn_out = norm(layer.post_attention_layernorm)
                L.w_post, L.eps_post = norm(layer.pre_feedforward_layernorm)
                L.w_mlp_out, L.eps_mlp_out = norm(layer.post_feedforward_layernorm)
            else:
                L.w_post, L.eps_post = norm(layer.post_attention_layernorm)
            L.q_norm, L.k_norm, L.qk_eps = None, None, 0.0
            if arch.qk_norm:  # qwen3, gemma3: an RMSNorm over each head of q and k before rotary
                (L.q_norm, L.qk_eps), (L.k_norm, _) = norm(a.q_norm), norm(a.k_norm)
            L.rope, L.table, L.sliding = arch.rope_layers[i], arch.layer_tables[i], arch.windows[i] is not None
            self.layers.append(L)
            if src.files is not None:  # read from the files: the layer's temporaries go back, not into the peak
                release_freed_memory()
        self.w_final, self.eps_final = norm(inner.norm)
        self.lm_head = linear([model.lm_head], head_ids)
        self._layer_structs, self._decoder = self._describe()
        self._head = self.lm_head.descriptor()

    def _describe(self) -> tuple[ctypes.Array, abi.Decoder]:
        """The decoder as forward.c reads it: per layer its four products and its norms (the post-attention one,
        then the next layer's input norm, the final norm after the last), addresses into this object's tensors."""
        n = len(self.layers)
        structs = (abi.Layer * n)()
        for i, L in enumerate(self.layers):
            w_next, eps_next = (
                (self.layers[i + 1].w_in, self.layers[i + 1].eps_in) if i + 1 < n else (self.w_final, self.eps_final)
            )
            products = (L.qkv.descriptor(), L.o.descriptor(), L.gate_up.descriptor(), L.down.descriptor())
            norms = (L.w_post.data_ptr(), w_next.data_ptr(), L.eps_post, eps_next)
            qk = (data_ptr(L.q_norm), data_ptr(L.k_norm), L.qk_eps, int(L.rope), L.table, int(L.sliding))
            branch = (data_ptr(L.w_attn_out), data_ptr(L.w_mlp_out), L.eps_attn_out, L.eps_mlp_out)
            structs[i] = abi.Layer(*products, *norms, *qk, *branch)
        first = self.layers[0]
        emb = self._embed_weight
        shape = (n, self.E, self.H, self.Hkv, self.D, self.inter)
        first_norm = (first.w_in.data_ptr(), first.eps_in)
        embed = (emb.data_ptr(), emb.shape[0], int(emb.dtype == torch.bfloat16))
        scales = (self.arch.embed_scale, self.arch.residual_scale)
        act = abi.ACT_GELU_TANH if self.arch.act == "gelu_tanh" else abi.ACT_SILU
        decoder = abi.Decoder(*shape, *first_norm, self.scaling, structs, *embed, self.rotary_dims, *scales, act)
        return structs, decoder

    def linear_layers(self) -> list[torch.nn.Module]:
        return [m for L in self.layers for m in (L.qkv, L.o, L.gate_up, L.down)] + [self.lm_head]
