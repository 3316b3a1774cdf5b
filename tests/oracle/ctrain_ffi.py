"""ctypes bindings to libctrain for the PyTorch oracle tests (run in the virtual environment that
scripts/test.sh makes, which sees Debian's torch and numpy).

Builds ops in an eager ctrain graph on numpy inputs and returns outputs and gradients, and drives
a ctrain trainer step by step, so the tests can compare both with PyTorch."""
import ctypes
import os

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CTRAIN_BUILD_DIR", "build")
LIB = ctypes.CDLL(os.path.join(ROOT, BUILD, "common", "libctrain.so"))

CT_F32, CT_I32, CT_BF16, CT_F16 = 0, 1, 4, 5
MAX_DIMS = 6


class Err(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 512)]


class Shape(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("dims", ctypes.c_int64 * MAX_DIMS)]


def _shape(dims):
    s = Shape()
    s.rank = len(dims)
    for i, d in enumerate(dims):
        s.dims[i] = d
    return s


vp, i32, i64, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
for name, args in {
    "ct_backend_cpu_create": [i32, ctypes.POINTER(vp), vp],
    "ct_backend_destroy": [vp],
    "ct_graph_create": [vp, i32, ctypes.POINTER(vp), vp],
    "ct_graph_destroy": [vp],
    "ct_graph_status": [vp, ctypes.POINTER(Err)],
    "ct_graph_read": [vp, i32, vp, ctypes.c_size_t, ctypes.POINTER(Err)],
    "ct_graph_shape": [vp, i32, ctypes.POINTER(i64)],
    "ct_graph_gradients": [vp, i32, i32, i32, ctypes.POINTER(i32), ctypes.POINTER(i32),
                           ctypes.POINTER(Err)],
    "ct_variable": [vp, ctypes.POINTER(Shape), vp, ctypes.c_char_p],
    "ct_constant": [vp, i32, ctypes.POINTER(Shape), vp],
    "ct_trainer_load": [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p), i32,
                        ctypes.POINTER(vp), ctypes.POINTER(Err)],
    "ct_trainer_destroy": [vp],
    "ct_trainer_step": [vp, vp, vp, i64, ctypes.POINTER(f32), ctypes.POINTER(f32),
                        ctypes.POINTER(Err)],
    "ct_trainer_get_param": [vp, ctypes.c_char_p, vp, i64, ctypes.POINTER(Err)],
    "ct_trainer_set_param": [vp, ctypes.c_char_p, vp, i64, ctypes.POINTER(Err)],
    "ct_trainer_predict": [vp, vp, i64, vp, ctypes.POINTER(Err)],
    "ct_predictor_load": [ctypes.c_char_p, i32, ctypes.POINTER(vp), ctypes.POINTER(Err)],
    "ct_predictor_run": [vp, vp, i64, vp, ctypes.POINTER(Err)],
    "ct_predictor_outputs": [vp],
    "ct_predictor_destroy": [vp],
}.items():
    getattr(LIB, name).argtypes = args
LIB.ct_predictor_outputs.restype = i64


class Graph:
    """An eager ctrain graph: every builder call runs at once (the tape)."""

    def __init__(self):
        self.be = vp()
        self.g = vp()
        assert LIB.ct_backend_cpu_create(1, ctypes.byref(self.be), None) == 0
        assert LIB.ct_graph_create(self.be, 1, ctypes.byref(self.g), None) == 0
        self.keep = []

    def close(self):
        LIB.ct_graph_destroy(self.g)
        LIB.ct_backend_destroy(self.be)

    def check(self, node):
        if node < 0:
            err = Err()
            LIB.ct_graph_status(self.g, ctypes.byref(err))
            raise RuntimeError(err.msg.decode())
        return node

    def variable(self, array):
        a = np.ascontiguousarray(array, dtype=np.float32).copy()
        self.keep.append(a)
        return self.check(LIB.ct_variable(self.g, ctypes.byref(_shape(a.shape)),
                                          a.ctypes.data_as(vp), b"x"))

    def constant(self, array):
        """An i32, f16 (float16 arrays) or f32 constant."""
        a = np.ascontiguousarray(array)
        dtype = {np.dtype(np.int32): CT_I32, np.dtype(np.float16): CT_F16}.get(a.dtype, CT_F32)
        a = a.astype({CT_I32: np.int32, CT_F16: np.float16}.get(dtype, np.float32))
        return self.check(LIB.ct_constant(self.g, dtype, ctypes.byref(_shape(a.shape)),
                                          a.ctypes.data_as(vp)))

    def op(self, name, *args):
        fn = getattr(LIB, "ct_" + name)
        fn.restype = ctypes.c_int
        conv = [ctypes.c_float(a) if isinstance(a, float) else a for a in args]
        return self.check(fn(self.g, *conv))

    def value(self, node, dtype=np.float32):
        dims = (i64 * MAX_DIMS)()
        rank = LIB.ct_graph_shape(self.g, node, dims)
        out = np.empty([dims[k] for k in range(rank)], dtype=dtype)
        err = Err()
        st = LIB.ct_graph_read(self.g, node, out.ctypes.data_as(vp), out.nbytes, ctypes.byref(err))
        assert st == 0, err.msg.decode()
        return out

    def gradients(self, target, sources):
        src = (i32 * len(sources))(*sources)
        out = (i32 * len(sources))()
        err = Err()
        st = LIB.ct_graph_gradients(self.g, target, -1, len(sources), src, out, ctypes.byref(err))
        assert st == 0, err.msg.decode()
        return list(out)


class Trainer:
    """A ctrain trainer made from a job file and --set overrides."""

    def __init__(self, job, sets=()):
        arr = (ctypes.c_char_p * max(1, len(sets)))(*[s.encode() for s in sets])
        self.t = vp()
        err = Err()
        st = LIB.ct_trainer_load(job.encode(), arr, len(sets), ctypes.byref(self.t),
                                 ctypes.byref(err))
        assert st == 0, err.msg.decode()

    def close(self):
        LIB.ct_trainer_destroy(self.t)

    def get(self, name, shape):
        out = np.empty(shape, dtype=np.float32)
        err = Err()
        st = LIB.ct_trainer_get_param(self.t, name.encode(), out.ctypes.data_as(vp), out.size,
                                      ctypes.byref(err))
        assert st == 0, err.msg.decode()
        return out

    def set(self, name, array):
        a = np.ascontiguousarray(array, dtype=np.float32)
        err = Err()
        st = LIB.ct_trainer_set_param(self.t, name.encode(), a.ctypes.data_as(vp), a.size,
                                      ctypes.byref(err))
        assert st == 0, err.msg.decode()

    def step(self, x, y):
        x = np.ascontiguousarray(x, dtype=np.float32)
        # integer class labels, or f32 targets (loss mean_squared_error) as they are
        y = np.ascontiguousarray(y, dtype=np.float32 if y.dtype.kind == "f" else np.int32)
        loss, acc, err = f32(), f32(), Err()
        st = LIB.ct_trainer_step(self.t, x.ctypes.data_as(vp), y.ctypes.data_as(vp), len(y),
                                 ctypes.byref(loss), ctypes.byref(acc), ctypes.byref(err))
        assert st == 0, err.msg.decode()
        self.last_accuracy = acc.value
        return loss.value

    def export_onnx(self, path):
        err = Err()
        st = LIB.ct_trainer_export_onnx(self.t, str(path).encode(), b"test", ctypes.byref(err))
        assert st == 0, err.msg.decode()

    def predict(self, x, classes):
        """classes: the output's shape per example (an int, or a tuple such as (T, C))."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        per = classes if isinstance(classes, tuple) else (classes,)
        out = np.empty((x.shape[0], *per), dtype=np.float32)
        err = Err()
        st = LIB.ct_trainer_predict(self.t, x.ctypes.data_as(vp), x.shape[0],
                                    out.ctypes.data_as(vp), ctypes.byref(err))
        assert st == 0, err.msg.decode()
        return out


class Predictor:
    """ct_predictor: a checkpoint's model for inference, thread-safe (`contexts` at once)."""

    def __init__(self, path, contexts):
        self.p, err = vp(), Err()
        st = LIB.ct_predictor_load(str(path).encode(), contexts, ctypes.byref(self.p),
                                   ctypes.byref(err))
        if st != 0:
            raise RuntimeError(err.msg.decode())
        self.outputs = LIB.ct_predictor_outputs(self.p)

    def close(self):
        LIB.ct_predictor_destroy(self.p)

    def run(self, x):
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], self.outputs), dtype=np.float32)
        err = Err()
        st = LIB.ct_predictor_run(self.p, x.ctypes.data_as(vp), x.shape[0],
                                  out.ctypes.data_as(vp), ctypes.byref(err))
        if st != 0:
            raise RuntimeError(err.msg.decode())
        return out
