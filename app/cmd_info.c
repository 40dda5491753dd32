/* cmd_info.c: `convoy info MODEL`: prints a GGUF's hyperparameters,
 * tokenizer, tensor table (absolute file offsets, so tools can cut a
 * tensor's bytes out), sizes and fingerprint, one "key: value" per line. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "commands.h"
#include "core/err.h"
#include "kernels/kernels.h"
#include "model/fingerprint.h"
#include "model/gguf.h"

static const char *ftype_name(uint32_t ftype)
{
    switch (ftype) {
    case 0: return "ALL_F32";
    case 1: return "MOSTLY_F16";
    case 2: return "MOSTLY_Q4_0";
    case 7: return "MOSTLY_Q8_0";
    case 14: return "MOSTLY_Q4_K_S";
    case 15: return "MOSTLY_Q4_K_M";
    case 16: return "MOSTLY_Q5_K_S";
    case 17: return "MOSTLY_Q5_K_M";
    case 18: return "MOSTLY_Q6_K";
    case 32: return "MOSTLY_BF16";
    default: return "other";
    }
}

/* Length of a file string as printed: long ones are cut. */
static int shown(gguf_str s)
{
    return s.len < 200 ? (int)s.len : 200;
}

/* Prints "label: value" of the u32 key ARCH.suffix, or "-" when absent;
 * returns the value (0 when absent). */
static uint32_t print_arch_u32(const gguf_file *f, const char *arch, const char *label, const char *suffix)
{
    char key[160];
    uint32_t v = 0;
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    if (gguf_get_u32(f, key, &v, NULL, 0)) {
        printf("%s: -\n", label);
        return 0;
    }
    printf("%s: %" PRIu32 "\n", label, v);
    return v;
}

static void print_hparams(const gguf_file *f, const char *arch)
{
    char key[160];
    gguf_str s;
    float x;
    uint32_t u;
    printf("architecture: %s\n", arch);
    if (!gguf_get_str(f, "general.name", &s, NULL, 0))
        printf("name: %.*s\n", shown(s), s.ptr);
    if (!gguf_get_u32(f, "general.file_type", &u, NULL, 0))
        printf("file_type: %" PRIu32 " (%s)\n", u, ftype_name(u));
    else
        printf("file_type: -\n");
    uint32_t n_embd = print_arch_u32(f, arch, "n_embd", "embedding_length");
    print_arch_u32(f, arch, "n_layer", "block_count");
    uint32_t n_head = print_arch_u32(f, arch, "n_head", "attention.head_count");
    snprintf(key, sizeof(key), "%s.attention.head_count_kv", arch);
    if (!gguf_get_u32(f, key, &u, NULL, 0))
        printf("n_head_kv: %" PRIu32 "\n", u);
    else
        printf("n_head_kv: %" PRIu32 " (default: n_head)\n", n_head);
    if (n_head && n_embd % n_head == 0)
        printf("head_dim: %" PRIu32 "\n", n_embd / n_head);
    print_arch_u32(f, arch, "n_ff", "feed_forward_length");

    const gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const gguf_tensor *embd = gguf_find_tensor(f, "token_embd.weight");
    snprintf(key, sizeof(key), "%s.vocab_size", arch);
    if (!gguf_get_u32(f, key, &u, NULL, 0))
        printf("n_vocab: %" PRIu32 "\n", u);
    else if (tokens && tokens->type == GGUF_ARRAY)
        printf("n_vocab: %" PRIu64 " (tokenizer)\n", tokens->arr_n);
    else if (embd && embd->n_dims >= 2)
        printf("n_vocab: %" PRId64 " (token_embd)\n", embd->ne[1]);
    else
        printf("n_vocab: -\n");
    print_arch_u32(f, arch, "n_ctx", "context_length");
    snprintf(key, sizeof(key), "%s.rope.dimension_count", arch);
    if (!gguf_get_u32(f, key, &u, NULL, 0))
        printf("rope_dim: %" PRIu32 "\n", u);
    else
        printf("rope_dim: -\n");
    snprintf(key, sizeof(key), "%s.rope.freq_base", arch);
    if (!gguf_get_f32(f, key, &x, NULL, 0))
        printf("rope_theta: %g\n", x);
    else
        printf("rope_theta: 10000 (default)\n");
    snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", arch);
    if (!gguf_get_f32(f, key, &x, NULL, 0))
        printf("rms_eps: %g\n", x);
    else
        printf("rms_eps: -\n");
}

static void print_tokenizer(const gguf_file *f)
{
    gguf_str model;
    const gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, NULL, 0) || !tokens || tokens->type != GGUF_ARRAY) {
        printf("tokenizer: -\n");
        return;
    }
    const char *kind = gguf_str_eq(model, "llama") ? " (SentencePiece)"
                       : gguf_str_eq(model, "gpt2") ? " (byte-level BPE)" : "";
    printf("tokenizer: %.*s%s, %" PRIu64 " tokens", shown(model), model.ptr, kind, tokens->arr_n);
    static const char *const ids[][2] = {
        {"bos", "tokenizer.ggml.bos_token_id"},
        {"eos", "tokenizer.ggml.eos_token_id"},
        {"unk", "tokenizer.ggml.unknown_token_id"},
    };
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        uint32_t id;
        if (!gguf_get_u32(f, ids[i][1], &id, NULL, 0))
            printf(", %s %" PRIu32, ids[i][0], id);
    }
    printf("\n");
}

static void print_tensors(const gguf_file *f)
{
    uint64_t total = 0;
    int64_t n_params = 0;
    printf("tensors: %" PRIu64 "\n", f->n_tensors);
    printf("  %4s %-36s %-6s %-24s %14s %12s\n", "#", "name", "type", "shape", "file_offset", "bytes");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        char shape[128]; /* 4 dims of at most 20 digits */
        int k = snprintf(shape, sizeof(shape), "[%" PRId64, t->ne[0]);
        for (uint32_t d = 1; d < t->n_dims; d++)
            k += snprintf(shape + k, sizeof(shape) - (size_t)k, ", %" PRId64, t->ne[d]);
        snprintf(shape + k, sizeof(shape) - (size_t)k, "]");
        printf("  %4" PRIu64 " %-36.*s %-6s %-24s %14" PRIu64 " %12" PRIu64 "\n", i, shown(t->name), t->name.ptr,
               cv_type_name(t->type), shape, f->data_offset + t->offset, t->size);
        total += t->size;
        n_params += t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    }
    printf("params: %" PRId64 " (%.2f M)\n", n_params, (double)n_params / 1e6);
    printf("tensor_bytes: %" PRIu64 " (%.2f MiB)\n", total, (double)total / (1 << 20));
}

int cmd_info(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: convoy info MODEL\n");
        return 0;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: convoy info MODEL\n");
        return 2;
    }
    gguf_file f;
    char err[CV_ERRLEN];
    if (gguf_open(&f, argv[1], err, sizeof(err))) {
        fprintf(stderr, "info: %s\n", err);
        return 1;
    }
    printf("file: %s\n", argv[1]);
    printf("gguf: version %" PRIu32 ", %" PRIu64 " key/values, alignment %" PRIu64 ", data at %" PRIu64
           ", %zu bytes\n",
           f.version, f.n_kv, f.alignment, f.data_offset, f.map.size);
    gguf_str arch;
    char arch_buf[64] = "-";
    if (!gguf_get_str(&f, "general.architecture", &arch, NULL, 0))
        snprintf(arch_buf, sizeof(arch_buf), "%.*s", shown(arch), arch.ptr);
    print_hparams(&f, arch_buf);
    print_tokenizer(&f);
    print_tensors(&f);
    printf("fingerprint: %016" PRIx64 "\n", cv_model_fingerprint(&f));
    gguf_close(&f);
    return 0;
}
