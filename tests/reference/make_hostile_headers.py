#!/usr/bin/env python3
"""Writes the seed corpus of hostile file headers under fuzz/seeds/.

One directory per fuzz target (gguf_header, safetensors_header,
llama2c_header), each file a few hundred bytes at most, plus
fuzz/seeds/expected.json: for every file the words its error must contain
("" when the file must parse). `shared/tests/hostile_headers.rs` runs the
parsers over them in a stable `cargo test` (with an allocation budget), and
cargo-fuzz starts from them (`cargo +nightly fuzz run gguf_header
fuzz/seeds/gguf_header`).

Only the Python standard library is needed:
    python3 tests/reference/make_hostile_headers.py
"""

import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "fuzz", "seeds")
EXPECTED = {}

LFS = b"version https://git-lfs.github.com/spec/v1\noid sha256:" + b"ab" * 32 + b"\nsize 538970456\n"


def put(target, name, data, expect):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)
    EXPECTED[f"{target}/{name}"] = expect


# ----- GGUF ------------------------------------------------------------------

def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gguf(kvs, tensors=b"", n_tensors=0, n_kv=None, version=3):
    body = b"".join(kvs)
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, len(kvs) if n_kv is None else n_kv) + body + tensors


def kv_u32(k, v):
    return gstr(k) + struct.pack("<II", 4, v)


def kv_arr(k, elem_type, n, payload):
    return gstr(k) + struct.pack("<IIQ", 9, elem_type, n) + payload


G = "gguf_header"
put(G, "array_len_past_file", gguf([kv_arr("tokenizer.ggml.tokens", 8, 1 << 60, b"")]), "count 1152921504606846976")
put(G, "string_len_past_file", gguf([gstr("general.name") + struct.pack("<IQ", 8, 1 << 20)]), "exceeds")
put(G, "string_over_limit", gguf([gstr("general.name") + struct.pack("<IQ", 8, 1 << 62)]), "limit")
put(G, "kv_count_huge", gguf([], n_kv=1 << 40), "metadata_kv_count")
put(G, "tensor_count_huge", gguf([], n_tensors=1 << 50), "tensor_count")
nested = struct.pack("<IQ", 9, 1)
deep = gstr("x") + struct.pack("<I", 9) + nested * 9 + struct.pack("<IQ", 0, 0)
put(G, "arrays_nested_too_deep", gguf([deep]), "nested deeper")
put(G, "unknown_value_type", gguf([gstr("x") + struct.pack("<I", 13)]), "unknown value type")
put(G, "unknown_array_element_type", gguf([kv_arr("x", 77, 1, b"\0")]), "unknown element value type")
put(G, "non_utf8_in_string_array", gguf([kv_arr("tokenizer.ggml.tokens", 8, 2, gstr("a") + gstr(b"\xff\xfe"))]), "UTF-8")
put(G, "truncated_u32_array", gguf([kv_arr("x", 4, 4, b"\0" * 6)]), "needs")
put(G, "big_endian", b"GGUF" + struct.pack(">IQQ", 3, 0, 0), "big-endian")
put(G, "lfs_pointer", LFS, "git lfs pull")
# Parses (metadata only, no tensors): a u8 array and a string array.
put(G, "metadata_arrays_ok", gguf([kv_arr("a", 0, 16, bytes(range(16))), kv_arr("b", 8, 2, gstr("x") + gstr("yz"))]), "")

# ----- safetensors -----------------------------------------------------------

def st(header, data=b""):
    h = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(h)) + h + data


S = "safetensors_header"
put(S, "header_len_past_file", struct.pack("<Q", 1 << 40) + b"{}", "limit")
put(S, "header_len_over_limit", struct.pack("<Q", (16 << 20) + 1) + b"{}", "limit")
put(S, "header_len_in_file_but_truncated", struct.pack("<Q", 100) + b"{}", "runs past the end")
dup = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
put(S, "tensor_listed_twice", st(dup, b"\0" * 8), "listed twice")
put(S, "offsets_overlap", st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                              "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12), "")
put(S, "shape_overflow", st({"a": {"dtype": "F32", "shape": [1 << 62, 1 << 62], "data_offsets": [0, 4]}}, b"\0" * 4), "")
put(S, "not_json", st(b"\xff\xff not json"), "")
put(S, "lfs_pointer", LFS, "git lfs pull")
put(S, "one_tensor_ok", st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4), "")
# The negative ones must fail; which message the crate gives is not pinned
# (empty expectation above means "must parse" only for the *_ok files).
for k in ("offsets_overlap", "shape_overflow", "not_json"):
    EXPECTED[f"{S}/{k}"] = "malformed safetensors"

# ----- llama2.c --------------------------------------------------------------

L = "llama2c_header"
# dim, hidden, layers, heads, kv heads, vocab, seq
put(L, "layers_2_pow_24", struct.pack("<7i", 64, 64, 1 << 24, 8, 8, 32, 16), "needs exactly")
put(L, "everything_huge", struct.pack("<7i", 1 << 24, 1 << 24, 1 << 24, 1 << 12, 1 << 12, -(1 << 24), 1 << 24), "needs exactly")
put(L, "zero_heads", struct.pack("<7i", 64, 64, 2, 0, 0, 32, 16), "out of range")
put(L, "short", b"\x01\x02", "shorter than the 28-byte header")
put(L, "lfs_pointer", LFS, "git lfs pull")

with open(os.path.join(ROOT, "expected.json"), "w") as f:
    json.dump(EXPECTED, f, indent=1, sort_keys=True)
    f.write("\n")
print(f"wrote {len(EXPECTED)} files under {os.path.normpath(ROOT)}")
