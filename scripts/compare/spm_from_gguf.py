"""A sentencepiece tokenizer.model rebuilt from a GGUF file's sentencepiece vocabulary (tokenizer.ggml.model "llama":
its tokens, scores and types), for a checkpoint folder that has only a tokenizer.json: llama.cpp's converter reads a
Gemma vocabulary correctly only from a tokenizer.model (without one it writes a byte-level "gpt2" vocabulary that
the tokenizer.json's sentencepiece-style pieces do not fit).

    build/peers/llamacpp/bin/python scripts/compare/spm_from_gguf.py FILE.gguf OUT/tokenizer.model

Runs in the converter's venv (sentencepiece and gguf-py; scripts/compare/setup_converter.sh).
"""

from __future__ import annotations

import sys

from gguf import GGUFReader
from sentencepiece import SentencePieceProcessor
from sentencepiece import sentencepiece_model_pb2 as spm

SPACE = "\u2581"  # sentencepiece's visible space


def field(reader: GGUFReader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def build(gguf_path: str) -> spm.ModelProto:
    r = GGUFReader(gguf_path)
    if field(r, "tokenizer.ggml.model") != "llama":
        raise SystemExit(f"{gguf_path}: not a sentencepiece vocabulary (tokenizer.ggml.model 'llama')")
    tokens, scores = field(r, "tokenizer.ggml.tokens"), field(r, "tokenizer.ggml.scores")
    types = field(r, "tokenizer.ggml.token_type")  # GGUF's numbering is sentencepiece's (1 normal .. 6 byte)
    m = spm.ModelProto()
    for token, score, kind in zip(tokens, scores, types, strict=True):
        # the converter writes a user-defined token's visible spaces as spaces; sentencepiece keeps them visible
        piece = token.replace(" ", SPACE) if kind == spm.ModelProto.SentencePiece.USER_DEFINED else token
        m.pieces.add(piece=piece, score=score, type=kind)
    t = m.trainer_spec
    t.model_type = spm.TrainerSpec.BPE
    t.vocab_size = len(tokens)
    t.byte_fallback = True
    for name in ("unk", "bos", "eos", "pad"):
        key = {"unk": "unknown", "pad": "padding"}.get(name, name)
        token_id = field(r, f"tokenizer.ggml.{key}_token_id")
        setattr(t, f"{name}_id", -1 if token_id is None else token_id)
    if t.unk_id >= 0:  # the converter marks <unk> CONTROL (a special token); sentencepiece needs it UNKNOWN
        m.pieces[t.unk_id].type = spm.ModelProto.SentencePiece.UNKNOWN
    n = m.normalizer_spec  # Gemma's: no normalization, no prefix space, spaces as SPACE
    n.name, n.add_dummy_prefix, n.remove_extra_whitespaces, n.escape_whitespaces = "identity", False, False, True
    return m


def main() -> int:
    src, out = sys.argv[1:3]
    m = build(src)
    with open(out, "wb") as f:
        f.write(m.SerializeToString())
    sp = SentencePieceProcessor(model_file=out)  # loads: the pieces are a valid model
    print(f"{out}: {sp.vocab_size()} pieces; 'Hello there' -> {sp.encode('Hello there')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
