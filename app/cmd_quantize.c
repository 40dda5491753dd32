/* cmd_quantize.c: `convoy quantize IN OUT TYPE`: converts a GGUF's weight
 * matrices (convoy_quantize_file) and prints one line per tensor, the
 * fallbacks, and the sizes before and after. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy quantize IN OUT TYPE [--output-type T] [-t THREADS]\n"
               "  TYPE: F32 F16 BF16 Q8_0 Q4_0 Q5_0 Q5_1 IQ4_NL IQ4_XS MXFP4 Q3_K Q4_K Q5_K Q6_K,\n"
               "  or llama.cpp's mixes Q2_K Q3_K_S Q3_K_M Q3_K_L (Q3_K to Q5_K for\n"
               "  attn_v/attn_output/ffn_down)\n"
               "  Q4_K_M Q5_K_M (Q6_K for attn_v/ffn_down of some layers), output Q6_K in each;\n"
               "  Q4_K_S = Q4_K, Q5_K_S = Q5_K\n"
               "  weight matrices become TYPE (output.weight: --output-type, default TYPE);\n"
               "  norms and other 1-D tensors are copied; inputs must be F32, F16 or BF16\n");
}

typedef struct quantize_totals {
    uint64_t src_bytes, bytes;
    int n_converted, n_fallback;
} quantize_totals;

static void print_tensor(void *user, const convoy_tensor_note *n)
{
    quantize_totals *tot = user;
    printf("[%4d/%4d] %-36s %-16s %-5s -> %-5s %11" PRIu64 " -> %11" PRIu64 " bytes\n", n->index + 1, n->count,
           n->name, n->shape, n->src_type, n->type, n->src_bytes, n->bytes);
    if (strcmp(n->type, n->want_type)) {
        printf("  fallback: %s: rows of %" PRId64 " do not fit %s blocks, using %s\n", n->name, n->ne[0],
               n->want_type, n->type);
        tot->n_fallback++;
    }
    if (strcmp(n->type, n->src_type))
        tot->n_converted++;
    tot->src_bytes += n->src_bytes;
    tot->bytes += n->bytes;
}

int cmd_quantize(int argc, char **argv)
{
    const char *files[3], *output_type = NULL;
    int32_t n_threads = 0; /* one per CPU */
    const arg_opt opts[] = {
        {"output-type", 0, ARG_STR, .dst = &output_type},
        {"threads", 't', ARG_INT, .dst = &n_threads, .lo = 1, .hi = 1024},
        {0},
    };
    const arg_cmd cmd = {.name = "quantize", .usage = usage, .opts = opts, .args = files, .n_args = 3};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    const char *in = files[0], *out = files[1], *type = files[2];
    const char *unknown = output_type && !convoy_tensor_type_known(output_type) ? output_type
                          : !convoy_quant_type_known(type)                          ? type
                                                                                    : NULL;
    if (unknown) {
        fprintf(stderr, "convoy quantize: unknown type '%s'\n", unknown);
        return 2;
    }
    quantize_totals tot = {0};
    char err[CONVOY_ERR_MAX];
    if (convoy_quantize_file(in, out, type, output_type, n_threads, print_tensor, &tot, err, sizeof err)) {
        fprintf(stderr, "convoy quantize: %s\n", err);
        return 1;
    }
    printf("total: %" PRIu64 " -> %" PRIu64 " bytes of tensors (%.2f -> %.2f MiB), %d converted, %d fell back\n",
           tot.src_bytes, tot.bytes, (double)tot.src_bytes / (1 << 20), (double)tot.bytes / (1 << 20),
           tot.n_converted, tot.n_fallback);
    printf("wrote %s\n", out);
    return 0;
}
