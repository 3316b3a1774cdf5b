/* The cluster spec (see ctrain/cluster.h) in two views: rank and size (ct_cluster_spec, for the
 * mirrored strategy) and tasks with addresses (ct_cluster, for the parameter-server strategy,
 * from --task/--chief, a cluster file and TF_CONFIG). In both, every source that is present is
 * read and checked against the others, so a launcher and an environment that disagree stop the
 * job with the names of the sources instead of hanging in the first collective or connect. */
#include "ctrain/cluster.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/yaml_tree.h"

typedef struct source {
    const char *name;     /* for messages */
    const char *rank_var; /* NULL: flags */
    const char *size_var; /* NULL: takes the size from another source */
    const char *local_var;
} source;

static const source sources[] = {
    {"Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
    {"PMIx", "PMIX_RANK", NULL, NULL},
    {"Slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"},
};

static const char *env_default(const char *name, void *user) {
    (void)user;
    return getenv(name);
}

/* Parses variable `var` (value v) as an integer >= 0; -1 when absent, -2 when malformed. */
static long parse(const char *var, const char *v, ct_err *err) {
    if (!v) {
        return -1;
    }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || errno || x < 0 || x > 1 << 24) {
        ct_err_set(err, CT_EINVAL, "cluster spec: %s=\"%s\" is not a non-negative integer", var, v);
        return -2;
    }
    return x;
}

ct_status ct_cluster_spec_read(int flag_rank, int flag_world_size, int flag_local_rank,
                               ct_getenv_fn getenv_fn, void *user, ct_cluster_spec *ret,
                               ct_err *err) {
    ct_getenv_fn get = getenv_fn ? getenv_fn : env_default;
    ct_cluster_spec s = {.rank = -1, .world_size = -1, .local_rank = -1};
    char rank_from[48] = "", size_from[48] = "";
    if (flag_rank >= 0 || flag_world_size >= 0) {
        s.rank = flag_rank;
        s.world_size = flag_world_size;
        snprintf(rank_from, sizeof rank_from, "--rank");
        snprintf(size_from, sizeof size_from, "--world-size");
    }
    s.local_rank = flag_local_rank;
    for (size_t k = 0; k < sizeof sources / sizeof sources[0]; k++) {
        const source *src = &sources[k];
        long r = parse(src->rank_var, get(src->rank_var, user), err);
        long n = src->size_var ? parse(src->size_var, get(src->size_var, user), err) : -1;
        long l = src->local_var ? parse(src->local_var, get(src->local_var, user), err) : -1;
        if (r == -2 || n == -2 || l == -2) {
            return CT_EINVAL;
        }
        if (r >= 0 && s.rank >= 0 && r != s.rank) {
            return ct_err_set(err, CT_EINVAL,
                              "cluster spec: %s says rank %d but %s=%ld: the launcher and the "
                              "environment disagree",
                              rank_from, s.rank, src->rank_var, r);
        }
        if (n >= 0 && s.world_size >= 0 && n != s.world_size) {
            return ct_err_set(err, CT_EINVAL,
                              "cluster spec: %s says %d processes but %s=%ld: the launcher and "
                              "the environment disagree",
                              size_from, s.world_size, src->size_var, n);
        }
        if (r >= 0 && s.rank < 0) {
            s.rank = (int)r;
            snprintf(rank_from, sizeof rank_from, "%s", src->rank_var);
        }
        if (n >= 0 && s.world_size < 0) {
            s.world_size = (int)n;
            snprintf(size_from, sizeof size_from, "%s", src->size_var);
        }
        if (l >= 0 && s.local_rank < 0) {
            s.local_rank = (int)l;
        }
    }
    if (s.rank < 0 && s.world_size < 0) {
        s = (ct_cluster_spec){.rank = 0, .world_size = 1, .local_rank = 0};
        snprintf(s.source, sizeof s.source, "single process (no launcher variables)");
        *ret = s;
        return CT_OK;
    }
    if (s.rank < 0 || s.world_size < 0) {
        return ct_err_set(
            err, CT_EINVAL, "cluster spec: %s gives the %s but nothing gives the %s (set %s)",
            s.rank >= 0 ? rank_from : size_from, s.rank >= 0 ? "rank" : "size",
            s.rank >= 0 ? "number of processes" : "rank", s.rank >= 0 ? "--world-size" : "--rank");
    }
    if (s.world_size < 1 || s.rank >= s.world_size) {
        return ct_err_set(err, CT_EINVAL,
                          "cluster spec: rank %d (%s) is outside the %d processes (%s)", s.rank,
                          rank_from, s.world_size, size_from);
    }
    if (s.local_rank < 0) {
        s.local_rank = s.rank;
    }
    snprintf(s.source, sizeof s.source, "%s / %s", rank_from, size_from);
    *ret = s;
    return CT_OK;
}

/* ---- the task view: --task/--chief, a cluster file and TF_CONFIG ----
 * Each source is read into a `view` of its own (errors name the source, the line and the key);
 * then the views are compared in order, and the first one that gives a task, or a list of some
 * type, is the one that is used. */

#define CLUSTER_FILE_MAX_BYTES (4 << 20) /* 4 types x 1024 tasks x a long address, and comments */
#define KEY_CAP 96                       /* "cluster.evaluator[1023]" and unknown keys */
#define WHERE_CAP 320                    /* "FILE:LINE: KEY" */

static const char *const task_type_names[CT_TASK_TYPES] = {
    "chief", "worker", "ps", "evaluator", "dispatcher", "data_worker"};
static const char *const expected_types = "chief, worker, ps, evaluator";
static const char *const master_hint = "'master' is TensorFlow 1's name for the chief: rename it "
                                       "to 'chief'";

const char *ct_task_type_name(int type) {
    return type >= 0 && type < CT_TASK_TYPES ? task_type_names[type] : NULL;
}

int ct_task_type_parse(const char *name) {
    for (int type = 0; name && type < CT_TASK_TYPES; type++) {
        if (!strcmp(name, task_type_names[type])) {
            return type;
        }
    }
    return -1;
}

/* The sources, in the order in which they are compared. */
enum { FROM_TASK_FLAG, FROM_CHIEF_FLAG, FROM_FILE, FROM_TF_CONFIG, N_VIEWS };

/* What one source says. n[type] == 0: the source lists no tasks of that type. */
typedef struct view {
    const char *name; /* "--task", "--chief", the file's path or "TF_CONFIG" */
    int is_flag;      /* messages name the flag alone, without line or key */
    int with_lines;   /* messages carry line numbers (files; TF_CONFIG when it spans lines) */
    int n[CT_TASK_TYPES];
    char (*addr[CT_TASK_TYPES])[CT_CLUSTER_ADDR_MAX]; /* owned */
    int *line[CT_TASK_TYPES];                         /* owned: the line of each address */
    int list_line[CT_TASK_TYPES];                     /* the line of the list's key */
    int task_type, task_index, task_line;             /* task_type -1: no task here */
} view;

typedef struct reader {
    ct_err *err;
    ct_status status; /* sticky: the first error wins */
} reader;

static void view_finish(view *v) {
    for (int type = 0; type < CT_TASK_TYPES; type++) {
        free(v->addr[type]);
        free(v->line[type]);
    }
}

/* Writes "NAME", "NAME:LINE" or either followed by ": KEY" into `buf` (WHERE_CAP bytes). */
static const char *where(const view *v, int line, const char *key, char *buf) {
    int used = v->with_lines && line > 0 ? snprintf(buf, WHERE_CAP, "%s:%d", v->name, line)
                                         : snprintf(buf, WHERE_CAP, "%s", v->name);
    if (!v->is_flag && key[0] && used >= 0 && used < WHERE_CAP) {
        snprintf(buf + used, (size_t)(WHERE_CAP - used), ": %s", key);
    }
    return buf;
}

static void fail(reader *r, ct_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(reader *r, ct_status code, const char *fmt, ...) {
    if (r->status != CT_OK) {
        return;
    }
    char msg[sizeof r->err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->status = ct_err_set(r->err, code, "%s", msg);
}

/* Records "SOURCE:LINE: KEY: what" as the first error. */
static void fail_at(reader *r, const view *v, int line, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void fail_at(reader *r, const view *v, int line, const char *key, const char *fmt, ...) {
    char at[WHERE_CAP], what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    fail(r, CT_EINVAL, "%s: %s", where(v, line, key, at), what);
}

/* Checks `text` as "host:port" or "[IPv6]:port", either optionally after "tcp://", and writes it
 * without the scheme into `out`. The host is "*", an IPv4 address or a name. Returns NULL, or
 * why `text` is not an address. */
static const char *check_address(const char *text, char *out) {
    if (!strncmp(text, "tcp://", 6)) {
        text += 6;
    }
    size_t len = strlen(text);
    const char *colon;
    if (len == 0) {
        return "is empty (expected host:port)";
    }
    if (len >= CT_CLUSTER_ADDR_MAX) {
        return "is too long";
    }
    if (text[0] == '[') {
        const char *close = strchr(text, ']');
        if (!close || close == text + 1 ||
            strspn(text + 1, "0123456789abcdefABCDEF:.") != (size_t)(close - text - 1)) {
            return "has a bad IPv6 host (expected [ADDRESS]:PORT)";
        }
        colon = close + 1;
        if (*colon != ':') {
            return "has no ':PORT' after the IPv6 host (expected [ADDRESS]:PORT)";
        }
    } else {
        colon = strchr(text, ':');
        if (!colon) {
            return "has no ':PORT' (expected host:port)";
        }
        if (strchr(colon + 1, ':')) {
            return "has more than one ':' (write an IPv6 host in brackets: [ADDRESS]:PORT)";
        }
        size_t host_len = (size_t)(colon - text);
        if (host_len == 0) {
            return "has no host (expected host:port; '*' for any interface)";
        }
        if (!(host_len == 1 && text[0] == '*') &&
            strspn(text, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._") !=
                host_len) {
            return "has a character that cannot be in a host name";
        }
    }
    const char *port = colon + 1;
    size_t digits = strspn(port, "0123456789");
    if (digits == 0 || port[digits] != '\0') {
        return "has a port that is not a number (expected host:port, port in [0, 65535])";
    }
    if (digits > 5 || strtol(port, NULL, 10) > 65535) {
        return "has a port outside [0, 65535]";
    }
    memcpy(out, text, len + 1);
    return NULL;
}

/* Port 0 asks for any free port, so several servers may list the same "host:0". */
static int is_any_port(const char *addr) {
    return strtol(strrchr(addr, ':') + 1, NULL, 10) == 0;
}

/* Parses a task index in [0, CT_CLUSTER_MAX_TASKS); -1 when `text` is not one. */
static int parse_index(const char *text) {
    size_t digits = strspn(text, "0123456789");
    if (digits == 0 || digits > 4 || text[digits] != '\0') {
        return -1;
    }
    long index = strtol(text, NULL, 10);
    return index < CT_CLUSTER_MAX_TASKS ? (int)index : -1;
}

/* Reads "cluster.TYPE: [addresses]" (`pair`) into v->addr[type]. */
static void read_list(reader *r, view *v, int type, const ct__yaml_pair *pair) {
    const ct__yaml_node *list = pair->value;
    const char *name = task_type_names[type];
    char key[KEY_CAP], buf[160];
    snprintf(key, sizeof key, "cluster.%s", name);
    v->list_line[type] = pair->line;
    if (list->kind == CT__YAML_NULL) {
        return;
    }
    if (list->kind != CT__YAML_SEQ) {
        fail_at(r, v, list->line, key, "must be a list of host:port addresses, got %s",
                ct__yaml_describe(list, buf, sizeof buf));
        return;
    }
    if (list->n > CT_CLUSTER_MAX_TASKS) {
        fail_at(r, v, list->line, key, "lists %zu addresses; at most %d are supported", list->n,
                CT_CLUSTER_MAX_TASKS);
        return;
    }
    if (type == CT_TASK_DISPATCHER && list->n > 1) {
        fail_at(r, v, list->line, key, "lists %zu addresses; a job has at most one dispatcher",
                list->n);
        return;
    }
    if (type == CT_TASK_CHIEF && list->n > 1) {
        fail_at(r, v, list->line, key,
                "lists %zu addresses; a cluster has at most one chief (list the others as "
                "workers)",
                list->n);
        return;
    }
    if (list->n == 0) {
        return;
    }
    v->addr[type] = calloc(list->n, sizeof *v->addr[type]);
    v->line[type] = calloc(list->n, sizeof *v->line[type]);
    if (!v->addr[type] || !v->line[type]) {
        fail(r, CT_ENOMEM, "%s: %s: out of memory", v->name, key);
        return;
    }
    v->n[type] = (int)list->n;
    for (size_t i = 0; i < list->n && r->status == CT_OK; i++) {
        const ct__yaml_node *item = list->items[i];
        const char *why;
        snprintf(key, sizeof key, "cluster.%s[%zu]", name, i);
        v->line[type][i] = item->line;
        if (item->kind != CT__YAML_SCALAR) {
            fail_at(r, v, item->line, key, "must be a host:port address, got %s",
                    ct__yaml_describe(item, buf, sizeof buf));
        } else if ((why = check_address(item->text, v->addr[type][i]))) {
            fail_at(r, v, item->line, key, "'%s' %s", item->text, why);
        }
    }
}

/* Reads "cluster: {TYPE: [addresses], ...}". */
static void read_cluster(reader *r, view *v, const ct__yaml_node *map) {
    char key[KEY_CAP], buf[160];
    if (map->kind == CT__YAML_NULL) {
        return;
    }
    if (map->kind != CT__YAML_MAP) {
        fail_at(r, v, map->line, "cluster",
                "must be a mapping of task type to addresses ({worker: [host:port, ...], ...}), "
                "got %s",
                ct__yaml_describe(map, buf, sizeof buf));
        return;
    }
    for (size_t i = 0; i < map->n && r->status == CT_OK; i++) {
        const ct__yaml_pair *pair = &map->pairs[i];
        int type = ct_task_type_parse(pair->key);
        snprintf(key, sizeof key, "cluster.%.60s", pair->key);
        if (!strcmp(pair->key, "master")) {
            fail_at(r, v, pair->line, key, "%s", master_hint);
        } else if (type < 0) {
            fail_at(r, v, pair->line, key, "unknown task type '%.60s' (expected %s)", pair->key,
                    expected_types);
        } else {
            read_list(r, v, type, pair);
        }
    }
}

/* Reads "task: {type: TYPE, index: N}" (index 0 when absent). "trial" is accepted and ignored:
 * some cloud launchers write it. */
static void read_task(reader *r, view *v, const ct__yaml_node *task) {
    static const char *const task_keys[] = {"type", "index", "trial"};
    char key[KEY_CAP], buf[160];
    if (task->kind == CT__YAML_NULL) {
        return;
    }
    if (task->kind != CT__YAML_MAP) {
        fail_at(r, v, task->line, "task", "must be a mapping {type: TYPE, index: N}, got %s",
                ct__yaml_describe(task, buf, sizeof buf));
        return;
    }
    for (size_t i = 0; i < task->n; i++) {
        const ct__yaml_pair *pair = &task->pairs[i];
        int known = 0;
        for (size_t k = 0; k < sizeof task_keys / sizeof task_keys[0]; k++) {
            known |= !strcmp(pair->key, task_keys[k]);
        }
        if (!known) {
            snprintf(key, sizeof key, "task.%.60s", pair->key);
            fail_at(r, v, pair->line, key, "unknown key (expected type, index)");
            return;
        }
    }
    const ct__yaml_node *type = ct__yaml_get(task, "type");
    const ct__yaml_node *index = ct__yaml_get(task, "index");
    int task_type = type && type->kind == CT__YAML_SCALAR ? ct_task_type_parse(type->text) : -1;
    int task_index = index ? -1 : 0;
    if (!type) {
        fail_at(r, v, task->line, "task", "has no 'type' (one of %s)", expected_types);
    } else if (type->kind == CT__YAML_SCALAR && !strcmp(type->text, "master")) {
        fail_at(r, v, type->line, "task.type", "%s", master_hint);
    } else if (task_type < 0) {
        fail_at(r, v, type->line, "task.type", "unknown task type %s (expected %s)",
                ct__yaml_describe(type, buf, sizeof buf), expected_types);
    } else if (index &&
               (index->kind != CT__YAML_SCALAR || (task_index = parse_index(index->text)) < 0)) {
        fail_at(r, v, index->line, "task.index", "must be an integer in [0, %d], got %s",
                CT_CLUSTER_MAX_TASKS - 1, ct__yaml_describe(index, buf, sizeof buf));
    } else {
        v->task_type = task_type;
        v->task_index = task_index;
        v->task_line = index ? index->line : type->line;
    }
}

/* Reads a whole cluster document (the cluster file or TF_CONFIG) into `v`. */
static void read_document(reader *r, view *v, const char *text, size_t len) {
    static const char *const ignored_keys[] = {"environment", "rpc_layer"};
    ct__yaml_node *root = NULL;
    char key[KEY_CAP], buf[160];
    ct_status st = ct__yaml_parse(text, len, v->name, &root, r->err);
    if (st != CT_OK) {
        r->status = st;
        return;
    }
    if (root->kind != CT__YAML_MAP) {
        fail_at(r, v, root->line, "",
                "must be a mapping {cluster: {worker: [host:port, ...], ...}, task: {type: "
                "TYPE, index: N}}, got %s",
                ct__yaml_describe(root, buf, sizeof buf));
    }
    for (size_t i = 0; root->kind == CT__YAML_MAP && i < root->n && r->status == CT_OK; i++) {
        const ct__yaml_pair *pair = &root->pairs[i];
        if (!strcmp(pair->key, "cluster")) {
            read_cluster(r, v, pair->value);
        } else if (!strcmp(pair->key, "task")) {
            read_task(r, v, pair->value);
        } else if (strcmp(pair->key, ignored_keys[0]) && strcmp(pair->key, ignored_keys[1])) {
            snprintf(key, sizeof key, "%.60s", pair->key);
            fail_at(r, v, pair->line, key,
                    "unknown key (expected cluster, task; environment and rpc_layer are "
                    "ignored)");
        }
    }
    ct__yaml_destroy(root);
}

/* Reads the file at `path` (at most CLUSTER_FILE_MAX_BYTES) into `v`. */
static void read_cluster_file(reader *r, view *v, const char *path) {
    char reason[128] = "unknown error";
    int failed = 0;
    size_t len = 0, cap = 4096;
    char *text = malloc(cap);
    if (!text) {
        fail(r, CT_ENOMEM, "%s: out of memory", path);
        return;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        strerror_r(errno, reason, sizeof reason);
        failed = 1;
    }
    while (f && !failed) {
        if (len == cap) {
            char *bigger = cap < CLUSTER_FILE_MAX_BYTES ? realloc(text, cap * 2) : NULL;
            if (!bigger) {
                snprintf(reason, sizeof reason, "%s",
                         cap < CLUSTER_FILE_MAX_BYTES ? "out of memory" : "larger than 4 MiB");
                failed = 1;
                break;
            }
            text = bigger;
            cap *= 2;
        }
        size_t got = fread(text + len, 1, cap - len, f);
        len += got;
        if (got == 0) {
            if (ferror(f)) {
                strerror_r(errno, reason, sizeof reason);
                failed = 1;
            }
            break;
        }
    }
    if (failed) {
        fail(r, CT_EIO, "%s: cannot read the cluster file: %s", path, reason);
    } else {
        read_document(r, v, text, len);
    }
    if (f) {
        fclose(f);
    }
    free(text);
}

/* Reads --task "TYPE" or "TYPE:INDEX". */
static void read_task_flag(reader *r, view *v, const char *text) {
    char type_name[16] = "";
    const char *colon = strchr(text, ':');
    size_t type_len = colon ? (size_t)(colon - text) : strlen(text);
    if (type_len < sizeof type_name) {
        memcpy(type_name, text, type_len);
        type_name[type_len] = '\0';
    }
    int type = ct_task_type_parse(type_name);
    int index = colon ? parse_index(colon + 1) : 0;
    if (!strcmp(type_name, "master")) {
        fail(r, CT_EINVAL, "--task '%s': %s", text, master_hint);
    } else if (type < 0) {
        fail(r, CT_EINVAL,
             "--task '%s': unknown task type (expected TYPE or TYPE:INDEX, TYPE one of %s)", text,
             expected_types);
    } else if (index < 0) {
        fail(r, CT_EINVAL, "--task '%s': the index must be an integer in [0, %d]", text,
             CT_CLUSTER_MAX_TASKS - 1);
    } else {
        v->task_type = type;
        v->task_index = index;
    }
}

/* Reads --chief ADDRESS: a chief list of one. */
static void read_chief_flag(reader *r, view *v, const char *text) {
    const char *why;
    v->addr[CT_TASK_CHIEF] = calloc(1, sizeof *v->addr[CT_TASK_CHIEF]);
    v->line[CT_TASK_CHIEF] = calloc(1, sizeof *v->line[CT_TASK_CHIEF]);
    if (!v->addr[CT_TASK_CHIEF] || !v->line[CT_TASK_CHIEF]) {
        fail(r, CT_ENOMEM, "--chief: out of memory");
    } else if ((why = check_address(text, v->addr[CT_TASK_CHIEF][0]))) {
        fail(r, CT_EINVAL, "--chief '%s': %s", text, why);
    } else {
        v->n[CT_TASK_CHIEF] = 1;
    }
}

/* Compares the views in order; the first view that gives the task, or a list of some type, is
 * the one used (in *ret_task_from and list_from[type]). Later views must agree with it. */
static void agree(reader *r, const view *views, const view **ret_task_from,
                  const view **list_from) {
    char a[WHERE_CAP], b[WHERE_CAP];
    const view *task_from = NULL;
    for (int k = 0; k < N_VIEWS && r->status == CT_OK; k++) {
        const view *v = &views[k];
        if (v->task_type >= 0 && !task_from) {
            task_from = v;
        } else if (v->task_type >= 0 && (v->task_type != task_from->task_type ||
                                         v->task_index != task_from->task_index)) {
            fail(r, CT_EINVAL, "cluster: %s says this process is %s:%d but %s says %s:%d",
                 where(task_from, task_from->task_line, "", a),
                 task_type_names[task_from->task_type], task_from->task_index,
                 where(v, v->task_line, "", b), task_type_names[v->task_type], v->task_index);
        }
        for (int type = 0; type < CT_TASK_TYPES && r->status == CT_OK; type++) {
            const view *u = list_from[type];
            if (v->n[type] == 0) {
                continue;
            }
            if (!u) {
                list_from[type] = v;
            } else if (type == CT_TASK_CHIEF && strcmp(u->addr[type][0], v->addr[type][0])) {
                fail(r, CT_EINVAL, "cluster: %s says the chief is '%s' but %s says '%s'",
                     where(u, u->line[type][0], "", a), u->addr[type][0],
                     where(v, v->line[type][0], "", b), v->addr[type][0]);
            } else if (u->n[type] != v->n[type]) {
                fail(r, CT_EINVAL, "cluster: %s lists %d %s tasks but %s lists %d",
                     where(u, u->list_line[type], "", a), u->n[type], task_type_names[type],
                     where(v, v->list_line[type], "", b), v->n[type]);
            }
        }
    }
    *ret_task_from = task_from;
}

/* The task's index must be inside its list when some source lists that type. */
static void check_task(reader *r, const view *task_from, const view *const *list_from) {
    char a[WHERE_CAP], b[WHERE_CAP];
    if (!task_from) {
        return;
    }
    int type = task_from->task_type, index = task_from->task_index;
    const view *list = list_from[type];
    if (type == CT_TASK_CHIEF && index > 0) {
        fail(r, CT_EINVAL, "%s: chief:%d: a cluster has one chief, with index 0",
             where(task_from, task_from->task_line, "task.index", a), index);
    } else if (list && index >= list->n[type]) {
        fail(r, CT_EINVAL, "%s: %s:%d is outside the %d %s tasks listed in %s",
             where(task_from, task_from->task_line, "task.index", a), task_type_names[type], index,
             list->n[type], task_type_names[type], where(list, list->list_line[type], "", b));
    }
}

/* No address may appear twice, whichever lists hold it (port 0 excepted). */
static void check_duplicates(reader *r, const view *const *list_from) {
    char a[WHERE_CAP], b[WHERE_CAP], key[KEY_CAP];
    for (int type = 0; type < CT_TASK_TYPES; type++) {
        const view *v = list_from[type];
        for (int i = 0; v && i < v->n[type]; i++) {
            const char *addr = v->addr[type][i];
            if (is_any_port(addr)) {
                continue;
            }
            for (int other = 0; other <= type; other++) {
                const view *u = list_from[other];
                int end = other == type ? i : u ? u->n[other] : 0;
                for (int j = 0; j < end; j++) {
                    if (strcmp(u->addr[other][j], addr)) {
                        continue;
                    }
                    snprintf(key, sizeof key, "cluster.%s[%d]", task_type_names[type], i);
                    fail(r, CT_EINVAL,
                         "%s: address '%s' is already %s[%d]'s (%s): two tasks cannot share an "
                         "address",
                         where(v, v->line[type][i], key, a), addr, task_type_names[other], j,
                         where(u, u->line[other][j], "", b));
                    return;
                }
            }
        }
    }
}

/* Appends printf-style text to `out` (`size` bytes, `*used` of them in use); cuts it short. */
static void append(char *out, size_t size, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void append(char *out, size_t size, size_t *used, const char *fmt, ...) {
    if (*used + 1 >= size) {
        return;
    }
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + *used, size - *used, fmt, ap);
    va_end(ap);
    *used = n < 0 ? size : *used + (size_t)n;
    *used = *used < size ? *used : size - 1;
}

/* Copies the chosen task and lists into `c`, and says where they came from in c->source. */
static void build(reader *r, const view *views, const view *task_from, const view *const *list_from,
                  ct_cluster *c) {
    size_t used = 0;
    int n_named = 0;
    if (task_from) {
        c->task_type = task_from->task_type;
        c->task_index = task_from->task_index;
    }
    for (int type = 0; type < CT_TASK_TYPES; type++) {
        const view *v = list_from[type];
        if (!v) {
            continue;
        }
        c->addr[type] = malloc((size_t)v->n[type] * sizeof *c->addr[type]);
        if (!c->addr[type]) {
            fail(r, CT_ENOMEM, "cluster: out of memory for %d addresses", v->n[type]);
            return;
        }
        memcpy(c->addr[type], v->addr[type], (size_t)v->n[type] * sizeof *c->addr[type]);
        c->n[type] = v->n[type];
    }
    append(c->source, sizeof c->source, &used, "task from %.60s; addresses from",
           task_from ? task_from->name : "no source");
    for (int k = 0; k < N_VIEWS; k++) {
        int gives = 0;
        for (int type = 0; type < CT_TASK_TYPES; type++) {
            gives |= list_from[type] == &views[k];
        }
        if (gives) {
            append(c->source, sizeof c->source, &used, "%s %.60s", n_named++ ? "," : "",
                   views[k].name);
        }
    }
    if (!task_from && !n_named) {
        used = 0;
        append(c->source, sizeof c->source, &used,
               "no source (no --task, --chief, --cluster or TF_CONFIG)");
    } else if (!n_named) {
        append(c->source, sizeof c->source, &used, " no source");
    }
}

ct_status ct_cluster_init(const ct_cluster_flags *flags, ct_getenv_fn getenv_fn, void *user,
                          ct_cluster *ret, ct_err *err) {
    static const ct_cluster_flags no_flags = {NULL, NULL, NULL};
    ct_getenv_fn get = getenv_fn ? getenv_fn : env_default;
    const char *tf_config = get("TF_CONFIG", user);
    reader r = {.err = err, .status = CT_OK};
    view views[N_VIEWS];
    const view *task_from = NULL, *list_from[CT_TASK_TYPES] = {NULL};
    ct_cluster c = {.task_type = -1, .task_index = -1};
    flags = flags ? flags : &no_flags;
    memset(views, 0, sizeof views);
    for (int k = 0; k < N_VIEWS; k++) {
        views[k].task_type = -1;
        views[k].task_index = -1;
    }
    views[FROM_TASK_FLAG].name = "--task";
    views[FROM_TASK_FLAG].is_flag = 1;
    views[FROM_CHIEF_FLAG].name = "--chief";
    views[FROM_CHIEF_FLAG].is_flag = 1;
    views[FROM_FILE].name = flags->cluster_file;
    views[FROM_FILE].with_lines = 1;
    views[FROM_TF_CONFIG].name = "TF_CONFIG";
    views[FROM_TF_CONFIG].with_lines = tf_config && strchr(tf_config, '\n');

    if (flags->task) {
        read_task_flag(&r, &views[FROM_TASK_FLAG], flags->task);
    }
    if (flags->chief && r.status == CT_OK) {
        read_chief_flag(&r, &views[FROM_CHIEF_FLAG], flags->chief);
    }
    if (flags->cluster_file && !flags->cluster_file[0]) {
        fail(&r, CT_EINVAL, "--cluster: no file name given");
    } else if (flags->cluster_file && r.status == CT_OK) {
        read_cluster_file(&r, &views[FROM_FILE], flags->cluster_file);
    }
    /* An empty TF_CONFIG is how some launchers say "none". */
    if (tf_config && tf_config[strspn(tf_config, " \t\r\n")] && r.status == CT_OK) {
        read_document(&r, &views[FROM_TF_CONFIG], tf_config, strlen(tf_config));
    }
    if (r.status == CT_OK) {
        agree(&r, views, &task_from, list_from);
    }
    if (r.status == CT_OK) {
        check_task(&r, task_from, list_from);
    }
    if (r.status == CT_OK) {
        check_duplicates(&r, list_from);
    }
    if (r.status == CT_OK) {
        build(&r, views, task_from, list_from, &c);
    }
    for (int k = 0; k < N_VIEWS; k++) {
        view_finish(&views[k]);
    }
    if (r.status != CT_OK) {
        ct_cluster_finish(&c);
        return r.status;
    }
    *ret = c;
    return CT_OK;
}

void ct_cluster_finish(ct_cluster *c) {
    if (!c) {
        return;
    }
    for (int type = 0; type < CT_TASK_TYPES; type++) {
        free(c->addr[type]);
        c->addr[type] = NULL;
        c->n[type] = 0;
    }
}

/* ---- tasks from a launcher's ranks ---- */

/* The first host of a Slurm node list: "node[01-04,07],login2" -> "node01". */
static void first_host(const char *list, char *out, size_t cap) {
    size_t n = strcspn(list, ",[");
    size_t len = n < cap - 1 ? n : cap - 1;
    memcpy(out, list, len);
    out[len] = '\0';
    if (list[n] == '[') {
        const char *digits = list + n + 1;
        size_t d = strcspn(digits, "-,]");
        if (len + d < cap) {
            memcpy(out + len, digits, d);
            out[len + d] = '\0';
        }
    }
}

ct_status ct_cluster_from_launcher(ct_cluster *c, int n_ps, ct_getenv_fn getenv_fn, void *user,
                                   ct_err *err) {
    ct_getenv_fn get = getenv_fn ? getenv_fn : env_default;
    if (c->task_type >= 0) {
        return CT_OK; /* a source named the task: it wins */
    }
    ct_cluster_spec spec;
    ct_status st = ct_cluster_spec_read(-1, -1, -1, get, user, &spec, err);
    if (st != CT_OK || spec.world_size < 2) {
        return st; /* no launcher, or one process */
    }
    n_ps = n_ps > 0 ? n_ps : 1;
    int n_workers = spec.world_size - 1 - n_ps;
    if (n_workers < 1) {
        return ct_err_set(err, CT_EINVAL,
                          "cluster spec: %d tasks (%s) leave no worker after the chief and %d "
                          "parameter server%s (--num-ps)",
                          spec.world_size, spec.source, n_ps, n_ps == 1 ? "" : "s");
    }
    char host[CT_CLUSTER_ADDR_MAX - 8] = "";
    const char *given = get("CTRAIN_CHIEF_HOST", user), *nodes = get("SLURM_JOB_NODELIST", user);
    const char *port_text = get("CTRAIN_CHIEF_PORT", user);
    if (given && given[0]) {
        snprintf(host, sizeof host, "%s", given);
    } else if (nodes && nodes[0]) {
        first_host(nodes, host, sizeof host);
    }
    long port = port_text ? strtol(port_text, NULL, 10) : 7450;
    if (port < 1 || port > 65535) {
        return ct_err_set(err, CT_EINVAL, "cluster spec: CTRAIN_CHIEF_PORT=\"%s\" is not a port",
                          port_text);
    }
    int counts[CT_TASK_TYPES] = {
        [CT_TASK_CHIEF] = 1, [CT_TASK_PS] = n_ps, [CT_TASK_WORKER] = n_workers};
    ct_cluster_finish(c);
    for (int type = 0; type < CT_TASK_TYPES; type++) {
        if (!counts[type]) {
            continue;
        }
        c->addr[type] = calloc((size_t)counts[type], sizeof *c->addr[type]);
        if (!c->addr[type]) {
            ct_cluster_finish(c);
            return ct_err_set(err, CT_ENOMEM, "cluster spec: out of memory");
        }
        c->n[type] = counts[type];
        for (int i = 0; i < counts[type]; i++) { /* servers listen on any port and report it */
            snprintf(c->addr[type][i], CT_CLUSTER_ADDR_MAX,
                     type == CT_TASK_CHIEF ? "%s:%ld" : "*:0", host[0] ? host : "localhost", port);
        }
    }
    int r = spec.rank;
    c->task_type = r == 0 ? CT_TASK_CHIEF : r <= n_ps ? CT_TASK_PS : CT_TASK_WORKER;
    c->task_index = r == 0 ? 0 : r <= n_ps ? r - 1 : r - 1 - n_ps;
    snprintf(c->source, sizeof c->source, "rank %d of %d (%.60s)", r, spec.world_size, spec.source);
    return CT_OK;
}
