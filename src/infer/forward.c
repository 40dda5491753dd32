/* forward.c: the Llama forward pass, top to bottom as the architecture,
 * over a batch of tokens and a layer range.
 *
 * Token embeddings (times sqrt(n_embd) for gemma), then for each layer:
 * RMSNorm -> Q, K, V projections (+ biases for qwen2 and gpt-oss, RMSNorm
 * of Q and K per attention head for qwen3 and gemma3) -> RoPE (phi3: LongRoPE's
 * factors and attention factor; gpt-oss: YaRN) -> K and V appended in
 * place to each token's slot -> attention of each (token, attention head) over its
 * slot's positions [0, pos], or (pos - n_swa, pos] on gemma's and
 * gpt-oss's sliding layers, its scores soft-capped for gemma2, gpt-oss's
 * sinks in its softmax -> output projection (+ bias for gpt-oss, RMSNorm
 * for gemma) + residual -> RMSNorm -> SwiGLU (gemma: GeGLU) feed-forward
 * (+ RMSNorm for gemma), or a mixture of experts (each token's top-k
 * experts' SwiGLU FFNs, weighted, + qwen2moe's gated shared expert;
 * gpt-oss: biases on the router and the experts, the weights the softmax
 * of the chosen logits, a clamped SwiGLU; the batch's rows grouped by
 * expert, so each expert's weights are read once per batch), + residual.
 * phi3's fused Q/K/V and gate/up matrices are row views (model/llama.h),
 * computed in one pass each. The last span then applies the final norm and
 * the output matrix to the wanted rows only (and soft-caps the logits when
 * the model asks); rows that pool get the final norm only.
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
#include <stddef.h>
#include <stdatomic.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "kernels/attention.h"
#include "kernels/kernels.h"

/* One product of a job: the rows of w times m activation rows at xq,
 * into y (rows ldy apart). */
typedef struct mm_task {
    cv_weight w;
    const void *xq;
    size_t x_stride;
    int32_t m;
    float *y;
    int32_t ldy;
    long chunk; /* rows per chunk */
    long first; /* the job's chunk index where this task's chunks start */
} mm_task;

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
    const float *rope_factors;  /* [n_rot / 2] divisors of the angles for the cache's context, or NULL */
    float *att_scratch;         /* per thread: cv_attn_scratch_floats(head_dim, group * CV_ATTN_TOKENS) */
    int32_t *att_run;           /* [n + 1] first token of each attention run, then n (attn_runs) */
    int32_t n_att_run;
    int32_t *next_pos;          /* [n_slot] validation scratch */

    /* a mixture of experts (n_expert > 0; k = n_expert_used), else NULL */
    float *probs;         /* [n][n_expert] router logits, then their softmax */
    int32_t *choice;      /* [n][k] each token's experts, best first */
    float *choice_w;      /* [n][k] their weights */
    int32_t *group_first; /* [n_expert + 1] where each expert's rows start in the grouped order */
    int32_t *row_at;      /* [n][k] the grouped row of each (token, choice) */
    float *xs;            /* [n * k][n_embd] the experts' input rows, grouped by expert */
    float *eg, *eu;       /* [n * k][n_ff_exp] the experts' gate and up, grouped */
    float *ed;            /* [n * k][n_embd] the experts' outputs, grouped */
    float *moe_out;       /* [n][n_embd] the weighted sum (+ the gated shared expert) */
    float *shexp_g;       /* [n] the shared expert's gate (qwen2moe) */
    mm_task *tasks;       /* [2 * n_expert] one pass's products */
    cv_experts *experts;  /* the experts' cache (model/experts.h) */
    int32_t *used;        /* [n_expert] the experts the batch chose, ascending */
    cv_expert *held;      /* [n_expert] their matrices, in the cache */
};

static size_t max_sz(size_t a, size_t b) { return a > b ? a : b; }

/* One thread's attention scratch: a run of CV_ATTN_TOKENS tokens. */
static size_t attn_scratch_floats(const cv_llama_hparams *hp)
{
    return cv_attn_scratch_floats(hp->head_dim, hp->n_head / hp->n_head_kv * CV_ATTN_TOKENS);
}

/* The buffers of a mixture of experts, for n_batch_max tokens; -1 when
 * out of memory (cv_forward_free releases what was allocated). */
static int alloc_experts(cv_forward *f)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const size_t n = (size_t)f->n_batch_max, rows = n * (size_t)hp->n_expert_used, n_embd = (size_t)hp->n_embd;
    f->probs = cv_aligned_alloc(sizeof(float) * n * (size_t)hp->n_expert);
    f->choice = cv_calloc(rows, sizeof *f->choice);
    f->choice_w = cv_calloc(rows, sizeof *f->choice_w);
    f->group_first = cv_calloc((size_t)hp->n_expert + 1, sizeof *f->group_first);
    f->row_at = cv_calloc(rows, sizeof *f->row_at);
    f->xs = cv_aligned_alloc(sizeof(float) * rows * n_embd);
    f->eg = cv_aligned_alloc(sizeof(float) * rows * (size_t)hp->n_ff_exp);
    f->eu = cv_aligned_alloc(sizeof(float) * rows * (size_t)hp->n_ff_exp);
    f->ed = cv_aligned_alloc(sizeof(float) * rows * n_embd);
    f->moe_out = cv_aligned_alloc(sizeof(float) * n * n_embd);
    f->shexp_g = cv_aligned_alloc(sizeof(float) * n);
    f->tasks = cv_calloc(2 * (size_t)hp->n_expert, sizeof *f->tasks);
    f->used = cv_calloc((size_t)hp->n_expert, sizeof *f->used);
    f->held = cv_calloc((size_t)hp->n_expert, sizeof *f->held);
    return f->probs && f->choice && f->choice_w && f->group_first && f->row_at && f->xs && f->eg && f->eu && f->ed &&
                   f->moe_out && f->shexp_g && f->tasks && f->used && f->held
               ? 0
               : -1;
}

cv_forward *cv_forward_create(const cv_llama *m, cv_kv *kv, cv_pool *pool, cv_experts *experts, int32_t n_batch_max,
                              char *err, size_t errlen)
{
    const cv_llama_hparams *hp = &m->hp;
    if (n_batch_max < 1) {
        cv_errf(err, errlen, "batch size must be at least 1");
        return NULL;
    }
    if (hp->n_expert && m->l1 > m->l0 && (!experts || cv_experts_n_slot(experts) < cv_experts_min_slots(m, n_batch_max))) {
        cv_errf(err, errlen, "a mixture of experts needs a cache of at least %d expert slots for batches of %d",
                cv_experts_min_slots(m, n_batch_max), n_batch_max);
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
    f->experts = experts;
    f->n_batch_max = n_batch_max;
    f->n_threads = cv_pool_size(pool);
    f->rope_factors = cv_llama_rope_factors(m, kv->n_ctx);
    const size_t n = (size_t)n_batch_max, n_q = (size_t)hp->n_head * hp->head_dim,
                 n_kv = (size_t)hp->n_head_kv * hp->head_dim, n_ff = (size_t)hp->n_ff;
    const size_t max_in = max_sz(max_sz(max_sz((size_t)hp->n_embd, n_q), n_ff), (size_t)hp->n_ff_exp);
    const size_t k = hp->n_expert ? (size_t)hp->n_expert_used : 1; /* activation rows per token */
    f->x = cv_aligned_alloc(sizeof(float) * n * hp->n_embd);
    f->xn = cv_aligned_alloc(sizeof(float) * n * hp->n_embd);
    f->q = cv_aligned_alloc(sizeof(float) * n * n_q);
    f->k = cv_aligned_alloc(sizeof(float) * n * n_kv);
    f->v = cv_aligned_alloc(sizeof(float) * n * n_kv);
    f->att = cv_aligned_alloc(sizeof(float) * n * n_q);
    f->gate = cv_aligned_alloc(sizeof(float) * n * n_ff);
    f->up = cv_aligned_alloc(sizeof(float) * n * n_ff);
    f->xq = cv_aligned_alloc(n * k * (4 * max_in + 64));
    f->rope_cos = cv_aligned_alloc(sizeof(float) * n * (size_t)(hp->n_rot / 2 + 1));
    f->rope_sin = cv_aligned_alloc(sizeof(float) * n * (size_t)(hp->n_rot / 2 + 1));
    f->swa_cos = cv_aligned_alloc(sizeof(float) * n * (size_t)(hp->n_rot / 2 + 1));
    f->swa_sin = cv_aligned_alloc(sizeof(float) * n * (size_t)(hp->n_rot / 2 + 1));
    f->att_scratch = cv_aligned_alloc(sizeof(float) * (size_t)f->n_threads * attn_scratch_floats(hp));
    f->att_run = cv_calloc(n + 1, sizeof *f->att_run);
    f->next_pos = cv_calloc((size_t)kv->n_slot, sizeof *f->next_pos);
    if (!f->x || !f->xn || !f->q || !f->k || !f->v || !f->att || !f->gate || !f->up || !f->xq || !f->rope_cos ||
        !f->rope_sin || !f->swa_cos || !f->swa_sin || !f->att_scratch || !f->att_run || !f->next_pos ||
        (hp->n_expert && alloc_experts(f))) {
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
    cv_free_aligned(f->probs);
    cv_free(f->choice);
    cv_free(f->choice_w);
    cv_free(f->group_first);
    cv_free(f->row_at);
    cv_free_aligned(f->xs);
    cv_free_aligned(f->eg);
    cv_free_aligned(f->eu);
    cv_free_aligned(f->ed);
    cv_free_aligned(f->moe_out);
    cv_free_aligned(f->shexp_g);
    cv_free(f->tasks);
    cv_free(f->used);
    cv_free(f->held);
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
    cv_glu glu;
} glu_job;

/* gelu's tanh approximation: sqrt(2/pi) (x + 0.044715 x^3) inside */
static float glu_gelu(float g, float u)
{
    return 0.5f * g * (1.0f + tanhf(0.7978845608f * g * (1.0f + 0.044715f * g * g))) * u;
}

/* gpt-oss's SwiGLU (ggml's swiglu_oai, alpha 1.702, limit 7): the gate
 * clamped above, up on both sides, then up shifted by 1 */
static float glu_oai(float g, float u)
{
    const float x = 7.0f < g ? 7.0f : g, y = u < -7.0f ? -7.0f : 7.0f < u ? 7.0f : u;
    return x / (1.0f + expf(1.702f * -x)) * (y + 1.0f);
}

/* gate = act(gate, up) over this thread's share (a prompt's exp calls
 * are too many for one thread while the other waits); SwiGLU's by the
 * kernel (kernels.h) */
static void glu_worker(void *ctx, int ith, int nth)
{
    const glu_job *j = ctx;
    long lo, hi;
    cv_split_range(j->n, ith, nth, &lo, &hi);
    if (j->glu == CV_GLU_SILU) {
        cv_silu_mul(j->gate + lo, j->up + lo, hi - lo);
        return;
    }
    float (*act)(float, float) = j->glu == CV_GLU_OAI ? glu_oai : glu_gelu;
    for (long i = lo; i < hi; i++)
        j->gate[i] = act(j->gate[i], j->up[i]);
}

/* YaRN's ramp ends in rotations over the original context: llama.cpp's
 * defaults (gpt-oss's converter writes none). */
#define YARN_BETA_FAST 32.0f
#define YARN_BETA_SLOW 1.0f

/* The rotary dimension that turns `rotations` times over the original
 * context (ggml_rope_yarn_corr_dim). */
static float yarn_corr_dim(const cv_llama_hparams *hp, float rotations, float base)
{
    return (float)hp->n_rot * logf((float)hp->n_ctx_orig / (rotations * 2 * (float)M_PI)) / (2 * logf(base));
}

/* YaRN's angle of pair i from its unscaled angle: the interpolated one
 * (times freq_scale) below the ramp, the unscaled one above it, mixed
 * linearly on the ramp between the pairs corr[0] and corr[1] (ggml's
 * rope_yarn). */
static float yarn_angle(float extrap, float freq_scale, const float corr[2], int32_t i, float ext)
{
    const float width = 0.001f > corr[1] - corr[0] ? 0.001f : corr[1] - corr[0];
    const float y = ((float)i - corr[0]) / width, y0 = 0.0f > y ? 0.0f : y;
    const float mix = (1 - (1.0f < y0 ? 1.0f : y0)) * ext;
    return freq_scale * extrap * (1 - mix) + extrap * mix;
}

/* cos/sin of each rotary pair i for each token's position: the angle is
 * pos * scale * base^(-2i/n_rot), divided by the RoPE factor i when the
 * model has them (Llama 3.1 scaling, Phi-3's LongRoPE); the powers are
 * formed by repeated multiplication, as llama.cpp does; with YaRN the
 * scale enters by yarn_angle. Both are then multiplied by rope_mscale (1
 * but for LongRoPE and YaRN). */
static void rope_tables(cv_forward *f, const cv_batch *b, float base, float scale, float *cos_t, float *sin_t)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const float *freqs = f->rope_factors, mscale = hp->rope_mscale;
    const int32_t half = hp->n_rot / 2;
    const float theta_scale = powf(base, -2.0f / (float)hp->n_rot);
    float corr[2] = {0, 0}; /* ggml_rope_yarn_corr_dims */
    if (hp->yarn_ext) {
        const float lo = floorf(yarn_corr_dim(hp, YARN_BETA_FAST, base));
        const float hi = ceilf(yarn_corr_dim(hp, YARN_BETA_SLOW, base));
        corr[0] = 0 > lo ? 0 : lo;
        corr[1] = (float)(hp->n_rot - 1) < hi ? (float)(hp->n_rot - 1) : hi;
    }
    for (int32_t t = 0; t < b->n_tokens; t++) {
        float theta = (float)b->pos[t] * (hp->yarn_ext ? 1.0f : scale);
        for (int32_t i = 0; i < half; i++) {
            float angle = freqs ? theta / freqs[i] : theta;
            if (hp->yarn_ext)
                angle = yarn_angle(angle, scale, corr, i, hp->yarn_ext);
            cos_t[(size_t)t * half + i] = cosf(angle) * mscale;
            sin_t[(size_t)t * half + i] = sinf(angle) * mscale;
            theta *= theta_scale;
        }
    }
}

/* Rotates the first n_rot values of each attention head by the tables' angles: pairs
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
    mm_task *task;
    int n_task;
    long total;       /* the chunks of every task */
    atomic_long next; /* the next chunk to take */
} matmul_job;

/* The task chunk c belongs to: the last whose first chunk is <= c. */
static const mm_task *task_of(const matmul_job *j, long c)
{
    int lo = 0, hi = j->n_task - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (j->task[mid].first <= c)
            lo = mid;
        else
            hi = mid - 1;
    }
    return &j->task[lo];
}

static void matmul_worker(void *ctx, int ith, int nth)
{
    (void)ith, (void)nth;
    matmul_job *j = ctx;
    for (long c; (c = atomic_fetch_add_explicit(&j->next, 1, memory_order_relaxed)) < j->total;) {
        const mm_task *t = task_of(j, c);
        const cv_weight *w = &t->w;
        const long r0 = (c - t->first) * t->chunk;
        const long r1 = r0 + t->chunk < w->n_out ? r0 + t->chunk : w->n_out;
        if (w->interleaved)
            cv_matmul_interleaved(w->type, w->data, w->n_in, t->xq, t->x_stride, t->m, t->y, t->ldy, r0, r1);
        else
            cv_matmul_rows(w->type, w->data, w->n_in, t->xq, t->x_stride, t->m, t->y, t->ldy, r0, r1);
    }
}

/* Each task's chunk size and where its chunks start; returns the bytes of
 * weights the job reads, once per activation row. */
static size_t plan_chunks(matmul_job *j, int nth)
{
    size_t bytes = 0;
    j->total = 0;
    for (int i = 0; i < j->n_task; i++) {
        mm_task *t = &j->task[i];
        const long n = t->w.n_out, want = (n + (long)nth * CHUNKS_PER_THREAD - 1) / ((long)nth * CHUNKS_PER_THREAD);
        t->chunk = (want + CHUNK_ALIGN - 1) / CHUNK_ALIGN * CHUNK_ALIGN;
        t->first = j->total;
        j->total += (n + t->chunk - 1) / t->chunk;
        bytes += cv_row_bytes(t->w.type, t->w.n_in) * (size_t)n * (size_t)t->m;
    }
    atomic_init(&j->next, 0);
    return bytes;
}

/* Runs the n_task products of task over the pool. */
static void run_tasks(cv_forward *f, mm_task *task, int n_task)
{
    matmul_job j = {.task = task, .n_task = n_task};
    const size_t bytes = plan_chunks(&j, cv_pool_size(f->pool));
    if (j.total > 0)
        run_job(f, bytes, matmul_worker, &j);
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

/* The m rows of x (n_in wide) as w's activation type: x itself for F32,
 * else converted into f->xq. *stride: the bytes from row to row. */
static const void *convert_act(cv_forward *f, const float *x, int32_t m, const cv_weight *w, size_t *stride)
{
    const cv_type act = cv_type_get(w->type)->vec_dot_type;
    const int32_t n_in = w->n_in;
    if (act == CV_TYPE_F32) {
        *stride = sizeof(float) * (size_t)n_in;
        return x;
    }
    *stride = cv_row_bytes(act, n_in);
    quant_job qj = {.from_float = cv_type_get(act)->from_float, .x = x, .xq = f->xq, .n_in = n_in, .stride = *stride,
                    .m = m};
    run_job(f, sizeof(float) * (size_t)n_in * (size_t)m, quant_worker, &qj);
    return f->xq;
}

/* Converts m rows of x (n_in wide) to the activation type of w[0] (all the
 * weights of one call share n_in and the activation type), then computes
 * y[i] = w[i] . x for each i in one pass over the pool. */
static void matmul(cv_forward *f, const float *x, int32_t m, const cv_weight *const *w, float *const *y, int n_w)
{
    mm_task task[3];
    size_t stride;
    const void *xq = convert_act(f, x, m, w[0], &stride);
    for (int i = 0; i < n_w; i++)
        task[i] = (mm_task){.w = *w[i], .xq = xq, .x_stride = stride, .m = m, .y = y[i], .ldy = w[i]->n_out};
    run_tasks(f, task, n_w);
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
    const float *sinks = f->m->layers[j->layer].sinks;
    cv_attn_args a = {.head_dim = hd,
                      .group = group,
                      .scale = hp->attn_scale,
                      .softcap = hp->attn_softcap,
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
        a.sinks = sinks ? sinks + (size_t)kvh * group : NULL;
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

/* Each token's K and V rows into its slot, in the cache's type by the
 * selected row conversion (F32: a copy; F16: F16C's rounding). */
static void kv_store(cv_forward *f, const cv_batch *b, int32_t layer)
{
    cv_kv *kv = f->kv;
    const size_t kv_dim = (size_t)kv->kv_dim;
    const cv_from_float_fn store = cv_type_get(kv->type)->from_float;
    for (int32_t t = 0; t < b->n_tokens; t++) {
        store(f->k + t * kv_dim, cv_kv_at(kv, kv->k, layer, b->seq[t], b->pos[t]), (int64_t)kv_dim);
        store(f->v + t * kv_dim, cv_kv_at(kv, kv->v, layer, b->seq[t], b->pos[t]), (int64_t)kv_dim);
    }
}

/* ---- the pass ---- */

const float *cv_forward_pooled(const cv_forward *f) { return f->xn; }

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
    if (L->q_norm) { /* RMSNorm per attention head, in place */
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
    if (L->bo)
        add_bias_rows(f->xn, L->bo, n, n_embd);
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
    glu_job gj = {.gate = f->gate, .up = f->up, .n = (long)n * hp->n_ff, .glu = hp->glu};
    run_job(f, sizeof(float) * 2 * (size_t)gj.n, glu_worker, &gj);
    const cv_weight *d_w[1] = {&L->w_down};
    float *const d_y[1] = {f->xn};
    matmul(f, f->gate, n, d_w, d_y, 1);
    if (L->post_ffn_norm)
        rmsnorm_rows(f->xn, f->xn, L->post_ffn_norm, n, n_embd, hp->rms_eps);
    add_rows(f->x, f->xn, (size_t)n * n_embd);
}

/* ---- a mixture of experts ---- */

/* x = softmax(x), n values in place, the sum in double as llama.cpp's
 * soft_max. */
static void softmax(float *x, int32_t n)
{
    float max = x[0];
    for (int32_t e = 1; e < n; e++)
        max = x[e] > max ? x[e] : max;
    double sum = 0.0;
    for (int32_t e = 0; e < n; e++) {
        x[e] = expf(x[e] - max);
        sum += (double)x[e];
    }
    const float scale = (float)(1.0 / sum);
    for (int32_t e = 0; e < n; e++)
        x[e] *= scale;
}

/* Token t's route: the softmax of its router logits (in place), the k
 * most probable experts best first (a tie goes to the lower index), their
 * probabilities as weights, scaled to sum to 1 when the model asks;
 * gpt-oss's: the k largest logits, their softmax as weights. */
static void route_token(cv_forward *f, int32_t t)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const int32_t n_expert = hp->n_expert, k = hp->n_expert_used;
    float *p = f->probs + (size_t)t * n_expert;
    int32_t *choice = f->choice + (size_t)t * k;
    float *w = f->choice_w + (size_t)t * k;
    if (!hp->expert_softmax_chosen)
        softmax(p, n_expert);
    bool taken[CV_LLAMA_MAX_EXPERTS] = {0};
    float w_sum = 0.0f;
    for (int32_t j = 0; j < k; j++) {
        int32_t best = -1;
        for (int32_t e = 0; e < n_expert; e++)
            if (!taken[e] && (best < 0 || p[e] > p[best]))
                best = e;
        taken[best] = true;
        choice[j] = best;
        w[j] = p[best];
        w_sum += w[j];
    }
    if (hp->expert_softmax_chosen)
        softmax(w, k);
    if (hp->expert_norm)
        for (int32_t j = 0; j < k; j++)
            w[j] /= w_sum;
}

/* Routes the n tokens (the router on f->xn), then groups the (token,
 * choice) pairs by expert, in token order within an expert, and copies
 * each pair's input row to its grouped row of f->xs. */
static void route(cv_forward *f, int32_t n, const cv_llama_layer *L)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const int32_t n_expert = hp->n_expert, k = hp->n_expert_used, n_embd = hp->n_embd;
    const cv_weight *r_w[1] = {&L->router};
    float *const r_y[1] = {f->probs};
    matmul(f, f->xn, n, r_w, r_y, 1);
    if (L->router_b)
        add_bias_rows(f->probs, L->router_b, n, n_expert);
    memset(f->group_first, 0, sizeof *f->group_first * (size_t)(n_expert + 1));
    for (int32_t t = 0; t < n; t++) {
        route_token(f, t);
        for (int32_t j = 0; j < k; j++)
            f->group_first[f->choice[(size_t)t * k + j] + 1]++;
    }
    for (int32_t e = 0; e < n_expert; e++)
        f->group_first[e + 1] += f->group_first[e];
    /* group_first[e] counts up through expert e's rows, ending at e + 1's first */
    for (int32_t t = 0; t < n; t++)
        for (int32_t j = 0; j < k; j++) {
            const size_t pair = (size_t)t * k + j;
            const int32_t row = f->group_first[f->choice[pair]]++;
            f->row_at[pair] = row;
            memcpy(f->xs + (size_t)row * n_embd, f->xn + (size_t)t * n_embd, sizeof(float) * (size_t)n_embd);
        }
    for (int32_t e = n_expert - 1; e > 0; e--)
        f->group_first[e] = f->group_first[e - 1];
    f->group_first[0] = 0;
}

/* ys[i] = the part[i] matrix (offsetof(cv_expert, gate), ...) of each
 * expert the batch uses times the grouped rows routed to it, in one pass
 * over the pool: each expert's weights are read once for all its rows.
 * The parts share their input width and activation type, `like`'s (the
 * layer's stack of the first); x holds n * k grouped rows. */
static void run_experts(cv_forward *f, const float *x, int32_t n, int32_t n_used, const cv_weight *like,
                        const size_t *part, float *const *ys, int n_parts)
{
    size_t stride;
    const char *xq = convert_act(f, x, n * f->m->hp.n_expert_used, like, &stride);
    int n_task = 0;
    for (int32_t u = 0; u < n_used; u++) {
        const int32_t e = f->used[u], first = f->group_first[e], m = f->group_first[e + 1] - first;
        for (int i = 0; i < n_parts; i++) {
            const cv_weight *w = (const cv_weight *)((const char *)&f->held[u] + part[i]);
            f->tasks[n_task++] = (mm_task){.w = *w, .xq = xq + (size_t)first * stride, .x_stride = stride, .m = m,
                                           .y = ys[i] + (size_t)first * w->n_out, .ldy = w->n_out};
        }
    }
    run_tasks(f, f->tasks, n_task);
}

/* The experts the batch chose, into f->used, and their matrices, from the
 * cache (read from the file when not in it). */
static int use_experts(cv_forward *f, int32_t l, int32_t *n_used, char *err, size_t errlen)
{
    *n_used = 0;
    for (int32_t e = 0; e < f->m->hp.n_expert; e++)
        if (f->group_first[e + 1] > f->group_first[e])
            f->used[(*n_used)++] = e;
    return cv_experts_use(f->experts, l, f->used, *n_used, f->held, err, errlen);
}

/* Adds each used expert's row of `bias` ([n_expert][width], gpt-oss's)
 * to its grouped rows of y. */
static void add_expert_bias(const cv_forward *f, float *y, const float *bias, int32_t width, int32_t n_used)
{
    for (int32_t u = 0; u < n_used; u++) {
        const int32_t e = f->used[u], first = f->group_first[e];
        add_bias_rows(y + (size_t)first * width, bias + (size_t)e * width, f->group_first[e + 1] - first, width);
    }
}

/* Each token's experts' outputs weighted and summed in choice order (as
 * llama.cpp adds the views of its experts), into f->moe_out. */
static void combine_experts(cv_forward *f, int32_t n)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const int32_t k = hp->n_expert_used, n_embd = hp->n_embd;
    for (int32_t t = 0; t < n; t++) {
        float *out = f->moe_out + (size_t)t * n_embd;
        for (int32_t j = 0; j < k; j++) {
            const float w = f->choice_w[(size_t)t * k + j];
            const float *d = f->ed + (size_t)f->row_at[(size_t)t * k + j] * n_embd;
            for (int32_t i = 0; i < n_embd; i++)
                out[i] = j == 0 ? w * d[i] : out[i] + w * d[i];
        }
    }
}

/* qwen2moe's shared expert: a SwiGLU FFN of f->xn (the layer's dense
 * matrices) times sigmoid(gate . xn), added to f->moe_out. */
static void add_shared_expert(cv_forward *f, int32_t n, const cv_llama_layer *L)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const int32_t n_embd = hp->n_embd;
    const cv_weight *gu_w[3] = {&L->w_gate, &L->w_up, &L->shexp_gate};
    float *const gu_y[3] = {f->gate, f->up, f->shexp_g};
    matmul_shared_input(f, f->xn, n, gu_w, gu_y, 3);
    glu_job gj = {.gate = f->gate, .up = f->up, .n = (long)n * hp->n_ff};
    run_job(f, sizeof(float) * 2 * (size_t)gj.n, glu_worker, &gj);
    const cv_weight *d_w[1] = {&L->w_down};
    float *const d_y[1] = {f->xn};
    matmul(f, f->gate, n, d_w, d_y, 1);
    for (int32_t t = 0; t < n; t++) {
        const float g = 1.0f / (1.0f + expf(-f->shexp_g[t]));
        for (int32_t i = 0; i < n_embd; i++)
            f->moe_out[(size_t)t * n_embd + i] += f->xn[(size_t)t * n_embd + i] * g;
    }
}

/* The mixture of experts of layer l: norm, routing, the chosen experts
 * (from the cache), their SwiGLU FFNs (gate and up, then down, each over
 * the experts the batch uses; gpt-oss: each plus its expert's bias, and
 * its clamped SwiGLU), their weighted sum (+ the shared expert), added to
 * the residual. */
static int moe_block(cv_forward *f, int32_t n, int32_t l, char *err, size_t errlen)
{
    const cv_llama_hparams *hp = &f->m->hp;
    const cv_llama_layer *L = &f->m->layers[l];
    rmsnorm_rows(f->xn, f->x, L->ffn_norm, n, hp->n_embd, hp->rms_eps);
    route(f, n, L);
    int32_t n_used;
    if (use_experts(f, l, &n_used, err, errlen))
        return -1;
    const size_t gu_part[2] = {offsetof(cv_expert, gate), offsetof(cv_expert, up)};
    float *const gu_y[2] = {f->eg, f->eu};
    if (same_act(&L->gate_exps, &L->up_exps))
        run_experts(f, f->xs, n, n_used, &L->gate_exps, gu_part, gu_y, 2);
    else
        for (int i = 0; i < 2; i++)
            run_experts(f, f->xs, n, n_used, i ? &L->up_exps : &L->gate_exps, gu_part + i, gu_y + i, 1);
    if (L->gate_exps_b) {
        add_expert_bias(f, f->eg, L->gate_exps_b, hp->n_ff_exp, n_used);
        add_expert_bias(f, f->eu, L->up_exps_b, hp->n_ff_exp, n_used);
    }
    glu_job gj = {.gate = f->eg, .up = f->eu, .n = (long)n * hp->n_expert_used * hp->n_ff_exp, .glu = hp->glu};
    run_job(f, sizeof(float) * 2 * (size_t)gj.n, glu_worker, &gj);
    const size_t d_part[1] = {offsetof(cv_expert, down)};
    float *const d_y[1] = {f->ed};
    run_experts(f, f->eg, n, n_used, &L->down_exps, d_part, d_y, 1);
    if (L->down_exps_b)
        add_expert_bias(f, f->ed, L->down_exps_b, hp->n_embd, n_used);
    combine_experts(f, n);
    if (L->shexp_gate.data)
        add_shared_expert(f, n, L);
    add_rows(f->x, f->moe_out, (size_t)n * hp->n_embd);
    return 0;
}

/* The residual stream's first rows: token embeddings (scaled for gemma),
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
        rope_tables(f, b, hp->rope_theta_swa, hp->rope_scale_swa, f->swa_cos, f->swa_sin);
    attn_runs(f, b);
    for (int32_t l = m->l0; l < m->l1; l++) {
        attention_block(f, b, l);
        if (!hp->n_expert)
            ffn_block(f, n, l);
        else if (moe_block(f, n, l, err, errlen))
            return -1;
    }

    for (int32_t t = 0; t < n; t++)
        f->kv->len[b->seq[t]] = b->pos[t] + 1;

    if (!cv_llama_has_output(m)) {
        memcpy(out, f->x, sizeof(float) * (size_t)n * n_embd);
        return 0;
    }
    /* pooled rows first, normalized into xn (rows pooled <= t: nothing of
     * x is overwritten before it is read), then the logits rows, moved up
     * in x and normalized there */
    int32_t n_pool = 0, n_want = 0;
    for (int32_t t = 0; t < n; t++)
        if (cv_want_pools(b->want[t]))
            rmsnorm_rows(f->xn + (size_t)n_pool++ * n_embd, f->x + (size_t)t * n_embd, m->output_norm, 1, n_embd,
                         hp->rms_eps);
    for (int32_t t = 0; t < n; t++)
        if (cv_want_logits(b->want[t]))
            memmove(f->x + (size_t)n_want++ * n_embd, f->x + (size_t)t * n_embd, sizeof(float) * n_embd);
    if (n_want == 0)
        return 0;
    rmsnorm_rows(f->x, f->x, m->output_norm, n_want, n_embd, hp->rms_eps);
    const cv_weight *out_w[1] = {&m->output};
    float *const out_y[1] = {out};
    matmul(f, f->x, n_want, out_w, out_y, 1);
    if (hp->logit_softcap > 0)
        for (size_t i = 0; i < (size_t)n_want * hp->n_vocab; i++)
            out[i] = hp->logit_softcap * tanhf(out[i] / hp->logit_softcap);
    return 0;
}
