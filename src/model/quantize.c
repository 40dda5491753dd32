/* quantize.c: per-tensor type conversion of GGUF files (see quantize.h).
 *
 * How: each weight matrix is dequantized row by row to f32 (the source
 * type's to_float; F32 rows are used in place) and handed to the target
 * type's `quantize`, llama.cpp's reference quantizer. Rows are split over
 * the threads of a cv_pool in contiguous ranges; each thread has its own
 * f32 scratch row. Every tensor is made when the writer comes to it
 * (gguf_write.h: converted, or copied, into the writer's one buffer), and
 * its input pages are released then, so the process holds one tensor at a
 * time. cv_quantize_file checks the target types, opens the input and runs
 * write_output: copy the keys, add every tensor with its type (add_tensor),
 * set the two quantization keys, write (make_tensor converts each).
 * Owner of this file: the tools helper. */
#include "model/quantize.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/pool.h"
#include "kernels/kernels.h"
#include "model/gguf.h"
#include "model/gguf_write.h"

#define QUANT_VERSION 2 /* GGML_QNT_VERSION, written as general.quantization_version */

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

bool cv_quant_is_weight_matrix(const char *name, uint32_t n_dims)
{
    return n_dims >= 2 && ends_with(name, "weight") && !ends_with(name, "_norm.weight") &&
           !ends_with(name, "ffn_gate_inp.weight");
}

static int block_size(cv_type t)
{
    int blck = 0;
    cv_ggml_type_info(t, NULL, &blck, NULL);
    return blck;
}

cv_type cv_quant_fit_type(cv_type want, int64_t row_len)
{
    int blck = block_size(want);
    if (blck <= 0 || row_len % blck == 0)
        return want;
    if (blck == QK_K && row_len % QK8_0 == 0)
        return want == CV_TYPE_Q2_K || want == CV_TYPE_Q3_K || want == CV_TYPE_IQ4_XS ? CV_TYPE_IQ4_NL
               : want == CV_TYPE_Q4_K                                              ? CV_TYPE_Q5_0
               : want == CV_TYPE_Q5_K                                              ? CV_TYPE_Q5_1
                                                                                   : CV_TYPE_Q8_0;
    return CV_TYPE_F16;
}

int cv_quant_file_type(cv_type t)
{
    switch (t) {
    case CV_TYPE_F32: return 0;
    case CV_TYPE_F16: return 1;
    case CV_TYPE_Q4_0: return 2;
    case CV_TYPE_Q8_0: return 7;
    case CV_TYPE_Q5_0: return 8;
    case CV_TYPE_Q5_1: return 9;
    case CV_TYPE_Q2_K: return 10;
    case CV_TYPE_Q3_K: return 11;
    case CV_TYPE_Q4_K: return 14;
    case CV_TYPE_Q5_K: return 16;
    case CV_TYPE_Q6_K: return 18;
    case CV_TYPE_IQ4_NL: return 25;
    case CV_TYPE_IQ4_XS: return 30;
    case CV_TYPE_BF16: return 32;
    case CV_TYPE_MXFP4: return 38;
    default: return -1;
    }
}

const char *cv_quant_file_type_name(int64_t ftype)
{
    static const char *const names[] = {
        [0] = "F32",     [1] = "F16",     [2] = "Q4_0",     [3] = "Q4_1",     [7] = "Q8_0",    [8] = "Q5_0",
        [9] = "Q5_1",    [10] = "Q2_K",   [11] = "Q3_K_S",  [12] = "Q3_K_M",  [13] = "Q3_K_L", [14] = "Q4_K_S",
        [15] = "Q4_K_M", [16] = "Q5_K_S", [17] = "Q5_K_M",  [18] = "Q6_K",    [19] = "IQ2_XXS", [20] = "IQ2_XS",
        [21] = "Q2_K_S", [22] = "IQ3_XS", [23] = "IQ3_XXS", [24] = "IQ1_S",   [25] = "IQ4_NL", [26] = "IQ3_S",
        [27] = "IQ3_M",  [28] = "IQ2_S",  [29] = "IQ2_M",   [30] = "IQ4_XS",  [31] = "IQ1_M",  [32] = "BF16",
        [36] = "TQ1_0",  [37] = "TQ2_0",  [38] = "MXFP4_MOE",
    };
    const int64_t n = (int64_t)(sizeof names / sizeof names[0]);
    return ftype >= 0 && ftype < n && names[ftype] ? names[ftype] : NULL;
}

int cv_quant_policy_file_type(const cv_quantize_params *p)
{
    static const int ftype[] = {[CV_MIX_Q2_K] = 10,   [CV_MIX_Q3_K_S] = 11, [CV_MIX_Q3_K_M] = 12,
                                [CV_MIX_Q3_K_L] = 13, [CV_MIX_Q4_K_M] = 15, [CV_MIX_Q5_K_M] = 17};
    return p->mix != CV_MIX_NONE ? ftype[p->mix] : cv_quant_file_type(p->type);
}

bool cv_quant_can_write(cv_type t)
{
    if (cv_quant_file_type(t) < 0)
        return false;
    const cv_type_traits *tr = cv_type_get(t);
    return tr && tr->quantize;
}

typedef struct convert_job {
    cv_type src_type, dst_type;
    const uint8_t *src;
    uint8_t *dst;
    int64_t n_rows, row_len;
    size_t src_row_bytes, dst_row_bytes;
    float *scratch; /* one f32 row per thread; NULL when the source is F32 */
} convert_job;

static void convert_range(void *ctx, int ith, int nth)
{
    const convert_job *j = ctx;
    cv_to_float_fn to_float = cv_type_get(j->src_type)->to_float;
    cv_from_float_fn quantize = cv_type_get(j->dst_type)->quantize;
    float *row = j->scratch ? j->scratch + (size_t)ith * (size_t)j->row_len : NULL;
    long r0, r1;
    cv_split_range((long)j->n_rows, ith, nth, &r0, &r1);
    for (long r = r0; r < r1; r++) {
        const uint8_t *s = j->src + (size_t)r * j->src_row_bytes;
        if (row)
            to_float(s, row, j->row_len);
        quantize(row ? row : (const float *)s, j->dst + (size_t)r * j->dst_row_bytes, j->row_len);
    }
}

/* Converts n_rows rows of row_len elements from src (F32, F16 or BF16) to
 * dst (a writable type that fits row_len) on the threads of pool. */
static int convert_rows(cv_type src_type, const void *src, cv_type dst_type, void *dst, int64_t n_rows,
                        int64_t row_len, cv_pool *pool)
{
    convert_job j = {
        .src_type = src_type, .dst_type = dst_type, .src = src, .dst = dst, .n_rows = n_rows,
        .row_len = row_len, .src_row_bytes = cv_row_bytes(src_type, row_len),
        .dst_row_bytes = cv_row_bytes(dst_type, row_len),
    };
    if (src_type != CV_TYPE_F32 &&
        !(j.scratch = cv_malloc((size_t)cv_pool_size(pool) * (size_t)row_len * sizeof(float))))
        return -1;
    cv_pool_run(pool, convert_range, &j);
    cv_free(j.scratch);
    return 0;
}

/* llama.cpp's use_more_bits: the first and last eighth of the layers and
 * every third one between get the higher type. */
static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* The mix's type for attn_v, ffn_down or attn_output (quantize.h). */
static cv_type mix_attn_v(const cv_quantize_params *p, int layer, int n_layer)
{
    if (p->n_expert == 8)
        return CV_TYPE_Q8_0;
    switch (p->mix) {
    case CV_MIX_Q2_K: return p->n_gqa >= 4 ? CV_TYPE_Q4_K : CV_TYPE_Q3_K;
    case CV_MIX_Q3_K_M: return layer < 2 ? CV_TYPE_Q5_K : CV_TYPE_Q4_K;
    case CV_MIX_Q3_K_L: return CV_TYPE_Q5_K;
    case CV_MIX_Q4_K_M:
    case CV_MIX_Q5_K_M: return use_more_bits(layer, n_layer) ? CV_TYPE_Q6_K : p->type;
    default: return p->type;
    }
}

static cv_type mix_ffn_down(const cv_quantize_params *p, int layer, int n_layer)
{
    switch (p->mix) {
    case CV_MIX_Q2_K: return CV_TYPE_Q3_K;
    case CV_MIX_Q3_K_M: return layer < n_layer / 16 ? CV_TYPE_Q5_K : CV_TYPE_Q4_K;
    case CV_MIX_Q3_K_L: return CV_TYPE_Q5_K;
    case CV_MIX_Q4_K_M:
    case CV_MIX_Q5_K_M: return use_more_bits(layer, n_layer) ? CV_TYPE_Q6_K : p->type;
    default: return p->type;
    }
}

static cv_type mix_attn_output(const cv_quantize_params *p)
{
    if (p->n_expert == 8)
        return p->mix == CV_MIX_Q2_K || p->mix == CV_MIX_Q3_K_S || p->mix == CV_MIX_Q3_K_M || p->mix == CV_MIX_Q4_K_M
                   ? CV_TYPE_Q5_K
                   : p->type;
    switch (p->mix) {
    case CV_MIX_Q2_K: return CV_TYPE_Q3_K;
    case CV_MIX_Q3_K_M: return CV_TYPE_Q4_K;
    case CV_MIX_Q3_K_L: return CV_TYPE_Q5_K;
    default: return p->type;
    }
}

/* A fused Q/K/V matrix (phi3's attn_qkv) one step up in the K mixes. */
static cv_type mix_attn_qkv(const cv_quantize_params *p)
{
    switch (p->mix) {
    case CV_MIX_Q3_K_M:
    case CV_MIX_Q3_K_L: return CV_TYPE_Q4_K;
    case CV_MIX_Q4_K_M: return CV_TYPE_Q5_K;
    case CV_MIX_Q5_K_M: return CV_TYPE_Q6_K;
    default: return p->type;
    }
}

cv_type cv_quant_policy_type(const cv_quantize_params *p, const char *name, int layer, int n_layer)
{
    if (!strcmp(name, "output.weight"))
        return p->output_type != CV_TYPE_COUNT ? p->output_type : p->mix != CV_MIX_NONE ? CV_TYPE_Q6_K : p->type;
    if (p->mix == CV_MIX_NONE || layer < 0)
        return p->type;
    if (ends_with(name, "attn_v.weight"))
        return mix_attn_v(p, layer, n_layer);
    if (strstr(name, "ffn_down"))
        return mix_ffn_down(p, layer, n_layer);
    if (ends_with(name, "attn_k.weight") && p->n_expert == 8)
        return CV_TYPE_Q8_0;
    if (ends_with(name, "attn_output.weight"))
        return mix_attn_output(p);
    if (ends_with(name, "attn_qkv.weight"))
        return mix_attn_qkv(p);
    return p->type;
}

int cv_quant_parse_type(const char *name, cv_type *type, cv_quant_mix *mix)
{
    static const struct {
        const char *name;
        cv_type type;
        cv_quant_mix mix;
    } mixes[] = {
        {"Q2_K", CV_TYPE_Q2_K, CV_MIX_Q2_K},     {"Q3_K_S", CV_TYPE_Q3_K, CV_MIX_Q3_K_S},
        {"Q3_K_M", CV_TYPE_Q3_K, CV_MIX_Q3_K_M}, {"Q3_K_L", CV_TYPE_Q3_K, CV_MIX_Q3_K_L},
        {"Q4_K_M", CV_TYPE_Q4_K, CV_MIX_Q4_K_M}, {"Q5_K_M", CV_TYPE_Q5_K, CV_MIX_Q5_K_M},
        {"Q4_K_S", CV_TYPE_Q4_K, CV_MIX_NONE},   {"Q5_K_S", CV_TYPE_Q5_K, CV_MIX_NONE},
    };
    *mix = CV_MIX_NONE;
    for (size_t i = 0; i < sizeof mixes / sizeof mixes[0]; i++)
        if (!strcasecmp(name, mixes[i].name)) {
            *type = mixes[i].type;
            *mix = mixes[i].mix;
            return 0;
        }
    int t = cv_type_from_name(name);
    if (t < 0)
        return -1;
    *type = (cv_type)t;
    return 0;
}

/* Layer index of a "blk.N." tensor name, or -1. */
int cv_quant_layer_of(const char *name)
{
    int layer, n;
    return sscanf(name, "blk.%d.%n", &layer, &n) == 1 && n > 0 ? layer : -1;
}

/* <arch>.<key> (a u32), or 0 when absent. */
static int arch_u32(const gguf_file *f, const char *key_suffix)
{
    gguf_str arch;
    uint32_t n = 0;
    char key[96];
    if (cv_gguf_get_str(f, "general.architecture", &arch, NULL, 0) == 0 && arch.len < 64) {
        snprintf(key, sizeof key, "%.*s.%s", (int)arch.len, arch.ptr, key_suffix);
        if (cv_gguf_find_kv(f, key))
            cv_gguf_get_u32(f, key, &n, NULL, 0);
    }
    return (int)n;
}

/* True when both paths name the same existing file: writing the output
 * would truncate the mapped input. */
static bool same_file(const char *a, const char *b)
{
    struct stat sa, sb;
    return stat(a, &sa) == 0 && stat(b, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

/* Both types the policy can ask for must be writable before anything is read. */
static int check_target_types(const cv_quantize_params *p, char *err, size_t errlen)
{
    cv_type output_type = cv_quant_policy_type(p, "output.weight", -1, 0);
    if (!cv_quant_can_write(p->type))
        return cv_errf(err, errlen, "cannot quantize to %s: not a weight type this build can write",
                       cv_type_name(p->type));
    if (!cv_quant_can_write(output_type))
        return cv_errf(err, errlen, "cannot quantize output.weight to %s: not a weight type this build can write",
                       cv_type_name(output_type));
    return 0;
}

/* One file's conversion: the input, the writer and what it is handed. */
typedef struct quant_run {
    const cv_quantize_params *p;
    cv_quantize_params policy; /* p with the input's n_gqa */
    const char *in_path;
    gguf_file in;
    int n_layer;
    cv_pool *pool;
    gguf_writer *w;
    char **names;   /* per tensor, NUL-terminated: the writer takes C strings */
    cv_type *want;  /* per tensor, the type the policy asked for */
    cv_type *type;  /* per tensor, the type written */
    cv_tensor_note_fn note;
    void *note_ctx;
} quant_run;

/* Every key/value of the input but the two set anew at the end. */
static void copy_keys(quant_run *q)
{
    for (uint64_t i = 0; i < q->in.n_kv; i++)
        if (!cv_gguf_str_eq(q->in.kv[i].key, "general.file_type") &&
            !cv_gguf_str_eq(q->in.kv[i].key, "general.quantization_version"))
            cv_gguf_copy_kv(q->w, &q->in.kv[i]);
}

/* cv_gguf_write's maker of tensor i: converted or copied into dst; then its
 * input pages go and it is noted. */
static int make_tensor(void *ctx, uint64_t i, void *dst, char *err, size_t errlen)
{
    quant_run *q = ctx;
    const gguf_tensor *t = &q->in.tensors[i];
    const int64_t n_rows = t->ne[1] * t->ne[2] * t->ne[3];
    const uint64_t size = (uint64_t)n_rows * cv_row_bytes(q->type[i], t->ne[0]);
    if (q->type[i] == t->type)
        memcpy(dst, t->data, size);
    else if (convert_rows(t->type, t->data, q->type[i], dst, n_rows, t->ne[0], q->pool))
        return cv_errf(err, errlen, "%s: out of memory converting tensor '%s'", q->in_path, q->names[i]);
    cv_fmap_release(&q->in.map, (size_t)((const uint8_t *)t->data - q->in.map.data), (size_t)t->size);
    if (q->note) {
        cv_tensor_note n = {
            .index = (int)i, .count = (int)q->in.n_tensors, .name = q->names[i], .n_dims = t->n_dims,
            .ne = t->ne, .src_type = t->type, .want_type = q->want[i], .type = q->type[i],
            .src_bytes = t->size, .bytes = size,
        };
        q->note(q->note_ctx, &n);
    }
    return 0;
}

/* Input tensor i: a weight matrix gets the policy's type; it is added to
 * the writer, to be made when written. */
static int add_tensor(quant_run *q, uint64_t i, char *err, size_t errlen)
{
    const gguf_tensor *t = &q->in.tensors[i];
    char *name = q->names[i] = cv_gguf_str_dup(t->name);
    if (!name)
        return cv_errf(err, errlen, "%s: out of memory", q->in_path);
    q->want[i] = q->type[i] = t->type;
    if (cv_quant_is_weight_matrix(name, t->n_dims)) {
        q->want[i] = cv_quant_policy_type(&q->policy, name, cv_quant_layer_of(name), q->n_layer);
        q->type[i] = cv_quant_fit_type(q->want[i], t->ne[0]);
    }
    if (q->type[i] != t->type && t->type != CV_TYPE_F32 && t->type != CV_TYPE_F16 && t->type != CV_TYPE_BF16)
        return cv_errf(err, errlen, "%s: tensor '%s' is %s: only F32, F16 and BF16 tensors are converted",
                       q->in_path, name, cv_type_name(t->type));
    const int64_t n_rows = t->ne[1] * t->ne[2] * t->ne[3];
    cv_gguf_add_made_tensor(q->w, name, q->type[i], t->n_dims, t->ne,
                         (uint64_t)n_rows * cv_row_bytes(q->type[i], t->ne[0]), make_tensor, q);
    return 0;
}

/* Writes out_path from the open input: its keys, every tensor, then
 * general.quantization_version and general.file_type. */
static int write_output(quant_run *q, const char *out_path, char *err, size_t errlen)
{
    const size_t n = q->in.n_tensors ? q->in.n_tensors : 1;
    q->w = cv_gguf_writer_create();
    q->names = cv_calloc(n, sizeof(*q->names));
    q->want = cv_calloc(n, sizeof(*q->want));
    q->type = cv_calloc(n, sizeof(*q->type));
    if (!q->w || !q->names || !q->want || !q->type)
        return cv_errf(err, errlen, "%s: out of memory", q->in_path);
    q->n_layer = arch_u32(&q->in, "block_count");
    const int n_head = arch_u32(&q->in, "attention.head_count"), n_head_kv = arch_u32(&q->in, "attention.head_count_kv");
    q->policy = *q->p;
    q->policy.n_gqa = n_head_kv > 0 ? n_head / n_head_kv : 1;
    q->policy.n_expert = arch_u32(&q->in, "expert_count");
    copy_keys(q);
    for (uint64_t i = 0; i < q->in.n_tensors; i++)
        if (add_tensor(q, i, err, errlen) != 0)
            return -1;
    cv_gguf_set_u32(q->w, "general.quantization_version", QUANT_VERSION);
    cv_gguf_set_u32(q->w, "general.file_type", (uint32_t)cv_quant_policy_file_type(q->p));
    return cv_gguf_write(q->w, out_path, err, errlen);
}

/* Releases what write_output allocated, the input and the threads. */
static void close_run(quant_run *q)
{
    for (uint64_t i = 0; q->names && i < q->in.n_tensors; i++)
        cv_free(q->names[i]);
    cv_free(q->names);
    cv_free(q->want);
    cv_free(q->type);
    cv_gguf_writer_free(q->w);
    cv_gguf_close(&q->in);
    cv_pool_free(q->pool);
}

int cv_quantize_file(const char *in_path, const char *out_path, const cv_quantize_params *p,
                     cv_tensor_note_fn note, void *note_ctx, char *err, size_t errlen)
{
    if (check_target_types(p, err, errlen) != 0)
        return -1;
    if (same_file(in_path, out_path))
        return cv_errf(err, errlen, "%s: the output would overwrite the input", out_path);
    quant_run q = {.p = p, .in_path = in_path, .note = note, .note_ctx = note_ctx};
    q.pool = cv_pool_create(p->n_threads);
    if (!q.pool)
        return cv_errf(err, errlen, "cannot start %d threads", p->n_threads);
    if (cv_gguf_open(&q.in, in_path, err, errlen)) {
        cv_pool_free(q.pool);
        return -1;
    }
    int rc = write_output(&q, out_path, err, errlen);
    close_run(&q);
    return rc;
}
