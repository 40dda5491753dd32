/* attention.c: the fused attention's dispatch and its scalar reference
 * (the schedule is in attention.h; attention_avx2.c, attention_avx512.c
 * and attention_neon.c follow it lane for lane). */
#include "kernels/attention.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/attention_impl.h"
#include "kernels/kernels.h"

size_t cv_attn_scratch_floats(int head_dim, int rows)
{
    const size_t n = CV_ATTN_SCRATCH(head_dim, rows);
    return (n + 15) & ~(size_t)15; /* whole 64-byte lines, so threads' scratch never shares one */
}

void cv_attn_group(const cv_attn_args *a)
{
#if defined(__x86_64__)
    if (strcmp(cv_kernels_name(), "avx512") == 0) {
        cv_attn_group_avx512(a);
        return;
    }
    if (cv_kernels_avx2()) {
        cv_attn_group_avx2(a);
        return;
    }
#elif defined(__aarch64__)
    if (strcmp(cv_kernels_name(), "neon") == 0) {
        cv_attn_group_neon(a);
        return;
    }
#endif
    cv_attn_group_ref(a);
}

static inline float elt(const void *row, int f16, int d)
{
    return f16 ? cv_fp16_to_fp32(((const cv_fp16 *)row)[d]) : ((const float *)row)[d];
}

static float score_ref(const float *q, const void *k, int f16, int hd)
{
    float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const int full = hd - hd % 8;
    for (int c = 0; c < full; c += 8)
        for (int l = 0; l < 8; l++)
            a[l] = fmaf(q[c + l], elt(k, f16, c + l), a[l]);
    float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (int d = full; d < hd; d++)
        s = fmaf(q[d], elt(k, f16, d), s);
    return s;
}

/* One token (n_tok 1). */
static void token_ref(const cv_attn_args *a)
{
    const int hd = a->head_dim, G = a->group, f16 = a->kv_type == CV_TYPE_F16;
    const size_t esz = f16 ? sizeof(cv_fp16) : sizeof(float), rstride = a->kv_stride * esz;
    float *S = a->scratch, *m = S + (size_t)G * CV_ATTN_BLOCK, *l = m + G, *alpha = l + G;
    for (int g = 0; g < G; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
    }
    memset(a->out, 0, sizeof(float) * (size_t)G * (size_t)hd);
    for (int p0 = 0; p0 < a->n_pos; p0 += CV_ATTN_BLOCK) {
        const int n = a->n_pos - p0 < CV_ATTN_BLOCK ? a->n_pos - p0 : CV_ATTN_BLOCK;
        /* 1. scores */
        for (int g = 0; g < G; g++)
            for (int i = 0; i < n; i++)
                S[g * CV_ATTN_BLOCK + i] =
                    score_ref(a->q + (size_t)g * hd, (const char *)a->k + (size_t)(p0 + i) * rstride, f16, hd) *
                    a->scale;
        if (a->softcap > 0)
            for (int g = 0; g < G; g++)
                attn_softcap_row(S + g * CV_ATTN_BLOCK, n, a->softcap);
        /* 2. online softmax */
        for (int g = 0; g < G; g++) {
            float *Sg = S + g * CV_ATTN_BLOCK;
            float b[8], t[8];
            for (int j = 0; j < 8; j++) {
                b[j] = -INFINITY;
                t[j] = 0.0f;
            }
            for (int i = 0; i < n; i++)
                b[i % 8] = attn_max(Sg[i], b[i % 8]);
            const float mb = attn_max(attn_max(attn_max(b[0], b[4]), attn_max(b[2], b[6])),
                                      attn_max(attn_max(b[1], b[5]), attn_max(b[3], b[7])));
            const float mn = attn_max(mb, m[g]);
            alpha[g] = attn_exp(m[g] - mn);
            for (int i = 0; i < n; i++) {
                Sg[i] = attn_exp(Sg[i] - mn);
                t[i % 8] = t[i % 8] + Sg[i];
            }
            const float bsum = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
            l[g] = fmaf(l[g], alpha[g], bsum);
            m[g] = mn;
        }
        /* 3. values */
        for (int g = 0; g < G; g++)
            if (alpha[g] != 1.0f)
                for (int d = 0; d < hd; d++)
                    a->out[(size_t)g * hd + d] = a->out[(size_t)g * hd + d] * alpha[g];
        for (int i = 0; i < n; i++) {
            const void *v = (const char *)a->v + (size_t)(p0 + i) * rstride;
            for (int g = 0; g < G; g++) {
                const float p = S[g * CV_ATTN_BLOCK + i];
                float *o = a->out + (size_t)g * hd;
                for (int d = 0; d < hd; d++)
                    o[d] = fmaf(p, elt(v, f16, d), o[d]);
            }
        }
    }
    for (int g = 0; a->sinks && g < G; g++)
        attn_sink(a->sinks[g], &m[g], &l[g], a->out + (size_t)g * hd, hd);
    for (int g = 0; g < G; g++)
        for (int d = 0; d < hd; d++)
            a->out[(size_t)g * hd + d] = a->out[(size_t)g * hd + d] / l[g];
}

void cv_attn_group_ref(const cv_attn_args *a) { attn_each_token(a, token_ref); }
