"""A real reader reads what ctrain's TFRecord writer and Example builder (ctrain/tfrecord.h) write.

libctrain is driven through ctypes: the writer writes raw records and Examples built with the
builder, and ct_tfrecord_convert_idx converts an IDX pair into shards. The files are read back
with the `tensorboard` package's TFRecord reader (every record's length and data CRCs checked)
and the Examples are parsed by the protobuf runtime from tf.train.Example's schema (rebuilt
here: tensorboard does not ship example.proto), so nothing of ours checks our own output. The
other direction, our reader on files TensorFlow wrote, is the `tfrecord` unit suite.

Runs in the virtual environment of scripts/test.sh (pip's tensorboard and protobuf); without
them the test fails, never skips."""
import ctypes
import gzip
import os
import struct

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from tensorboard.compat.tensorflow_stub import errors
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("CTRAIN_BUILD_DIR", "build")
LIBPATH = os.path.join(ROOT, BUILD, "common", "libctrain.so")
CT_OK = 0


class Err(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int), ("msg", ctypes.c_char * 512)]


def load_lib():
    lib = ctypes.CDLL(LIBPATH)
    vp, i32, sz, perr = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.POINTER(Err)
    pvp, psz = ctypes.POINTER(vp), ctypes.POINTER(sz)
    sigs = {
        "ct_tfrecord_writer_create": ([ctypes.c_char_p, pvp, perr], i32),
        "ct_tfrecord_writer_write": ([vp, ctypes.c_char_p, sz, perr], i32),
        "ct_tfrecord_writer_close": ([vp, perr], i32),
        "ct_example_builder_create": ([pvp, perr], i32),
        "ct_example_builder_add_floats": ([vp, ctypes.c_char_p, ctypes.POINTER(ctypes.c_float),
                                           sz, perr], i32),
        "ct_example_builder_add_int64s": ([vp, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64),
                                           sz, perr], i32),
        "ct_example_builder_add_bytes": ([vp, ctypes.c_char_p, pvp, psz, sz, perr], i32),
        "ct_example_builder_encode": ([vp, pvp, psz, perr], i32),
        "ct_example_builder_clear": ([vp], None),
        "ct_example_builder_destroy": ([vp], None),
        "ct_tfrecord_convert_idx": ([ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, i32, i32,
                                     perr],
                                    i32),
    }
    for name, (args, res) in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, res
    return lib


def check(status, err):
    assert status == CT_OK, err.msg.decode()


def example_class():
    """tf.train.Example from its schema (tensorflow/core/example/{example,feature}.proto)."""
    F = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="ct_test_example.proto", package="ct_test",
                                           syntax="proto3")

    def message(name, fields, nested=None):
        m = f.message_type.add(name=name)
        for number, fname, ftype, label, type_name, oneof in fields:
            fd = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                fd.type_name = type_name
            if oneof is not None:
                fd.oneof_index = oneof
        return m

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    message("BytesList", [(1, "value", F.TYPE_BYTES, rep, None, None)])
    message("FloatList", [(1, "value", F.TYPE_FLOAT, rep, None, None)])
    message("Int64List", [(1, "value", F.TYPE_INT64, rep, None, None)])
    feature = message("Feature", [
        (1, "bytes_list", F.TYPE_MESSAGE, opt, ".ct_test.BytesList", 0),
        (2, "float_list", F.TYPE_MESSAGE, opt, ".ct_test.FloatList", 0),
        (3, "int64_list", F.TYPE_MESSAGE, opt, ".ct_test.Int64List", 0)])
    feature.oneof_decl.add(name="kind")
    features = message("Features", [(1, "feature", F.TYPE_MESSAGE, rep,
                                     ".ct_test.Features.FeatureEntry", None)])
    entry = features.nested_type.add(name="FeatureEntry")
    entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=opt)
    entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=opt,
                    type_name=".ct_test.Feature")
    entry.options.map_entry = True
    message("Example", [(1, "features", F.TYPE_MESSAGE, opt, ".ct_test.Features", None)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("ct_test.Example"))


def read_records(path):
    """Every record of the file through tensorboard's reader, which checks both CRCs."""
    reader = PyRecordReader_New(path.encode())
    out = []
    while True:
        try:
            reader.GetNext()
        except errors.OutOfRangeError:
            return out
        out.append(reader.record())


class Builder:
    def __init__(self, lib):
        self.lib, self.err, self.b = lib, Err(), ctypes.c_void_p()
        check(lib.ct_example_builder_create(ctypes.byref(self.b), ctypes.byref(self.err)),
              self.err)

    def floats(self, name, values):
        arr = (ctypes.c_float * len(values))(*values)
        check(self.lib.ct_example_builder_add_floats(self.b, name.encode(), arr, len(values),
                                                     ctypes.byref(self.err)), self.err)

    def int64s(self, name, values):
        arr = (ctypes.c_int64 * len(values))(*values)
        check(self.lib.ct_example_builder_add_int64s(self.b, name.encode(), arr, len(values),
                                                     ctypes.byref(self.err)), self.err)

    def bytes(self, name, values):
        bufs = [ctypes.create_string_buffer(v, len(v) or 1) for v in values]
        ptrs = (ctypes.c_void_p * len(values))(*[ctypes.addressof(b) for b in bufs])
        lens = (ctypes.c_size_t * len(values))(*[len(v) for v in values])
        check(self.lib.ct_example_builder_add_bytes(self.b, name.encode(), ptrs, lens,
                                                    len(values), ctypes.byref(self.err)), self.err)

    def encode(self):
        data, n = ctypes.c_void_p(), ctypes.c_size_t()
        check(self.lib.ct_example_builder_encode(self.b, ctypes.byref(data), ctypes.byref(n),
                                                 ctypes.byref(self.err)), self.err)
        record = ctypes.string_at(data, n.value)
        self.lib.ct_example_builder_clear(self.b)
        return record

    def close(self):
        self.lib.ct_example_builder_destroy(self.b)


def write_file(lib, path, records):
    err, w = Err(), ctypes.c_void_p()
    check(lib.ct_tfrecord_writer_create(path.encode(), ctypes.byref(w), ctypes.byref(err)), err)
    for r in records:
        check(lib.ct_tfrecord_writer_write(w, r, len(r), ctypes.byref(err)), err)
    check(lib.ct_tfrecord_writer_close(w, ctypes.byref(err)), err)


def test_raw_records_and_examples_read_by_tensorboard(tmp_path):
    lib = load_lib()
    raw = [b"", b"x", bytes(range(256)) * 40, b"\0" * 7]
    raw_path = str(tmp_path / "raw.tfrecord")
    write_file(lib, raw_path, raw)
    assert read_records(raw_path) == raw

    b = Builder(lib)
    examples = []
    for k in range(4):
        b.floats("f", [k + 0.5, -2.25 * k, 3e-8])
        b.int64s("i", [k, -(2**40) - k, 2**63 - 1, -(2**63)])
        b.bytes("b", [b"img-%d" % k, b"", bytes([k] * 300)])
        b.floats("empty", [])
        examples.append(b.encode())
    b.close()
    ex_path = str(tmp_path / "examples.tfrecord")
    write_file(lib, ex_path, examples)
    Example = example_class()
    got = read_records(ex_path)
    assert len(got) == 4
    for k, record in enumerate(got):
        ex = Example.FromString(record)
        feat = ex.features.feature
        assert set(feat) == {"f", "i", "b", "empty"}
        assert list(feat["f"].float_list.value) == [k + 0.5, -2.25 * k, struct.unpack(
            "<f", struct.pack("<f", 3e-8))[0]]
        assert list(feat["i"].int64_list.value) == [k, -(2**40) - k, 2**63 - 1, -(2**63)]
        assert list(feat["b"].bytes_list.value) == [b"img-%d" % k, b"", bytes([k] * 300)]
        assert feat["empty"].WhichOneof("kind") == "float_list"
        assert list(feat["empty"].float_list.value) == []


def write_idx(path, magic, dims, data):
    head = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims)
    with gzip.open(path, "wb") as f:
        f.write(head + data)


def test_converted_idx_shards_read_by_tensorboard(tmp_path):
    lib = load_lib()
    n, rows, cols = 11, 28, 28
    pixels = bytes((i * 7 + 3) % 256 for i in range(n * rows * cols))
    labels = bytes((i * 3) % 10 for i in range(n))
    images_path, labels_path = str(tmp_path / "im.gz"), str(tmp_path / "lb.gz")
    write_idx(images_path, 0x803, [n, rows, cols], pixels)
    write_idx(labels_path, 0x801, [n], labels)
    err = Err()
    prefix = str(tmp_path / "mnist")
    check(lib.ct_tfrecord_convert_idx(images_path.encode(), labels_path.encode(),
                                      prefix.encode(), 3, 1, ctypes.byref(err)), err)  # 1: NONE
    Example = example_class()
    seen = []
    for s in range(3):
        path = "%s-%05d-of-00003.tfrecord" % (prefix, s)
        for record in read_records(path):
            feat = Example.FromString(record).features.feature
            seen.append((feat["image"].bytes_list.value[0], list(feat["label"].int64_list.value)))
    assert len(seen) == n
    size = rows * cols
    for i, (image, label) in enumerate(seen):
        assert image == pixels[i * size:(i + 1) * size]
        assert label == [labels[i]]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["im.gz", "lb.gz"] + ["mnist-%05d-of-00003.tfrecord" % s for s in range(3)])
