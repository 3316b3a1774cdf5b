/* A small generic YAML/JSON tree for config files: mappings (ordered key/value pairs), sequences,
 * scalars (text plus whether it was quoted) and nulls, each node with its 1-based line number.
 * Built with libyaml; type interpretation (ints, bools, names) is left to the reader, so that its
 * messages can name the dotted key. Internal to libctrain. */
#ifndef CTRAIN_IO_YAML_TREE_H
#define CTRAIN_IO_YAML_TREE_H

#include <stddef.h>

#include "ctrain/status.h"

typedef enum ct__yaml_kind {
    CT__YAML_NULL,   /* empty value, ~, null (unquoted) */
    CT__YAML_SCALAR, /* any other scalar: text as written */
    CT__YAML_SEQ,    /* [a, b] or "- a" lines */
    CT__YAML_MAP,    /* {k: v} or "k: v" lines, in file order, keys unique */
} ct__yaml_kind;

typedef struct ct__yaml_node ct__yaml_node;

typedef struct ct__yaml_pair {
    char *key;            /* owned, NUL-terminated */
    int line;             /* line of the key; 0 when created by an override */
    ct__yaml_node *value; /* owned, never NULL */
} ct__yaml_pair;

struct ct__yaml_node {
    ct__yaml_kind kind;
    int line;   /* 1-based; 0 when the node came from an override */
    char *text; /* scalar: owned text; NULL for other kinds */
    int quoted; /* scalar: written in quotes (so "3" is a string, not a number) */
    size_t n;   /* number of pairs (map) or items (seq) */
    size_t cap;
    ct__yaml_pair *pairs;  /* map: n pairs */
    ct__yaml_node **items; /* seq: n items */
};

/* Parses one YAML (or JSON) document from `text` (`len` bytes, need not be NUL-terminated) into a
 * tree. `name` stands for the source in messages ("job.yaml:3: bad YAML: ..."). An empty text
 * gives a NULL-kind root. Duplicate keys, non-scalar keys, aliases and more than one document are
 * errors. Returns CT_OK and an owned tree in *ret_root, CT_EINVAL (syntax) or CT_ENOMEM.
 * Thread-safe. */
ct_status ct__yaml_parse(const char *text, size_t len, const char *name, ct__yaml_node **ret_root,
                         ct_err *err);

/* As ct__yaml_parse, refusing a mapping of more than max_keys keys (untrusted text, such as a
 * request body: the duplicate-key check costs the square of a mapping's keys). */
ct_status ct__yaml_parse_limited(const char *text, size_t len, const char *name, size_t max_keys,
                                 ct__yaml_node **ret_root, ct_err *err);

/* Frees `node` and everything below it; accepts NULL. */
void ct__yaml_destroy(ct__yaml_node *node);

/* Returns the pair for `key` in mapping `map`, or NULL when absent or `map` is not a mapping.
 * The pointer is a view valid until the tree changes. */
const ct__yaml_pair *ct__yaml_find(const ct__yaml_node *map, const char *key);

/* Returns the value for `key` in mapping `map`, or NULL (as ct__yaml_find). */
const ct__yaml_node *ct__yaml_get(const ct__yaml_node *map, const char *key);

/* Returns "nothing", "a mapping", "a list" or "'TEXT'" style descriptions for messages: the kind
 * as words for containers, and for scalars writes the quoted text into `buf` (`size` bytes). */
const char *ct__yaml_describe(const ct__yaml_node *node, char *buf, size_t size);

/* Applies one override "dotted.key=value" to `root` (a mapping, or a null root, which becomes an
 * empty mapping). Path segments are separated by '.'; list items are addressed as `layers.1` or
 * `layers[1]`. The value is parsed as YAML (a scalar or a flow collection). Missing mapping keys
 * are created (every node from the override gets line 0), so a later validation can report
 * unknown keys. Errors (CT_EINVAL, message starting "--set KEY=VALUE: "): no '=', an empty path
 * segment, an index out of range or into a non-list, a key under a scalar, a bad value.
 * Thread-safe per tree. */
ct_status ct__yaml_apply_set(ct__yaml_node *root, const char *set, ct_err *err);

#endif
