"""Each GGUF block type's served form and its error against the file's own values.

    python scripts/bench.py gguf_types --model models/Qwen2.5-Coder-1.5B-Instruct \
        --files models/gguf/*.gguf

A GGUF matrix is served in one of two forms (model/packed.py): int4 (4-bit codes in groups of 32 with 6-bit
sub-scales: Q4_K's own layout, so a Q4_K block is kept bit for bit) or int8 with one scale per output row (any other
type, de-quantized by the `gguf` package first). Per block type this reports, over real matrices, the relative error
(Frobenius norm of the difference over the file values' norm) of each form against the values the file holds, and
for scale the type's own error against the float32 values it was made from. Types found in --files are read from
them (their own error unknown: the float32 values are not in the file); the types the `gguf` package can write
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, BF16) are also made from --model's matrices (the first and a middle layer's
q, v and down projections), so each has a row whatever files are at hand.
"""

from __future__ import annotations

import glob
import json

from .. import report

ENGINE = True
SHARED = {}
QUICK = {"matrices": 2}
QUICK_HELP = "two matrices per type"
WRITTEN = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16")


def add_options(ap) -> None:
    ap.add_argument("--files", nargs="*", default=sorted(glob.glob("models/gguf/*.gguf")), help="GGUF files read")
    ap.add_argument("--matrices", type=int, default=6, help="matrices per type (the largest first)")


def _errors(values):
    """values: float32 [N, K] (the file's) -> (int8 per row error, int4 error) relative to them."""
    from specgram.model import int4, int8

    norm = values.norm().item()
    q, s = int8.quantize_rows(values)
    e8 = (int8.dequantize_rows(q, s) - values).norm().item() / norm
    e4 = (int4.quantize(values).dequantize() - values).norm().item() / norm if values.shape[1] % 256 == 0 else None
    return e8, e4


def _from_files(files: list[str], per_type: int) -> dict[str, list[dict]]:
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    from specgram.model.gguf_format import read_header

    found: dict[str, list[dict]] = {}
    for f in files:
        h = read_header(f)
        matrices = sorted((t for t in h.tensors.values() if len(t.shape) == 2), key=lambda t: -t.nbytes)
        for t in matrices:
            if t.type_name == "F32" or len(found.get(t.type_name, [])) >= per_type:
                continue
            rows = min(t.shape[0], 4096)  # a head's first rows: enough for the statistic
            data = np.memmap(f, dtype=np.uint8, mode="r", offset=t.offset, shape=(t.shape[0], t.nbytes // t.shape[0]))
            values = torch.from_numpy(dequantize(np.array(data[:rows]), GGMLQuantizationType(t.type_id)).copy())
            e8, e4 = _errors(values.float())
            found.setdefault(t.type_name, []).append(dict(source=f"{f}:{t.name}", int8=e8, int4=e4, own=None))
    return found


def _written(model: str, per_type: int) -> dict[str, list[dict]]:
    import torch
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    from specgram.model.checkpoint import TensorFiles

    files = TensorFiles(model)
    layers = sorted({int(n.split(".")[2]) for n in files.meta if n.startswith("model.layers.")})
    names = [f"model.layers.{i}.{m}.weight" for i in (layers[0], layers[len(layers) // 2])
             for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")][:per_type]  # fmt: skip
    out: dict[str, list[dict]] = {}
    for name in names:
        original = files.get(name).float()
        for kind in WRITTEN:
            t = GGMLQuantizationType[kind]
            values = torch.from_numpy(dequantize(quantize(original.numpy(), t), t).astype("float32"))
            own = (values - original).norm().item() / original.norm().item()
            e8, e4 = _errors(values)
            out.setdefault(kind, []).append(dict(source=f"{model}:{name}", int8=e8, int4=e4, own=own))
    return out


def _cell(xs: list[float | None]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "–"
    return f"{sum(xs) / len(xs):.4f}" if max(xs) - min(xs) < 5e-5 else f"{min(xs):.4f}–{max(xs):.4f}"


def run(args) -> None:
    found = _from_files(args.files, args.matrices)
    made = _written(str(args.model), args.matrices)
    rows, raw = [], dict(files=found, written=made)
    for kind in sorted(set(found) | set(made)):
        for origin, table in (("in the files", found), ("written here", made)):
            if kind not in table:
                continue
            r = table[kind]
            auto = "int4 (its blocks)" if kind == "Q4_K" else "int8 per row"
            e_auto = "0 (bit for bit)" if kind == "Q4_K" else _cell([x["int8"] for x in r])
            rows.append([kind, origin, len(r), _cell([x["own"] for x in r]), auto, e_auto,
                         "0 (bit for bit)" if kind == "Q4_K" else _cell([x["int4"] for x in r]),
                         _cell([x["int8"] for x in r])])  # fmt: skip
            report.log(f"{kind} {origin}: " + json.dumps(r))
    lines = report.header("GGUF block types as served", args, f"files {', '.join(args.files) or 'none'}")
    lines += report.table(
        ["block type", "matrices", "n", "the type's error against float32", "weights auto serves", "its error",
         "weights int4 error", "weights int8 error"],
        rows,
    )  # fmt: skip
    lines.append("")
    lines.append("Errors are relative Frobenius norms against the file's values (de-quantized by the gguf package).")
    report.write(args, lines, raw)
