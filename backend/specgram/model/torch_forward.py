"""The PyTorch forward: transformers' own model computes every layer as its family defines it (embedding scale,
norms, q/k norms, rotary per layer type, activations, multipliers), with our slot KV cache and our attention
plugged in through transformers' attention interface. Any decoder transformers runs is computed here as
transformers computes it; what is ours is where the keys and values live and which of them each query sees.

How it plugs in: the model's attention implementation is set to ATTENTION. Each attention module hands its new
keys and values to the `cache` it is given (a SlotBatch: they go into our cache at the rows' slots and
positions, and every row's keys and values so far come back) and calls the registered attention function with
the layer's sliding window; that function builds the rows' masks itself (causal by absolute position, within
the window). A 4D placeholder mask tells transformers' mask builders to build nothing. Called without a
SlotBatch (transformers' own forward of the same model, e.g. a test's reference) the function is transformers'
SDPA attention with transformers' masks, exactly as loaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .families import Arch
from .kv_cache import KVCache, WriteIndex

ATTENTION = "specgram_slots"
# a 4D attention mask tells transformers' mask builders to build none; ours are built by the attention function
_NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)


def attention_mask(
    starts: torch.Tensor, width: int, length: int, window: int | None, tree: tuple | None = None
) -> torch.Tensor:
    """-> bool [B, 1, T, L]: query t of row b (absolute position starts[b] + t) sees keys j <= its position
    (and, with a sliding window, j > position - window). Padded queries see garbage keys; their outputs are
    never used, and key 0 is always visible so no row is all -inf. tree: (ancestor masks [B, T] int64, the bits of
    model/tree.py's masks; depths [B, T]): a tree token sees the committed keys and its ancestors only, and its
    window counts positions by depth."""
    q_pos = starts[:, None] + torch.arange(width, device=starts.device)[None, :]  # [B, T]
    k_pos = torch.arange(length, device=starts.device)  # [L]
    mask = k_pos[None, None, :] <= q_pos[:, :, None]  # [B, T, L]
    q_at, k_at = q_pos[:, :, None], k_pos[None, None, :]  # the positions the window counts by
    if tree is not None:
        bits, depth = tree
        back = q_pos[:, :, None] - k_pos[None, None, :]  # [B, T, L]: how far back each key is
        mask &= (back > 63) | ((bits[:, :, None] >> back.clamp(0, 63)) & 1).bool()
        q_at = (starts[:, None] + depth)[:, :, None]
        row = (k_pos[None, :] - starts[:, None]).clamp(0, width - 1)  # [B, L] each key's token in the row
        k_at = torch.where(k_pos[None, :] >= starts[:, None], starts[:, None] + depth.gather(1, row), k_pos)[:, None]
    if window is not None:
        mask &= k_at > q_at - window
        mask[:, :, 0] |= ~mask.any(-1)
    return mask[:, None]


class SlotBatch:
    """One forward's rows as transformers' attention modules see them (in the place of its Cache): row b writes
    its new tokens at widx and reads keys 0 .. length - 1 of slot slots[b]."""

    def __init__(
        self,
        cache: KVCache,
        slots: torch.Tensor,
        widx: WriteIndex,
        starts: torch.Tensor,
        width: int,
        length: int,
        tree: tuple | None = None,
    ):
        self.cache, self.slots, self.widx, self.starts = cache, slots, widx, starts
        self.width, self.length, self.tree = width, length, tree  # tree: attention_mask's
        self._masks: dict[int | None, torch.Tensor] = {}  # by sliding window: the layers share them

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        """key, value [B, Hkv, T, D] (rotary applied) -> every row's keys and values so far, [B, Hkv, L, D]."""
        self.cache.write(layer_idx, key, value, self.widx)
        return self.cache.read(layer_idx, self.slots, self.length)

    def mask(self, window: int | None) -> torch.Tensor:
        if window not in self._masks:
            self._masks[window] = attention_mask(self.starts, self.width, self.length, window, self.tree)
        return self._masks[window]


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function contract: query [B, H, T, D], key / value [B, Hkv, L, D] -> ([B, T, H, D],
    None). kwargs: the layer's sliding_window and softcap, and our SlotBatch (absent: transformers' own SDPA)."""
    batch: SlotBatch | None = kwargs.pop("specgram_batch", None)
    if batch is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    mask = batch.mask(kwargs.get("sliding_window"))
    softcap = kwargs.get("softcap")
    if softcap is None:
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, scale=scaling, enable_gqa=key.shape[1] != query.shape[1]
        )
    else:  # scores capped before the softmax: no fused kernel takes that
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
        scores = (query @ key.transpose(-1, -2)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
        scores = torch.tanh(scores / softcap) * softcap
        out = scores.masked_fill(~mask, float("-inf")).softmax(-1, dtype=torch.float32).to(query.dtype) @ value
    return out.transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # transformers' own forward keeps SDPA's masks


_register()


def plug(model: torch.nn.Module) -> None:
    """Route the model's attention through ATTENTION (its own forward, without a SlotBatch, is unchanged)."""
    model.set_attn_implementation(ATTENTION)


def hidden(model: torch.nn.Module, tokens: torch.Tensor, positions: torch.Tensor, batch: SlotBatch) -> torch.Tensor:
    """tokens, positions [B, T] -> the final-normed hidden states [B, T, E], the rows' KV written on the way."""
    inputs = dict(input_ids=tokens, position_ids=positions, attention_mask=_NO_MASK, cache=batch, use_cache=False)
    return model.model(**inputs, specgram_batch=batch).last_hidden_state


def head(model: torch.nn.Module, arch: Arch, h: torch.Tensor) -> torch.Tensor:
    """The logits (float32) of hidden states h [..., E]: the lm_head, then the family's scale and soft cap in
    the model's dtype, as its CausalLM computes them."""
    logits = model.lm_head(h)
    if arch.logits_divisor != 1.0:
        logits = logits / arch.logits_divisor
    if arch.logit_softcap is not None:
        logits = torch.tanh(logits / arch.logit_softcap) * arch.logit_softcap
    return logits.float()
