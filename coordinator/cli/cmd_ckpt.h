/* `ctrain ckpt`: the checkpoint tools (coordinator/cli/cmd_ckpt.c). */
#ifndef CTRAIN_CKPT_CMD_H
#define CTRAIN_CKPT_CMD_H

#include <stdio.h>

void ckpt_usage(FILE *f);
/* argv[0] is the subcommand; returns the exit code. */
int ckpt_main(int argc, char **argv);

#endif
