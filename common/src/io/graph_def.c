/* The GraphDef that TensorBoard draws for a ctrain graph, written as TensorFlow writes its own:
 * - a node's name is its tensor's name (variables: "dense_1/kernel"; placeholders), else
 *   "<scope>/<Op>" in the name scope it was built in (ct_graph_set_scope: the layer, "loss",
 *   "gradients/<layer>", "optimizer"), made unique as TensorFlow does ("MatMul", "MatMul_1");
 * - op names in TensorFlow's CamelCase ("MatMul", "Conv2D", "SumTo");
 * - attrs: "dtype" (TensorFlow's DataType enum), "_output_shapes" on every node (TensorBoard
 *   labels the edges with them) and "shape" on the leaves;
 * - the optimizer's update, which reads the variables and the gradient buffers outside the
 *   graph's edges, gets them as inputs, so that it is drawn where it acts. */
#include "io/graph_def.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrain/ops.h"
#include "tensorboard.pb-c.h"

#define NODE_NAME_CAP 200
#define OP_NAME_CAP 48

/* Everything one NodeDef points to, in one allocation per graph. */
typedef struct node_pb {
    Ctrain__Tb__NodeDef def;
    char *in_store[CT_MAX_INPUTS];
    char **inputs; /* in_store, or the optimizer's own array */
    Ctrain__Tb__NodeDef__AttrEntry entries[3];
    Ctrain__Tb__NodeDef__AttrEntry *entry_ptrs[3];
    Ctrain__Tb__AttrValue shape_val, dtype_val, shapes_val;
    Ctrain__Tb__AttrValue__ListValue list;
    Ctrain__Tb__TensorShapeProto *list_shapes[1];
    Ctrain__Tb__TensorShapeProto shape;
    Ctrain__Tb__TensorShapeProto__Dim dims[CT_MAX_DIMS];
    Ctrain__Tb__TensorShapeProto__Dim *dim_ptrs[CT_MAX_DIMS];
    char name[NODE_NAME_CAP];
    char op[OP_NAME_CAP];
} node_pb;

/* Open-addressing set of node names (indices into the node_pb array; -1: empty slot). */
typedef struct name_set {
    int *slots;
    size_t mask;
    const node_pb *nodes;
} name_set;

static size_t name_hash(const char *s) {
    size_t h = 1469598103934665603u; /* FNV-1a */
    for (; *s; s++) {
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    }
    return h;
}

/* The slot holding `name`, or the empty slot where it would go. */
static size_t name_slot(const name_set *set, const char *name) {
    size_t i = name_hash(name) & set->mask;
    while (set->slots[i] >= 0 && strcmp(set->nodes[set->slots[i]].name, name) != 0) {
        i = (i + 1) & set->mask;
    }
    return i;
}

/* Copies s into out with the characters TensorFlow does not allow in node names
 * ([A-Za-z0-9.][A-Za-z0-9_./-]*) replaced by '_': ':' and '^' would read as output indices and
 * control inputs, and empty scopes ("a//b", a leading or trailing '/') confuse the graph view. */
static void sanitize_name(char *out, size_t cap, const char *s) {
    size_t n = 0;
    for (; s[n] && n + 1 < cap; n++) {
        char c = s[n];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-' ||
                 (c == '/' && n > 0 && s[n + 1] && s[n - 1] != '/');
        out[n] = ok ? c : '_';
    }
    out[n] = '\0';
}

/* TensorFlow's spelling of an op: CamelCase ("sum_to" -> "SumTo", "conv2d" -> "Conv2D"). */
static void op_display(char *out, size_t cap, ct_op op) {
    const char *s = ct_op_name(op);
    if (!strcmp(s, "matmul")) {
        snprintf(out, cap, "MatMul");
        return;
    }
    size_t n = 0;
    for (int up = 1; *s && n + 1 < cap; s++) {
        if (*s == '_') {
            up = 1;
            continue;
        }
        int after_digit = n > 0 && isdigit((unsigned char)out[n - 1]) && *s == 'd';
        out[n++] = (char)(up || after_digit ? toupper((unsigned char)*s) : *s);
        up = 0;
    }
    out[n] = '\0';
}

/* Gives nodes[i] a unique name: its tensor's name or "<scope>/<Op>", then "_1", "_2", ... */
static void assign_name(name_set *set, node_pb *nodes, int i, ct_graph *g, const ct_node *node) {
    char base[NODE_NAME_CAP - 16], raw[NODE_NAME_CAP];
    op_display(nodes[i].op, OP_NAME_CAP, node->op);
    const char *scope = ct_graph_scope_name(g, node->scope);
    if (node->out.name[0]) {
        snprintf(raw, sizeof raw, "%s", node->out.name);
    } else {
        snprintf(raw, sizeof raw, "%.150s%s%s", scope, scope[0] ? "/" : "", nodes[i].op);
    }
    sanitize_name(base, sizeof base, raw);
    char *name = nodes[i].name;
    snprintf(name, NODE_NAME_CAP, "%s", base);
    size_t slot = name_slot(set, name);
    for (int k = 1; set->slots[slot] >= 0; k++) {
        snprintf(name, NODE_NAME_CAP, "%s_%d", base, k);
        slot = name_slot(set, name);
    }
    set->slots[slot] = i;
}

/* TensorFlow's DataType enum */
static int tf_dtype(ct_dtype d) {
    switch (d) {
    case CT_F32:
        return 1; /* DT_FLOAT */
    case CT_I32:
        return 3; /* DT_INT32 */
    case CT_U8:
        return 4; /* DT_UINT8 */
    case CT_I64:
        return 9; /* DT_INT64 */
    case CT_BF16:
        return 14; /* DT_BFLOAT16 */
    case CT_F16:
        return 19; /* DT_HALF */
    }
    return 0; /* DT_INVALID */
}

static int is_leaf(const ct_node *node) {
    return node->op == CT_OP_PLACEHOLDER || node->op == CT_OP_VARIABLE || node->op == CT_OP_CONST;
}

/* What the optimizer's update reads besides its edges: the variables and the nodes that write
 * the gradient buffers. Returns their count; fills ids when not NULL. */
static int update_sources(ct_graph *g, int *ids) {
    int n = 0;
    for (int i = 0; i < ct_graph_size(g); i++) {
        const ct_node *node = ct_graph_node(g, i);
        if (node->op == CT_OP_VARIABLE ||
            (node->op > CT_OP_CONST && (node->flags & (CT_NODE_BOUND | CT_NODE_ACCUMULATE)) &&
             node->op != CT_OP_APPLY_OPTIMIZER)) {
            if (ids) {
                ids[n] = i;
            }
            n++;
        }
    }
    return n;
}

static void fill_attrs(node_pb *p, const ct_node *node) {
    p->shape = (Ctrain__Tb__TensorShapeProto)CTRAIN__TB__TENSOR_SHAPE_PROTO__INIT;
    for (int d = 0; d < node->out.shape.rank; d++) {
        p->dims[d] = (Ctrain__Tb__TensorShapeProto__Dim)CTRAIN__TB__TENSOR_SHAPE_PROTO__DIM__INIT;
        p->dims[d].size = node->out.shape.dims[d];
        p->dim_ptrs[d] = &p->dims[d];
    }
    p->shape.n_dim = (size_t)node->out.shape.rank;
    p->shape.dim = p->dim_ptrs;
    /* The runtime initializer: the INIT macro's "{0}" for a union led by a struct trips
     * -Wmissing-braces. */
    protobuf_c_message_init(&ctrain__tb__attr_value__descriptor, &p->dtype_val);
    p->dtype_val.value_case = CTRAIN__TB__ATTR_VALUE__VALUE_TYPE;
    p->dtype_val.type = tf_dtype(node->out.dtype);
    protobuf_c_message_init(&ctrain__tb__attr_value__list_value__descriptor, &p->list);
    p->list_shapes[0] = &p->shape;
    p->list.n_shape = 1;
    p->list.shape = p->list_shapes;
    protobuf_c_message_init(&ctrain__tb__attr_value__descriptor, &p->shapes_val);
    p->shapes_val.value_case = CTRAIN__TB__ATTR_VALUE__VALUE_LIST;
    p->shapes_val.list = &p->list;
    protobuf_c_message_init(&ctrain__tb__attr_value__descriptor, &p->shape_val);
    p->shape_val.value_case = CTRAIN__TB__ATTR_VALUE__VALUE_SHAPE;
    p->shape_val.shape = &p->shape;

    const char *keys[3] = {"dtype", "_output_shapes", "shape"};
    Ctrain__Tb__AttrValue *vals[3] = {&p->dtype_val, &p->shapes_val, &p->shape_val};
    int n = is_leaf(node) ? 3 : 2;
    for (int k = 0; k < n; k++) {
        p->entries[k] = (Ctrain__Tb__NodeDef__AttrEntry)CTRAIN__TB__NODE_DEF__ATTR_ENTRY__INIT;
        p->entries[k].key = (char *)keys[k];
        p->entries[k].value = vals[k];
        p->entry_ptrs[k] = &p->entries[k];
    }
    p->def.n_attr = (size_t)n;
    p->def.attr = p->entry_ptrs;
}

/* nodes[i]'s NodeDef; the update's inputs come from `extra` (n_extra ids) */
static void fill_node(node_pb *p, node_pb *nodes, const ct_node *node, char **extra_names,
                      const int *extra, int n_extra) {
    p->def = (Ctrain__Tb__NodeDef)CTRAIN__TB__NODE_DEF__INIT;
    p->def.name = p->name;
    p->def.op = p->op;
    p->inputs = p->in_store;
    for (int k = 0; k < node->n_in; k++) {
        p->inputs[k] = nodes[node->in[k]].name;
    }
    p->def.n_input = (size_t)node->n_in;
    if (node->op == CT_OP_APPLY_OPTIMIZER && node->n_in == 0 && extra_names) {
        for (int k = 0; k < n_extra; k++) {
            extra_names[k] = nodes[extra[k]].name;
        }
        p->inputs = extra_names;
        p->def.n_input = (size_t)n_extra;
    }
    p->def.input = p->inputs;
    fill_attrs(p, node);
}

/* Every node's input is a node of g. */
static ct_status check_inputs(ct_graph *g, const char *where, ct_err *err) {
    int n = ct_graph_size(g);
    for (int i = 0; i < n; i++) {
        const ct_node *node = ct_graph_node(g, i);
        for (int k = 0; k < node->n_in; k++) {
            if (node->in[k] < 0 || node->in[k] >= n) {
                return ct_err_set(err, CT_EINVAL, "%s: graph: node %d input %d is %d (%d nodes)",
                                  where, i, k, node->in[k], n);
            }
        }
    }
    return CT_OK;
}

ct_status ct__graph_def_pack(ct_graph *g, const char *where, unsigned char **ret, size_t *ret_len,
                             ct_err *err) {
    ct_status st = check_inputs(g, where, err);
    if (st != CT_OK) {
        return st;
    }
    int n = ct_graph_size(g), n_extra = update_sources(g, NULL);
    size_t cap = 16;
    while (cap < 2 * (size_t)n) {
        cap *= 2;
    }
    node_pb *nodes = calloc(n > 0 ? (size_t)n : 1, sizeof *nodes);
    Ctrain__Tb__NodeDef **defs = calloc(n > 0 ? (size_t)n : 1, sizeof *defs);
    int *extra = malloc((size_t)(n_extra + 1) * sizeof *extra);
    char **extra_names = malloc((size_t)(n_extra + 1) * sizeof *extra_names);
    name_set set = {malloc(cap * sizeof(int)), cap - 1, nodes};
    unsigned char *packed = NULL;
    if (!nodes || !defs || !extra || !extra_names || !set.slots) {
        st = ct_err_set(err, CT_ENOMEM, "%s: graph: no memory for %d nodes", where, n);
        goto done;
    }
    update_sources(g, extra);
    memset(set.slots, 0xff, cap * sizeof(int)); /* all -1 */
    for (int i = 0; i < n; i++) {
        assign_name(&set, nodes, i, g, ct_graph_node(g, i));
    }
    for (int i = 0; i < n; i++) {
        fill_node(&nodes[i], nodes, ct_graph_node(g, i), extra_names, extra, n_extra);
        defs[i] = &nodes[i].def;
    }
    Ctrain__Tb__GraphDef gd = CTRAIN__TB__GRAPH_DEF__INIT;
    gd.n_node = (size_t)n;
    gd.node = defs;
    size_t len = ctrain__tb__graph_def__get_packed_size(&gd);
    if (!(packed = malloc(len > 0 ? len : 1))) {
        st = ct_err_set(err, CT_ENOMEM, "%s: graph: no memory for a %zu-byte GraphDef", where, len);
        goto done;
    }
    ctrain__tb__graph_def__pack(&gd, packed);
    *ret = packed;
    *ret_len = len;
    packed = NULL;
done:
    free(packed);
    free(set.slots);
    free(extra_names);
    free(extra);
    free(defs);
    free(nodes);
    return st;
}
