/* cmd_split.c: `convoy split MODEL --stages N | --split A,B,... -o DIR`:
 * cuts a model into per-stage files (convoy_split_file) and prints one
 * line per shard. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"

#define SPLIT_MAX 64 /* shards at most, as the engine takes them */

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy split MODEL (--stages N | --split A,B,...) -o DIR\n"
               "  writes DIR/STEM.shard-K-of-N.gguf: shard K holds only its layers (the first also the\n"
               "  embeddings, the last the output norm and matrix), the whole model's metadata, its layer\n"
               "  range and the whole model's fingerprint; serve one with `convoy stage -m SHARD`\n"
               "  --stages N      N shards of layers as equal as they go (the first ones one more)\n"
               "  --split A,B,... shards of A, B, ... layers, in order (they sum to the model's)\n");
}

/* --split's counts into counts; returns how many, or -1 after a message. */
static int parse_counts(const char *s, int32_t *counts)
{
    int n = 0;
    for (const char *p = s;; p++) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 65536 || (*end && *end != ',') || n == SPLIT_MAX) {
            fprintf(stderr, "convoy split: --split %s: expected up to %d layer counts >= 1, separated by commas\n",
                    s, SPLIT_MAX);
            return -1;
        }
        counts[n++] = (int32_t)v;
        if (!*end)
            return n;
        p = end;
    }
}

static void print_shard(void *user, int32_t k, int32_t n, const char *path, int32_t first, int32_t last,
                        uint64_t n_tensors, uint64_t bytes)
{
    (void)user;
    printf("shard %d/%d: layers [%d, %d), %" PRIu64 " tensors, %.2f MiB: %s\n", k + 1, n, first, last, n_tensors,
           (double)bytes / (1 << 20), path);
}

int cmd_split(int argc, char **argv)
{
    const char *model, *dir = NULL, *split = NULL;
    int32_t stages = 0;
    const arg_opt opts[] = {
        {"stages", 0, ARG_INT, .dst = &stages, .lo = 1, .hi = SPLIT_MAX},
        {"split", 0, ARG_STR, .dst = &split},
        {NULL, 'o', ARG_STR, .dst = &dir, .required = true},
        {0},
    };
    const arg_cmd cmd = {.name = "split", .usage = usage, .opts = opts, .args = &model, .n_args = 1};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    if (!stages == !split) {
        fprintf(stderr, "convoy split: give either --stages N or --split A,B,...\n");
        return 2;
    }
    int32_t counts[SPLIT_MAX];
    const int n = split ? parse_counts(split, counts) : stages;
    if (n < 0)
        return 2;
    char err[CONVOY_ERR_MAX];
    if (convoy_split_file(model, dir, n, split ? counts : NULL, print_shard, NULL, err, sizeof err)) {
        fprintf(stderr, "convoy split: %s\n", err);
        return 1;
    }
    return 0;
}
