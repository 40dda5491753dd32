/* cmd_pack.c: `convoy pack IN.gguf OUT` and `convoy unpack IN OUT.gguf`:
 * a whole GGUF with its tensors losslessly coded (convoy_pack_file), and
 * back byte for byte (convoy_unpack_file). */
#include <inttypes.h>
#include <stdio.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"

static void pack_usage(FILE *f)
{
    fprintf(f, "usage: convoy pack IN.gguf OUT\n"
               "  codes every tensor of IN losslessly (rANS over byte planes, scales and quants);\n"
               "  `convoy unpack OUT IN2.gguf` gives back IN byte for byte\n");
}

static void unpack_usage(FILE *f)
{
    fprintf(f, "usage: convoy unpack IN OUT.gguf\n"
               "  writes the GGUF a `convoy pack` file holds, byte for byte\n");
}

static void print_sizes(const char *out, const convoy_pack_stats *st)
{
    const double pct = st->file_bytes ? 100.0 * (double)st->packed_bytes / (double)st->file_bytes : 0.0;
    printf("%" PRIu64 " segments: %" PRIu64 " bytes of GGUF, %" PRIu64 " packed (%.2f%%)\n", st->n_segments,
           st->file_bytes, st->packed_bytes, pct);
    printf("wrote %s\n", out);
}

/* Both commands: two paths, one call. */
static int run(int argc, char **argv, const char *name, void (*usage)(FILE *),
               int (*fn)(const char *, const char *, convoy_pack_stats *, char *, size_t))
{
    const char *files[2];
    const arg_opt opts[] = {{0}};
    const arg_cmd cmd = {.name = name, .usage = usage, .opts = opts, .args = files, .n_args = 2};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    convoy_pack_stats st;
    char err[CONVOY_ERR_MAX];
    if (fn(files[0], files[1], &st, err, sizeof err)) {
        fprintf(stderr, "convoy %s: %s\n", name, err);
        return 1;
    }
    print_sizes(files[1], &st);
    return 0;
}

int cmd_pack(int argc, char **argv)
{
    return run(argc, argv, "pack", pack_usage, convoy_pack_file);
}

int cmd_unpack(int argc, char **argv)
{
    return run(argc, argv, "unpack", unpack_usage, convoy_unpack_file);
}
