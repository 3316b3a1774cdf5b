"""16-bit float conversions (ctrain/half.h, used by gradient compression) against NumPy: fp16
must equal numpy.float16 bit for bit, bf16 must be round-to-nearest-even of the top 16 bits."""
import ctypes
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LIB = ctypes.CDLL(os.path.join(ROOT, os.environ.get("CTRAIN_BUILD_DIR", "build"), "common",
                               "libctrain.so"))
for name, res, arg in (("ct_f32_to_fp16", ctypes.c_uint16, ctypes.c_float),
                       ("ct_fp16_to_f32", ctypes.c_float, ctypes.c_uint16),
                       ("ct_f32_to_bf16", ctypes.c_uint16, ctypes.c_float),
                       ("ct_bf16_to_f32", ctypes.c_float, ctypes.c_uint16)):
    getattr(LIB, name).restype = res
    getattr(LIB, name).argtypes = [arg]


def values():
    r = np.random.default_rng(3)
    spread = r.standard_normal(3000) * 10.0 ** r.integers(-10, 6, 3000)
    edges = [0.0, -0.0, 65504, 65519, 65520, 1e5, 6.1e-5, 5.96e-8, 2.98e-8, 3e-8, 1e-9,
             np.inf, -np.inf, 1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11]
    return np.concatenate([spread, edges]).astype(np.float32)


def test_fp16_matches_numpy():
    v = values()
    with np.errstate(over="ignore"):
        ref = v.astype(np.float16)
    got = np.array([LIB.ct_f32_to_fp16(float(x)) for x in v], dtype=np.uint16)
    assert np.array_equal(got, ref.view(np.uint16))
    back = np.array([LIB.ct_fp16_to_f32(int(h)) for h in got], dtype=np.float32)
    assert np.array_equal(back, ref.astype(np.float32))
    assert np.isnan(LIB.ct_fp16_to_f32(LIB.ct_f32_to_fp16(float("nan"))))


def test_bf16_rounds_to_nearest_even():
    v = values()
    bits = v.view(np.uint32).astype(np.uint64)
    ref = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    got = np.array([LIB.ct_f32_to_bf16(float(x)) for x in v], dtype=np.uint16)
    finite = np.isfinite(v)
    assert np.array_equal(got[finite], ref[finite])
    back = np.array([LIB.ct_bf16_to_f32(int(h)) for h in got], dtype=np.float32)
    assert np.all(np.abs(back[finite] - v[finite]) <= np.abs(v[finite]) * 2.0 ** -8)
    assert np.isnan(LIB.ct_bf16_to_f32(LIB.ct_f32_to_bf16(float("nan"))))
