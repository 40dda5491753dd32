/* files.c: include/convoy.h's model files: the report of `convoy info`,
 * a file's stats, writing models (quantize, synth) over src/model/, and
 * packing them (codec/pack.h). */
#include "convoy.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "codec/pack.h"
#include "core/alloc.h"
#include "core/err.h"
#include "core/utf8.h"
#include "core/fmap.h"
#include "kernels/kernels.h"
#include "model/fingerprint.h"
#include "model/gguf.h"
#include "model/quantize.h"
#include "model/shard.h"
#include "model/synth.h"

static const char *ftype_name(uint32_t ftype)
{
    switch (ftype) {
    case 0: return "ALL_F32";
    case 1: return "MOSTLY_F16";
    case 2: return "MOSTLY_Q4_0";
    case 7: return "MOSTLY_Q8_0";
    case 8: return "MOSTLY_Q5_0";
    case 9: return "MOSTLY_Q5_1";
    case 10: return "MOSTLY_Q2_K";
    case 11: return "MOSTLY_Q3_K_S";
    case 12: return "MOSTLY_Q3_K_M";
    case 13: return "MOSTLY_Q3_K_L";
    case 14: return "MOSTLY_Q4_K_S";
    case 15: return "MOSTLY_Q4_K_M";
    case 16: return "MOSTLY_Q5_K_S";
    case 17: return "MOSTLY_Q5_K_M";
    case 18: return "MOSTLY_Q6_K";
    case 25: return "MOSTLY_IQ4_NL";
    case 30: return "MOSTLY_IQ4_XS";
    case 32: return "MOSTLY_BF16";
    case 38: return "MOSTLY_MXFP4_MOE";
    default: return "other";
    }
}

/* Length of a file string as printed: long ones are cut. */
/* A GGUF's strings are its author's: printed escaped (core/utf8.h), so
 * that a model's name cannot steer the terminal, and at most 200 bytes. */
#define SHOWN_MAX 200
#define SHOWN_BUF (4 * SHOWN_MAX + 1)
static const char *shown(const char *ptr, uint64_t len, char buf[SHOWN_BUF])
{
    return cv_escape(buf, SHOWN_BUF, ptr, len < SHOWN_MAX ? (size_t)len : SHOWN_MAX);
}

static int64_t count_params(const gguf_file *f)
{
    int64_t n = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        n += f->tensors[i].ne[0] * f->tensors[i].ne[1] * f->tensors[i].ne[2] * f->tensors[i].ne[3];
    return n;
}

/* Prints "label: value" of the u32 key ARCH.suffix, or "-" when absent;
 * returns the value (0 when absent). */
static uint32_t print_arch_u32(FILE *out, const gguf_file *f, const char *arch, const char *label,
                               const char *suffix)
{
    char key[160];
    uint32_t v = 0;
    snprintf(key, sizeof(key), "%s.%s", arch, suffix);
    if (cv_gguf_get_u32(f, key, &v, NULL, 0)) {
        fprintf(out, "%s: -\n", label);
        return 0;
    }
    fprintf(out, "%s: %" PRIu32 "\n", label, v);
    return v;
}

/* The vocabulary size from wherever the file states it, best source first. */
static void print_n_vocab(FILE *out, const gguf_file *f, const char *arch)
{
    char key[160];
    uint32_t u;
    const gguf_kv *tokens = cv_gguf_find_kv(f, "tokenizer.ggml.tokens");
    const gguf_tensor *embd = cv_gguf_find_tensor(f, "token_embd.weight");
    snprintf(key, sizeof(key), "%s.vocab_size", arch);
    if (!cv_gguf_get_u32(f, key, &u, NULL, 0))
        fprintf(out, "n_vocab: %" PRIu32 "\n", u);
    else if (tokens && tokens->type == GGUF_ARRAY)
        fprintf(out, "n_vocab: %" PRIu64 " (tokenizer)\n", tokens->arr_n);
    else if (embd && embd->n_dims >= 2)
        fprintf(out, "n_vocab: %" PRId64 " (token_embd)\n", embd->ne[1]);
    else
        fprintf(out, "n_vocab: -\n");
}

/* The rope and norm keys, with llama.cpp's defaults where it has one. */
static void print_rope_norm(FILE *out, const gguf_file *f, const char *arch)
{
    char key[160];
    float x;
    uint32_t u;
    snprintf(key, sizeof(key), "%s.rope.dimension_count", arch);
    if (!cv_gguf_get_u32(f, key, &u, NULL, 0))
        fprintf(out, "rope_dim: %" PRIu32 "\n", u);
    else
        fprintf(out, "rope_dim: -\n");
    snprintf(key, sizeof(key), "%s.rope.freq_base", arch);
    if (!cv_gguf_get_f32(f, key, &x, NULL, 0))
        fprintf(out, "rope_theta: %g\n", x);
    else
        fprintf(out, "rope_theta: 10000 (default)\n");
    snprintf(key, sizeof(key), "%s.attention.layer_norm_rms_epsilon", arch);
    if (!cv_gguf_get_f32(f, key, &x, NULL, 0))
        fprintf(out, "rms_eps: %g\n", x);
    else
        fprintf(out, "rms_eps: -\n");
}

/* A mixture of experts' keys, when the file has them. */
static void print_experts(FILE *out, const gguf_file *f, const char *arch)
{
    static const char *const keys[][2] = {{"n_expert", "expert_count"},
                                          {"n_expert_used", "expert_used_count"},
                                          {"n_ff_exp", "expert_feed_forward_length"},
                                          {"n_ff_shexp", "expert_shared_feed_forward_length"}};
    char key[160];
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        snprintf(key, sizeof key, "%s.%s", arch, keys[i][1]);
        if (cv_gguf_find_kv(f, key))
            print_arch_u32(out, f, arch, keys[i][0], keys[i][1]);
    }
}

static void print_hparams(FILE *out, const gguf_file *f, const char *arch)
{
    char key[160], buf[SHOWN_BUF];
    gguf_str s;
    uint32_t u;
    fprintf(out, "architecture: %s\n", shown(arch, strlen(arch), buf));
    if (!cv_gguf_get_str(f, "general.name", &s, NULL, 0))
        fprintf(out, "name: %s\n", shown(s.ptr, s.len, buf));
    if (!cv_gguf_get_u32(f, "general.file_type", &u, NULL, 0))
        fprintf(out, "file_type: %" PRIu32 " (%s)\n", u, ftype_name(u));
    else
        fprintf(out, "file_type: -\n");
    uint32_t n_embd = print_arch_u32(out, f, arch, "n_embd", "embedding_length");
    print_arch_u32(out, f, arch, "n_layer", "block_count");
    uint32_t n_head = print_arch_u32(out, f, arch, "n_head", "attention.head_count");
    snprintf(key, sizeof(key), "%s.attention.head_count_kv", arch);
    if (!cv_gguf_get_u32(f, key, &u, NULL, 0))
        fprintf(out, "n_head_kv: %" PRIu32 "\n", u);
    else
        fprintf(out, "n_head_kv: %" PRIu32 " (default: n_head)\n", n_head);
    snprintf(key, sizeof(key), "%s.attention.key_length", arch);
    if (!cv_gguf_get_u32(f, key, &u, NULL, 0))
        fprintf(out, "head_dim: %" PRIu32 "\n", u);
    else if (n_head && n_embd % n_head == 0)
        fprintf(out, "head_dim: %" PRIu32 "\n", n_embd / n_head);
    print_arch_u32(out, f, arch, "n_ff", "feed_forward_length");
    print_experts(out, f, arch);
    print_n_vocab(out, f, arch);
    print_arch_u32(out, f, arch, "n_ctx", "context_length");
    print_rope_norm(out, f, arch);
}

static void print_tokenizer(FILE *out, const gguf_file *f)
{
    gguf_str model;
    const gguf_kv *tokens = cv_gguf_find_kv(f, "tokenizer.ggml.tokens");
    if (cv_gguf_get_str(f, "tokenizer.ggml.model", &model, NULL, 0) || !tokens || tokens->type != GGUF_ARRAY) {
        fprintf(out, "tokenizer: -\n");
        return;
    }
    const char *kind = cv_gguf_str_eq(model, "llama") ? " (SentencePiece)"
                       : cv_gguf_str_eq(model, "gpt2") ? " (byte-level BPE)" : "";
    char buf[SHOWN_BUF];
    fprintf(out, "tokenizer: %s%s, %" PRIu64 " tokens", shown(model.ptr, model.len, buf), kind, tokens->arr_n);
    static const char *const ids[][2] = {
        {"bos", "tokenizer.ggml.bos_token_id"},
        {"eos", "tokenizer.ggml.eos_token_id"},
        {"unk", "tokenizer.ggml.unknown_token_id"},
    };
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        uint32_t id;
        if (!cv_gguf_get_u32(f, ids[i][1], &id, NULL, 0))
            fprintf(out, ", %s %" PRIu32, ids[i][0], id);
    }
    fprintf(out, "\n");
}

/* "[a, b, ...]" of n_dims dims. */
static void format_shape(char *shape, size_t n, uint32_t n_dims, const int64_t *ne)
{
    int k = snprintf(shape, n, "[%" PRId64, ne[0]);
    for (uint32_t d = 1; d < n_dims; d++)
        k += snprintf(shape + k, n - (size_t)k, ", %" PRId64, ne[d]);
    snprintf(shape + k, n - (size_t)k, "]");
}

static void print_tensors(FILE *out, const gguf_file *f)
{
    uint64_t total = 0;
    fprintf(out, "tensors: %" PRIu64 "\n", f->n_tensors);
    fprintf(out, "  %4s %-36s %-6s %-24s %14s %12s\n", "#", "name", "type", "shape", "file_offset", "bytes");
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        char shape[128], buf[SHOWN_BUF]; /* 4 dims of at most 20 digits */
        format_shape(shape, sizeof(shape), t->n_dims, t->ne);
        fprintf(out, "  %4" PRIu64 " %-36s %-6s %-24s %14" PRIu64 " %12" PRIu64 "\n", i,
                shown(t->name.ptr, t->name.len, buf), cv_type_name(t->type), shape, f->data_offset + t->offset,
                t->size);
        total += t->size;
    }
    const int64_t n_params = count_params(f);
    fprintf(out, "params: %" PRId64 " (%.2f M)\n", n_params, (double)n_params / 1e6);
    fprintf(out, "tensor_bytes: %" PRIu64 " (%.2f MiB)\n", total, (double)total / (1 << 20));
}

/* A shard's layers ("shard: layers [1, 3) of 5"), or nothing for a whole model. */
static void print_shard(FILE *out, const gguf_file *f)
{
    uint32_t first, last, n_layer;
    if (cv_shard_is(f) && !cv_gguf_get_u32(f, CV_SHARD_KEY_FIRST, &first, NULL, 0) &&
        !cv_gguf_get_u32(f, CV_SHARD_KEY_LAST, &last, NULL, 0) &&
        !cv_gguf_get_u32(f, CV_SHARD_KEY_N_LAYER, &n_layer, NULL, 0))
        fprintf(out, "shard: layers [%" PRIu32 ", %" PRIu32 ") of %" PRIu32 "\n", first, last, n_layer);
}

int convoy_file_report(const char *path, FILE *out, char *err, size_t errlen)
{
    gguf_file f;
    if (cv_gguf_open(&f, path, err, errlen))
        return -1;
    fprintf(out, "file: %s\n", path);
    fprintf(out, "gguf: version %" PRIu32 ", %" PRIu64 " key/values, alignment %" PRIu64 ", data at %" PRIu64
                 ", %zu bytes\n",
            f.version, f.n_kv, f.alignment, f.data_offset, f.map.size);
    gguf_str arch;
    char arch_buf[64] = "-";
    if (!cv_gguf_get_str(&f, "general.architecture", &arch, NULL, 0))
        snprintf(arch_buf, sizeof(arch_buf), "%.*s", (int)(arch.len < 63 ? arch.len : 63), arch.ptr);
    print_hparams(out, &f, arch_buf);
    print_tokenizer(out, &f);
    print_tensors(out, &f);
    print_shard(out, &f);
    fprintf(out, "fingerprint: %016" PRIx64 "\n", cv_model_fingerprint(&f));
    cv_gguf_close(&f);
    return 0;
}

int convoy_file_get_stats(const char *path, convoy_file_stats *st, char *err, size_t errlen)
{
    gguf_file f;
    if (cv_gguf_open(&f, path, err, errlen))
        return -1;
    *st = (convoy_file_stats){.n_tensors = f.n_tensors, .n_params = count_params(&f), .bytes = f.map.size,
                              .fingerprint = cv_model_fingerprint(&f)};
    cv_gguf_close(&f);
    return 0;
}

/* ---- writing files ---- */

static int threads_or_cpus(int32_t n_threads)
{
    const long n_cpu = sysconf(_SC_NPROCESSORS_ONLN);
    return n_threads > 0 ? n_threads : n_cpu > 0 ? (int)n_cpu : 1;
}

/* Hands src/model's tensor notes on in convoy.h's terms. */
typedef struct note_relay {
    convoy_tensor_note_fn fn;
    void *user;
} note_relay;

static void relay_note(void *ctx, const cv_tensor_note *n)
{
    const note_relay *r = ctx;
    char shape[128]; /* 4 dims of at most 20 digits */
    format_shape(shape, sizeof(shape), n->n_dims, n->ne);
    const convoy_tensor_note note = {
        .index = n->index, .count = n->count, .name = n->name, .n_dims = n->n_dims, .ne = n->ne, .shape = shape,
        .src_type = cv_type_name(n->src_type), .want_type = cv_type_name(n->want_type),
        .type = cv_type_name(n->type), .src_bytes = n->src_bytes, .bytes = n->bytes,
    };
    r->fn(r->user, &note);
}

bool convoy_quant_type_known(const char *name)
{
    cv_type type;
    cv_quant_mix mix;
    return cv_quant_parse_type(name, &type, &mix) == 0;
}

bool convoy_tensor_type_known(const char *name)
{
    return cv_type_from_name(name) >= 0;
}

int convoy_quantize_file(const char *in, const char *out, const char *type, const char *output_type,
                         int32_t n_threads, convoy_tensor_note_fn note, void *user, char *err, size_t errlen)
{
    cv_quantize_params p = {.output_type = CV_TYPE_COUNT, .n_threads = threads_or_cpus(n_threads)};
    if (cv_quant_parse_type(type, &p.type, &p.mix))
        return cv_errf(err, errlen, "unknown type '%s'", type);
    if (output_type) {
        const int t = cv_type_from_name(output_type);
        if (t < 0)
            return cv_errf(err, errlen, "unknown type '%s'", output_type);
        p.output_type = (cv_type)t;
    }
    note_relay relay = {note, user};
    return cv_quantize_file(in, out, &p, note ? relay_note : NULL, &relay, err, errlen);
}

convoy_synth_params convoy_synth_default_params(void)
{
    cv_synth_params q;
    cv_synth_defaults(&q);
    return (convoy_synth_params){.n_ctx = q.n_ctx, .rope_theta = q.rope_theta, .output_scale = q.output_scale,
                                 .tied = q.tied, .seed = q.seed, .type = cv_type_name(q.type)};
}

int convoy_synth_set_shape(convoy_synth_params *p, const char *shape, char *err, size_t errlen)
{
    cv_synth_params q;
    cv_synth_defaults(&q);
    if (cv_synth_preset(&q, shape, err, errlen))
        return -1;
    p->n_embd = q.n_embd;
    p->n_layer = q.n_layer;
    p->n_head = q.n_head;
    p->n_head_kv = q.n_head_kv;
    p->n_ff = q.n_ff;
    p->n_vocab = q.n_vocab;
    p->n_ctx = q.n_ctx;
    p->rope_theta = q.rope_theta;
    p->output_scale = q.output_scale;
    p->n_swa = q.n_swa;
    p->arch = cv_llama_arch_name(q.arch);
    p->head_dim = q.head_dim;
    p->n_expert = q.n_expert;
    p->n_expert_used = q.n_expert_used;
    p->n_ff_exp = q.n_ff_exp;
    p->n_ff_shexp = q.n_ff_shexp;
    p->n_ctx_orig = q.n_ctx_orig;
    return 0;
}

const char *convoy_synth_shape_name(int32_t i)
{
    return cv_synth_preset_name(i);
}

int convoy_synth_file(const convoy_synth_params *p, const char *out, convoy_tensor_note_fn note, void *user,
                      char *err, size_t errlen)
{
    cv_synth_params q;
    cv_synth_defaults(&q); /* what p does not say: rms eps */
    if (cv_quant_parse_type(p->type, &q.type, &q.mix))
        return cv_errf(err, errlen, "unknown type '%s'", p->type);
    snprintf(q.name, sizeof(q.name), "%s", p->name ? p->name : "");
    q.n_embd = p->n_embd;
    q.n_layer = p->n_layer;
    q.n_head = p->n_head;
    q.n_head_kv = p->n_head_kv;
    q.n_ff = p->n_ff;
    q.n_vocab = p->n_vocab;
    q.n_ctx = p->n_ctx;
    q.rope_theta = p->rope_theta;
    q.output_scale = p->output_scale;
    q.tied = p->tied;
    q.chatml = p->chatml;
    q.fim = p->fim;
    q.tool_marker = p->tool_marker;
    q.n_swa = p->n_swa;
    if (p->arch && cv_llama_arch_of(p->arch, strlen(p->arch), &q.arch))
        return cv_errf(err, errlen, "unknown architecture '%s'", p->arch);
    q.head_dim = p->head_dim;
    q.n_expert = p->n_expert;
    q.n_expert_used = p->n_expert_used;
    q.n_ff_exp = p->n_ff_exp;
    q.n_ff_shexp = p->n_ff_shexp;
    q.n_ctx_orig = p->n_ctx_orig;
    q.seed = p->seed;
    q.n_threads = threads_or_cpus(p->n_threads);
    note_relay relay = {note, user};
    return cv_synth_write(&q, out, note ? relay_note : NULL, &relay, err, errlen);
}

static int by_offset(const void *a, const void *b)
{
    const cv_pack_tensor *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

/* Writes through a new file at path, removed again when write fails. */
static int write_file(const char *path, int (*write)(void *, FILE *, char *, size_t), void *ctx, char *err,
                      size_t errlen)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return cv_errf(err, errlen, "%s: cannot create", path);
    int rc = write(ctx, fp, err, errlen);
    if (fclose(fp) && !rc)
        rc = cv_errf(err, errlen, "%s: write failed", path);
    if (rc)
        unlink(path);
    return rc;
}

typedef struct pack_job {
    const gguf_file *f;
    cv_pack_tensor *t;
    const cv_fmap *map;
    convoy_pack_stats st;
} pack_job;

static int write_packed(void *ctx, FILE *fp, char *err, size_t errlen)
{
    pack_job *j = ctx;
    cv_pack_src src;
    cv_pack_src_of_buffer(&src, j->f->map.data, j->f->map.size, j->t, j->f->n_tensors);
    j->st.n_segments = cv_pack_count(&src);
    return cv_pack_write(&src, fp, &j->st.packed_bytes, err, errlen);
}

int convoy_pack_file(const char *in, const char *out, convoy_pack_stats *st, char *err, size_t errlen)
{
    gguf_file f;
    if (cv_gguf_open(&f, in, err, errlen))
        return -1;
    pack_job j = {.f = &f, .t = cv_calloc(f.n_tensors ? f.n_tensors : 1, sizeof(cv_pack_tensor))};
    int rc = j.t ? 0 : cv_errf(err, errlen, "%s: out of memory", in);
    for (uint64_t i = 0; j.t && i < f.n_tensors; i++)
        j.t[i] = (cv_pack_tensor){f.data_offset + f.tensors[i].offset, f.tensors[i].size, f.tensors[i].type};
    if (j.t) {
        qsort(j.t, f.n_tensors, sizeof(cv_pack_tensor), by_offset);
        rc = write_file(out, write_packed, &j, err, errlen);
    }
    j.st.file_bytes = f.map.size;
    if (st)
        *st = j.st;
    cv_free(j.t);
    cv_gguf_close(&f);
    return rc;
}

static int write_unpacked(void *ctx, FILE *fp, char *err, size_t errlen)
{
    pack_job *j = ctx;
    return cv_pack_read(j->map->data, j->map->size, fp, &j->st.file_bytes, &j->st.n_segments, err, errlen);
}

int convoy_unpack_file(const char *in, const char *out, convoy_pack_stats *st, char *err, size_t errlen)
{
    cv_fmap map;
    if (cv_fmap_open(&map, in, err, errlen))
        return -1;
    pack_job j = {.map = &map, .st.packed_bytes = map.size};
    char why[CV_ERRLEN];
    const int rc = write_file(out, write_unpacked, &j, why, sizeof why);
    if (rc)
        cv_errf(err, errlen, "%s: %s", in, why);
    if (st)
        *st = j.st;
    cv_fmap_close(&map);
    return rc;
}

int convoy_split_file(const char *in, const char *dir, int32_t n, const int32_t *counts, convoy_shard_note_fn note,
                      void *user, char *err, size_t errlen)
{
    return cv_shard_write(in, dir, n, counts, note, user, err, errlen);
}
