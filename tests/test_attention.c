/* test_attention.c: the fused attention kernel (kernels/attention.h).
 * - the selected version (AVX2, NEON) gives the reference's bits on random
 *   queries, keys and values, F32 and F16 KV, for head_dim 4..256 (with and
 *   without a tail past whole 8-lane chunks), groups 1..9 and position
 *   counts from 1 across several blocks, including counts that are not a
 *   multiple of the block or of 8, peaked and flat softmaxes, and a running
 *   max that grows from block to block;
 * - the result is within rounding of a double-precision attention, also
 *   with the scores soft-capped (Gemma 2: cap * tanh(score / cap)), which
 *   every version applies with the same bits, and with attention sinks
 *   (gpt-oss: one more exp(sink) in each head's denominator);
 * - tokens at consecutive positions in one call give each token's bits
 *   alone, across block edges that some see whole and others in part;
 * - a head's output does not depend on the other heads of its group (a
 *   group of G gives the bits of G groups of 1), on the scratch's previous
 *   contents, or on how (token, KV head) pairs of a batch are split over
 *   1, 2 or 3 threads;
 * - the schedule's exp is within 2 ulp of exp and exact at 0, its tanh
 *   within 1.2e-7 of tanh;
 * - with the engine (not in the kernels-only aarch64 build): stories260K
 *   with an F16 KV cache gives the same logits alone, batched and on 2
 *   threads, and the reference kernels the same as the SIMD ones. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/pool.h"
#include "kernels/attention.h"
#include "kernels/attention_impl.h"
#include "kernels/kernels.h"
#include "test.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_float(void) { return (float)((double)(rng_next() >> 40) / (double)(1ull << 23) - 1.0); }

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* One case's data: n_pos rows of kv_dim values (this head's hd at offset
 * off), as F32 or F16. */
typedef struct kcase {
    int hd, group, n_pos, f16;
    float softcap; /* 0: off */
    float *sinks;  /* [group] or NULL */
    size_t stride, off;
    float *q;
    void *k, *v;
} kcase;

static void make_case(kcase *c, int hd, int group, int n_pos, int f16, float qscale, int ramp)
{
    c->hd = hd;
    c->group = group;
    c->n_pos = n_pos;
    c->f16 = f16;
    c->softcap = 0.0f;
    c->sinks = NULL;
    c->stride = (size_t)hd * 3;
    c->off = (size_t)hd;
    c->q = malloc(sizeof(float) * (size_t)group * hd);
    const size_t esz = f16 ? 2 : 4, n = (size_t)n_pos * c->stride;
    c->k = malloc(n * esz);
    c->v = malloc(n * esz);
    for (int i = 0; i < group * hd; i++)
        c->q[i] = rng_float() * qscale;
    for (size_t i = 0; i < n; i++) {
        const int pos = (int)(i / c->stride), d = (int)(i % c->stride) - hd;
        /* ramp: keys grow along the first query, so the max grows block by block */
        float kf = rng_float();
        if (ramp && d >= 0 && d < hd)
            kf = kf * 0.1f + c->q[d] * (float)pos / (float)n_pos;
        const float vf = rng_float() * 4.0f;
        if (f16) {
            ((cv_fp16 *)c->k)[i] = cv_fp32_to_fp16(kf);
            ((cv_fp16 *)c->v)[i] = cv_fp32_to_fp16(vf);
        } else {
            ((float *)c->k)[i] = kf;
            ((float *)c->v)[i] = vf;
        }
    }
}

/* Gives the case's heads sinks around the scores' size, some above every
 * score (then the sink dominates and rescales the accumulator), some below. */
static void add_sinks(kcase *c, float size)
{
    c->sinks = malloc(sizeof(float) * (size_t)c->group);
    for (int g = 0; g < c->group; g++)
        c->sinks[g] = rng_float() * size;
}

static void free_case(kcase *c)
{
    free(c->sinks);
    free(c->q);
    free(c->k);
    free(c->v);
}

typedef void (*attn_fn)(const cv_attn_args *a);

/* Runs fn on heads [g0, g0 + ng) of the case, scratch poisoned first. */
static void run_case(const kcase *c, attn_fn fn, int g0, int ng, float *out)
{
    const size_t nsc = cv_attn_scratch_floats(c->hd, ng), esz = c->f16 ? 2 : 4;
    float *sc = malloc(sizeof(float) * nsc);
    for (size_t i = 0; i < nsc; i++)
        sc[i] = (i & 1) ? NAN : 1e30f;
    cv_attn_args a = {.head_dim = c->hd,
                      .group = ng,
                      .n_tok = 1,
                      .n_pos = c->n_pos,
                      .scale = 1.0f / sqrtf((float)c->hd),
                      .softcap = c->softcap,
                      .sinks = c->sinks ? c->sinks + g0 : NULL,
                      .q = c->q + (size_t)g0 * c->hd,
                      .kv_type = c->f16 ? CV_TYPE_F16 : CV_TYPE_F32,
                      .k = (const char *)c->k + c->off * esz,
                      .v = (const char *)c->v + c->off * esz,
                      .kv_stride = c->stride,
                      .out = out,
                      .scratch = sc};
    fn(&a);
    free(sc);
}

static double elt(const kcase *c, const void *base, int pos, int d)
{
    const size_t i = (size_t)pos * c->stride + c->off + (size_t)d;
    return c->f16 ? (double)cv_fp16_to_fp32(((const cv_fp16 *)base)[i]) : (double)((const float *)base)[i];
}

/* max |out - exact| / max |v| over the case */
static double error_vs_double(const kcase *c, const float *out)
{
    double worst = 0.0, vmax = 0.0;
    double *s = malloc(sizeof(double) * (size_t)c->n_pos);
    for (int g = 0; g < c->group; g++) {
        double mx = -INFINITY, sum = 0.0;
        for (int i = 0; i < c->n_pos; i++) {
            double dot = 0.0;
            for (int d = 0; d < c->hd; d++)
                dot += (double)c->q[g * c->hd + d] * elt(c, c->k, i, d);
            s[i] = dot / sqrt((double)c->hd);
            if (c->softcap > 0)
                s[i] = c->softcap * tanh(s[i] / c->softcap);
            if (s[i] > mx)
                mx = s[i];
        }
        if (c->sinks && c->sinks[g] > mx)
            mx = c->sinks[g];
        for (int i = 0; i < c->n_pos; i++)
            sum += (s[i] = exp(s[i] - mx));
        if (c->sinks)
            sum += exp(c->sinks[g] - mx);
        for (int d = 0; d < c->hd; d++) {
            double o = 0.0;
            for (int i = 0; i < c->n_pos; i++) {
                const double v = elt(c, c->v, i, d);
                o += s[i] / sum * v;
                if (fabs(v) > vmax)
                    vmax = fabs(v);
            }
            const double e = fabs(o - (double)out[g * c->hd + d]);
            if (e > worst)
                worst = e;
        }
    }
    free(s);
    return vmax > 0 ? worst / vmax : worst;
}

static const int head_dims[] = {4, 8, 12, 64, 80, 128, 256};
static const int groups[] = {1, 2, 4, 7, 9};
static const int n_positions[] = {1, 2, 7, 8, 9, 63, 64, 65, 100, 129, 300};
#define COUNT(a) (int)(sizeof(a) / sizeof((a)[0]))

static void test_simd_matches_ref(void)
{
    int n_cases = 0;
    for (int f16 = 0; f16 < 2; f16++)
        for (int ih = 0; ih < COUNT(head_dims); ih++)
            for (int ig = 0; ig < COUNT(groups); ig++)
                for (int ip = 0; ip < COUNT(n_positions); ip++) {
                    const int hd = head_dims[ih], G = groups[ig], np = n_positions[ip];
                    if (hd >= 128 && G > 4 && np > 100)
                        continue; /* keeps the reference's time down */
                    const float qscale = (ip % 3 == 0) ? 0.5f : (ip % 3 == 1) ? 4.0f : 16.0f;
                    kcase c;
                    make_case(&c, hd, G, np, f16, qscale, ip % 2);
                    /* a third of the cases soft-capped, below their larger scores; half with sinks */
                    c.softcap = (ig + ip) % 3 == 2 ? 3.0f : 0.0f;
                    if ((ih + ig + ip) % 2)
                        add_sinks(&c, 2.0f * qscale);
                    const size_t no = (size_t)G * hd;
                    float *ref = malloc(sizeof(float) * no), *got = malloc(sizeof(float) * no);
                    run_case(&c, cv_attn_group_ref, 0, G, ref);
                    run_case(&c, cv_attn_group, 0, G, got);
                    CHECKF(same_bits(ref, got, no),
                           "%s hd %d group %d n_pos %d %s cap %g sinks %d: differs from the reference",
                           cv_kernels_name(), hd, G, np, f16 ? "F16" : "F32", c.softcap, c.sinks != NULL);
#if defined(__x86_64__)
                    if (cv_kernels_avx2()) {
                        run_case(&c, cv_attn_group_avx2, 0, G, got);
                        CHECKF(same_bits(ref, got, no), "avx2 hd %d group %d n_pos %d cap %g", hd, G, np, c.softcap);
                    }
                    if (!strcmp(cv_kernels_name(), "avx512")) {
                        run_case(&c, cv_attn_group_avx512, 0, G, got);
                        CHECKF(same_bits(ref, got, no), "avx512 hd %d group %d n_pos %d cap %g", hd, G, np,
                               c.softcap);
                    }
#endif
                    const double err = error_vs_double(&c, ref);
                    CHECKF(err < 2e-5, "hd %d group %d n_pos %d %s cap %g sinks %d: error %g against double", hd, G,
                           np, f16 ? "F16" : "F32", c.softcap, c.sinks != NULL, err);
                    /* each head alone (group of 1) gives the same bits */
                    for (int g = 0; g < G; g++) {
                        run_case(&c, cv_attn_group, g, 1, got);
                        CHECKF(same_bits(ref + (size_t)g * hd, got, (size_t)hd),
                               "hd %d group %d n_pos %d: head %d alone differs", hd, G, np, g);
                    }
                    free(ref);
                    free(got);
                    free_case(&c);
                    n_cases++;
                }
    fprintf(stderr, "  %d cases, kernels %s\n", n_cases, cv_kernels_name());
}

/* Tokens at consecutive positions in one call: each token's bits are those
 * of the reference for it alone, across block edges (a block that some
 * tokens see whole and others in part), with q and out rows strided. */
typedef struct tok_case {
    int hd, G, n_pos, n_tok, f16;
    float softcap;
    int sinks; /* each head a sink */
    size_t tok_stride;
} tok_case;

static void run_tokens(const tok_case *tc, const kcase *c, attn_fn fn, int together, float *out)
{
    const size_t nsc = cv_attn_scratch_floats(tc->hd, tc->G * tc->n_tok), esz = tc->f16 ? 2 : 4;
    float *sc = malloc(sizeof(float) * nsc);
    for (size_t i = 0; i < nsc; i++)
        sc[i] = (i & 1) ? NAN : 1e30f;
    memset(out, 0xff, sizeof(float) * tc->tok_stride * (size_t)tc->n_tok);
    cv_attn_args a = {.head_dim = tc->hd,
                      .group = tc->G,
                      .n_tok = together ? tc->n_tok : 1,
                      .scale = 1.0f / sqrtf((float)tc->hd),
                      .softcap = tc->softcap,
                      .sinks = c->sinks,
                      .tok_stride = tc->tok_stride,
                      .kv_type = tc->f16 ? CV_TYPE_F16 : CV_TYPE_F32,
                      .k = (const char *)c->k + c->off * esz,
                      .v = (const char *)c->v + c->off * esz,
                      .kv_stride = c->stride,
                      .scratch = sc};
    for (int t = 0; t < (together ? 1 : tc->n_tok); t++) {
        a.n_pos = tc->n_pos + t;
        a.q = c->q + (size_t)t * tc->tok_stride;
        a.out = out + (size_t)t * tc->tok_stride;
        fn(&a);
    }
    free(sc);
}

static void check_tokens(const tok_case *tc)
{
    kcase c;
    /* the case's q holds n_tok strided rows of G heads; its KV the last token's positions */
    make_case(&c, tc->hd, (int)(tc->tok_stride / (size_t)tc->hd) * tc->n_tok, tc->n_pos + tc->n_tok - 1, tc->f16,
              4.0f, tc->n_pos % 2);
    if (tc->sinks)
        add_sinks(&c, 8.0f);
    const size_t n_out = tc->tok_stride * (size_t)tc->n_tok;
    float *ref = malloc(sizeof(float) * n_out), *got = malloc(sizeof(float) * n_out);
    run_tokens(tc, &c, cv_attn_group_ref, 0, ref);
    struct {
        const char *name;
        attn_fn fn;
        int on;
    } v[] = {{"ref", cv_attn_group_ref, 1}, {cv_kernels_name(), cv_attn_group, 1},
#if defined(__x86_64__)
             {"avx2", cv_attn_group_avx2, cv_kernels_avx2()},
             {"avx512", cv_attn_group_avx512, !strcmp(cv_kernels_name(), "avx512")},
#endif
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        if (!v[i].on)
            continue;
        run_tokens(tc, &c, v[i].fn, 1, got);
        for (int t = 0; t < tc->n_tok; t++)
            CHECKF(same_bits(ref + (size_t)t * tc->tok_stride, got + (size_t)t * tc->tok_stride,
                             (size_t)tc->G * tc->hd),
                   "%s: hd %d group %d n_pos %d, token %d of %d %s cap %g sinks %d: differs from the token alone",
                   v[i].name, tc->hd, tc->G, tc->n_pos, t, tc->n_tok, tc->f16 ? "F16" : "F32", tc->softcap,
                   tc->sinks);
    }
    free(ref);
    free(got);
    free_case(&c);
}

static void test_tokens_together(void)
{
    static const int hds[] = {12, 32, 64, 80, 128}, gs[] = {1, 3, 4, 8};
    static const int starts[] = {1, 5, 57, 63, 64, 65, 120, 190};
    int n_cases = 0;
    for (int f16 = 0; f16 < 2; f16++)
        for (int ih = 0; ih < COUNT(hds); ih++)
            for (int ig = 0; ig < COUNT(gs); ig++)
                for (int is = 0; is < COUNT(starts); is++) {
                    const int n_tok = 1 + (ih + ig + is) % CV_ATTN_TOKENS;
                    const tok_case tc = {.hd = hds[ih], .G = gs[ig], .n_pos = starts[is], .n_tok = n_tok,
                                         .f16 = f16, .softcap = (ih + is) % 2 ? 3.0f : 0.0f,
                                         .sinks = (ig + is) % 2,
                                         .tok_stride = (size_t)(gs[ig] + 1) * hds[ih]};
                    check_tokens(&tc);
                    n_cases++;
                }
    const tok_case most = {.hd = 64, .G = 4, .n_pos = 60, .n_tok = CV_ATTN_TOKENS, .f16 = 1, .tok_stride = 256};
    check_tokens(&most);
    fprintf(stderr, "  %d cases, kernels %s\n", n_cases + 1, cv_kernels_name());
}

static void test_forced_reference(void)
{
    kcase c;
    make_case(&c, 64, 4, 200, 1, 4.0f, 1);
    float ref[256], got[256];
    run_case(&c, cv_attn_group_ref, 0, 4, ref);
    cv_kernels_init(1);
    CHECK(!strcmp(cv_kernels_name(), "ref"));
    run_case(&c, cv_attn_group, 0, 4, got);
    cv_kernels_init(0);
    CHECK(same_bits(ref, got, 256));
    free_case(&c);
}

static void test_exp(void)
{
    CHECK(attn_exp(0.0f) == 1.0f);
    CHECK(attn_exp(-0.0f) == 1.0f);
    CHECK(attn_exp(-INFINITY) >= 0.0f && attn_exp(-INFINITY) < 1e-37f);
    CHECK(isnan(attn_exp(NAN)));
    double worst = 0.0;
    for (int i = 0; i <= 2000000; i++) {
        const float x = -87.0f * (float)i / 2000000.0f;
        const double e = exp((double)x), got = attn_exp(x);
        const float ef = (float)e;
        const double ulp = (double)nextafterf(ef, INFINITY) - (double)ef;
        const double u = fabs(got - e) / ulp;
        if (u > worst)
            worst = u;
    }
    fprintf(stderr, "  exp: worst %.2f ulp on [-87, 0]\n", worst);
    CHECK(worst <= 2.0);
    /* the soft-cap's tanh, built on it */
    CHECK(attn_tanh(0.0f) == 0.0f && !signbit(attn_tanh(0.0f)) && signbit(attn_tanh(-0.0f)));
    CHECK(attn_tanh(INFINITY) == 1.0f && attn_tanh(-INFINITY) == -1.0f && isnan(attn_tanh(NAN)));
    double worst_abs = 0.0;
    for (int i = -2000000; i <= 2000000; i++) {
        const float x = 10.0f * (float)i / 2000000.0f;
        const double e = fabs((double)attn_tanh(x) - tanh((double)x));
        if (e > worst_abs)
            worst_abs = e;
    }
    fprintf(stderr, "  tanh: worst %.3g absolute on [-10, 10]\n", worst_abs);
    CHECK(worst_abs <= 1.2e-7);
}

/* ---- a batch over a pool, as the forward pass runs it ---- */

#define B_TOKENS 5
#define B_KVH 3
#define B_G 4
#define B_HD 64
#define B_CTX 150

typedef struct batch_job {
    const float *q; /* [t][B_KVH * B_G][hd] */
    const void *k, *v; /* [slot][pos][B_KVH * hd] */
    int f16;
    const int *slot, *pos;
    float *out;
    float *scratch;
    size_t scratch_floats;
} batch_job;

static void batch_worker(void *ctx, int ith, int nth)
{
    const batch_job *j = ctx;
    const size_t kv_dim = (size_t)B_KVH * B_HD, esz = j->f16 ? 2 : 4;
    long p0, p1;
    cv_split_range((long)B_TOKENS * B_KVH, ith, nth, &p0, &p1);
    for (long p = p0; p < p1; p++) {
        const int t = (int)(p / B_KVH), h = (int)(p % B_KVH);
        const size_t qo = ((size_t)t * B_KVH * B_G + (size_t)h * B_G) * B_HD;
        const size_t ko = ((size_t)j->slot[t] * B_CTX * kv_dim + (size_t)h * B_HD) * esz;
        cv_attn_args a = {.head_dim = B_HD,
                          .group = B_G,
                          .n_tok = 1,
                          .n_pos = j->pos[t] + 1,
                          .scale = 0.125f,
                          .q = j->q + qo,
                          .kv_type = j->f16 ? CV_TYPE_F16 : CV_TYPE_F32,
                          .k = (const char *)j->k + ko,
                          .v = (const char *)j->v + ko,
                          .kv_stride = kv_dim,
                          .out = j->out + qo,
                          .scratch = j->scratch + (size_t)ith * j->scratch_floats};
        cv_attn_group(&a);
    }
}

static void test_batch_and_threads(void)
{
    const size_t kv_dim = (size_t)B_KVH * B_HD, nq = (size_t)B_TOKENS * B_KVH * B_G * B_HD;
    const size_t nkv = (size_t)B_TOKENS * B_CTX * kv_dim;
    const int slot[B_TOKENS] = {0, 1, 2, 3, 4}, pos[B_TOKENS] = {0, 149, 63, 64, 100};
    float *q = malloc(sizeof(float) * nq), *alone = malloc(sizeof(float) * nq), *out = malloc(sizeof(float) * nq);
    float *kf = malloc(sizeof(float) * nkv), *vf = malloc(sizeof(float) * nkv);
    cv_fp16 *kh = malloc(2 * nkv), *vh = malloc(2 * nkv);
    for (size_t i = 0; i < nq; i++)
        q[i] = rng_float() * 3.0f;
    for (size_t i = 0; i < nkv; i++) {
        kf[i] = rng_float();
        vf[i] = rng_float();
        kh[i] = cv_fp32_to_fp16(kf[i]);
        vh[i] = cv_fp32_to_fp16(vf[i]);
    }
    const size_t sf = cv_attn_scratch_floats(B_HD, B_G);
    float *scratch = malloc(sizeof(float) * 3 * sf);
    for (int f16 = 0; f16 < 2; f16++) {
        batch_job j = {.q = q, .k = f16 ? (void *)kh : (void *)kf, .v = f16 ? (void *)vh : (void *)vf, .f16 = f16,
                       .slot = slot, .pos = pos, .scratch = scratch, .scratch_floats = sf};
        /* each token alone, one thread */
        for (int t = 0; t < B_TOKENS; t++)
            for (int h = 0; h < B_KVH; h++) {
                const size_t qo = ((size_t)t * B_KVH * B_G + (size_t)h * B_G) * B_HD;
                const size_t ko = ((size_t)slot[t] * B_CTX * kv_dim + (size_t)h * B_HD) * (f16 ? 2 : 4);
                cv_attn_args a = {.head_dim = B_HD, .group = B_G, .n_tok = 1, .n_pos = pos[t] + 1, .scale = 0.125f,
                                  .q = q + qo, .kv_type = f16 ? CV_TYPE_F16 : CV_TYPE_F32,
                                  .k = (const char *)j.k + ko, .v = (const char *)j.v + ko, .kv_stride = kv_dim,
                                  .out = alone + qo, .scratch = scratch};
                cv_attn_group(&a);
            }
        for (int threads = 1; threads <= 3; threads++) {
            cv_pool *pool = cv_pool_create(threads);
            CHECK(pool != NULL);
            memset(out, 0xff, sizeof(float) * nq);
            j.out = out;
            cv_pool_run(pool, batch_worker, &j);
            CHECKF(same_bits(alone, out, nq), "%s KV, %d threads: batch differs from tokens alone",
                   f16 ? "F16" : "F32", threads);
            cv_pool_free(pool);
        }
    }
    free(q);
    free(alone);
    free(out);
    free(kf);
    free(vf);
    free(kh);
    free(vh);
    free(scratch);
}

#ifndef CONVOY_KERNELS_ONLY
#include "convoy.h"

#define N_TOK 40

static float *stories_f16_logits(convoy_model *m, int threads, int batched, int *n_vocab)
{
    char err[512];
    convoy_ctx_params p = convoy_ctx_default_params();
    p.n_threads = threads;
    p.n_slot = 2;
    p.n_batch = 64;
    p.n_ctx = 128;
    p.kv_f16 = true;
    convoy_ctx *c = convoy_ctx_create(m, &p, err, sizeof err);
    CHECKF(c != NULL, "%s", err);
    if (!c)
        return NULL;
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    const int32_t nv = info.n_vocab;
    *n_vocab = nv;
    float *logits = malloc(sizeof(float) * (size_t)N_TOK * nv), *other = malloc(sizeof(float) * 2 * nv);
    int32_t tok[2], pos[2], seq[2];
    uint8_t want[2] = {1, 1};
    for (int i = 0; i < N_TOK; i++) {
        int n = 0;
        tok[n] = (int32_t)(1 + (i * 37) % 500);
        pos[n] = i;
        seq[n++] = 0;
        if (batched && i < N_TOK - 5) { /* another sequence beside it, ahead by 5 */
            tok[n] = (int32_t)(7 + (i * 11) % 400);
            pos[n] = i;
            seq[n++] = 1;
        }
        convoy_batch b = {.n_tokens = n, .token = tok, .pos = pos, .seq = seq, .want = want};
        if (convoy_decode(c, &b, other, err, sizeof err)) {
            CHECKF(0, "decode: %s", err);
            break;
        }
        memcpy(logits + (size_t)i * nv, other, sizeof(float) * (size_t)nv);
    }
    free(other);
    convoy_ctx_free(c);
    return logits;
}

static void test_stories_f16_kv(void)
{
    char path[1024], err[512];
    if (!test_shared_path(path, sizeof path, "models/stories260K.gguf"))
        return;
    convoy_model *m = convoy_model_load(path, err, sizeof err);
    CHECKF(m != NULL, "%s", err);
    if (!m)
        return;
    int nv = 0;
    float *base = stories_f16_logits(m, 1, 0, &nv);
    float *two = stories_f16_logits(m, 2, 0, &nv);
    float *batched = stories_f16_logits(m, 2, 1, &nv);
    cv_kernels_init(1);
    float *ref = stories_f16_logits(m, 1, 1, &nv);
    cv_kernels_init(0);
    const size_t n = (size_t)N_TOK * nv;
    if (base && two && batched && ref) {
        CHECKF(same_bits(base, two, n), "2 threads differ");
        CHECKF(same_bits(base, batched, n), "batched differs");
        CHECKF(same_bits(base, ref, n), "reference kernels differ");
    }
    free(base);
    free(two);
    free(batched);
    free(ref);
    convoy_model_free(m);
}
#endif

int main(void)
{
    TEST_RUN(test_exp);
    TEST_RUN(test_simd_matches_ref);
    TEST_RUN(test_tokens_together);
    TEST_RUN(test_forced_reference);
    TEST_RUN(test_batch_and_threads);
#ifndef CONVOY_KERNELS_ONLY
    TEST_RUN(test_stories_f16_kv);
#endif
    return test_summary();
}
