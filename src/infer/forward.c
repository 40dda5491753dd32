/* forward.c: the Llama forward pass, top to bottom as the architecture,
 * over a batch of tokens and a layer range.
 *
 * Token embeddings (times sqrt(n_embd) for gemma3), then for each layer:
 * RMSNorm -> Q, K, V projections (+ biases for qwen2, per-head RMSNorm of Q
 * and K for qwen3 and gemma3) -> RoPE -> K and V appended in place to each
 * token's slot -> attention of each (token, head) over its slot's positions
 * [0, pos], or (pos - n_swa, pos] on gemma3's sliding layers -> output
 * projection (+ RMSNorm for gemma3) + residual -> RMSNorm -> SwiGLU (gemma3:
 * GeGLU) feed-forward (+ RMSNorm for gemma3) + residual. The span holding
 * the head then applies the final norm and the output matrix to the wanted
 * rows only (and soft-caps the logits when the model asks).
 *
 * All buffers are allocated by cv_forward_create for n_batch_max tokens;
 * cv_forward_run allocates nothing. Matrix products and attention are split
 * over the pool's threads by output rows and by (token, KV head) pairs: each
 * value is computed by one thread in one fixed order, never split along the
 * reduction, so results do not depend on threads or batch composition. A
 * job too small to repay waking the pool runs on the calling thread.
 * Activations are converted to each weight's vec_dot_type (Q8_0 for Q4_0
 * and Q8_0 weights...) once per distinct type, as llama.cpp's CPU backend
 * does. */
#include "infer/forward.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "kernels/attention.h"
#include "kernels/kernels.h"

struct cv_forward {
    const cv_llama *m;
    cv_kv *kv;
    cv_pool *pool;
    int32_t n_batch_max;
    int32_t n_threads;

    float *x;    /* [n][n_embd] residual stream */
    float *xn;   /* [n][n_embd] normalized */
    float *q;    /* [n][n_q] */
    float *k;    /* [n][n_kv] */
    float *v;    /* [n][n_kv] */
    float *att;  /* [n][n_q] attention output */
    float *gate; /* [n][n_ff] */
    float *up;   /* [n][n_ff] */
    void *xq;    /* activations converted for the weights: n rows of up to 4 * max_in bytes */
    float *rope_cos, *rope_sin; /* [n][n_rot / 2] */
    float *swa_cos, *swa_sin;   /* [n][n_rot / 2] for the sliding layers (their own RoPE base) */
    float *att_scratch;         /* per thread: cv_attn_scratch_floats(head_dim, group * CV_ATTN_TOKENS) */
    int32_t *att_run;           /* [n + 1] first token of each attention run, then n (attn_runs) */
    int32_t n_att_run;
    int32_t *next_pos;          /* [n_slot] validation scratch */
};

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* One thread's attention scratch: a run of CV_ATTN_TOKENS tokens. */
static size_t attn_scratch_floats(const cv_llama_hparams *hp)
{
    return cv_attn_scratch_floats(hp->head_dim, hp->n_head / hp->n_head_kv * CV_ATTN_TOKENS);
}

cv_forward *cv_forward_create(const cv_llama *m, cv_kv *kv, cv_pool *pool, int32_t n_batch_max, char *err,
                              size_t errlen)
{
    const cv_llama_hparams *hp = &m->hp;
    if (n_batch_max < 1) {
        cv_errf(err, errlen, "batch size must be at least 1");
        return NULL;
    }
    if (kv->l0 != m->l0 || kv->l1 != m->l1 || kv->kv_dim != hp->n_head_kv * hp->head_dim) {
        cv_errf(err, errlen, "KV cache does not match the model's layer range or shape");
        return NULL;
    }
    cv_forward *f = cv_calloc(1, sizeof *f);
    if (!f) {
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    f->m = m;
    f->kv = kv;
    f->pool = pool;
    f->n_batch_max = n_batch_max;
    f->n_threads = cv_pool_size(pool);
    const size_t n = (size_t)n_batch_max, n_q = (size_t)hp->n_head * hp->head_dim,
                 n_kv = (size_t)hp->n_head_kv * hp->head_dim, n_ff = (size_t)hp->n_ff;
    const size_t max_in = max_sz(max_sz((size_t)hp->n_embd, n_q), n_ff);
    f->x = cv_aligned_alloc(sizeof(float) * n * hp->n_embd);
    f->xn = cv_aligned_alloc(sizeof(float) * n * hp->n_embd);
    f->q = cv_aligned_alloc(sizeof(float) * n * n_q);
    f->k = cv_aligned_alloc(sizeof(float) * n * n_kv);
    f->v = cv_aligned_alloc(sizeof(float) * n * n_kv);
    f->att = cv_aligned_alloc(sizeof(float) * n * n_q);
    f->gate = cv_aligned_alloc(sizeof(float) * n * n_ff);
    f->up = cv_aligned_alloc(sizeof(float) * n * n_ff);
    f->xq = cv_aligned_alloc(n * (4 * max_in + 64));
    f->rope_cos = cv_aligned_alloc(sizeof(float) * n * (size_t)(hp->n_rot / 2 + 1));
    f->rope_sin = cv_aligned_alloc(sizeof(float) * n * (size_t)(hp->n_rot / 2 + 1));
    f->swa_cos = cv_aligned_alloc(sizeof(float) * n * (size_t)(hp->n_rot / 2 + 1));
    f->swa_sin = cv_aligned_alloc(sizeof(float) * n * (size_t)(hp->n_rot / 2 + 1));
    f->att_scratch = cv_aligned_alloc(sizeof(float) * (size_t)f->n_threads * attn_scratch_floats(hp));
    f->att_run = cv_calloc(n + 1, sizeof *f->att_run);
    f->next_pos = cv_calloc((size_t)kv->n_slot, sizeof *f->next_pos);
    if (!f->x || !f->xn || !f->q || !f->k || !f->v || !f->att || !f->gate || !f->up || !f->xq || !f->rope_cos ||
        !f->rope_sin || !f->swa_cos || !f->swa_sin || !f->att_scratch || !f->att_run || !f->next_pos) {
        cv_forward_free(f);
        cv_errf(err, errlen, "out of memory for forward buffers (batch %d)", n_batch_max);
        return NULL;
    }
    return f;
}

void cv_forward_free(cv_forward *f)
{
    if (!f)
        return;
    cv_free_aligned(f->x);
    cv_free_aligned(f->xn);
    cv_free_aligned(f->q);
    cv_free_aligned(f->k);
    cv_free_aligned(f->v);
    cv_free_aligned(f->att);
    cv_free_aligned(f->gate);
    cv_free_aligned(f->up);
    cv_free_aligned(f->xq);
    cv_free_aligned(f->rope_cos);
    cv_free_aligned(f->rope_sin);
    cv_free_aligned(f->swa_cos);
    cv_free_aligned(f->swa_sin);
    cv_free_aligned(f->att_scratch);
    cv_free(f->att_run);
    cv_free(f->next_pos);
    cv_free(f);
}


/* ---- element-wise operations (one thread but swiglu; cheap next to the matmuls) ---- */

/* y = x / rms(x) * w, rows of n; the sum of squares in double, as llama.cpp. */
static void rmsnorm_rows(float *y, const float *x, const float *w, int32_t rows, int32_t n, float eps)
{
    for (int32_t r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * n;
        float *yr = y + (size_t)r * n;
        double sum = 0.0;
        for (int32_t i = 0; i < n; i++)
            sum += (double)(xr[i] * xr[i]);
        const float mean = (float)(sum / n);
        const float scale = 1.0f / sqrtf(mean + eps);
        for (int32_t i = 0; i < n; i++)
            yr[i] = (xr[i] * scale) * w[i];
    }
}

static void add_rows(float *x, const float *d, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] += d[i];
}

/* A job that reads fewer bytes than this runs on the calling thread alone:
 * waking the pool costs microseconds, more than such a job takes (the
 * 260K-parameter stories model decoded 4200 tokens/s with 2 threads,
 * 31000 with 1). Which thread computes an output never changes its bits. */
#define POOL_MIN_BYTES (256 * 1024)

static void run_job(cv_forward *f, size_t bytes, cv_pool_fn fn, void *ctx)
{
    if (bytes < POOL_MIN_BYTES)
        fn(ctx, 0, 1);
    else
        cv_pool_run(f->pool, fn, ctx);
}

typedef struct glu_job {
    float *gate;
    const float *up;
    long n;
    bool gelu; /* GeGLU (Gemma), else SwiGLU */
} glu_job;

static float silu(float g) { return g / (1.0f + expf(-g)); }

/* gelu's tanh approximation: sqrt(2/pi) (x + 0.044715 x^3) inside */
static float gelu(float g) { return 0.5f * g * (1.0f + tanhf(0.7978845608f * g * (1.0f + 0.044715f * g * g))); }

/* gate = act(gate) * up over this thread's share (a prompt's expf calls
 * are too many for one thread while the other waits) */
static void glu_worker(void *ctx, int ith, int nth)
{
    const glu_job *j = ctx;
    float (*act)(float) = j->gelu ? gelu : silu;
    long lo, hi;
    cv_split_range(j->n, ith, nth, &lo, &hi);
    for (long i = lo; i < hi; i++)
        j->gate[i] = act(j->gate[i]) * j->up[i];
}

/* cos/sin of each rotary pair i for each token's position: the angle is
 * pos * scale * base^(-2i/n_rot), divided by rope_freqs[i] when the model
 * has them (Llama 3.1 scaling); the powers are formed by repeated
 * multiplication, as llama.cpp does. */
static void rope_tables(cv_forward *f, const cv_batch *b, float base, float scale, float *cos_t, float *sin_t)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const float *freqs = f->m->rope_freqs;
    const int32_t half = hp->n_rot / 2;
    const float theta_scale = powf(base, -2.0f / (float)hp->n_rot);
    for (int32_t t = 0; t < b->n_tokens; t++) {
        float theta = (float)b->pos[t] * scale;
        for (int32_t i = 0; i < half; i++) {
            const float angle = freqs ? theta / freqs[i] : theta;
            cos_t[(size_t)t * half + i] = cosf(angle);
            sin_t[(size_t)t * half + i] = sinf(angle);
            theta *= theta_scale;
        }
    }
}

/* Rotates the first n_rot values of each head by the tables' angles: pairs
 * (2i, 2i+1), or (i, i + n_rot/2) for NeoX-style models. */
static void rope_rows(const cv_forward *f, float *x, int32_t n_tokens, int32_t n_heads, const float *cos_t,
                      const float *sin_t)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const int32_t half = hp->n_rot / 2, hd = hp->head_dim;
    const int32_t stride = hp->rope_neox ? 1 : 2, offset = hp->rope_neox ? half : 1;
    for (int32_t t = 0; t < n_tokens; t++) {
        const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
        for (int32_t h = 0; h < n_heads; h++) {
            float *p = x + ((size_t)t * n_heads + h) * hd;
            for (int32_t i = 0; i < half; i++) {
                float *a = p + i * stride, *b = a + offset;
                const float x0 = *a, x1 = *b;
                *a = x0 * c[i] - x1 * s[i];
                *b = x0 * s[i] + x1 * c[i];
            }
        }
    }
}

static void add_bias_rows(float *x, const float *bias, int32_t rows, int32_t n)
{
    for (int32_t r = 0; r < rows; r++)
        add_rows(x + (size_t)r * n, bias, (size_t)n);
}

/* ---- matrix products over the pool ---- */

/* Rows are handed out in chunks, about CHUNKS_PER_THREAD per thread and
 * weight, from one counter: a thread slowed by another process on its core
 * takes fewer, so two threads stay ahead of one. Which thread computes a
 * row never changes its bits. Chunks are whole multiples of CHUNK_ALIGN rows
 * (the tile kernels' row groups). */
#define CHUNKS_PER_THREAD 8
#define CHUNK_ALIGN 16

typedef struct matmul_job {
    const cv_weight *w[3];
    float *y[3];
    long chunk[3];    /* rows per chunk of each weight */
    long first[4];    /* chunk index where each weight's chunks start; first[n_w]: the total */
    int n_w;
    const void *xq;
    size_t x_stride;
    int32_t m;
    atomic_long next; /* the next chunk to take */
} matmul_job;

static void matmul_worker(void *ctx, int ith, int nth)
{
    (void)ith, (void)nth;
    matmul_job *j = ctx;
    for (long c; (c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->first[j->n_w];) {
        int i = 0;
        while (c >= j->first[i + 1])
            i++;
        const cv_weight *w = j->w[i];
        const long r0 = (c - j->first[i]) * j->chunk[i];
        const long r1 = r0 + j->chunk[i] < w->n_out ? r0 + j->chunk[i] : w->n_out;
        if (w->interleaved)
            cv_matmul_interleaved(w->type, w->data, w->n_in, j->xq, j->x_stride, j->m, j->y[i], w->n_out, r0, r1);
        else
            cv_matmul_rows(w->type, w->data, w->n_in, j->xq, j->x_stride, j->m, j->y[i], w->n_out, r0, r1);
    }
}

/* Each weight's chunk size and where its chunks start. */
static void plan_chunks(matmul_job *j, int nth)
{
    j->first[0] = 0;
    for (int i = 0; i < j->n_w; i++) {
        const long n = j->w[i]->n_out, want = (n + (long)nth * CHUNKS_PER_THREAD - 1) / ((long)nth * CHUNKS_PER_THREAD);
        j->chunk[i] = (want + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
        j->first[i + 1] = j->first[i] + (n + j->chunk[i] - 1) / j->chunk[i];
    }
    atomic_init(&j->next, 0);
}

typedef struct quant_job {
    cv_from_float_fn from_float;
    const float *x;
    char *xq;
    int32_t n_in;
    size_t stride;
    int32_t m;
} quant_job;

/* This thread's share of the m rows of x in the activation type. */
static void quant_worker(void *ctx, int ith, int nth)
{
    const quant_job *j = ctx;
    long lo, hi;
    cv_split_range(j->m, ith, nth, &lo, &hi);
    for (long t = lo; t < hi; t++)
        j->from_float(j->x + (size_t)t * j->n_in, j->xq + (size_t)t * j->stride, j->n_in);
}

/* Converts m rows of x (n_in wide) to the activation type of w[0] (all the
 * weights of one call share n_in and the activation type), then computes
 * y[i] = w[i] . x for each i in one pass over the pool. */
static void matmul(cv_forward *f, const float *x, int32_t m, const cv_weight *const *w, float *const *y, int n_w)
{
    const cv_type act = cv_type_get(w[0]->type)->vec_dot_type;
    const cv_type_traits *at = cv_type_get(act);
    const int32_t n_in = w[0]->n_in;
    matmul_job j = {.n_w = n_w, .m = m};
    for (int i = 0; i < n_w; i++) {
        j.w[i] = w[i];
        j.y[i] = y[i];
    }
    plan_chunks(&j, cv_pool_size(f->pool));
    if (act == CV_TYPE_F32) {
        j.xq = x;
        j.x_stride = sizeof(float) * (size_t)n_in;
    } else {
        j.x_stride = cv_row_bytes(act, n_in);
        quant_job qj = {.from_float = at->from_float, .x = x, .xq = f->xq, .n_in = n_in, .stride = j.x_stride, .m = m};
        run_job(f, sizeof(float) * (size_t)n_in * (size_t)m, quant_worker, &qj);
        j.xq = f->xq;
    }
    size_t bytes = 0; /* the weights, read once per token */
    for (int i = 0; i < n_w; i++)
        bytes += cv_row_bytes(w[i]->type, n_in) * (size_t)w[i]->n_out * (size_t)m;
    run_job(f, bytes, matmul_worker, &j);
}

static bool same_act(const cv_weight *a, const cv_weight *b)
{
    return cv_type_get(a->type)->vec_dot_type == cv_type_get(b->type)->vec_dot_type;
}

/* Projections sharing one input: grouped when their activation types agree. */
static void matmul_shared_input(cv_forward *f, const float *x, int32_t m, const cv_weight *const *w,
                                float *const *y, int n_w)
{
    int start = 0;
    while (start < n_w) {
        int end = start + 1;
        while (end < n_w && same_act(w[start], w[end]))
            end++;
        matmul(f, x, m, w + start, y + start, end - start);
        start = end;
    }
}

/* ---- attention ---- */

typedef struct attn_job {
    cv_forward *f;
    const cv_batch *b;
    int32_t layer;
    int32_t window; /* n_swa on a sliding layer, else 0 */
} attn_job;

/* Splits the batch into runs for the attention kernel: up to
 * CV_ATTN_TOKENS tokens of one slot at consecutive positions, which meet
 * each K and V row once for all of them (a prompt's chunk, a verify
 * window). */
static void attn_runs(cv_forward *f, const cv_batch *b)
{
    int32_t n = 0;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const bool extends = n > 0 && t - f->att_run[n - 1] < CV_ATTN_TOKENS && b->seq[t] == b->seq[t - 1] &&
                             b->pos[t] == b->pos[t - 1] + 1;
        if (!extends)
            f->att_run[n++] = t;
    }
    f->att_run[n] = b->n_tokens;
    f->n_att_run = n;
}

/* One (run, KV head) pair at a time: the fused kernel runs the group's
 * query heads of the run's tokens together over the slot's positions. On
 * a sliding layer each token is a run of its own over its window's
 * positions, so its bits never depend on its neighbours in the batch. */
static void attn_worker(void *ctx, int ith, int nth)
{
    const attn_job *j = ctx;
    cv_forward *f = j->f;
    const cv_llama_hparams *hp = &f->m->hp;
    const cv_kv *kv = f->kv;
    const int32_t hd = hp->head_dim, n_head = hp->n_head, n_head_kv = hp->n_head_kv, group = n_head / n_head_kv;
    cv_attn_args a = {.head_dim = hd,
                      .group = group,
                      .scale = hp->attn_scale,
                      .tok_stride = (size_t)n_head * hd,
                      .kv_type = kv->type,
                      .kv_stride = (size_t)kv->kv_dim,
                      .scratch = f->att_scratch + (size_t)ith * attn_scratch_floats(hp)};
    /* dealt round-robin: a later run sees more positions, and contiguous
     * ranges gave the last of two threads 3/4 of a prompt's attention */
    const long n_runs = j->window ? j->b->n_tokens : f->n_att_run;
    for (long p = ith; p < n_runs * n_head_kv; p += nth) {
        const int32_t r = (int32_t)(p / n_head_kv), kvh = (int32_t)(p % n_head_kv);
        const int32_t t = j->window ? r : f->att_run[r], slot = j->b->seq[t], pos = j->b->pos[t];
        const int32_t first = j->window && pos >= j->window ? pos + 1 - j->window : 0;
        const size_t qoff = ((size_t)t * n_head + (size_t)kvh * group) * hd, kvoff = (size_t)kvh * hd * kv->elt_size;
        a.n_tok = j->window ? 1 : f->att_run[r + 1] - t;
        a.n_pos = pos + 1 - first;
        a.q = f->q + qoff;
        a.out = f->att + qoff;
        a.k = (const char *)cv_kv_at(kv, kv->k, j->layer, slot, first) + kvoff;
        a.v = (const char *)cv_kv_at(kv, kv->v, j->layer, slot, first) + kvoff;
        cv_attn_group(&a);
    }
}

/* The K and V bytes the batch's attention reads in one layer. */
static size_t attn_bytes(const cv_forward *f, const cv_batch *b)
{
    size_t positions = 0;
    for (int32_t t = 0; t < b->n_tokens; t++)
        positions += (size_t)b->pos[t] + 1;
    return positions * 2 * cv_row_bytes(f->kv->type, f->kv->kv_dim);
}

static void kv_store(cv_forward *f, const cv_batch *b, int32_t layer)
{
    cv_kv *kv = f->kv;
    const size_t kv_dim = (size_t)kv->kv_dim;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        void *kd = cv_kv_at(kv, kv->k, layer, b->seq[t], b->pos[t]);
        void *vd = cv_kv_at(kv, kv->v, layer, b->seq[t], b->pos[t]);
        const float *ks = f->k + t * kv_dim, *vs = f->v + t * kv_dim;
        if (kv->type == CV_TYPE_F32) {
            memcpy(kd, ks, sizeof(float) * kv_dim);
            memcpy(vd, vs, sizeof(float) * kv_dim);
        } else {
            for (size_t i = 0; i < kv_dim; i++) {
                ((cv_fp16 *)kd)[i] = cv_fp32_to_fp16(ks[i]);
                ((cv_fp16 *)vd)[i] = cv_fp32_to_fp16(vs[i]);
            }
        }
    }
}

/* ---- the pass ---- */

int cv_forward_check(cv_forward *f, const cv_batch *b, bool rollback, char *err, size_t errlen)
{
    const cv_kv *kv = f->kv;
    if (b->n_tokens < 1 || b->n_tokens > f->n_batch_max)
        return cv_errf(err, errlen, "batch of %d tokens is outside [1, %d]", b->n_tokens, f->n_batch_max);
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const int32_t s = b->seq[t];
        if (s < 0 || s >= kv->n_slot)
            return cv_errf(err, errlen, "token %d: sequence slot %d is outside [0, %d)", t, s, kv->n_slot);
        f->next_pos[s] = -1; /* no token of s seen yet */
    }
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const int32_t s = b->seq[t];
        const bool cut = f->next_pos[s] < 0 && rollback; /* the slot's first token, which may cut it back */
        const int32_t expect = f->next_pos[s] < 0 ? kv->len[s] : f->next_pos[s];
        if (cut ? b->pos[t] < 0 || b->pos[t] > expect : b->pos[t] != expect)
            return cv_errf(err, errlen, "token %d: position %d in slot %d, expected %s%d", t, b->pos[t], s,
                           cut ? "0 to " : "", expect);
        if (b->pos[t] >= kv->n_ctx)
            return cv_errf(err, errlen, "slot %d is full: position %d reaches the context size %d", s, b->pos[t],
                           kv->n_ctx);
        f->next_pos[s] = b->pos[t] + 1;
        if (cv_llama_has_embd(f->m) && (b->token[t] < 0 || b->token[t] >= f->m->hp.n_vocab))
            return cv_errf(err, errlen, "token %d: id %d is outside the vocabulary [0, %d)", t, b->token[t],
                           f->m->hp.n_vocab);
    }
    return 0;
}

/* Attention of layer l: norm, projections, RoPE, the KV store, attention,
 * the output projection (and its norm), added to the residual. */
static void attention_block(cv_forward *f, const cv_batch *b, int32_t l)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const cv_llama_layer *L = &f->m->layers[l];
    const int32_t n = b->n_tokens, n_embd = hp->n_embd;
    const bool slides = cv_llama_layer_slides(hp, l);
    rmsnorm_rows(f->xn, f->x, L->attn_norm, n, n_embd, hp->rms_eps);
    const cv_weight *qkv_w[3] = {&L->wq, &L->wk, &L->wv};
    float *const qkv_y[3] = {f->q, f->k, f->v};
    matmul_shared_input(f, f->xn, n, qkv_w, qkv_y, 3);
    if (L->bq) {
        add_bias_rows(f->q, L->bq, n, hp->n_head * hp->head_dim);
        add_bias_rows(f->k, L->bk, n, hp->n_head_kv * hp->head_dim);
        add_bias_rows(f->v, L->bv, n, hp->n_head_kv * hp->head_dim);
    }
    if (L->q_norm) { /* per-head RMSNorm, in place */
        rmsnorm_rows(f->q, f->q, L->q_norm, n * hp->n_head, hp->head_dim, hp->rms_eps);
        rmsnorm_rows(f->k, f->k, L->k_norm, n * hp->n_head_kv, hp->head_dim, hp->rms_eps);
    }
    const float *c = slides ? f->swa_cos : f->rope_cos, *s = slides ? f->swa_sin : f->rope_sin;
    rope_rows(f, f->q, n, hp->n_head, c, s);
    rope_rows(f, f->k, n, hp->n_head_kv, c, s);
    kv_store(f, b, l);
    attn_job aj = {.f = f, .b = b, .layer = l, .window = slides ? hp->n_swa : 0};
    run_job(f, attn_bytes(f, b), attn_worker, &aj);
    const cv_weight *o_w[1] = {&L->wo};
    float *const o_y[1] = {f->xn};
    matmul(f, f->att, n, o_w, o_y, 1);
    if (L->post_attn_norm)
        rmsnorm_rows(f->xn, f->xn, L->post_attn_norm, n, n_embd, hp->rms_eps);
    add_rows(f->x, f->xn, (size_t)n * n_embd);
}

/* The feed-forward of layer l: norm, gate and up, SwiGLU or GeGLU, down
 * (and its norm), added to the residual. */
static void ffn_block(cv_forward *f, int32_t n, int32_t l)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const cv_llama_layer *L = &f->m->layers[l];
    const int32_t n_embd = hp->n_embd;
    rmsnorm_rows(f->xn, f->x, L->ffn_norm, n, n_embd, hp->rms_eps);
    const cv_weight *gu_w[2] = {&L->w_gate, &L->w_up};
    float *const gu_y[2] = {f->gate, f->up};
    matmul_shared_input(f, f->xn, n, gu_w, gu_y, 2);
    glu_job gj = {.gate = f->gate, .up = f->up, .n = (long)n * hp->n_ff, .gelu = hp->arch == CV_ARCH_GEMMA3};
    run_job(f, sizeof(float) * 2 * (size_t)gj.n, glu_worker, &gj);
    const cv_weight *d_w[1] = {&L->w_down};
    float *const d_y[1] = {f->xn};
    matmul(f, f->gate, n, d_w, d_y, 1);
    if (L->post_ffn_norm)
        rmsnorm_rows(f->xn, f->xn, L->post_ffn_norm, n, n_embd, hp->rms_eps);
    add_rows(f->x, f->xn, (size_t)n * n_embd);
}

/* The residual stream's first rows: token embeddings (scaled for gemma3),
 * or the previous stage's hidden states. */
static void embed(cv_forward *f, const cv_batch *b, const float *in)
{
    const cv_llama *m = f->m;
    const int32_t n = b->n_tokens, n_embd = m->hp.n_embd;
    if (!cv_llama_has_embd(m)) {
        memcpy(f->x, in, sizeof(float) * (size_t)n * n_embd);
        return;
    }
    const cv_type_traits *et = cv_type_get(m->tok_embd.type);
    const size_t row = cv_row_bytes(m->tok_embd.type, n_embd);
    for (int32_t t = 0; t < n; t++)
        et->to_float((const char *)m->tok_embd.data + (size_t)b->token[t] * row, f->x + (size_t)t * n_embd, n_embd);
    if (m->hp.embd_scale != 1.0f)
        for (size_t i = 0; i < (size_t)n * n_embd; i++)
            f->x[i] *= m->hp.embd_scale;
}

int cv_forward_run(cv_forward *f, const cv_batch *b, const float *in, float *out, char *err, size_t errlen)
{
    if (cv_forward_check(f, b, false, err, errlen))
        return -1;
    const cv_llama *m = f->m;
    const cv_llama_hparams *hp = &m->hp;
    const int32_t n = b->n_tokens, n_embd = hp->n_embd;

    embed(f, b, in);
    rope_tables(f, b, hp->rope_theta, hp->rope_scale, f->rope_cos, f->rope_sin);
    if (hp->n_swa)
        rope_tables(f, b, hp->rope_theta_swa, 1.0f, f->swa_cos, f->swa_sin);
    attn_runs(f, b);
    for (int32_t l = m->l0; l < m->l1; l++) {
        attention_block(f, b, l);
        ffn_block(f, n, l);
    }

    for (int32_t t = 0; t < n; t++)
        f->kv->len[b->seq[t]] = b->pos[t] + 1;

    if (!cv_llama_has_head(m)) {
        memcpy(out, f->x, sizeof(float) * (size_t)n * n_embd);
        return 0;
    }
    int32_t n_want = 0;
    for (int32_t t = 0; t < n; t++)
        if (b->want[t])
            memmove(f->x + (size_t)n_want++ * n_embd, f->x + (size_t)t * n_embd, sizeof(float) * n_embd);
    if (n_want == 0)
        return 0;
    rmsnorm_rows(f->xn, f->x, m->output_norm, n_want, n_embd, hp->rms_eps);
    const cv_weight *out_w[1] = {&m->output};
    float *const out_y[1] = {out};
    matmul(f, f->xn, n_want, out_w, out_y, 1);
    if (hp->logit_softcap > 0)
        for (size_t i = 0; i < (size_t)n_want * hp->n_vocab; i++)
            out[i] = hp->logit_softcap * tanhf(out[i] / hp->logit_softcap);
    return 0;
}
