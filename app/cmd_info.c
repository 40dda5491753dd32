/* cmd_info.c: `convoy info MODEL`: prints a GGUF's hyperparameters,
 * tokenizer, tensor table (absolute file offsets, so tools can cut a
 * tensor's bytes out), sizes and fingerprint, one "key: value" per line. */
#include <stdio.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy info MODEL\n");
}

int cmd_info(int argc, char **argv)
{
    const char *path;
    const arg_opt opts[] = {{0}};
    const arg_cmd cmd = {.name = "info", .usage = usage, .opts = opts, .args = &path, .n_args = 1};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    char err[CONVOY_ERR_MAX];
    if (convoy_file_report(path, stdout, err, sizeof err)) {
        fprintf(stderr, "info: %s\n", err);
        return 1;
    }
    return 0;
}
