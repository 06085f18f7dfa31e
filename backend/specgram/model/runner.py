"""ModelRunner: a decoder causal LM (a family of families.py) over a slot-indexed KV cache.

One class serves the target and the draft model: two instances, composed by the engine.
On the PyTorch forward the layers, norms and rotary are transformers' own (torch_forward.py: numerics match
HF); only attention over our KV cache and the batching of ragged rows are ours.

A forward takes B rows; row b appends num_new[b] tokens to slot slots[b] starting at position starts[b].
Rows are right-padded to a common width T. This covers prefill (T = prompt length), decode (T = 1) and
speculative verification (T = k + 1) with one code path.

Two implementations of that forward: transformers' modules with PyTorch ops (any device; the CUDA-graph
path), and on CPU the native one (native.py: our kernels, fused projections, attention reading the cache in
place), chosen by the `linear` setting (auto = native where its kernels build). The native forward may also
run the model with int8 weights (`weights` "int8": int8.py), for a target served so or an int8 draft copy, or
with int8 weights and activations quantized per row to int16 / int8 ("int8-dynamic" / "int8-dynamic8", on VNNI:
int8-dynamic is the int8 draft copy where the CPU has it) or to int8 per 256 inputs ("int8-blocks": a target in
int8 where the CPU has VNNI).
"""

from __future__ import annotations

import torch

from ..errors import ModelLoadError
from . import lora, rotary, torch_forward
from . import tree as tree_rows
from .checkpoint import ModuleTensors
from .choice import ForwardChoice, choose_for, projections
from .families import describe
from .kv_cache import KVCache, WriteIndex, make_write_index
from .transfer import h2d, right_pad


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        max_slots: int,
        max_seq_len: int,
        forward: ForwardChoice | None = None,
        cache: KVCache | None = None,
        head_ids: torch.Tensor | None = None,
        tensors: ModuleTensors | None = None,
    ):
        """forward: which forward runs the model, with its weights, KV dtype and static width (choice.py; None =
        choose_for(model), every setting auto). The native CPU forward keeps activations and the KV cache in
        float32 (bfloat16 with kv_dtype so) and the matmul weights in the model's dtype or an int8 form (int8.py);
        `model` itself stays as loaded, but for a rotary whose frequencies depend on the length: fixed at
        max_seq_len (rotary.py). Several runners of one max_seq_len may share one `model` (an int8 copy of a
        target), each with its own cache or (cache=) one of them sharing another's.
        static_width > 0 turns on the static path (CUDA graphs on GPU, cuda_graphs.py) for forwards of up to
        that many new tokens per row; the cache then gets a scratch slot (for padding rows) and static_width
        positions of headroom per row (for the padded entries of a row near max_seq_len).
        cache: another runner's KV cache to read and write instead of a cache of its own (the native forward only;
        the int8 draft copy of its target: the same layers, heads and slots, so the copy attends to the target's
        own K and V of every committed token, and the target's verify overwrites what the copy wrote past them).
        kv_dtype is then that cache's.
        head_ids [V'] long: the native forward's logits are those of these vocabulary entries only, in this order
        (a draft's reduced vocabulary); the PyTorch forward computes the whole vocabulary (self.head_ids None).
        tensors: where the native forward reads the weights (checkpoint.py: `model` a skeleton on the meta device,
        its weights read one at a time from the checkpoint's files); None: the model's own parameters."""
        forward = forward or choose_for(model)
        self.model = model.eval()
        cfg = model.config
        self.config, self.arch = cfg, describe(cfg)
        torch_forward.plug(model)
        rotary.freeze(model.model.rotary_emb, max_seq_len, self.arch.rope_types)  # longrope, dynamic: one table
        self.device = torch.device("cpu") if tensors is not None else next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        kind, weights, kv_dtype, static_width = forward.kind, forward.weights, forward.kv_dtype, forward.static_width
        self.native = None
        if kind == "native":
            from .native import NativeForward

            self.native = NativeForward(model, forward.lib, weights, head_ids, tensors)
            self.dtype = torch.float32  # activations (and the KV cache unless kv_dtype says)
        kv = torch.bfloat16 if kv_dtype == "bfloat16" else self.dtype
        self.linear_kind, self.weights, self.kv_dtype = kind, weights, kv_dtype
        self.fuse_steps = self.native is not None  # forward_step: prompt chunks and verify rows in one pass
        self.vocab_size = cfg.vocab_size
        self.head_ids = head_ids if self.native is not None else None  # logits [.., V'] of these ids (None: all)
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = cfg.num_key_value_heads
        self.head_dim = self.arch.head_dim
        window = self.arch.window if self.native is not None else None  # the torch forward's layers say theirs
        self.window = window if window and window < max_seq_len else None
        self.max_seq_len = max_seq_len
        self.scratch_slot = max_slots  # used only by the static path
        extra_slots, headroom = (1, static_width) if static_width else (0, 0)
        shape = (
            cfg.num_hidden_layers,
            max_slots + extra_slots,
            self.num_kv_heads,
            max_seq_len + headroom,
            self.head_dim,
        )
        if cache is not None:
            if self.native is None or not cache.k_positions_last or tuple(cache.v.shape) != shape:
                raise ModelLoadError(
                    f"a shared KV cache needs the native forward and a cache of V shape {shape} "
                    f"with positions last; got V {tuple(cache.v.shape)} on the {kind} forward"
                )
            self.cache = cache
            self.shares_cache = True
            self.kv_dtype = "bfloat16" if cache.v.dtype == torch.bfloat16 else "auto"
        else:
            self.cache = KVCache(*shape, kv, self.device, k_positions_last=self.native is not None)
            self.shares_cache = False
        self.lora_hooks, self.adapters = None, None  # attach_lora
        self.graphed = None
        if static_width:
            from .cuda_graphs import GraphedForward

            self.graphed = GraphedForward(self, max_slots, static_width)

    def attach_lora(self, adapters) -> None:
        """Apply LoRA adapters (lora.Adapters) from now on: each row's tokens under the adapter its call names."""
        if self.graphed is not None:
            raise ModelLoadError("LoRA adapters do not run on the CUDA-graph path (set cuda_graphs off)")
        self.adapters = adapters
        if self.native is not None:
            self.native.attach_lora(adapters)
        else:
            self.lora_hooks = lora.TorchHooks(self.model, adapters)

    def linear_layers(self) -> list[torch.nn.Module]:
        """Every weight matmul of one forward, in order (the lm_head last), as this runner calls them."""
        if self.native is not None:
            return self.native.linear_layers()
        return projections(self.model)

    def forward_rows(
        self,
        rows: list[list[int]],
        slots: list[int],
        starts: list[int],
        last_only: bool,
        trees: list[list[int] | None] | None = None,
        adapters: list[int] | None = None,
    ) -> torch.Tensor:
        """forward() from python lists: row b appends rows[b] to slot slots[b] at position starts[b], under LoRA
        adapter adapters[b] (-1: none; adapters None: none at all; attach_lora).
        Everything that depends on the row lengths (padding, the cache write index, the attended length) is
        computed here on the host and copied without blocking, so a CUDA forward never waits on the host.
        Small forwards (decode, verify, draft steps) take the static / CUDA-graph path when it is on.
        trees: per row its tokens' parents (tree.py: a tree of drafts; None: a plain row), or None."""
        adapters = adapters if self.adapters is not None else None  # no LoRA attached: nothing to apply
        if self.native is not None:
            return self.native.forward_rows(self.cache, rows, slots, starts, last_only, self.window, trees, adapters)
        if tree_rows.plain(trees):
            trees = None
        width = max(map(len, rows))
        if self.graphed is not None and trees is None and self.graphed.handles(len(rows), width):
            return self.graphed.forward(rows, slots, starts, last_only)
        tokens = right_pad(rows)
        num_new = [len(row) for row in rows]
        s, st, n = (torch.tensor(v, dtype=torch.long) for v in (slots, starts, num_new))
        widx = make_write_index(s, st, n, width)  # on the host: no nonzero() on the device
        dev = self.device
        widx = WriteIndex(*(h2d(t, dev) for t in (widx.batch_idx, widx.step_idx, widx.slot_idx, widx.pos_idx)))
        return self.forward(
            h2d(tokens, dev),
            h2d(s, dev),
            h2d(st, dev),
            h2d(n, dev),
            last_only,
            length=max(a + b for a, b in zip(starts, num_new, strict=True)),
            widx=widx,
            tree=None if trees is None else tree_rows.tensors(trees, width, dev),
            adapters=None if adapters is None else h2d(torch.tensor(adapters), dev),
        )

    def forward_step(
        self,
        rows: list[list[int]],
        slots: list[int],
        starts: list[int],
        n_last: int,
        trees: list[list[int] | None] | None = None,
        adapters: list[int] | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One engine step's forward: rows[:n_last] are prompt chunks -> logits [n_last, V] at each one's last
        token; the other rows are verify rows -> logits [B - n_last, T, V] at every token (T the longest); None
        for a side without rows. With fuse_steps (the native forward, whose rows never mix: each row's logits
        are bitwise those of a forward of that row alone) both sides share one pass over the weights, so the
        verify rows ride along a compute-bound prefill for about a millisecond a row. Otherwise each side gets
        a forward of its own: a prompt chunk is never padded to a verify row's shape nor the reverse, and the
        verify side keeps its small static shapes (CUDA graphs). trees: per verify row its tokens' parents (a tree
        of drafts, tree.py; None: a plain row), or None for all plain. adapters: per row its LoRA adapter, or None."""
        adapters = adapters if self.adapters is not None else None  # no LoRA attached: nothing to apply
        if self.fuse_steps and 0 < n_last < len(rows):
            return self.native.forward_split(self.cache, rows, slots, starts, n_last, self.window, trees, adapters)
        first = rest = None
        ads = (None, None) if adapters is None else (adapters[:n_last], adapters[n_last:])
        if n_last:
            first = self.forward_rows(rows[:n_last], slots[:n_last], starts[:n_last], True, adapters=ads[0])
        if n_last < len(rows):
            rest = self.forward_rows(
                rows[n_last:], slots[n_last:], starts[n_last:], False, trees and trees[n_last:], ads[1]
            )
        return first, rest

    def keep_path(self, slot: int, start: int, rows: list[int]) -> None:
        """After a tree row's verify: the K and V of its tokens `rows` (row indices, in path order, each past the
        row's first token at `start`) move to positions start + 1, start + 2, ... (the committed path); a chain's
        accepted tokens are there already (nothing moves)."""
        src = [start + r for r in rows]
        dst = list(range(start + 1, start + 1 + len(rows)))
        if src != dst:
            self.cache.move(slot, src, dst)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        slots: torch.Tensor,
        starts: torch.Tensor,
        num_new: torch.Tensor,
        last_only: bool,
        length: int | None = None,
        widx: WriteIndex | None = None,
        tree: tuple | None = None,
        adapters: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens: [B, T] (right-padded), slots/starts/num_new: [B] on self.device.
        Writes the new tokens' KV into the cache and returns logits (float32):
        [B, V] at each row's last new token if last_only, else [B, T, V].
        length (max of starts + num_new) and widx (make_write_index) may be given precomputed on the host;
        computed here they cost a device -> host sync each. tree: (ancestor masks, depths) [B, T] (tree.tensors):
        rows that are trees of drafts (the PyTorch forward only). adapters: [B] each row's LoRA adapter (-1: none),
        or None: none."""
        if self.native is not None:
            return self.native(self.cache, tokens, slots, starts, num_new, last_only, self.window, adapters)
        B, T = tokens.shape
        if length is None:
            length = int((starts + num_new).max())
        steps = torch.arange(T, device=self.device)[None, :] if tree is None else tree[1]  # [B, T] depths
        positions = (starts[:, None] + steps).clamp_max(self.max_seq_len - 1)  # padding stays in range
        if widx is None:
            widx = make_write_index(slots, starts, num_new, T)
        if self.lora_hooks is not None:  # each row's adapter (None: the base model's forward)
            self.lora_hooks.rows = adapters
        try:
            h = torch_forward.hidden(
                self.model, tokens, positions, torch_forward.SlotBatch(self.cache, slots, widx, starts, T, length, tree)
            )
        finally:
            if self.lora_hooks is not None:
                self.lora_hooks.rows = None
        if last_only:
            h = h[torch.arange(B, device=self.device), num_new - 1]  # [B, hidden]
        return torch_forward.head(self.model, self.arch, h)

    @torch.inference_mode()
    def forward_static(self, tokens: torch.Tensor, slots: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """The shape-static forward that CUDA graphs capture: tokens [B, T], slots/starts [B] on the device
        -> logits [B, T, V] float32 (positions past a row's own tokens are padding: their logits are unused).
        No host syncs and no data-dependent shapes: every (row, step) entry is written to the cache (padding
        lands at positions >= the row's valid length, inside the headroom, or in the scratch slot), and
        attention spans the whole cache row, masked by position.
        Rows must satisfy starts + T <= cache positions (the headroom guarantees it for T <= static_width)."""
        B, T = tokens.shape
        L = self.cache.k.shape[3]  # cache positions
        positions = starts[:, None] + torch.arange(T, device=self.device)[None, :]  # [B, T]
        steps = torch.arange(T, device=self.device).repeat(B)  # [B*T]
        rows = torch.arange(B, device=self.device).repeat_interleave(T)  # [B*T]
        widx = WriteIndex(rows, steps, slots[rows], positions.reshape(-1))
        h = torch_forward.hidden(
            self.model, tokens, positions, torch_forward.SlotBatch(self.cache, slots, widx, starts, T, L)
        )
        return torch_forward.head(self.model, self.arch, h)
