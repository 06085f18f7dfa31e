"""The CPU forward on our own kernels (kernels/*.c): a decoder step as one native call for all layers, for the
families whose description (families.py) it covers.

Per layer:  x = rmsnorm(h) -> qkv = x W_qkv -> q/k head norms, rotary, cache write -> attention (reads the cache
            in place) -> h += attn W_o; x = rmsnorm(h) -> gu = x W_gate|up -> a = silu(gate) * up -> h += a W_down
            (the family's q/k norms, rotary per layer and multipliers: packed.py hands them to forward.c)
Why: a decode or verify step at small batch is bound by streaming the weights once; PyTorch's eager path adds
dozens of small ops per layer and gathers whole cache rows for attention. Here the
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
the call to int16 / int8 (on VNNI, kernels/gemm_i8a8.c: exact integer sums, so just as invariant); "int8-blocks":
to int8 per row and block of 256 inputs (kernels/gemm_i8b.c), as "int4" quantizes its inputs; the residual
stream, norms, attention and the KV cache stay float32.

Shapes: N new tokens (the rows' real tokens, padding dropped), hidden size E, H query heads and Hkv KV
heads of size D, intermediate size I; per layer the cache holds K as [S slots, Hkv, D, P positions] and V as
[S, Hkv, P, D], float32, or bfloat16 (each value rounded to nearest even as it is written, widened exactly as it
is read: lossy against float32, but the same for a token alone or batched, so the invariance holds; the int8
draft copy's own cache, where attention over many streams reads as many bytes as its int8 weights).
"""

from __future__ import annotations

import ctypes
from itertools import accumulate

import torch

from ..errors import ModelLoadError
from . import rotary
from . import tree as tree_rows
from .kernels import abi
from .packed import PackedDecoder

CACHE_DTYPES = (torch.float32, torch.bfloat16)  # the KV cache the kernels read: exact, or half the bytes


def _int64s(values: list[int]) -> ctypes.Array:
    """A list of ints as the C int64 array the kernels read (no tensor: a decode step's indices are a few ints)."""
    return (ctypes.c_int64 * len(values))(*values)


def _address(v) -> int:
    """The data address of an index vector: a ctypes int64 array or a contiguous int64 tensor."""
    return v.data_ptr() if isinstance(v, torch.Tensor) else ctypes.addressof(v)


class NativeForward(PackedDecoder):
    """A model's forward on the kernels: its packed weights and structs (PackedDecoder) and the calls into
    forward.c, with the rotary tables by cache length."""

    def __init__(self, model: torch.nn.Module, lib, *args, **kwargs):  # PackedDecoder's arguments
        super().__init__(model, lib, *args, **kwargs)
        self.rotary = model.model.rotary_emb
        if not rotary.fixed(self.rotary):  # its tables would change with the call (rotary.freeze first)
            raise ModelLoadError("a length-dependent rotary module: freeze it (model/rotary.py) before packing")
        self._rope_tables: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # by cache length
        width = self._tables(torch.zeros(1, 1, dtype=torch.long))[0].shape[-1]
        if width != self.rotary_dims:  # the kernels read rows of rotary_dims floats
            raise ModelLoadError(
                f"the rotary tables are {width} wide where the native forward rotates {self.rotary_dims} dimensions "
                "of each head: serve this checkpoint with linear torch"
            )
        self._lora, self._lora_keep = None, None

    def attach_lora(self, adapters) -> None:
        """LoRA adapters (lora.Adapters) applied from now on, each token under its row's adapter (the calls'
        `adapters`)."""
        self._lora, self._lora_keep = adapters.native_table(len(self.layers))

    def _lora_args(self, per_token: list[int] | None) -> tuple:
        """-> (the adapters' table, each token's adapter) for forward.c; (None, None) where no token has one."""
        if self._lora is None or per_token is None or max(per_token, default=-1) < 0:
            return None, None
        return ctypes.byref(self._lora), _int64s(per_token)

    @torch.inference_mode()
    def __call__(
        self,
        cache,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        starts: torch.Tensor,
        num_new: torch.Tensor,
        last_only: bool,
        window: int | None,
        adapters: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The runner's forward() on padded tensors: tokens [B, T] long (right-padded), slots/starts/num_new [B]
        long, adapters [B] long (each row's LoRA adapter, -1: none; None: none at all), all on the CPU. Padding is
        dropped first: the layers see only the N real tokens."""
        B, T = tokens.shape
        valid = torch.arange(T)[None, :] < num_new[:, None]  # [B, T]
        positions = (starts[:, None] + torch.arange(T)[None, :])[valid]  # [N]
        tok_slots = slots[:, None].expand(B, T)[valid]  # [N]
        head_rows = (num_new.cumsum(0) - 1).contiguous() if last_only else None
        per_token = None if adapters is None else adapters[:, None].expand(B, T)[valid].tolist()
        flat = (tokens[valid].contiguous(), tok_slots.contiguous(), positions.contiguous())
        logits = self._run(cache, *flat, per_token, window, head_rows)
        return logits if last_only else self._per_token(logits, num_new.tolist())

    @torch.inference_mode()
    def forward_rows(
        self,
        cache,
        rows: list[list[int]],
        slots: list[int],
        starts: list[int],
        last_only: bool,
        window: int | None,
        trees: list[list[int] | None] | None = None,
        adapters: list[int] | None = None,
    ) -> torch.Tensor:
        """The runner's forward_rows, built straight from the lists (no padded [B, T] tensors): row b appends
        rows[b] to slot slots[b] from position starts[b]; trees and adapters as forward_split's."""
        lengths = [len(r) for r in rows]
        head_rows = _int64s([n - 1 for n in accumulate(lengths)]) if last_only else None
        masks = tree_rows.flat_masks(trees, lengths)
        logits = self._run(cache, *self._flatten(rows, slots, starts, adapters), window, head_rows, masks)
        return logits if last_only else self._per_token(logits, lengths)

    @torch.inference_mode()
    def forward_split(
        self,
        cache,
        rows: list[list[int]],
        slots: list[int],
        starts: list[int],
        n_last: int,
        window: int | None,
        trees: list[list[int] | None] | None = None,
        adapters: list[int] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """forward_rows over all rows in one pass over the weights -> (logits [n_last, V] at the last token of
        rows[:n_last], logits [B - n_last, T, V] at every token of the rest). Each row's results are bitwise
        what a forward of that row alone gives (the kernels never mix rows). trees: per row its tokens' parents
        (tree.py; None: a plain row), or None for all plain: a tree token's results are bitwise those of its own
        path verified as a plain row. adapters: per row its LoRA adapter (-1: none), or None: none at all."""
        lengths = [len(r) for r in rows]
        ends = list(accumulate(lengths))
        n = ends[n_last - 1] if n_last else 0
        head_rows = _int64s([e - 1 for e in ends[:n_last]] + list(range(n, ends[-1] if ends else 0)))
        masks = tree_rows.flat_masks(trees, lengths)
        logits = self._run(cache, *self._flatten(rows, slots, starts, adapters), window, head_rows, masks)
        return logits[:n_last], self._per_token(logits[n_last:], lengths[n_last:])

    @staticmethod
    def _flatten(rows: list[list[int]], slots: list[int], starts: list[int], adapters: list[int] | None) -> tuple:
        """-> tokens, slots, positions [N] as int64 arrays, the rows one after another, and each token's row's
        adapter (a list; None where `adapters`, per row, is None)."""
        flat_tokens, flat_slots, flat_pos = [], [], []
        for row, slot, start in zip(rows, slots, starts, strict=True):
            flat_tokens += row
            flat_slots += [slot] * len(row)
            flat_pos += range(start, start + len(row))
        per_token = None if adapters is None else [a for a, r in zip(adapters, rows, strict=True) for _ in r]
        return _int64s(flat_tokens), _int64s(flat_slots), _int64s(flat_pos), per_token

    def _per_token(self, logits: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """logits [N, V] at every token of rows of `lengths` tokens, one row after another -> [B, T, V] with T the
        longest row (zeros past a row's end)."""
        B, T = len(lengths), max(lengths)
        if all(n == T for n in lengths):
            return logits.view(B, T, -1)
        out = torch.empty(B, T, logits.shape[-1])  # each row's slice copied, only the padding zeroed: an
        start = 0  # 8-row verify's [B, T, V] is ~8 MB to fill otherwise
        for b, n in enumerate(lengths):
            out[b, :n] = logits[start : start + n]
            out[b, n:] = 0
            start += n
        return out

    def check_cache(self, cache) -> None:
        """ValueError unless `cache` fits this model and the kernels: float32 or bfloat16, K positions last, this
        model's layers, KV heads and head size, contiguous."""
        L, S, Hkv, P, D = cache.v.shape
        if (
            cache.v.dtype not in CACHE_DTYPES
            or cache.k.dtype != cache.v.dtype
            or not cache.k_positions_last
            or cache.k.shape != (L, S, Hkv, D, P)
            or (L, Hkv, D) != (len(self.layers), self.Hkv, self.D)
            or not (cache.k.is_contiguous() and cache.v.is_contiguous())
        ):
            raise ValueError(
                f"KV cache K {tuple(cache.k.shape)} / V {tuple(cache.v.shape)} {cache.v.dtype} does "
                f"not fit the native forward ({len(self.layers)} layers, {self.Hkv} KV heads of "
                f"{self.D}, float32 or bfloat16, K positions last)"
            )

    def _bad_batch(self, code: int, cache, tokens, slots, positions) -> ValueError:
        """The error for forward.c's return code, naming the first offending value (this runs only then)."""
        S, P = cache.v.shape[1], cache.v.shape[3]
        tokens, slots, positions = (
            list(v.tolist() if isinstance(v, torch.Tensor) else v) for v in (tokens, slots, positions)
        )
        if code == abi.BAD_TOKEN:
            bad = next(t for t in tokens if not 0 <= t < self._embed_weight.shape[0])
            return ValueError(f"token id {bad} out of range: the vocabulary has {self._embed_weight.shape[0]} ids")
        if code == abi.BAD_SLOT:
            bad = next(s for s in slots if not 0 <= s < S)
            return ValueError(f"slot {bad} out of range: the cache has {S} slots")
        if code == abi.BAD_POSITION:
            bad = next(p for p in positions if not 0 <= p < P)
            return ValueError(f"position {bad} out of range: the cache holds {P} positions")
        if code == abi.BAD_TREE:
            return ValueError("a tree token's ancestor mask must include the token itself")
        if code == abi.BAD_ROW:
            return ValueError("tokens of one slot must be adjacent and in consecutive positions")
        return ValueError("a logits row outside the batch" if code == abi.BAD_HEAD_ROW else f"bad batch ({code})")

    def _rotary(self, P: int) -> tuple[torch.Tensor, torch.Tensor]:
        """-> cos, sin tables by position ([tables x P, rotary]), built once per cache length with the checkpoint's
        own rotary module (frozen where its frequencies depend on the length: rotary.py), so a position's rows do
        not depend on the call (tests/unit/test_rotary.py). One table per rotary the family has (gemma3: its
        global and local bases)."""
        tables = self._rope_tables.get(P)
        if tables is None:
            tables = self._rope_tables[P] = self._tables(torch.arange(P)[None])
        return tables

    def _tables(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x, cos, sin = torch.empty(1, 1, 1), [], []
        for layer_type in self.arch.rope_types:
            c, s = self.rotary(x, position_ids=position_ids, **({"layer_type": layer_type} if layer_type else {}))
            cos.append(c[0].float())
            sin.append(s[0].float())
        return torch.cat(cos).contiguous(), torch.cat(sin).contiguous()

    def layers_forward(
        self, cache, tokens: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, window: int | None
    ) -> torch.Tensor:
        """tokens, slots, positions: [N] long -> final-normed hidden states [N, E]; KV written to `cache`."""
        return self._run(cache, tokens, slots, positions, None, window, head_rows=False)

    def _run(self, cache, tokens, slots, positions, adapters, window: int | None, head_rows, tree=None) -> torch.Tensor:
        """tokens, slots, positions: [N] int64 (ctypes arrays, or contiguous int64 tensors), adapters: each token's
        LoRA adapter (a list [N], -1: none) or None: none; KV written to `cache`
        -> float32 logits [R, V] at the final hidden rows head_rows [R] (None: all N), or with head_rows False
        the final-normed hidden states [N, E]. The embedding lookup, rotary, every layer and the lm_head in one
        native call (kernels/forward.c), which checks the indices before it writes anything (ValueError).
        tree: each token's ancestor mask (uint64 [N], tree.flat_masks), or None: causal."""
        self.check_cache(cache)
        N = len(tokens)
        for name, t in (("tokens", tokens), ("slots", slots), ("positions", positions), ("head_rows", head_rows)):
            if isinstance(t, torch.Tensor) and (
                t.dtype != torch.long or t.dim() != 1 or not t.is_contiguous() or (name != "head_rows" and len(t) != N)
            ):
                raise ValueError(
                    f"{name}: expected a contiguous int64 tensor of shape ({N},), got {t.dtype} {tuple(t.shape)}"
                )
        S, P = cache.v.shape[1], cache.v.shape[3]
        cos, sin = self._rotary(P)
        x = torch.empty(N, self.E) if head_rows is False else None
        head, rows_ptr, R, logits = None, None, 0, None
        if head_rows is not False:
            R = N if head_rows is None else len(head_rows)
            rows_ptr = None if head_rows is None else _address(head_rows)
            head, logits = ctypes.byref(self._head), torch.empty(R, self.lm_head.out_features)
        code = self.lib.specgram_decoder_forward(
            ctypes.byref(self._decoder),
            _address(tokens),
            None if x is None else x.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            1,  # the tables are by position
            cache.k.data_ptr(),
            cache.v.data_ptr(),
            int(cache.v.dtype == torch.bfloat16),
            S,
            P,
            _address(slots),
            _address(positions),
            None if tree is None else ctypes.addressof(tree),
            N,
            window or 0,
            head,
            rows_ptr,
            R,
            None if logits is None else logits.data_ptr(),
            *self._lora_args(adapters),
            torch.get_num_threads(),
        )
        if code:
            raise self._bad_batch(code, cache, tokens, slots, positions)
        if logits is not None and self.arch.logits_divisor != 1.0:  # granite: as its CausalLM divides them
            logits /= self.arch.logits_divisor
        return x if logits is None else logits
