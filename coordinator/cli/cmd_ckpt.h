/* `ctrain ckpt`: the checkpoint tools (coordinator/cli/cmd_ckpt.c). */
#ifndef CTRAIN_CKPT_CMD_H
#define CTRAIN_CKPT_CMD_H

#include <stdio.h>

void ckpt_usage(FILE *f);
/* argv[0] is the subcommand; returns the exit code. */
int ckpt_main(int argc, char **argv);
/* The arguments of an export, FILE [--format F] OUT in any order, into *in, *out, *format (NULL
 * when absent); 0, or the exit code after a line naming `who` and the extra argument. */
int ckpt_export_args(int argc, char **argv, const char *who, const char **in, const char **out,
                     const char **format);

#endif
