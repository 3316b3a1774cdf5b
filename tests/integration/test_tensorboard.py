"""TensorBoard reads what ctrain's event writer (ctrain/events.h) writes.

libctrain is driven through ctypes (scalars, histograms, text, a graph), and the run directory is
read back with the `tensorboard` package's own reader (EventFileLoader and EventAccumulator):
tags, steps and values must come back exactly, every record must pass its CRC checks, and
TensorBoard's histogram and text plugins must accept the data.

The suite runs in the virtual environment that scripts/test.sh makes (Debian's torch and numpy,
pip's tensorboard). Without `tensorboard` the test fails, never skips: a silent skip would hide
that the event files were never checked."""
import ctypes
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CTRAIN_BUILD_DIR", "build")
LIBPATH = os.path.join(ROOT, BUILD, "common", "libctrain.so")

CT_OK, CT_EIO = 0, -3
CT_F32 = 0
MAX_DIMS = 6

SCALARS = [(0, 2.5), (1, 1.25), (2, 0.1), (3, 1e-3), (10, 3.3), (1 << 40, -7.0)]
HIST_VALUES = [-3.5, -0.25, 0.0, 1e-12, 0.5, 0.5, 0.5, 2.0, 1000.0, float("nan"), float("inf")]
TEXT = "# Job\n\nlr: **0.1**, ünïcödé"


class Err(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 512)]


class Shape(ctypes.Structure):
    _fields_ = [("rank", ctypes.c_int), ("dims", ctypes.c_int64 * MAX_DIMS)]


def load_lib():
    lib = ctypes.CDLL(LIBPATH)
    vp, i32, i64, perr = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.POINTER(Err)
    sigs = {
        "ct_events_create": ([ctypes.c_char_p, ctypes.POINTER(vp), perr], i32),
        "ct_events_scalar": ([vp, ctypes.c_char_p, i64, ctypes.c_double, perr], i32),
        "ct_events_histogram": ([vp, ctypes.c_char_p, i64, ctypes.POINTER(ctypes.c_float), i64,
                                 perr], i32),
        "ct_events_text": ([vp, ctypes.c_char_p, i64, ctypes.c_char_p, perr], i32),
        "ct_events_graph": ([vp, vp, perr], i32),
        "ct_events_flush": ([vp, perr], i32),
        "ct_events_destroy": ([vp], None),
        "ct_events_path": ([vp], ctypes.c_char_p),
        "ct_backend_cpu_create": ([i32, ctypes.POINTER(vp), perr], i32),
        "ct_backend_destroy": ([vp], None),
        "ct_graph_create": ([vp, i32, ctypes.POINTER(vp), perr], i32),
        "ct_graph_destroy": ([vp], None),
        "ct_graph_status": ([vp, perr], i32),
        "ct_placeholder": ([vp, i32, ctypes.POINTER(Shape), ctypes.c_char_p], i32),
        "ct_variable": ([vp, ctypes.POINTER(Shape), vp, ctypes.c_char_p], i32),
        "ct_matmul": ([vp, i32, i32, i32, i32], i32),
        "ct_add": ([vp, i32, i32], i32),
        "ct_relu": ([vp, i32], i32),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def shape(*dims):
    s = Shape()
    s.rank = len(dims)
    for i, d in enumerate(dims):
        s.dims[i] = d
    return s


def ok(status, err):
    assert status == CT_OK, (status, err.msg.decode())


def write_events(lib, run_dir):
    """Writes the events the checks expect into run_dir; returns the event file's path."""
    err = Err()
    w = ctypes.c_void_p()
    ok(lib.ct_events_create(run_dir.encode(), ctypes.byref(w), ctypes.byref(err)), err)
    for step, value in SCALARS:
        ok(lib.ct_events_scalar(w, b"loss", step, value, ctypes.byref(err)), err)
    vals = (ctypes.c_float * len(HIST_VALUES))(*HIST_VALUES)
    ok(lib.ct_events_histogram(w, b"weights/dense", 5, vals, len(HIST_VALUES),
                               ctypes.byref(err)), err)
    ok(lib.ct_events_text(w, b"config", 0, TEXT.encode(), ctypes.byref(err)), err)

    be, g = ctypes.c_void_p(), ctypes.c_void_p()
    ok(lib.ct_backend_cpu_create(1, ctypes.byref(be), ctypes.byref(err)), err)
    ok(lib.ct_graph_create(be, 0, ctypes.byref(g), ctypes.byref(err)), err)
    wdata = (ctypes.c_float * 12)()
    bdata = (ctypes.c_float * 4)()
    xs, ws, bs = shape(2, 3), shape(3, 4), shape(4)
    x = lib.ct_placeholder(g, CT_F32, ctypes.byref(xs), b"input")
    k = lib.ct_variable(g, ctypes.byref(ws), ctypes.cast(wdata, ctypes.c_void_p), b"dense/kernel")
    b = lib.ct_variable(g, ctypes.byref(bs), ctypes.cast(bdata, ctypes.c_void_p), b"dense/bias")
    lib.ct_relu(g, lib.ct_add(g, lib.ct_matmul(g, x, k, 0, 0), b))
    ok(lib.ct_graph_status(g, ctypes.byref(err)), err)
    ok(lib.ct_events_graph(w, g, ctypes.byref(err)), err)
    lib.ct_graph_destroy(g)
    lib.ct_backend_destroy(be)

    ok(lib.ct_events_flush(w, ctypes.byref(err)), err)
    path = lib.ct_events_path(w).decode()
    lib.ct_events_destroy(w)
    return path


def check_errors(lib, tmp):
    """A run directory that cannot be made is CT_EIO naming the path."""
    plain = os.path.join(tmp, "plain")
    with open(plain, "w"):
        pass
    err = Err()
    w = ctypes.c_void_p()
    st = lib.ct_events_create(os.path.join(plain, "run").encode(), ctypes.byref(w), ctypes.byref(err))
    assert st == CT_EIO and not w.value, (st, w)
    assert plain in err.msg.decode(), err.msg


def check_with_tensorboard(tmp):
    """Writes events with libctrain and reads them with tensorboard; raises AssertionError."""
    import numpy as np
    from tensorboard import data_compat
    from tensorboard.backend.event_processing import event_accumulator, event_file_loader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.plugins.histogram import metadata as histogram_metadata
    from tensorboard.util import tensor_util

    lib = load_lib()
    run_dir = os.path.join(tmp, "logs", "run1")
    path = write_events(lib, run_dir)
    assert os.path.dirname(path) == run_dir
    assert os.path.basename(path).startswith("events.out.tfevents."), path
    check_errors(lib, tmp)

    # Every record: the stub reader checks both CRCs and stops at the first bad one.
    events = [event_pb2.Event.FromString(r)
              for r in event_file_loader.RawEventFileLoader(path).Load()]
    assert len(events) == 1 + len(SCALARS) + 3, len(events)
    assert events[0].file_version == "brain.Event:2"

    acc = event_accumulator.EventAccumulator(
        run_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.HISTOGRAMS: 0,
                                event_accumulator.TENSORS: 0})
    acc.Reload()
    assert acc.file_version == 2.0
    tags = acc.Tags()
    assert tags["scalars"] == ["loss"], tags
    assert tags["histograms"] == ["weights/dense"], tags
    assert tags["tensors"] == ["config"], tags
    assert tags["graph"] is True, tags

    scalars = acc.Scalars("loss")
    assert [s.step for s in scalars] == [step for step, _ in SCALARS]
    assert [s.value for s in scalars] == [float(np.float32(v)) for _, v in SCALARS]

    (h,) = acc.Histograms("weights/dense")
    assert h.step == 5
    hv = h.histogram_value
    finite = [float(np.float32(v)) for v in HIST_VALUES if math.isfinite(v)]
    assert hv.num == len(finite)
    assert hv.min == min(finite) and hv.max == max(finite)
    # summed in order in doubles, as the writer does (sum() may compensate on newer Pythons)
    total = squares = 0.0
    for v in finite:
        total += v
        squares += v * v
    assert hv.sum == total and hv.sum_squares == squares
    assert sum(hv.bucket) == len(finite)
    assert list(hv.bucket_limit) == sorted(hv.bucket_limit)
    for i, limit in enumerate(hv.bucket_limit):
        lo = hv.bucket_limit[i - 1] if i else -math.inf
        assert hv.bucket[i] == sum(lo < v <= limit for v in finite), (i, limit)
    # The histograms plugin's migration turns it into [left, right, count] rows.
    (raw,) = [v for e in events if e.HasField("summary") for v in e.summary.value
              if v.tag == "weights/dense"]
    migrated = data_compat.migrate_value(raw)
    assert migrated.metadata.plugin_data.plugin_name == histogram_metadata.PLUGIN_NAME
    rows = tensor_util.make_ndarray(migrated.tensor)
    assert rows.shape[1] == 3 and rows[:, 2].sum() == len(finite)
    assert rows[0, 0] == np.float32(min(finite)) and rows[-1, 1] == np.float32(max(finite))

    assert "config" in acc.PluginTagToContent("text")
    (t,) = acc.Tensors("config")
    assert t.step == 0
    assert t.tensor_proto.dtype == 7  # DT_STRING
    assert tensor_util.make_ndarray(t.tensor_proto).item().decode() == TEXT

    graph = acc.Graph()
    nodes = {n.name: n for n in graph.node}
    assert list(nodes) == ["input", "dense/kernel", "dense/bias", "MatMul", "Add", "Relu"]
    assert nodes["MatMul"].op == "MatMul"
    assert list(nodes["MatMul"].input) == ["input", "dense/kernel"]
    assert list(nodes["Add"].input) == ["MatMul", "dense/bias"]
    assert list(nodes["Relu"].input) == ["Add"]
    assert [d.size for d in nodes["Add"].attr["_output_shapes"].list.shape[0].dim] == [2, 4]
    assert [d.size for d in nodes["input"].attr["shape"].shape.dim] == [2, 3]
    assert nodes["input"].attr["dtype"].type == 1  # DT_FLOAT


def test_tensorboard_reads_ctrain_events(tmp_path):
    assert os.path.exists(LIBPATH), f"{LIBPATH} not built"
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise AssertionError(f"{sys.executable} has no tensorboard package: run the tests with "
                             "scripts/test.sh (it makes a virtual environment with it)")
    check_with_tensorboard(str(tmp_path))
