/* cmd_quantize.c: `convoy quantize IN OUT TYPE`: converts a GGUF's weight
 * matrices (src/model/quantize.h) and prints one line per tensor, the
 * fallbacks, and the sizes before and after. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "core/err.h"
#include "kernels/kernels.h"
#include "model/quantize.h"

static void quantize_usage(FILE *f)
{
    fprintf(f, "usage: convoy quantize IN OUT TYPE [--output-type T] [-t THREADS]\n"
               "  TYPE: F32 F16 BF16 Q8_0 Q4_0 Q4_K Q5_K Q6_K, or llama.cpp's mixes Q4_K_M Q5_K_M\n"
               "  (Q6_K for output and for attn_v/ffn_down of some layers); Q4_K_S = Q4_K, Q5_K_S = Q5_K\n"
               "  weight matrices become TYPE (output.weight: --output-type, default TYPE);\n"
               "  norms and other 1-D tensors are copied; inputs must be F32, F16 or BF16\n");
}

typedef struct quantize_totals {
    uint64_t src_bytes, bytes;
    int n_converted, n_fallback;
} quantize_totals;

static void print_tensor(void *ctx, const cv_tensor_note *n)
{
    quantize_totals *tot = ctx;
    char shape[128]; /* 4 dims of at most 20 digits */
    int k = snprintf(shape, sizeof(shape), "[%" PRId64, n->ne[0]);
    for (uint32_t d = 1; d < n->n_dims; d++)
        k += snprintf(shape + k, sizeof(shape) - (size_t)k, ", %" PRId64, n->ne[d]);
    snprintf(shape + k, sizeof(shape) - (size_t)k, "]");
    printf("[%4d/%4d] %-36s %-16s %-5s -> %-5s %11" PRIu64 " -> %11" PRIu64 " bytes\n", n->index + 1, n->count,
           n->name, shape, cv_type_name(n->src_type), cv_type_name(n->type), n->src_bytes, n->bytes);
    if (n->type != n->want_type) {
        printf("  fallback: %s: rows of %" PRId64 " do not fit %s blocks, using %s\n", n->name, n->ne[0],
               cv_type_name(n->want_type), cv_type_name(n->type));
        tot->n_fallback++;
    }
    if (n->type != n->src_type)
        tot->n_converted++;
    tot->src_bytes += n->src_bytes;
    tot->bytes += n->bytes;
}

int cmd_quantize(int argc, char **argv)
{
    const char *pos[3];
    int n_pos = 0;
    const char *output_type = NULL;
    long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    cv_quantize_params p = {.output_type = CV_TYPE_COUNT, .n_threads = n_cpu > 0 ? (int)n_cpu : 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            quantize_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--output-type") && i + 1 < argc) {
            output_type = argv[++i];
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            const char *v = arg_value(argc, argv, &i);
            int32_t n_threads;
            if (!v || arg_int(a, v, 1, 1024, &n_threads))
                return 2;
            p.n_threads = n_threads;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "convoy quantize: unknown option %s\n", a);
            quantize_usage(stderr);
            return 2;
        } else if (n_pos < 3) {
            pos[n_pos++] = a;
        } else {
            quantize_usage(stderr);
            return 2;
        }
    }
    if (n_pos != 3) {
        quantize_usage(stderr);
        return 2;
    }
    cv_kernels_init(0);
    cv_type base;
    int ot = output_type ? cv_type_from_name(output_type) : CV_TYPE_COUNT;
    if (cv_quant_parse_type(pos[2], &base, &p.k_mix) || ot < 0) {
        fprintf(stderr, "convoy quantize: unknown type '%s'\n", ot < 0 ? output_type : pos[2]);
        return 2;
    }
    p.type = base;
    p.output_type = (cv_type)ot;

    quantize_totals tot = {0};
    char err[CV_ERRLEN];
    if (cv_quantize_file(pos[0], pos[1], &p, print_tensor, &tot, err, sizeof(err))) {
        fprintf(stderr, "convoy quantize: %s\n", err);
        return 1;
    }
    printf("total: %" PRIu64 " -> %" PRIu64 " bytes of tensors (%.2f -> %.2f MiB), %d converted, %d fell back\n",
           tot.src_bytes, tot.bytes, (double)tot.src_bytes / (1 << 20), (double)tot.bytes / (1 << 20),
           tot.n_converted, tot.n_fallback);
    printf("wrote %s\n", pos[1]);
    return 0;
}
