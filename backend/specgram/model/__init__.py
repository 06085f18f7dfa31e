"""The model: a decoder forward (the families of families.py) over a slot-indexed KV cache.

runner       ModelRunner (target and draft alike): ragged rows -> logits, writing the KV cache
families     what each model family differs in (Arch), read from its config; what the native forward covers
torch_forward  transformers' own model with our slot cache and attention plugged in (the PyTorch forward)
native       the native CPU forward (our C kernels, kernels/) with its fused projections
choice       which forward runs a model (native or PyTorch), its weights and KV dtype: ForwardChoice
packed       a model as the native forward reads it: packed weights, norms, the kernels' structs
linear       the native forward's matmuls (fused projections, packed weights)
kv_cache     slot x position cache, write indices
cuda_graphs  the shape-static CUDA-graph path for small forwards
transfer     host -> device copies that never stall the host
quantize     the int8 dynamic-quantized draft copy (where the native kernels do not run)
int8         int8 weights with a scale per output channel, for the native kernels
"""
