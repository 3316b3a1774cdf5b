/* The YAML/JSON tree behind job files: libyaml's event parser folded into mappings, sequences,
 * scalars and nulls that keep their line numbers, plus `--set dotted.key=value` overrides applied
 * to the tree before validation. Aliases are refused: configs do not need them and they would make
 * a node reachable from two places. */
#include "core/yaml_tree.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* Deeper than any sane config; keeps the recursive descent off the end of the stack. */
#define MAX_DEPTH 64
#define MAX_SET_SEGMENTS 32

typedef struct tree_parser {
    yaml_parser_t yaml;
    const char *name; /* file name, or "--set KEY=VALUE" */
    int with_lines;   /* messages carry ":LINE" after the name */
    const char *text; /* for line numbers of reader (encoding) errors */
    size_t len;
    ct_err *err;
    char path[256];  /* dotted path of the node being built, for duplicate-key messages */
    size_t max_keys; /* keys in one mapping (0: any); the duplicate check is quadratic in them */
} tree_parser;

static ct__yaml_node *node_new(ct__yaml_kind kind, int line) {
    ct__yaml_node *node = calloc(1, sizeof *node);
    if (node) {
        node->kind = kind;
        node->line = line;
    }
    return node;
}

void ct__yaml_destroy(ct__yaml_node *node) {
    if (!node) {
        return;
    }
    for (size_t i = 0; i < node->n; i++) {
        if (node->kind == CT__YAML_MAP) {
            free(node->pairs[i].key);
            ct__yaml_destroy(node->pairs[i].value);
        } else if (node->kind == CT__YAML_SEQ) {
            ct__yaml_destroy(node->items[i]);
        }
    }
    free(node->pairs);
    free(node->items);
    free(node->text);
    free(node);
}

/* Makes room for one more pair or item; 0 on success, -1 when out of memory. */
static int reserve_one(ct__yaml_node *node) {
    if (node->n < node->cap) {
        return 0;
    }
    size_t cap = node->cap ? node->cap * 2 : 4;
    if (node->kind == CT__YAML_MAP) {
        ct__yaml_pair *pairs = realloc(node->pairs, cap * sizeof *pairs);
        if (!pairs) {
            return -1;
        }
        node->pairs = pairs;
    } else {
        ct__yaml_node **items = realloc(node->items, cap * sizeof *items);
        if (!items) {
            return -1;
        }
        node->items = items;
    }
    node->cap = cap;
    return 0;
}

/* Appends key -> value to a mapping, taking ownership of `value` (freed on failure). */
static ct_status map_push(ct__yaml_node *map, const char *key, int line, ct__yaml_node *value) {
    char *copy = strdup(key);
    if (!copy || reserve_one(map) != 0) {
        free(copy);
        ct__yaml_destroy(value);
        return CT_ENOMEM;
    }
    map->pairs[map->n++] = (ct__yaml_pair){.key = copy, .line = line, .value = value};
    return CT_OK;
}

const ct__yaml_pair *ct__yaml_find(const ct__yaml_node *map, const char *key) {
    if (!map || map->kind != CT__YAML_MAP) {
        return NULL;
    }
    for (size_t i = 0; i < map->n; i++) {
        if (strcmp(map->pairs[i].key, key) == 0) {
            return &map->pairs[i];
        }
    }
    return NULL;
}

const ct__yaml_node *ct__yaml_get(const ct__yaml_node *map, const char *key) {
    const ct__yaml_pair *pair = ct__yaml_find(map, key);
    return pair ? pair->value : NULL;
}

const char *ct__yaml_describe(const ct__yaml_node *node, char *buf, size_t size) {
    if (!node || node->kind == CT__YAML_NULL) {
        return "nothing";
    }
    if (node->kind == CT__YAML_MAP) {
        return "a mapping";
    }
    if (node->kind == CT__YAML_SEQ) {
        return "a list";
    }
    snprintf(buf, size, node->quoted ? "\"%s\"" : "'%s'", node->text);
    return buf;
}

/* ---- building the tree from libyaml events ---- */

/* Records "NAME:LINE: what" (or "NAME: what" for override values) and returns CT_EINVAL. */
static ct_status fail_at(tree_parser *p, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static ct_status fail_at(tree_parser *p, int line, const char *fmt, ...) {
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (p->with_lines) {
        return ct_err_set(p->err, CT_EINVAL, "%s:%d: %s", p->name, line, what);
    }
    return ct_err_set(p->err, CT_EINVAL, "%s: %s", p->name, what);
}

/* Reports libyaml's own error: the problem, where, and what it was parsing. */
static ct_status syntax_error(tree_parser *p) {
    const yaml_parser_t *y = &p->yaml;
    if (y->error == YAML_MEMORY_ERROR) {
        return ct_err_set(p->err, CT_ENOMEM, "%s: out of memory while parsing YAML", p->name);
    }
    int line = (int)y->problem_mark.line + 1;
    if (y->error == YAML_READER_ERROR) { /* bad encoding: only a byte offset is known */
        line = 1;
        for (size_t i = 0; i < y->problem_offset && i < p->len; i++) {
            line += p->text[i] == '\n';
        }
    }
    int last_line = 1; /* libyaml puts an error at the end of text one line past it */
    for (size_t i = 0; i + 1 < p->len; i++) {
        last_line += p->text[i] == '\n';
    }
    line = line > last_line ? last_line : line;
    char context[160] = "";
    if (y->context && p->with_lines) {
        snprintf(context, sizeof context, " (%s at line %d)", y->context,
                 (int)y->context_mark.line + 1);
    } else if (y->context) {
        snprintf(context, sizeof context, " (%s)", y->context);
    }
    return fail_at(p, line, "bad YAML: %s%s", y->problem ? y->problem : "syntax error", context);
}

static ct_status next_event(tree_parser *p, yaml_event_t *ev) {
    if (!yaml_parser_parse(&p->yaml, ev)) {
        return syntax_error(p);
    }
    return CT_OK;
}

static int is_null_text(const char *s) {
    return !*s || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") || !strcmp(s, "NULL");
}

static ct_status make_scalar(tree_parser *p, const yaml_event_t *ev, ct__yaml_node **ret) {
    int line = (int)ev->start_mark.line + 1;
    const char *value = (const char *)ev->data.scalar.value;
    const char *tag = (const char *)ev->data.scalar.tag;
    if (strlen(value) != ev->data.scalar.length) {
        return fail_at(p, line, "%s%sa value contains a NUL character", p->path,
                       p->path[0] ? ": " : "");
    }
    int quoted =
        ev->data.scalar.style != YAML_PLAIN_SCALAR_STYLE || (tag && !strcmp(tag, YAML_STR_TAG));
    ct__yaml_node *node = node_new(CT__YAML_SCALAR, line);
    if (!node) {
        return CT_ENOMEM;
    }
    if (!quoted && is_null_text(value)) {
        node->kind = CT__YAML_NULL;
    } else {
        node->quoted = quoted;
        if (!(node->text = strdup(value))) {
            free(node);
            return CT_ENOMEM;
        }
    }
    *ret = node;
    return CT_OK;
}

static ct_status parse_node(tree_parser *p, const yaml_event_t *ev, int depth, ct__yaml_node **ret);

/* Appends ".key" (or "[index]" when key is NULL) to the path; returns the old length so that the
 * caller can cut it back. */
static size_t path_push(tree_parser *p, const char *key, size_t index) {
    size_t old = strlen(p->path);
    if (key) {
        snprintf(p->path + old, sizeof p->path - old, "%s%s", old ? "." : "", key);
    } else {
        snprintf(p->path + old, sizeof p->path - old, "[%zu]", index);
    }
    return old;
}

static ct_status parse_seq(tree_parser *p, int line, int depth, ct__yaml_node **ret) {
    ct_status st;
    ct__yaml_node *seq = node_new(CT__YAML_SEQ, line);
    if (!seq) {
        return CT_ENOMEM;
    }
    for (;;) {
        yaml_event_t ev;
        if ((st = next_event(p, &ev)) != CT_OK) {
            goto fail;
        }
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        ct__yaml_node *item = NULL;
        size_t old = path_push(p, NULL, seq->n);
        st = parse_node(p, &ev, depth + 1, &item);
        p->path[old] = '\0';
        yaml_event_delete(&ev);
        if (st != CT_OK) {
            goto fail;
        }
        if (reserve_one(seq) != 0) {
            ct__yaml_destroy(item);
            st = CT_ENOMEM;
            goto fail;
        }
        seq->items[seq->n++] = item;
    }
    *ret = seq;
    return CT_OK;
fail:
    ct__yaml_destroy(seq);
    return st;
}

/* Reads one key (a scalar event) of a mapping into `key` (owned, returned) and its line. */
static ct_status read_key(tree_parser *p, yaml_event_t *ev, char **key, int *key_line) {
    *key_line = (int)ev->start_mark.line + 1;
    if (ev->type != YAML_SCALAR_EVENT) {
        return fail_at(p, *key_line, "%s%skeys must be plain names, not lists or mappings", p->path,
                       p->path[0] ? ": " : "");
    }
    if (!(*key = strdup((const char *)ev->data.scalar.value))) {
        return CT_ENOMEM;
    }
    return CT_OK;
}

static ct_status parse_map(tree_parser *p, int line, int depth, ct__yaml_node **ret) {
    ct_status st;
    char *key = NULL;
    ct__yaml_node *map = node_new(CT__YAML_MAP, line);
    if (!map) {
        return CT_ENOMEM;
    }
    for (;;) {
        yaml_event_t ev;
        int key_line = 0;
        if ((st = next_event(p, &ev)) != CT_OK) {
            goto fail;
        }
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        st = read_key(p, &ev, &key, &key_line);
        yaml_event_delete(&ev);
        if (st != CT_OK) {
            goto fail;
        }
        size_t old = path_push(p, key, 0);
        if (p->max_keys && map->n >= p->max_keys) {
            st =
                fail_at(p, key_line, "%s: more than %zu keys in one mapping", p->path, p->max_keys);
            goto fail;
        }
        const ct__yaml_pair *dup = ct__yaml_find(map, key);
        if (dup) {
            st = fail_at(p, key_line, "%s: duplicate key (first at line %d)", p->path, dup->line);
            goto fail;
        }
        ct__yaml_node *value = NULL;
        if ((st = next_event(p, &ev)) != CT_OK) {
            goto fail;
        }
        st = parse_node(p, &ev, depth + 1, &value);
        yaml_event_delete(&ev);
        p->path[old] = '\0';
        if (st == CT_OK && value->kind == CT__YAML_NULL) {
            value->line = key_line; /* libyaml marks an empty value where the next token starts */
        }
        if (st != CT_OK || (st = map_push(map, key, key_line, value)) != CT_OK) {
            goto fail;
        }
        free(key);
        key = NULL;
    }
    *ret = map;
    return CT_OK;
fail:
    free(key);
    ct__yaml_destroy(map);
    return st;
}

static ct_status parse_node(tree_parser *p, const yaml_event_t *ev, int depth,
                            ct__yaml_node **ret) {
    int line = (int)ev->start_mark.line + 1;
    const char *where = p->path[0] ? p->path : "document";
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        return make_scalar(p, ev, ret);
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT:
        if (depth >= MAX_DEPTH) {
            return fail_at(p, line, "%s: nested more than %d levels deep", where, MAX_DEPTH);
        }
        return ev->type == YAML_SEQUENCE_START_EVENT ? parse_seq(p, line, depth, ret)
                                                     : parse_map(p, line, depth, ret);
    case YAML_ALIAS_EVENT:
        return fail_at(p, line, "%s: YAML aliases (*%s) are not supported", where,
                       (const char *)ev->data.alias.anchor);
    default:
        return fail_at(p, line, "%s: unexpected YAML structure", where);
    }
}

/* Reads the stream: nothing (a null root) or exactly one document. */
static ct_status parse_stream(tree_parser *p, ct__yaml_node **ret_root) {
    ct_status st;
    ct__yaml_node *root = NULL;
    yaml_event_t ev;
    if ((st = next_event(p, &ev)) != CT_OK) { /* STREAM-START */
        return st;
    }
    yaml_event_delete(&ev);
    if ((st = next_event(p, &ev)) != CT_OK) {
        return st;
    }
    if (ev.type == YAML_STREAM_END_EVENT) {
        yaml_event_delete(&ev);
        *ret_root = node_new(CT__YAML_NULL, 1);
        return *ret_root ? CT_OK : CT_ENOMEM;
    }
    yaml_event_delete(&ev); /* DOCUMENT-START */
    if ((st = next_event(p, &ev)) != CT_OK) {
        return st;
    }
    st = parse_node(p, &ev, 0, &root);
    yaml_event_delete(&ev);
    if (st != CT_OK || (st = next_event(p, &ev)) != CT_OK) { /* DOCUMENT-END */
        goto fail;
    }
    yaml_event_delete(&ev);
    if ((st = next_event(p, &ev)) != CT_OK) {
        goto fail;
    }
    int line = (int)ev.start_mark.line + 1;
    int more = ev.type != YAML_STREAM_END_EVENT;
    yaml_event_delete(&ev);
    if (more) {
        st = fail_at(p, line, "bad YAML: more than one document (a second '---'?)");
        goto fail;
    }
    *ret_root = root;
    return CT_OK;
fail:
    ct__yaml_destroy(root);
    return st;
}

static ct_status parse_named(const char *text, size_t len, const char *name, int with_lines,
                             size_t max_keys, ct__yaml_node **ret_root, ct_err *err) {
    tree_parser p = {.name = name,
                     .with_lines = with_lines,
                     .text = text,
                     .len = len,
                     .err = err,
                     .max_keys = max_keys};
    if (!yaml_parser_initialize(&p.yaml)) {
        return ct_err_set(err, CT_ENOMEM, "%s: out of memory", name);
    }
    yaml_parser_set_input_string(&p.yaml, (const unsigned char *)text, len);
    ct__yaml_node *root = NULL;
    ct_status st = parse_stream(&p, &root);
    yaml_parser_delete(&p.yaml);
    if (st == CT_ENOMEM && (!err || err->code != CT_ENOMEM)) {
        ct_err_set(err, CT_ENOMEM, "%s: out of memory while parsing YAML", name);
    }
    if (st == CT_OK) {
        *ret_root = root;
    }
    return st;
}

ct_status ct__yaml_parse(const char *text, size_t len, const char *name, ct__yaml_node **ret_root,
                         ct_err *err) {
    return parse_named(text, len, name, 1, 0, ret_root, err);
}

ct_status ct__yaml_parse_limited(const char *text, size_t len, const char *name, size_t max_keys,
                                 ct__yaml_node **ret_root, ct_err *err) {
    return parse_named(text, len, name, 1, max_keys, ret_root, err);
}

/* ---- overrides ---- */

typedef struct set_segment {
    char name[128];
    int bracket; /* written as [N]: must index a list */
    int numeric; /* all digits: an index when it meets a list, else a key */
    size_t index;
} set_segment;

/* Splits "a.b[1].2" into segments; returns the count, or -1 with a reason in *why. */
static int split_key(const char *key, size_t len, set_segment *segs, const char **why) {
    size_t pos = 0;
    int n = 0;
    while (pos < len) {
        if (n == MAX_SET_SEGMENTS) {
            *why = "key has too many parts";
            return -1;
        }
        set_segment *s = &segs[n];
        memset(s, 0, sizeof *s);
        if (key[pos] == '[') {
            size_t start = ++pos;
            while (pos < len && isdigit((unsigned char)key[pos])) {
                s->index = s->index * 10 + (size_t)(key[pos++] - '0');
            }
            if (n == 0 || pos == start || pos >= len || key[pos] != ']' || pos - start > 9) {
                *why = n == 0            ? "key must start with a name"
                       : pos - start > 9 ? "index too large"
                                         : "expected [INDEX] with digits";
                return -1;
            }
            pos++;
            s->bracket = 1;
        } else {
            if (n > 0 && key[pos++] != '.') {
                *why = "expected '.' or '[' after ']'";
                return -1;
            }
            size_t start = pos;
            while (pos < len && key[pos] != '.' && key[pos] != '[') {
                pos++;
            }
            if (pos == start || pos - start >= sizeof s->name) {
                *why = pos == start ? "empty key segment" : "key segment too long";
                return -1;
            }
            memcpy(s->name, key + start, pos - start);
            s->numeric = pos - start <= 9;
            for (size_t i = start; i < pos; i++) {
                s->numeric &= isdigit((unsigned char)key[i]) != 0;
            }
            s->index = s->numeric ? (size_t)strtoul(s->name, NULL, 10) : 0;
        }
        n++;
    }
    return n;
}

static void mark_from_set(ct__yaml_node *node) {
    node->line = 0;
    for (size_t i = 0; i < node->n; i++) {
        if (node->kind == CT__YAML_MAP) {
            node->pairs[i].line = 0;
            mark_from_set(node->pairs[i].value);
        } else {
            mark_from_set(node->items[i]);
        }
    }
}

/* Walks `segs` from `cur`, creating missing mapping keys, and stores `value` (owned) at the end.
 * `shown` collects the path as printed (list indices in brackets). */
static ct_status place_value(ct__yaml_node *cur, const set_segment *segs, int n,
                             ct__yaml_node *value, const char *set, ct_err *err) {
    char shown[320] = "", buf[160];
    for (int i = 0; i < n; i++) {
        const set_segment *s = &segs[i];
        int last = i == n - 1;
        size_t at = strlen(shown);
        if (cur->kind == CT__YAML_NULL && !s->bracket) {
            cur->kind = CT__YAML_MAP; /* `- flatten:` gains options */
        }
        if (s->bracket || (s->numeric && cur->kind == CT__YAML_SEQ)) {
            if (cur->kind != CT__YAML_SEQ) {
                ct_err_set(err, CT_EINVAL, "--set %s: %s: is %s, not a list", set,
                           at ? shown : "(top level)", ct__yaml_describe(cur, buf, sizeof buf));
                goto fail;
            }
            snprintf(shown + at, sizeof shown - at, "[%zu]", s->index);
            if (s->index >= cur->n) {
                shown[at] = '\0';
                ct_err_set(err, CT_EINVAL,
                           "--set %s: %s[%zu]: index out of range (%s has %zu items)", set, shown,
                           s->index, shown, cur->n);
                goto fail;
            }
            if (last) {
                ct__yaml_destroy(cur->items[s->index]);
                cur->items[s->index] = value;
                return CT_OK;
            }
            cur = cur->items[s->index];
            continue;
        }
        if (cur->kind != CT__YAML_MAP) {
            ct_err_set(err, CT_EINVAL, "--set %s: %s: is %s, cannot hold key '%s'", set, shown,
                       ct__yaml_describe(cur, buf, sizeof buf), s->name);
            goto fail;
        }
        snprintf(shown + at, sizeof shown - at, at ? ".%s" : "%s", s->name);
        ct__yaml_pair *pair = (ct__yaml_pair *)ct__yaml_find(cur, s->name);
        if (last) {
            if (pair) {
                ct__yaml_destroy(pair->value);
                pair->value = value;
                return CT_OK;
            }
            return map_push(cur, s->name, 0, value);
        }
        if (!pair) {
            ct__yaml_node *child = node_new(CT__YAML_MAP, 0);
            if (!child || map_push(cur, s->name, 0, child) != CT_OK) {
                ct__yaml_destroy(value);
                return CT_ENOMEM;
            }
            pair = &cur->pairs[cur->n - 1];
        }
        cur = pair->value;
    }
    return CT_OK;
fail:
    ct__yaml_destroy(value);
    return CT_EINVAL;
}

ct_status ct__yaml_apply_set(ct__yaml_node *root, const char *set, ct_err *err) {
    const char *eq = strchr(set, '=');
    if (!eq) {
        return ct_err_set(err, CT_EINVAL, "--set %s: expected KEY=VALUE (e.g. train.epochs=3)",
                          set);
    }
    size_t start = 0, end = (size_t)(eq - set);
    while (start < end && isspace((unsigned char)set[start])) {
        start++;
    }
    while (end > start && isspace((unsigned char)set[end - 1])) {
        end--;
    }
    set_segment segs[MAX_SET_SEGMENTS];
    const char *why = "missing key before '='";
    int n = end > start ? split_key(set + start, end - start, segs, &why) : -1;
    if (n <= 0) {
        return ct_err_set(err, CT_EINVAL, "--set %s: %s", set, why);
    }
    char name[300];
    snprintf(name, sizeof name, "--set %s", set);
    ct__yaml_node *value = NULL;
    ct_status st = parse_named(eq + 1, strlen(eq + 1), name, 0, 0, &value, err);
    if (st != CT_OK) {
        return st;
    }
    mark_from_set(value);
    ct_status placed = place_value(root, segs, n, value, set, err);
    if (placed == CT_ENOMEM) {
        ct_err_set(err, CT_ENOMEM, "--set %s: out of memory", set);
    }
    return placed;
}
