/* The GraphDef of a ctrain graph, as TensorBoard's graph dashboard draws TensorFlow's (see
 * graph_def.c). */
#ifndef CTRAIN_IO_GRAPH_DEF_H
#define CTRAIN_IO_GRAPH_DEF_H

#include <stddef.h>

#include "ctrain/graph.h"
#include "ctrain/status.h"

/* g packed as a GraphDef: *ret (malloc'd, the caller frees) of *ret_len bytes. where names the
 * file in errors. CT_EINVAL for a node whose input is not a node, CT_ENOMEM. */
ct_status ct__graph_def_pack(ct_graph *g, const char *where, unsigned char **ret, size_t *ret_len,
                             ct_err *err);

#endif
