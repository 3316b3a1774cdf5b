"""The parameter-server wire decoder under libFuzzer (clang -fsanitize=fuzzer,address,undefined):
tests/fuzz/fuzz_wire.c, built here from the sources and run for a bounded number of inputs from a
small seed corpus of valid messages. Any crash, leak, undefined behaviour or refusal without a
message fails the test."""
import os
import shutil
import struct
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"))


def varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def field(num, wire, payload):
    return varint(num << 3 | wire) + payload


def envelope(kind, tensors=(), held=(), version=0):
    """A ctrain.wire.Envelope (common/proto/envelope.proto), written by hand."""
    e = field(1, 0, varint(2)) + field(2, 1, struct.pack("<Q", 0x2A)) + field(3, 0, varint(kind))
    e += field(4, 0, varint(3)) + field(7, 0, varint(version))
    for shard, nbytes in tensors:
        ref = field(1, 0, varint(shard)) + field(4, 0, varint(nbytes))
        e += field(8, 2, varint(len(ref)) + ref)
    if held:
        packed = b"".join(varint(h) for h in held)
        e += field(9, 2, varint(len(packed)) + packed)
    return e


def frames(*fs):
    """The fuzz target's input layout: count, then length-prefixed frames, the last raw."""
    out = bytes([len(fs) - 1])
    for f in fs[:-1]:
        out += struct.pack("<H", len(f)) + f
    return out + fs[-1]


@pytest.mark.skipif(not shutil.which("clang"), reason="clang is not installed (libFuzzer)")
def test_wire_decoder_under_libfuzzer(tmp_path):
    exe = tmp_path / "fuzz_wire"
    header = os.path.join(BUILD, "common", "envelope.pb-c.h")
    assert os.path.exists(header), "build first: the generated protobuf-c code is needed"
    cmd = ["clang", "-g", "-O1", "-fsanitize=fuzzer,address,undefined",
           "-fno-sanitize-recover=undefined", "-D_POSIX_C_SOURCE=200809L", "-D_DEFAULT_SOURCE",
           "-I", os.path.join(ROOT, "common", "include"), "-I", os.path.join(ROOT, "common", "src"),
           "-I", os.path.join(BUILD, "common"),
           os.path.join(ROOT, "tests", "fuzz", "fuzz_wire.c"),
           os.path.join(ROOT, "common", "src", "net", "wire.c"),
           os.path.join(BUILD, "common", "envelope.pb-c.c"),
           os.path.join(BUILD, "common", "ps.pb-c.c"),
           os.path.join(BUILD, "common", "data_service.pb-c.c"),
           os.path.join(BUILD, "common", "elastic.pb-c.c"),
           os.path.join(ROOT, "common", "src", "core", "status.c"),
           os.path.join(ROOT, "common", "src", "core", "clock.c"),
           "-lprotobuf-c", "-lzmq", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    seeds = [frames(envelope(9, [(0, 8), (1, 4)]), b"\0" * 8, b"\0" * 4),
             frames(envelope(7, held=[1, 2, 3], version=5)),
             frames(envelope(8, [(2, 16)]), b"\1" * 16),
             frames(b"\xff\x00garbage")]
    for i, s in enumerate(seeds):
        (corpus / f"seed{i}").write_bytes(s)
    r = subprocess.run([str(exe), "-runs=200000", "-max_total_time=60", "-max_len=4096",
                        "-rss_limit_mb=1024", str(corpus)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Done" in r.stderr, r.stderr[-2000:]
