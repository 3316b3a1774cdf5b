/* ONNX export, the builder and the file (see io/onnx_build.h): the graph's nodes in order, each
 * written by io/onnx_ops.c as one or a few ONNX nodes; variables and constants as initializers
 * named as their tensors ("dense_1/kernel"); the model (IR 8, opset 17) serialized by protobuf-c
 * and written atomically. Every message and string lives in one arena, freed at the end. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/atomic_file.h"
#include "io/onnx_build.h"

#define BLOCK_BYTES (64 * 1024)
#define OPSET 17
#define IR_VERSION 8

struct onnx_block {
    onnx_block *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
};

const char *ct__ob_fail(onnx_b *b, ct_status st, const char *fmt, ...) {
    if (b->st == CT_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(b->why, sizeof b->why, fmt, ap);
        va_end(ap);
        b->st = st;
    }
    return NULL;
}

void *ct__ob_alloc(onnx_b *b, size_t bytes) {
    bytes = (bytes + 15) & ~(size_t)15;
    onnx_block *k = b->blocks;
    if (!k || k->cap - k->used < bytes) {
        size_t cap = bytes > BLOCK_BYTES ? bytes : BLOCK_BYTES;
        if (!(k = malloc(sizeof *k + cap))) {
            ct__ob_fail(b, CT_ENOMEM, "out of memory");
            return NULL;
        }
        *k = (onnx_block){.next = b->blocks, .cap = cap};
        b->blocks = k;
    }
    void *p = k->data + k->used;
    k->used += bytes;
    return memset(p, 0, bytes);
}

static char *ob_str(onnx_b *b, const char *s) {
    char *c = ct__ob_alloc(b, strlen(s) + 1);
    return c ? strcpy(c, s) : NULL;
}

const char *ct__ob_fresh(onnx_b *b, const char *base) {
    char name[96];
    snprintf(name, sizeof name, "%s_%d", base, b->fresh++);
    return ob_str(b, name);
}

/* Appends p to the array *items (count *n, capacity *cap). */
static int push(onnx_b *b, void ***items, int *n, int *cap, void *p) {
    if (*n == *cap) {
        int grown = *cap ? 2 * *cap : 64;
        void **a = realloc(*items, (size_t)grown * sizeof *a);
        if (!a) {
            ct__ob_fail(b, CT_ENOMEM, "out of memory");
            return 0;
        }
        *items = a;
        *cap = grown;
    }
    (*items)[(*n)++] = p;
    return 1;
}

Ctrain__Onnx__NodeProto *ct__ob_node(onnx_b *b, const char *op_type, int n_in,
                                     const char *const *in, const char *out) {
    Ctrain__Onnx__NodeProto *n = ct__ob_alloc(b, sizeof *n);
    char **ins = ct__ob_alloc(b, sizeof *ins * (size_t)(n_in ? n_in : 1));
    char **outs = ct__ob_alloc(b, sizeof *outs);
    if (!n || !ins || !outs || !out) {
        return NULL;
    }
    *n = (Ctrain__Onnx__NodeProto)CTRAIN__ONNX__NODE_PROTO__INIT;
    for (int k = 0; k < n_in; k++) {
        if (!in[k]) {
            return NULL;
        }
        ins[k] = (char *)in[k];
    }
    outs[0] = (char *)out;
    n->n_input = (size_t)n_in;
    n->input = ins;
    n->n_output = 1;
    n->output = outs;
    n->op_type = ob_str(b, op_type);
    n->name = (char *)out;
    return push(b, (void ***)&b->nodes, &b->n_nodes, &b->cap_nodes, n) ? n : NULL;
}

const char *ct__ob_op1(onnx_b *b, const char *op_type, const char *x) {
    const char *out = ct__ob_fresh(b, op_type);
    return ct__ob_node(b, op_type, 1, &x, out) ? out : NULL;
}

const char *ct__ob_op2(onnx_b *b, const char *op_type, const char *x, const char *y) {
    const char *in[2] = {x, y}, *out = ct__ob_fresh(b, op_type);
    return ct__ob_node(b, op_type, 2, in, out) ? out : NULL;
}

static Ctrain__Onnx__AttributeProto *attr(onnx_b *b, Ctrain__Onnx__NodeProto *n, const char *name,
                                          Ctrain__Onnx__AttributeProto__AttributeType type) {
    Ctrain__Onnx__AttributeProto *a = ct__ob_alloc(b, sizeof *a);
    Ctrain__Onnx__AttributeProto **all =
        n ? ct__ob_alloc(b, sizeof *all * (n->n_attribute + 1)) : NULL;
    if (!a || !all) {
        return NULL;
    }
    *a = (Ctrain__Onnx__AttributeProto)CTRAIN__ONNX__ATTRIBUTE_PROTO__INIT;
    a->name = ob_str(b, name);
    a->has_type = 1;
    a->type = type;
    if (n->n_attribute) {
        memcpy(all, n->attribute, sizeof *all * n->n_attribute);
    }
    all[n->n_attribute] = a;
    n->attribute = all;
    n->n_attribute++;
    return a;
}

void ct__ob_attr_i(onnx_b *b, Ctrain__Onnx__NodeProto *n, const char *name, int64_t v) {
    Ctrain__Onnx__AttributeProto *a =
        attr(b, n, name, CTRAIN__ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INT);
    if (a) {
        a->has_i = 1;
        a->i = v;
    }
}

void ct__ob_attr_f(onnx_b *b, Ctrain__Onnx__NodeProto *n, const char *name, float v) {
    Ctrain__Onnx__AttributeProto *a =
        attr(b, n, name, CTRAIN__ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__FLOAT);
    if (a) {
        a->has_f = 1;
        a->f = v;
    }
}

void ct__ob_attr_ints(onnx_b *b, Ctrain__Onnx__NodeProto *n, const char *name, int count,
                      const int64_t *v) {
    Ctrain__Onnx__AttributeProto *a =
        attr(b, n, name, CTRAIN__ONNX__ATTRIBUTE_PROTO__ATTRIBUTE_TYPE__INTS);
    int64_t *copy = a ? ct__ob_alloc(b, sizeof *copy * (size_t)(count ? count : 1)) : NULL;
    if (copy) {
        memcpy(copy, v, sizeof *copy * (size_t)count);
        a->n_ints = (size_t)count;
        a->ints = copy;
    }
}

const char *ct__ob_init(onnx_b *b, const char *name, int data_type, int rank, const int64_t *dims,
                        const void *data, size_t bytes) {
    Ctrain__Onnx__TensorProto *t = ct__ob_alloc(b, sizeof *t);
    int64_t *d = ct__ob_alloc(b, sizeof *d * (size_t)(rank ? rank : 1));
    if (!t || !d) {
        return NULL;
    }
    *t = (Ctrain__Onnx__TensorProto)CTRAIN__ONNX__TENSOR_PROTO__INIT;
    if (rank > 0) {
        memcpy(d, dims, sizeof *d * (size_t)rank);
    }
    t->n_dims = (size_t)rank;
    t->dims = d;
    t->has_data_type = 1;
    t->data_type = data_type;
    t->name = ob_str(b, name);
    t->has_raw_data = 1;
    t->raw_data = (ProtobufCBinaryData){.len = bytes, .data = (uint8_t *)data};
    return push(b, (void ***)&b->inits, &b->n_inits, &b->cap_inits, t) ? t->name : NULL;
}

const char *ct__ob_scalar(onnx_b *b, float v) {
    float *c = ct__ob_alloc(b, sizeof *c);
    if (!c) {
        return NULL;
    }
    *c = v;
    return ct__ob_init(b, ct__ob_fresh(b, "const"), CTRAIN__ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, 0,
                       NULL, c, sizeof *c);
}

const char *ct__ob_i64s(onnx_b *b, int count, const int64_t *v) {
    int64_t *c = ct__ob_alloc(b, sizeof *c * (size_t)(count ? count : 1)), dim = count;
    if (!c) {
        return NULL;
    }
    memcpy(c, v, sizeof *c * (size_t)count);
    return ct__ob_init(b, ct__ob_fresh(b, "ints"), CTRAIN__ONNX__TENSOR_PROTO__DATA_TYPE__INT64, 1,
                       &dim, c, sizeof *c * (size_t)count);
}

static int onnx_dtype(ct_dtype t) {
    return t == CT_F32   ? CTRAIN__ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT
           : t == CT_I32 ? CTRAIN__ONNX__TENSOR_PROTO__DATA_TYPE__INT32
           : t == CT_I64 ? CTRAIN__ONNX__TENSOR_PROTO__DATA_TYPE__INT64
           : t == CT_U8  ? CTRAIN__ONNX__TENSOR_PROTO__DATA_TYPE__UINT8
                         : 0;
}

/* The graph input or output `name` of node n's type, its first dimension "batch". */
static Ctrain__Onnx__ValueInfoProto *value_info(onnx_b *b, const char *name, const ct_node *n) {
    Ctrain__Onnx__ValueInfoProto *v = ct__ob_alloc(b, sizeof *v);
    Ctrain__Onnx__TypeProto *type = ct__ob_alloc(b, sizeof *type);
    Ctrain__Onnx__TypeProto__Tensor *tt = ct__ob_alloc(b, sizeof *tt);
    Ctrain__Onnx__TensorShapeProto *shape = ct__ob_alloc(b, sizeof *shape);
    int rank = n->out.shape.rank;
    Ctrain__Onnx__TensorShapeProto__Dimension *dims = ct__ob_alloc(b, sizeof *dims * (size_t)rank);
    Ctrain__Onnx__TensorShapeProto__Dimension **ptrs = ct__ob_alloc(b, sizeof *ptrs * (size_t)rank);
    if (!v || !type || !tt || !shape || (rank && (!dims || !ptrs))) {
        return NULL;
    }
    for (int d = 0; d < rank; d++) {
        dims[d] = (Ctrain__Onnx__TensorShapeProto__Dimension)
            CTRAIN__ONNX__TENSOR_SHAPE_PROTO__DIMENSION__INIT;
        if (d == 0) {
            dims[d].value_case = CTRAIN__ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_PARAM;
            dims[d].dim_param = ob_str(b, "batch");
        } else {
            dims[d].value_case = CTRAIN__ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE;
            dims[d].dim_value = n->out.shape.dims[d];
        }
        ptrs[d] = &dims[d];
    }
    *shape = (Ctrain__Onnx__TensorShapeProto)CTRAIN__ONNX__TENSOR_SHAPE_PROTO__INIT;
    shape->n_dim = (size_t)rank;
    shape->dim = ptrs;
    *tt = (Ctrain__Onnx__TypeProto__Tensor)CTRAIN__ONNX__TYPE_PROTO__TENSOR__INIT;
    tt->has_elem_type = 1;
    tt->elem_type = onnx_dtype(n->out.dtype);
    tt->shape = shape;
    *type = (Ctrain__Onnx__TypeProto)CTRAIN__ONNX__TYPE_PROTO__INIT;
    type->value_case = CTRAIN__ONNX__TYPE_PROTO__VALUE_TENSOR_TYPE;
    type->tensor_type = tt;
    *v = (Ctrain__Onnx__ValueInfoProto)CTRAIN__ONNX__VALUE_INFO_PROTO__INIT;
    v->name = ob_str(b, name);
    v->type = type;
    return v;
}

/* A leaf: the input, or an initializer named as its tensor (unique: "<name>_<k>" on a clash). */
static const char *leaf(onnx_b *b, const ct_node *n, int input) {
    if (input) {
        return ob_str(b, "input");
    }
    if (!n->out.data || !onnx_dtype(n->out.dtype)) {
        return ct__ob_fail(b, CT_EINVAL, "ONNX export: node %d (%s) has no value to write", n->id,
                           ct_op_name(n->op));
    }
    const char *name = n->out.name[0] ? n->out.name : "const";
    for (int k = 0; k < b->n_inits && name; k++) {
        name = strcmp(b->inits[k]->name, name) ? name : ct__ob_fresh(b, n->out.name);
    }
    return name ? ct__ob_init(b, name, onnx_dtype(n->out.dtype), n->out.shape.rank,
                              n->out.shape.dims, n->out.data, ct_tensor_bytes(&n->out))
                : NULL;
}

/* Names every node that output needs, in graph order (inputs come first). */
static void walk(onnx_b *b, int input, int output) {
    int size = ct_graph_size(b->g);
    unsigned char *need = calloc((size_t)size, 1);
    if (!need) {
        ct__ob_fail(b, CT_ENOMEM, "out of memory");
        return;
    }
    need[output] = 1;
    for (int i = output; i >= 0; i--) {
        const ct_node *n = ct_graph_node(b->g, i);
        for (int k = 0; need[i] && k < n->n_in; k++) {
            need[n->in[k]] = 1;
        }
    }
    for (int i = 0; i <= output && b->st == CT_OK; i++) {
        const ct_node *n = ct_graph_node(b->g, i);
        if (!need[i]) {
            continue;
        }
        const char *in[CT_MAX_INPUTS];
        int batched = i == input;
        for (int k = 0; k < n->n_in; k++) {
            in[k] = b->name[n->in[k]];
            batched |= b->batched[n->in[k]];
        }
        b->batched[i] = (unsigned char)batched;
        int is_leaf = n->op == CT_OP_PLACEHOLDER || n->op == CT_OP_VARIABLE || n->op == CT_OP_CONST;
        if (is_leaf && i != input && n->op == CT_OP_PLACEHOLDER) {
            ct__ob_fail(b, CT_EINVAL, "ONNX export: the graph has a second input (node %d)", i);
        } else if (is_leaf) {
            b->name[i] = leaf(b, n, i == input);
        } else {
            b->name[i] =
                ct__onnx_emit(b, n, in, i == output ? ob_str(b, "output") : ct__ob_fresh(b, "v"));
        }
        if (!b->name[i] && b->st == CT_OK) {
            ct__ob_fail(b, CT_ENOMEM, "out of memory");
        }
    }
    free(need);
}

/* The model around the nodes, serialized into the file. */
static ct_status write_model(onnx_b *b, int input, int output, const char *producer,
                             const char *path, ct_err *err) {
    Ctrain__Onnx__GraphProto graph = CTRAIN__ONNX__GRAPH_PROTO__INIT;
    Ctrain__Onnx__ValueInfoProto *in = value_info(b, "input", ct_graph_node(b->g, input));
    Ctrain__Onnx__ValueInfoProto *out = value_info(b, "output", ct_graph_node(b->g, output));
    if (b->st != CT_OK || !in || !out) {
        return ct_err_set(err, b->st != CT_OK ? b->st : CT_ENOMEM, "%s",
                          b->st != CT_OK ? b->why : "out of memory");
    }
    graph.name = "ctrain";
    graph.n_node = (size_t)b->n_nodes;
    graph.node = b->nodes;
    graph.n_initializer = (size_t)b->n_inits;
    graph.initializer = b->inits;
    graph.n_input = 1;
    graph.input = &in;
    graph.n_output = 1;
    graph.output = &out;
    Ctrain__Onnx__OperatorSetIdProto opset = CTRAIN__ONNX__OPERATOR_SET_ID_PROTO__INIT,
                                     *ops = &opset;
    opset.domain = "";
    opset.has_version = 1;
    opset.version = OPSET;
    Ctrain__Onnx__ModelProto model = CTRAIN__ONNX__MODEL_PROTO__INIT;
    model.has_ir_version = 1;
    model.ir_version = IR_VERSION;
    model.producer_name = "ctrain";
    model.producer_version = (char *)producer;
    model.graph = &graph;
    model.n_opset_import = 1;
    model.opset_import = &ops;
    size_t len = ctrain__onnx__model_proto__get_packed_size(&model);
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        return ct_err_set(err, CT_ENOMEM, "ONNX export: out of memory for %zu bytes", len);
    }
    ctrain__onnx__model_proto__pack(&model, buf);
    ct__atomic_file f = {0};
    ct_status st = ct__atomic_file_open(&f, path, err);
    st = st == CT_OK ? ct__atomic_file_write(&f, buf, len, err) : st;
    st = ct__atomic_file_finish(&f, st, err);
    free(buf);
    return st;
}

ct_status ct__onnx_write(ct_graph *g, int input, int output, const char *producer, const char *path,
                         ct_err *err) {
    int size = ct_graph_size(g);
    if (input < 0 || output < 0 || input >= size || output >= size || input > output) {
        return ct_err_set(err, CT_EINVAL, "ONNX export: bad input or output node (%d, %d)", input,
                          output);
    }
    onnx_b b = {.g = g};
    b.name = calloc((size_t)size, sizeof *b.name);
    b.batched = calloc((size_t)size, 1);
    ct_status st;
    if (!b.name || !b.batched) {
        st = ct_err_set(err, CT_ENOMEM, "ONNX export: out of memory");
    } else {
        walk(&b, input, output);
        st = write_model(&b, input, output, producer, path, err);
    }
    while (b.blocks) {
        onnx_block *next = b.blocks->next;
        free(b.blocks);
        b.blocks = next;
    }
    free(b.nodes);
    free(b.inits);
    free(b.name);
    free((void *)b.batched);
    return st;
}
