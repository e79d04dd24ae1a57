#!/usr/bin/env python3
"""Prints the vectors of TestLoRAVLLMVectors (engine/lora_hash_test.go).

vLLM's block hash with a LoRA adapter's extra keys, recomputed as vLLM
computes it: hash_fn((parent, tuple(tokens), extra_keys)), extra_keys the
tuple (lora_name,) on every block of the adapter's request and
(lora_name, cache_salt) on a salted first block; sha256 over pickle
protocol 5 (Python's own pickle), sha256_cbor over canonical CBOR (the small
encoder below, written apart from the Go one). NONE_HASH is hash_fn of the
seed "vllm-none-hash". Tokens 1..48, block size 16. Run: python3 lora_vectors.py
"""
import hashlib
import pickle
import struct


def cbor(o):
    def head(major, v):
        m = major << 5
        if v < 24:
            return bytes([m | v])
        if v < 256:
            return bytes([m | 24, v])
        if v < 65536:
            return bytes([m | 25]) + struct.pack(">H", v)
        if v < 2**32:
            return bytes([m | 26]) + struct.pack(">I", v)
        return bytes([m | 27]) + struct.pack(">Q", v)

    if o is None:
        return b"\xf6"
    if isinstance(o, bytes):
        return head(2, len(o)) + o
    if isinstance(o, str):
        b = o.encode()
        return head(3, len(b)) + b
    if isinstance(o, int):
        return head(0, o)
    if isinstance(o, tuple):
        return head(4, len(o)) + b"".join(cbor(x) for x in o)
    raise TypeError(o)


def digest(algo, obj):
    data = pickle.dumps(obj, protocol=5) if algo == "sha256" else cbor(obj)
    return hashlib.sha256(data).digest()


toks = list(range(1, 49))
for algo in ("sha256", "sha256_cbor"):
    for lora, salt in (("sql-lora", ""), ("sql-lora", "tenant-a"), ("é" * 40, "x" * 300)):
        parent = digest(algo, "vllm-none-hash")
        print(algo, repr(lora[:12]), repr(salt[:12]))
        for i in range(3):
            keys = [lora] + ([salt] if salt and i == 0 else [])
            parent = digest(algo, (parent, tuple(toks[16 * i:16 * i + 16]), tuple(keys)))
            print("   ", parent.hex(), int.from_bytes(parent, "big") & (2**64 - 1))
