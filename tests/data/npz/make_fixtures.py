#!/usr/bin/python3
"""Writes the .npz fixtures that tests/unit/test_npz.c reads. Run from anywhere with Debian's
python3 (python3-numpy); the outputs are committed, so this only runs again when they change.
np.savez stamps members with the current time, so the bytes differ per run but not the arrays."""
import os
import zipfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def arrays():
    # Known values the C test checks element by element.
    return {
        "a": np.arange(12, dtype=np.float32).reshape(3, 4),
        "v": np.array([-3, 0, 7, 1 << 40], dtype=np.int64),
        "d": np.linspace(-1.0, 1.0, 5),  # float64: the reader narrows it to f32
        "i": np.arange(-2, 3, dtype=np.int32),
        "u": np.array([0, 255, 7], dtype=np.uint8),
        "s": np.float32(2.5),  # rank 0
        "dense_1/kernel": np.full((2, 2), 0.5, dtype=np.float32),
        "ramp": (np.arange(3000) % 7).astype(np.float32),  # several deflate blocks' worth
    }


def main():
    np.savez(os.path.join(HERE, "savez.npz"), **arrays())
    np.savez_compressed(os.path.join(HERE, "savez_compressed.npz"), **arrays())
    np.savez(os.path.join(HERE, "fortran.npz"),
             ok=np.zeros(2, np.float32),
             f=np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)))
    np.savez(os.path.join(HERE, "bigendian.npz"), b=np.arange(4, dtype=">i4"))
    np.savez(os.path.join(HERE, "float16.npz"), h=np.arange(3, dtype=np.float16))
    np.savez(os.path.join(HERE, "complex.npz"), c=np.arange(3, dtype=np.complex64))
    with zipfile.ZipFile(os.path.join(HERE, "not_npy.npz"), "w") as z:
        z.writestr("x.npy", b"hello, not an array")


if __name__ == "__main__":
    main()
