/* cmd_keygen.c: `convoy keygen FILE`: a new random cluster key (pipe/seal.h)
 * for the --key of the head and every node. */
#include <stdio.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"
#include "pipe/seal.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy keygen FILE\n"
               "  writes a new random 32-byte cluster key to FILE (64 hex digits, mode 0600; an existing\n"
               "  file is never overwritten). Copy it to every machine of the pipeline and give it to the\n"
               "  head and every node with --key FILE: links are then authenticated and encrypted.\n");
}

int cmd_keygen(int argc, char **argv)
{
    const char *path = NULL;
    const arg_opt opts[] = {{0}};
    const arg_cmd cmd = {.name = "keygen", .usage = usage, .opts = opts, .args = &path, .n_args = 1};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    char err[CONVOY_ERR_MAX];
    if (cv_seal_key_generate(path, err, sizeof err)) {
        fprintf(stderr, "convoy keygen: %s\n", err);
        return 1;
    }
    fprintf(stderr, "convoy keygen: wrote a new cluster key to %s\n", path);
    return 0;
}
