/* test_kernels.c: the kernels of F32, F16, BF16, Q8_0, Q4_0, Q5_0, Q5_1,
 * IQ4_NL and MXFP4 (with Q8_1 activations).
 *
 * The selected (SIMD) kernels must give the same bits as the references
 * (vec_dot, activation conversion) on random rows of many lengths and on
 * raw random quant bytes; the quantizers must follow llama.cpp's rules
 * (checked on blocks whose result is known by hand) and round-trip within
 * the quantization step; vec_dot must agree with a double-precision dot of
 * the dequantized rows; cv_matmul_rows (tile kernels and their tails) must
 * give each output the bits of vec_dot_ref whatever the number of rows and
 * tokens, the row split, the width, or the forced reference, for these
 * types and the K-quants (Q2_K and Q3_K: vec_dot alone). */
#include <math.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "kernels/kernels_impl.h"
#include "kernels/quants32.h"
#include "test.h"

#define RNG_SEED 0x9e3779b97f4a7c15ull
static uint64_t rng_state = RNG_SEED;

static uint64_t rng_next(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* uniform in [-1, 1) */
static float rng_float(void)
{
    return (float)((double)(rng_next() >> 40) / (double)(1ull << 23) - 1.0);
}

/* Random activations/weights: each run of 32 has its own scale (2^-6 ..
 * 2^6), and some runs are all zero. */
static void fill_random(float *x, int n)
{
    for (int i = 0; i < n; i += 32) {
        uint64_t r = rng_next();
        float scale = (r & 15) == 0 ? 0.0f : ldexpf(1.0f, (int)((r >> 8) % 13) - 6);
        for (int j = i; j < n && j < i + 32; j++)
            x[j] = rng_float() * scale;
    }
}

static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

static const cv_type weight_types[] = {CV_TYPE_F32,  CV_TYPE_F16,  CV_TYPE_BF16,   CV_TYPE_Q8_0, CV_TYPE_Q4_0,
                                       CV_TYPE_Q5_0, CV_TYPE_Q5_1, CV_TYPE_IQ4_NL, CV_TYPE_MXFP4};
#define N_WEIGHT_TYPES (int)(sizeof(weight_types) / sizeof(weight_types[0]))

static const int lengths[] = {1, 2, 3, 7, 8, 9, 15, 16, 31, 32, 33, 63, 64, 65, 96, 100, 127, 128,
                              160, 255, 256, 288, 1000, 1024, 2080, 4096, 4097, 8192};
#define N_LENGTHS (int)(sizeof(lengths) / sizeof(lengths[0]))

/* Converts x (n floats) to a weight row of type t and an activation row of
 * its vec_dot_type with the selected kernels. */
static void make_rows(cv_type t, const float *w, const float *x, int n, void *wq, void *xq)
{
    const cv_type_traits *tt = cv_type_get(t);
    tt->quantize(w, wq, n);
    cv_type_get(tt->vec_dot_type)->from_float(x, xq, n);
}

static int simd_selected(void)
{
    return strcmp(cv_kernels_name(), "ref") != 0;
}

static void test_type_table(void)
{
    for (int i = 0; i < N_WEIGHT_TYPES; i++) {
        cv_type t = weight_types[i];
        const cv_type_traits *tt = cv_type_get(t);
        CHECK(tt != NULL);
        if (!tt)
            continue;
        const char *name;
        int blck;
        size_t size;
        CHECK(cv_ggml_type_info(t, &name, &blck, &size));
        CHECKF(strcmp(name, tt->name) == 0 && blck == tt->blck_size && size == tt->type_size, "%s", tt->name);
        CHECK(strcmp(cv_type_name(t), tt->name) == 0);
        CHECK(cv_type_from_name(tt->name) == (int)t);
        CHECK(tt->to_float && tt->from_float && tt->quantize && tt->vec_dot && tt->vec_dot_ref);
        CHECK(cv_type_get(tt->vec_dot_type) != NULL);
    }
    CHECK(cv_type_from_name("q4_0") == CV_TYPE_Q4_0);
    CHECK(cv_type_from_name("bf16") == CV_TYPE_BF16);
    CHECK(cv_type_from_name("Q4_1") == -1);
    CHECK(cv_type_from_name("Q4_0x") == -1);
    CHECK(cv_type_from_name("") == -1);
    CHECK(cv_type_from_name(NULL) == -1);
    CHECK(cv_type_get(CV_TYPE_Q4_0)->vec_dot_type == CV_TYPE_Q8_0);
    CHECK(cv_type_get(CV_TYPE_Q5_0)->vec_dot_type == CV_TYPE_Q8_0);
    CHECK(cv_type_get(CV_TYPE_IQ4_NL)->vec_dot_type == CV_TYPE_Q8_0);
    CHECK(cv_type_get(CV_TYPE_MXFP4)->vec_dot_type == CV_TYPE_Q8_0);
    CHECK(cv_type_get(CV_TYPE_Q5_1)->vec_dot_type == CV_TYPE_Q8_1);
    CHECK(cv_type_get(CV_TYPE_Q8_1) && !cv_type_get(CV_TYPE_Q8_1)->quantize); /* activations only */
    CHECK(cv_type_from_name("iq4_nl") == CV_TYPE_IQ4_NL);
    CHECK(cv_row_bytes(CV_TYPE_Q5_0, 64) == 44 && cv_row_bytes(CV_TYPE_Q5_1, 64) == 48);
    CHECK(cv_row_bytes(CV_TYPE_IQ4_NL, 64) == 36 && cv_row_bytes(CV_TYPE_Q8_1, 64) == 72);
    CHECK(cv_type_from_name("mxfp4") == CV_TYPE_MXFP4 && cv_row_bytes(CV_TYPE_MXFP4, 64) == 34);
    CHECK(cv_type_get((cv_type)3) == NULL); /* Q4_1: a GGML type convoy does not compute with */
    CHECK(cv_type_get((cv_type)-1) == NULL);
    CHECK(cv_type_get(CV_TYPE_COUNT) == NULL);
    CHECK(strcmp(cv_type_name((cv_type)3), "Q4_1") == 0);   /* named, though not computed with */
    CHECK(strcmp(cv_type_name((cv_type)4), "unknown") == 0); /* an id GGML removed */
    CHECK(cv_row_bytes(CV_TYPE_Q4_0, 64) == 36);
    CHECK(cv_row_bytes(CV_TYPE_Q8_0, 96) == 102);
    CHECK(cv_row_bytes(CV_TYPE_Q4_0, 33) == 0);
    CHECK(cv_row_bytes(CV_TYPE_F16, 3) == 6);
    CHECK(cv_row_bytes(CV_TYPE_F32, -1) == 0);
    CHECK(cv_row_bytes((cv_type)3, 32) == 0);
}

/* Selected vec_dot == reference, bit for bit, for every type and length. */
static void test_vec_dot_matches_ref(void)
{
    if (!simd_selected())
        SKIP("kernels are the reference on this machine (%s)", cv_kernels_name());
    float *w = malloc(8192 * sizeof(float)), *x = malloc(8192 * sizeof(float));
    void *wq = malloc(8192 * 4), *xq = malloc(8192 * 4);
    for (int i = 0; i < N_WEIGHT_TYPES; i++) {
        const cv_type_traits *tt = cv_type_get(weight_types[i]);
        for (int k = 0; k < N_LENGTHS; k++) {
            int n = lengths[k];
            if (n % tt->blck_size)
                continue;
            for (int rep = 0; rep < 3; rep++) {
                fill_random(w, n);
                fill_random(x, n);
                make_rows(weight_types[i], w, x, n, wq, xq);
                float got = tt->vec_dot(n, wq, xq), want = tt->vec_dot_ref(n, wq, xq);
                CHECKF(same_bits(got, want), "%s n=%d: %.9g vs ref %.9g", tt->name, n, got, want);
            }
        }
    }
    free(w);
    free(x);
    free(wq);
    free(xq);
}

/* Raw random quant bytes (every int8 and nibble value, including -128)
 * with finite random scales: the integer parts must be exact everywhere. */
static void test_vec_dot_raw_blocks(void)
{
    if (!simd_selected())
        SKIP("kernels are the reference on this machine (%s)", cv_kernels_name());
    enum { NB = 67 };
    static block_q8_0 w8[NB], x8[NB];
    static block_q4_0 w4[NB];
    for (int rep = 0; rep < 20; rep++) {
        for (int b = 0; b < NB; b++) {
            for (int j = 0; j < QK8_0; j++) {
                w8[b].qs[j] = (int8_t)(rep == 0 ? -128 : (int)(rng_next() & 255) - 128);
                x8[b].qs[j] = (int8_t)(rep == 0 ? -128 : (int)(rng_next() & 255) - 128);
            }
            for (int j = 0; j < QK4_0 / 2; j++)
                w4[b].qs[j] = (uint8_t)rng_next();
            w8[b].d = cv_fp32_to_fp16(rng_float());
            x8[b].d = cv_fp32_to_fp16(rng_float() * 0.01f);
            w4[b].d = cv_fp32_to_fp16(rng_float());
        }
        const cv_type_traits *q8 = cv_type_get(CV_TYPE_Q8_0), *q4 = cv_type_get(CV_TYPE_Q4_0);
        for (int nb = 1; nb <= NB; nb += 11) {
            int n = nb * QK8_0;
            float a = q8->vec_dot(n, w8, x8), b = q8->vec_dot_ref(n, w8, x8);
            CHECKF(same_bits(a, b), "Q8_0 raw n=%d: %.9g vs %.9g", n, a, b);
            a = q4->vec_dot(n, w4, x8);
            b = q4->vec_dot_ref(n, w4, x8);
            CHECKF(same_bits(a, b), "Q4_0 raw n=%d: %.9g vs %.9g", n, a, b);
        }
    }
    /* all -128: each lane of a block is 4 * 128 * 128 */
    for (int b = 0; b < NB; b++) {
        memset(w8[b].qs, 0x80, QK8_0);
        memset(x8[b].qs, 0x80, QK8_0);
        w8[b].d = x8[b].d = cv_fp32_to_fp16(1.0f);
    }
    CHECK(cv_type_get(CV_TYPE_Q8_0)->vec_dot(QK8_0, w8, x8) == 32.0f * 16384.0f);
    CHECK(cv_type_get(CV_TYPE_Q8_0)->vec_dot_ref(QK8_0, w8, x8) == 32.0f * 16384.0f);
}

/* Selected activation conversions == reference, byte for byte. */
static void test_from_float_matches_ref(void)
{
    if (!simd_selected())
        SKIP("kernels are the reference on this machine (%s)", cv_kernels_name());
    enum { N = 4096 };
    float *x = malloc(N * sizeof(float));
    block_q8_0 *a = malloc(N / QK8_0 * sizeof(block_q8_0)), *b = malloc(N / QK8_0 * sizeof(block_q8_0));
    cv_fp16 *h1 = malloc(N * sizeof(cv_fp16)), *h2 = malloc(N * sizeof(cv_fp16));
    const cv_type_traits *q8 = cv_type_get(CV_TYPE_Q8_0), *f16 = cv_type_get(CV_TYPE_F16);

    for (int rep = 0; rep < 20; rep++) {
        fill_random(x, N);
        q8->from_float(x, a, N);
        cv_quantize_row_q8_0_ref(x, b, N);
        CHECKF(memcmp(a, b, N / QK8_0 * sizeof(block_q8_0)) == 0, "Q8_0 quantizer, rep %d", rep);
    }
    /* special blocks: zeros; a subnormal maximum (127/amax overflows to
     * inf, so cvt sees inf and NaN); NaN and inf elements; exact ties */
    static const float specials[][4] = {
        {0.0f, -0.0f, 0.0f, 0.0f},   {1e-39f, 0.0f, -3e-40f, 1e-45f}, {NAN, 1.0f, -2.0f, 0.5f},
        {1.0f, NAN, -2.0f, 0.5f},    {INFINITY, 1.0f, -1.0f, 0.0f},  {-INFINITY, -0.0f, 3.0f, 1e30f},
        {127.0f, 2.5f, -2.5f, 0.5f}, {3.4e38f, -3.4e38f, 1.0f, 0.0f},
    };
    int n_specials = (int)(sizeof(specials) / sizeof(specials[0]));
    for (int s = 0; s < n_specials; s++) {
        for (int j = 0; j < QK8_0; j++)
            x[j] = specials[s][(j * 7 + s) % 4];
        q8->from_float(x, a, QK8_0);
        cv_quantize_row_q8_0_ref(x, b, QK8_0);
        CHECKF(memcmp(a, b, sizeof(block_q8_0)) == 0, "Q8_0 quantizer, special block %d", s);
    }
    /* a NaN or an inf at each position: the max tree order shows */
    for (int s = 0; s < 2 * QK8_0; s++) {
        fill_random(x, QK8_0);
        x[s % QK8_0] = s < QK8_0 ? NAN : -INFINITY;
        q8->from_float(x, a, QK8_0);
        cv_quantize_row_q8_0_ref(x, b, QK8_0);
        CHECKF(memcmp(a, b, sizeof(block_q8_0)) == 0, "Q8_0 quantizer, %s at %d", s < QK8_0 ? "NaN" : "inf",
               s % QK8_0);
    }

    /* F16: random bit patterns (NaN, inf, subnormals), lengths with tails */
    for (int i = 0; i < N; i++) {
        uint32_t u = (uint32_t)rng_next();
        memcpy(&x[i], &u, 4);
    }
    for (int n = 1; n <= N; n = n * 3 + 1) {
        f16->from_float(x, h1, n);
        cv_convert_row_f32_to_f16_ref(x, h2, n);
        CHECKF(memcmp(h1, h2, (size_t)n * sizeof(cv_fp16)) == 0, "F16 conversion n=%d", n);
    }
    free(x);
    free(a);
    free(b);
    free(h1);
    free(h2);
}

/* The Q8_0 activation rule (round to nearest even, id = 127/amax) and the
 * llama-quantize weight rule (roundf, id = 1/d) on a block with exact ties;
 * Q4_0 on a block it represents exactly. */
static void test_quantizer_rules(void)
{
    float x[QK8_0];
    for (int j = 0; j < QK8_0; j++)
        x[j] = (float)(j % 8) - 3.5f; /* ties -3.5 .. 3.5 */
    x[5] = 127.0f;                     /* amax 127: d = 1, id = 1 */
    x[6] = -2.5f;
    block_q8_0 act, wgt;
    for (int pass = 0; pass < 2; pass++) {
        cv_kernels_init(pass);
        cv_type_get(CV_TYPE_Q8_0)->from_float(x, &act, QK8_0);
        cv_type_get(CV_TYPE_Q8_0)->quantize(x, &wgt, QK8_0);
        CHECK(cv_fp16_to_fp32(act.d) == 1.0f && cv_fp16_to_fp32(wgt.d) == 1.0f);
        for (int j = 0; j < QK8_0; j++) {
            float r = j == 5 ? 127.0f : x[j];
            CHECKF(act.qs[j] == (int8_t)rintf(r), "activation q[%d] = %d for %g", j, act.qs[j], r);
            CHECKF(wgt.qs[j] == (int8_t)roundf(r), "weight q[%d] = %d for %g", j, wgt.qs[j], r);
        }
        CHECK(act.qs[6] == -2 && wgt.qs[6] == -3);
    }
    cv_kernels_init(0);

    /* Q4_0: the largest magnitude (-16, signed) maps to -8, so d = 2 and
     * every even value in [-16, 14] is exact */
    float v[QK4_0], back[QK4_0];
    for (int j = 0; j < QK4_0; j++)
        v[j] = (float)(2 * (j % 16) - 16);
    block_q4_0 q4;
    cv_type_get(CV_TYPE_Q4_0)->quantize(v, &q4, QK4_0);
    CHECK(cv_fp16_to_fp32(q4.d) == 2.0f);
    cv_type_get(CV_TYPE_Q4_0)->to_float(&q4, back, QK4_0);
    CHECK(memcmp(v, back, sizeof v) == 0);
    CHECK(q4.qs[0] == 0x00 && q4.qs[15] == 0xff);
    /* a positive maximum gives a negative scale; values past +7 * |d| clamp */
    for (int j = 0; j < QK4_0; j++)
        v[j] = j == 0 ? 8.0f : j == 1 ? -8.0f : 0.0f;
    cv_type_get(CV_TYPE_Q4_0)->quantize(v, &q4, QK4_0);
    CHECK(cv_fp16_to_fp32(q4.d) == -1.0f);
    CHECK((q4.qs[0] & 15) == 0 && (q4.qs[1] & 15) == 15 && (q4.qs[2] & 15) == 8);
}

/* MXFP4 (llama.cpp's quantize_row_mxfp4_ref): e = floor(log2(amax)) + 125,
 * scale 2^(e - 128); each element the nearest table value, a tie to the
 * first in table order (the smaller magnitude, +0 before -0). */
static void test_quantizer_rules_mxfp4(void)
{
    float v[32], back[32];
    block_mxfp4 q;
    const cv_type_traits *tt = cv_type_get(CV_TYPE_MXFP4);
    for (int j = 0; j < 32; j++)
        v[j] = 0.25f * cv_kvalues_mxfp4[(j * 5) % 16]; /* amax 3: e 126, scale 0.25, every value exact */
    tt->quantize(v, &q, 32);
    tt->to_float(&q, back, 32);
    CHECK(q.e == 126 && memcmp(v, back, sizeof v) == 0);
    CHECK(mxfp4_scale(q.e) == 0.25f && mxfp4_scale(0) == 0x1p-128f && mxfp4_scale(1) == 0x1p-127f &&
          mxfp4_scale(255) == 0x1p127f);
    /* amax 15: e 128, scale 1, so x meets the table itself: past 12, and
     * halfway between two values */
    static const float x[16] = {15.0f, 0.5f, 2.5f, -2.5f, 5.0f, -5.0f, 10.0f, -0.0f,
                                -15.0f, -0.5f, 1.5f, -1.5f, 3.5f, -10.0f, 7.0f, -7.0f};
    static const uint8_t want[16] = {7, 0, 2, 10, 4, 12, 6, 0, 15, 0, 1, 9, 3, 14, 5, 13};
    for (int j = 0; j < 32; j++)
        v[j] = x[j / 16 * 8 + j % 8];
    tt->quantize(v, &q, 32);
    CHECK(q.e == 128);
    for (int j = 0; j < 32; j++) {
        const int got = j < 16 ? q.qs[j] & 15 : q.qs[j - 16] >> 4;
        CHECKF(got == want[j / 16 * 8 + j % 8], "MXFP4 element %d (%g): index %d", j, v[j], got);
    }
    memset(v, 0, sizeof v); /* all zero: e 0, every index 0 */
    tt->quantize(v, &q, 32);
    CHECK(q.e == 0 && q.qs[0] == 0 && q.qs[15] == 0);
    v[3] = 0x1p-140f; /* below llama.cpp's range: e clamps to 0 */
    tt->quantize(v, &q, 32);
    CHECK(q.e == 0);
}

/* Q5_0, Q5_1, IQ4_NL and MXFP4 on blocks they represent exactly, and the
 * Q8_1 activation rule: Q8_0's quants and d, s = d * their sum. */
static void test_quantizer_rules_quants32(void)
{
    float v[32], back[32];
    block_q5_0 q5_0;
    for (int j = 0; j < 32; j++)
        v[j] = (float)(2 * ((j * 7) % 32) - 32); /* every even value in [-32, 30]: -32 maps to -16, d = 2 */
    cv_type_get(CV_TYPE_Q5_0)->quantize(v, &q5_0, 32);
    cv_type_get(CV_TYPE_Q5_0)->to_float(&q5_0, back, 32);
    CHECK(cv_fp16_to_fp32(q5_0.d) == 2.0f && memcmp(v, back, sizeof v) == 0);
    CHECK(q5_0.qs[0] == 0x00 && q5_0.qh[0] == 0x98); /* q 0 and 16 for elements 0 and 16; q >= 16 at 3, 4, 7 */

    block_q5_1 q5_1;
    for (int j = 0; j < 32; j++)
        v[j] = (float)((j * 5) % 32) * 0.5f - 3.0f; /* min -3, max 12.5: d = 0.5 */
    cv_type_get(CV_TYPE_Q5_1)->quantize(v, &q5_1, 32);
    cv_type_get(CV_TYPE_Q5_1)->to_float(&q5_1, back, 32);
    CHECK(cv_fp16_to_fp32(q5_1.d) == 0.5f && cv_fp16_to_fp32(q5_1.m) == -3.0f);
    CHECK(memcmp(v, back, sizeof v) == 0);

    /* IQ4_NL: the table at scale 0.5, so that -127 is the largest: the
     * least-squares fit finds d = 0.5 exactly */
    block_iq4_nl iq4;
    for (int j = 0; j < 32; j++)
        v[j] = 0.5f * cv_kvalues_iq4nl[(j * 3) % 16];
    cv_type_get(CV_TYPE_IQ4_NL)->quantize(v, &iq4, 32);
    cv_type_get(CV_TYPE_IQ4_NL)->to_float(&iq4, back, 32);
    CHECK(cv_fp16_to_fp32(iq4.d) == 0.5f && memcmp(v, back, sizeof v) == 0);
    memset(v, 0, sizeof v); /* all zero: d 0, every index that of the value nearest 0 (1, index 8) */
    cv_type_get(CV_TYPE_IQ4_NL)->quantize(v, &iq4, 32);
    CHECK(iq4.d == 0 && iq4.qs[0] == 0x88 && iq4.qs[15] == 0x88);

    test_quantizer_rules_mxfp4();

    for (int j = 0; j < 32; j++)
        v[j] = j == 5 ? 127.0f : (float)(j % 8) - 2.5f; /* amax 127: d = 1, quants rint(x) */
    block_q8_1 q8_1;
    block_q8_0 q8_0;
    cv_type_get(CV_TYPE_Q8_1)->from_float(v, &q8_1, 32);
    cv_quantize_row_q8_0_ref(v, &q8_0, 32);
    int sum = 0;
    for (int j = 0; j < 32; j++)
        sum += q8_1.qs[j];
    CHECK(q8_1.d == q8_0.d && memcmp(q8_1.qs, q8_0.qs, 32) == 0);
    CHECK(cv_fp16_to_fp32(q8_1.s) == (float)sum && sum == 127 + 4 * (-2 - 2 + 0 + 0 + 2 + 2 + 4 + 4) - 2);
}

/* |d| of the block of a row of type t that holds element j (MXFP4: its
 * scale 2^(e - 128)). */
static float block_scale_at(cv_type t, const void *row, int j)
{
    const char *block = (const char *)row + cv_row_bytes(t, 32) * (size_t)(j / 32);
    if (t == CV_TYPE_MXFP4)
        return mxfp4_scale(((const block_mxfp4 *)block)->e);
    cv_fp16 d;
    memcpy(&d, block, sizeof d);
    return fabsf(cv_fp16_to_fp32(d));
}

/* Quantize then dequantize: within the step of each block. */
static void test_round_trip(void)
{
    enum { N = 8192 };
    float *x = malloc(N * sizeof(float)), *y = malloc(N * sizeof(float));
    void *q = malloc(N * sizeof(float));
    /* its own input: earlier tests draw more or less of the stream with
     * the kernels selected, and a bound checked on one input holds there */
    rng_state = RNG_SEED;
    fill_random(x, N);
    for (int i = 0; i < N_WEIGHT_TYPES; i++) {
        const cv_type_traits *tt = cv_type_get(weight_types[i]);
        tt->quantize(x, q, N);
        tt->to_float(q, y, N);
        int bad = 0;
        for (int j = 0; j < N && !bad; j++) {
            float tol;
            switch (weight_types[i]) {
            case CV_TYPE_F32: tol = 0.0f; break;
            case CV_TYPE_F16: tol = fabsf(x[j]) * 0x1p-11f + 0x1p-25f; break;
            case CV_TYPE_BF16: tol = fabsf(x[j]) * 0x1p-8f; break;
            case CV_TYPE_Q8_0: tol = 0.57f * block_scale_at(CV_TYPE_Q8_0, q, j); break;
            /* half the widest gap (24) between values; past 113 (as -127 of the other sign) they clip */
            case CV_TYPE_IQ4_NL: tol = 16.0f * block_scale_at(CV_TYPE_IQ4_NL, q, j); break;
            /* amax is below 16 scales and the table ends at 12: it clips by up to 4 */
            case CV_TYPE_MXFP4: tol = 4.0f * block_scale_at(CV_TYPE_MXFP4, q, j); break;
            default: tol = 1.01f * block_scale_at(weight_types[i], q, j); break;
            }
            if (fabsf(x[j] - y[j]) > tol) {
                CHECKF(0, "%s element %d: %.9g -> %.9g (tol %g)", tt->name, j, x[j], y[j], tol);
                bad = 1;
            }
        }
    }
    free(x);
    free(y);
    free(q);
}

/* A Q5_1 row's minimum meets the activation sums s as stored (fp16, of
 * the unrounded scale): what that adds to the dot of the dequantized rows
 * (xd, the dequantized Q8_1 row). */
static double q8_1_sum_rounding(const void *w, const void *x, const float *xd, int n)
{
    const block_q5_1 *wb = w;
    const block_q8_1 *xb = x;
    double add = 0;
    for (int b = 0; b < n / 32; b++) {
        double sum = 0;
        for (int j = 0; j < 32; j++)
            sum += xd[32 * b + j];
        add += (double)cv_fp16_to_fp32(wb[b].m) * ((double)cv_fp16_to_fp32(xb[b].s) - sum);
    }
    return add;
}

/* vec_dot against a double-precision dot of the dequantized rows. */
static void test_vec_dot_accuracy(void)
{
    enum { N = 8192 };
    float *w = malloc(N * sizeof(float)), *x = malloc(N * sizeof(float));
    float *wd = malloc(N * sizeof(float)), *xd = malloc(N * sizeof(float));
    void *wq = malloc(N * 4), *xq = malloc(N * 4);
    for (int i = 0; i < N_WEIGHT_TYPES; i++) {
        const cv_type_traits *tt = cv_type_get(weight_types[i]);
        const cv_type_traits *at = cv_type_get(tt->vec_dot_type);
        for (int k = 0; k < N_LENGTHS; k++) {
            int n = lengths[k];
            if (n % tt->blck_size)
                continue;
            fill_random(w, n);
            fill_random(x, n);
            make_rows(weight_types[i], w, x, n, wq, xq);
            tt->to_float(wq, wd, n);
            at->to_float(xq, xd, n);
            double dot = 0, mag = 0;
            for (int j = 0; j < n; j++) {
                dot += (double)wd[j] * xd[j];
                mag += fabs((double)wd[j] * xd[j]);
            }
            if (tt->vec_dot_type == CV_TYPE_Q8_1)
                dot += q8_1_sum_rounding(wq, xq, xd, n);
            float got = tt->vec_dot(n, wq, xq);
            CHECKF(fabs(got - dot) <= 1e-5 * mag + 1e-30, "%s n=%d: %.9g vs %.9g (mag %g)", tt->name, n,
                   got, dot, mag);
        }
    }
    free(w);
    free(x);
    free(wd);
    free(xd);
    free(wq);
    free(xq);
}

/* Raw random quant bytes (every int8 and nibble value, -128 included) with
 * finite random scales (d, and Q5_1's m, Q8_1's s), for n_rows rows of
 * type t (a block type with d first, or MXFP4: exponents within 2^+-28 of
 * 1, or the subnormal scales of 0 and 1, so that no sum overflows). */
static void fill_raw_blocks(cv_type t, void *rows, int n, int n_rows)
{
    const cv_type_traits *tt = cv_type_get(t);
    const int n_scales = t == CV_TYPE_MXFP4 ? 0 : t == CV_TYPE_Q5_1 || t == CV_TYPE_Q8_1 ? 2 : 1;
    size_t n_blocks = (size_t)n_rows * (size_t)(n / tt->blck_size);
    uint8_t *p = rows;
    for (size_t b = 0; b < n_blocks; b++, p += tt->type_size) {
        for (size_t j = 0; j < tt->type_size; j++)
            p[j] = (uint8_t)rng_next();
        if (t == CV_TYPE_MXFP4)
            p[0] = (uint8_t)(p[0] % 8 == 0 ? p[0] / 8 % 2 : 100 + p[0] % 57);
        for (int k = 0; k < n_scales; k++) {
            cv_fp16 d = cv_fp32_to_fp16(rng_float() * 0.01f);
            memcpy(p + k * sizeof d, &d, sizeof d);
        }
    }
}

/* Q5_0, Q5_1, IQ4_NL and MXFP4 on raw random blocks against raw
 * activations, and at their largest sums (every quant at its most negative
 * value against activations of -128), where vec_dot_ref is exact: the SIMD
 * kernels give its bits. */
static void test_vec_dot_raw_quants32(void)
{
    enum { NB = 67 };
    static const cv_type types[] = {CV_TYPE_Q5_0, CV_TYPE_Q5_1, CV_TYPE_IQ4_NL, CV_TYPE_MXFP4};
    static uint8_t w[NB * 36], x[NB * 36];
    for (int ti = 0; ti < 4; ti++) {
        const cv_type_traits *tt = cv_type_get(types[ti]);
        for (int rep = 0; rep < 20; rep++) {
            fill_raw_blocks(types[ti], w, NB * 32, 1);
            fill_raw_blocks(tt->vec_dot_type, x, NB * 32, 1);
            for (int nb = 1; nb <= NB; nb += 11) {
                const float a = tt->vec_dot(nb * 32, w, x), b = tt->vec_dot_ref(nb * 32, w, x);
                CHECKF(same_bits(a, b), "%s raw n=%d: %.9g vs %.9g", tt->name, nb * 32, a, b);
            }
        }
        /* quants 0 (Q5_0: -16, IQ4_NL: -127, Q5_1: 31 with qh all set; MXFP4: 15, -12 at e 128), d 1,
         * m 0; y -128, d 1, s 0 */
        const size_t wb = tt->type_size, xb = cv_type_get(tt->vec_dot_type)->type_size;
        memset(w, 0, sizeof w);
        memset(x, 0x80, sizeof x);
        for (int b = 0; b < NB; b++) {
            const cv_fp16 one = cv_fp32_to_fp16(1.0f);
            memcpy(x + b * xb, &one, sizeof one);
            if (types[ti] == CV_TYPE_MXFP4) {
                w[b * wb] = 128;
                memset(w + b * wb + 1, 0xff, 16);
                continue;
            }
            memcpy(w + b * wb, &one, sizeof one);
            if (types[ti] == CV_TYPE_Q5_1) {
                memset(w + b * wb + 4, 0xff, 20); /* qh and qs: every quant 31 */
                memset(x + b * xb + 2, 0, 2);
            }
        }
        const double per_block = types[ti] == CV_TYPE_Q5_0   ? 16.0 * 128 * 32
                                 : types[ti] == CV_TYPE_Q5_1 ? -31.0 * 128 * 32
                                 : types[ti] == CV_TYPE_MXFP4 ? 12.0 * 128 * 32
                                                              : 127.0 * 128 * 32;
        const float a = tt->vec_dot(NB * 32, w, x), b = tt->vec_dot_ref(NB * 32, w, x);
        CHECKF(b == per_block * NB && same_bits(a, b), "%s extremes: %.9g, ref %.9g, exact %.9g", tt->name, a, b,
               per_block * NB);
    }
}

enum { MM_MAX_ROWS = 37, MM_MAX_TOKENS = 64, MM_LDY = 41, MM_MAX_N = 8192 };

/* y: (MM_MAX_TOKENS + 1) x MM_LDY floats. Fills it with a sentinel, then
 * runs cv_matmul_rows over each piece [cuts[c], cuts[c+1]) of the rows. */
static void matmul_split(cv_type t, const void *w, int n, const void *xq, size_t x_stride, int m,
                         const long *cuts, int n_cuts, float *y)
{
    for (int i = 0; i < (MM_MAX_TOKENS + 1) * MM_LDY; i++)
        y[i] = -7.0f;
    for (int c = 0; c + 1 < n_cuts; c++)
        cv_matmul_rows(t, w, n, xq, x_stride, m, y, MM_LDY, cuts[c], cuts[c + 1]);
}

/* The rows [0, rows) of w interleaved (for the types that have the
 * layout) give each output of cv_matmul_interleaved the bits of want,
 * whole and cut at a group edge, with this CPU's kernels and with the
 * reference; nothing outside the outputs is written. */
static void check_interleaved(cv_type t, const void *w, int n, long rows, const void *xq, size_t x_row, int m,
                              const float *want, float *y)
{
    const size_t bytes = cv_row_bytes(t, n) * (size_t)rows;
    void *wi = malloc(bytes);
    memcpy(wi, w, bytes);
    if (cv_interleave(t, n, rows, wi) != 0) {
        CHECK(t != CV_TYPE_Q8_0 && t != CV_TYPE_Q4_0 && t != CV_TYPE_IQ4_NL && t != CV_TYPE_Q4_K && t != CV_TYPE_Q5_K &&
              t != CV_TYPE_MXFP4 && t != CV_TYPE_Q6_K);
        free(wi);
        return;
    }
    for (int pass = 0; pass < 3; pass++) {
        const long cut = pass == 1 ? 8 : 0;
        for (int i = 0; i < (MM_MAX_TOKENS + 1) * MM_LDY; i++)
            y[i] = -7.0f;
        cv_kernels_init(pass == 2);
        cv_matmul_interleaved(t, wi, n, xq, x_row, m, y, MM_LDY, 0, cut);
        cv_matmul_interleaved(t, wi, n, xq, x_row, m, y, MM_LDY, cut, rows);
        cv_kernels_init(0);
        int bad = 0, outside = 0;
        for (int s = 0; s <= m; s++)
            for (int r = 0; r < MM_LDY; r++) {
                const int j = s * MM_LDY + r;
                if (s < m && r < rows)
                    bad += !same_bits(y[j], want[j]);
                else
                    outside += y[j] != -7.0f;
            }
        CHECKF(bad == 0, "%s interleaved n=%d rows=%ld m=%d pass %d: %d outputs differ from vec_dot_ref",
               cv_type_name(t), n, rows, m, pass, bad);
        CHECKF(outside == 0, "%s interleaved n=%d rows=%ld m=%d: %d writes outside the outputs", cv_type_name(t), n,
               rows, m, outside);
    }
    free(wi);
}

/* Every output of cv_matmul_rows is the bits of vec_dot_ref of its row and
 * token, whatever the number of rows and tokens (tiles and their tails),
 * the row split, the width (chunk and token block edges), or the forced
 * reference; nothing outside the rows and tokens is written. */
static void test_matmul_rows(void)
{
    static const cv_type matmul_types[] = {CV_TYPE_F32,    CV_TYPE_F16,  CV_TYPE_BF16, CV_TYPE_Q8_0,
                                           CV_TYPE_Q4_0,   CV_TYPE_Q4_K, CV_TYPE_Q5_K, CV_TYPE_Q6_K,
                                           CV_TYPE_Q5_0,   CV_TYPE_Q5_1, CV_TYPE_IQ4_NL, CV_TYPE_Q2_K,
                                           CV_TYPE_Q3_K,   CV_TYPE_IQ4_XS, CV_TYPE_MXFP4};
    static const int widths[] = {32, 100, 256, 1056, 2080, 2304, 8192};
    static const int row_counts[] = {3, 8, 9, 16, 37};
    static const int token_counts[] = {1, 2, 3, 4, 5, 7, 8, 17, 33, 64};
    enum { N_WIDTHS = 7, N_ROW_COUNTS = 5, N_TOKEN_COUNTS = 10, N_TYPES = 15 };
    const size_t y_size = (MM_MAX_TOKENS + 1) * MM_LDY * sizeof(float);
    float *wf = malloc(MM_MAX_ROWS * MM_MAX_N * sizeof(float)), *xf = malloc(MM_MAX_N * sizeof(float));
    char *wq = malloc(MM_MAX_ROWS * MM_MAX_N * 4), *xq = malloc(MM_MAX_TOKENS * (MM_MAX_N * 4 + 8));
    float *y_all = malloc(y_size), *y_one = malloc(y_size), *y_split = malloc(y_size), *y_ref = malloc(y_size);
    float *want = malloc(y_size);
    for (int i = 0; i < N_TYPES; i++) {
        cv_type t = matmul_types[i];
        const cv_type_traits *tt = cv_type_get(t);
        const cv_type_traits *at = cv_type_get(tt->vec_dot_type);
        for (int k = 0; k < N_WIDTHS; k++) {
            int n = widths[k];
            if (n % tt->blck_size)
                continue;
            /* raw quant bytes for the block types at one width */
            int raw = tt->is_quantized && n == 1056;
            size_t w_row = cv_row_bytes(t, n), x_row = cv_row_bytes(tt->vec_dot_type, n) + 8;
            if (raw) {
                fill_raw_blocks(t, wq, n, MM_MAX_ROWS);
                for (int s = 0; s < MM_MAX_TOKENS; s++)
                    fill_raw_blocks(tt->vec_dot_type, xq + s * x_row, n, 1);
            } else {
                fill_random(wf, MM_MAX_ROWS * n);
                for (int r = 0; r < MM_MAX_ROWS; r++)
                    tt->quantize(wf + (size_t)r * n, wq + r * w_row, n);
                for (int s = 0; s < MM_MAX_TOKENS; s++) {
                    fill_random(xf, n);
                    at->from_float(xf, xq + s * x_row, n);
                }
            }
            for (int s = 0; s < MM_MAX_TOKENS; s++)
                for (int r = 0; r < MM_MAX_ROWS; r++)
                    want[s * MM_LDY + r] = tt->vec_dot_ref(n, wq + r * w_row, xq + s * x_row);
            for (int ri = 0; ri < N_ROW_COUNTS; ri++) {
                const long rows = row_counts[ri];
                const long whole[] = {0, rows}, pieces[] = {0, rows / 4, rows / 4 + 1, rows - 1, rows};
                for (int mi = 0; mi < N_TOKEN_COUNTS; mi++) {
                    const int m = token_counts[mi];
                    if (n == MM_MAX_N && m != MM_MAX_TOKENS && m != 5)
                        continue; /* keeps the widest case short */
                    matmul_split(t, wq, n, xq, x_row, m, whole, 2, y_all);
                    matmul_split(t, wq, n, xq, x_row, m, pieces, 5, y_split);
                    for (int s = 0; s < m; s++)
                        cv_matmul_rows(t, wq, n, xq + s * x_row, x_row, 1, y_one + s * MM_LDY, MM_LDY, 0, rows);
                    cv_kernels_init(1);
                    matmul_split(t, wq, n, xq, x_row, m, whole, 2, y_ref);
                    cv_kernels_init(0);
                    int bad = 0, outside = 0;
                    for (int s = 0; s <= m; s++)
                        for (int r = 0; r < MM_LDY; r++) {
                            int j = s * MM_LDY + r;
                            if (s < m && r < rows)
                                bad += !same_bits(y_all[j], want[j]) || !same_bits(y_split[j], want[j]) ||
                                       !same_bits(y_one[j], want[j]) || !same_bits(y_ref[j], want[j]);
                            else
                                outside += y_all[j] != -7.0f || y_split[j] != -7.0f || y_ref[j] != -7.0f;
                        }
                    CHECKF(bad == 0, "%s n=%d%s rows=%ld m=%d: %d outputs differ from vec_dot_ref", tt->name, n,
                           raw ? " (raw)" : "", rows, m, bad);
                    CHECKF(outside == 0, "%s n=%d rows=%ld m=%d: %d writes outside the outputs", tt->name, n, rows,
                           m, outside);
                    if (rows % 8 == 0)
                        check_interleaved(t, wq, n, rows, xq, x_row, m, want, y_all);
                }
            }
        }
    }
    free(wf);
    free(xf);
    free(wq);
    free(xq);
    free(y_all);
    free(y_one);
    free(y_split);
    free(y_ref);
    free(want);
}

static void test_dispatch(void)
{
    cv_kernels_init(1);
    CHECK(strcmp(cv_kernels_name(), "ref") == 0);
    CHECK(cv_type_get(CV_TYPE_Q4_0)->vec_dot == cv_type_get(CV_TYPE_Q4_0)->vec_dot_ref);
    CHECK(cv_type_get(CV_TYPE_Q8_0)->from_float == cv_quantize_row_q8_0_ref);
    cv_kernels_init(0);
    const char *env = getenv("CONVOY_KERNELS");
    if (env && strcmp(env, "ref") == 0)
        CHECK(strcmp(cv_kernels_name(), "ref") == 0);
#if defined(__aarch64__)
    else
        CHECK(strcmp(cv_kernels_name(), "neon") == 0);
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        const int avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
                           !(env && strcmp(env, "avx2") == 0);
        CHECK(strcmp(cv_kernels_name(), avx512 ? "avx512" : "avx2") == 0);
        CHECK(cv_kernels_avx2());
    }
#endif
    fprintf(stderr, "kernels: %s\n", cv_kernels_name());
}

/* cv_matmul_interleaved of the rows of w, interleaved, gives vec_dot_ref's
 * bits for m tokens. */
static void check_interleaved_extremes(cv_type t, const uint8_t *w, int n, int rows, const uint8_t *x, size_t x_row,
                                       int m)
{
    const size_t w_row = cv_row_bytes(t, n);
    uint8_t *wi = malloc(rows * w_row);
    float *y = malloc((size_t)m * rows * sizeof(float));
    memcpy(wi, w, rows * w_row);
    CHECK(cv_interleave(t, n, rows, wi) == 0);
    cv_matmul_interleaved(t, wi, n, x, x_row, m, y, rows, 0, rows);
    int bad = 0;
    for (int s = 0; s < m; s++)
        for (int r = 0; r < rows; r++)
            bad += !same_bits(y[s * rows + r], cv_type_get(t)->vec_dot_ref(n, w + r * w_row, x + s * x_row));
    CHECKF(bad == 0, "%s interleaved m=%d: %d outputs differ from vec_dot_ref", cv_type_name(t), m, bad);
    free(wi);
    free(y);
}

/* Q4_0, IQ4_NL and MXFP4 at their largest sums: every nibble the same
 * (Q4_0: 15, value 7; IQ4_NL: 15, value 113, whose high nibble of 113 +
 * 128 is 15, and 3, value -65, whose low nibble of -65 + 128 is 15;
 * MXFP4: 7, value 12, whose 12 + 12 the AVX2 kernel sums in int16 for
 * half a block, and 15, value -12) against activations of -128, which the
 * interleaved kernels sum in int16 over the 8 groups of 4 of a block; the
 * result is exact. The blocks' scales alternate: d -0.5 and 1 (MXFP4:
 * exponents 127 and 128, 0.5 and 1). */
static void test_nibble_extremes(void)
{
    enum { N = 256, ROWS = 16, TOKENS = 9 };
    static const struct {
        cv_type t;
        uint8_t nibble;
        int value;
    } cases[] = {{CV_TYPE_Q4_0, 15, 7},
                 {CV_TYPE_IQ4_NL, 15, 113},
                 {CV_TYPE_IQ4_NL, 3, -65},
                 {CV_TYPE_MXFP4, 7, 12},
                 {CV_TYPE_MXFP4, 15, -12}};
    const size_t x_row = cv_row_bytes(CV_TYPE_Q8_0, N);
    uint8_t *w = malloc(ROWS * cv_row_bytes(CV_TYPE_Q4_0, N)), *x = malloc(TOKENS * x_row);
    for (int b = 0; b < TOKENS * N / QK8_0; b++) {
        block_q8_0 *blk = (block_q8_0 *)x + b;
        blk->d = cv_fp32_to_fp16(1.0f);
        memset(blk->qs, 0x80, QK8_0);
    }
    for (int c = 0; c < 5; c++) {
        const cv_type t = cases[c].t;
        const int mxfp4 = t == CV_TYPE_MXFP4;
        const size_t w_row = cv_row_bytes(t, N), block_bytes = cv_type_get(t)->type_size;
        memset(w, cases[c].nibble * 17, ROWS * w_row);
        for (int b = 0; b < ROWS * N / QK4_0; b++) {
            uint8_t *blk = w + (size_t)b * block_bytes;
            if (mxfp4) {
                blk[0] = b % 2 ? 128 : 127;
            } else {
                const cv_fp16 d = cv_fp32_to_fp16(b % 2 ? 1.0f : -0.5f);
                memcpy(blk, &d, sizeof d);
            }
        }
        for (int r = 0; r < ROWS; r++) {
            const float ref = cv_type_get(t)->vec_dot_ref(N, w + r * w_row, x);
            const double exact = N / QK4_0 / 2 * (1.0 + (mxfp4 ? 0.5 : -0.5)) * cases[c].value * -128 * QK4_0;
            CHECKF(ref == exact, "%s row %d: ref %.9g, exact %.9g", cv_type_name(t), r, ref, exact);
        }
        for (int m = 1; m <= TOKENS; m += 4)
            check_interleaved_extremes(t, w, N, ROWS, x, x_row, m);
    }
    free(w);
    free(x);
}

/* Q4_K/Q5_K at their largest sums: every quant and 6-bit scale and min at
 * its maximum, activations all -128 or alternating -128 and 127. The tiles
 * add groups of products in int16 before scaling them; here they must
 * still give vec_dot_ref's bits, and vec_dot_ref the exact value. */
static void test_kquant_extremes(void)
{
    enum { N = 512, ROWS = 16, TOKENS = 64 };
    static const cv_type types[] = {CV_TYPE_Q4_K, CV_TYPE_Q5_K};
    static const int token_counts[] = {1, 7, 8, 9, 64};
    for (int ti = 0; ti < 2; ti++)
        for (int alternate = 0; alternate < 2; alternate++) {
            const cv_type t = types[ti];
            const size_t w_row = cv_row_bytes(t, N), x_row = cv_row_bytes(CV_TYPE_Q8_K, N);
            uint8_t *w = malloc(ROWS * w_row), *x = malloc(TOKENS * x_row);
            float *y = malloc(TOKENS * ROWS * sizeof(float));
            memset(w, 0xFF, ROWS * w_row); /* quants 15 (31), scales and mins 63 */
            for (int b = 0; b < ROWS * N / 256; b++) {
                cv_fp16 *d = (cv_fp16 *)(w + (size_t)b * cv_row_bytes(t, 256));
                d[0] = cv_fp32_to_fp16(b % 2 ? 1.0f : -0.5f); /* d */
                d[1] = cv_fp32_to_fp16(0.25f);                 /* dmin */
            }
            block_q8_K *xb = (block_q8_K *)x;
            for (int b = 0; b < TOKENS * N / 256; b++) {
                xb[b].d = 1.0f;
                for (int e = 0; e < 256; e++)
                    xb[b].qs[e] = (int8_t)(alternate && e % 2 ? 127 : -128);
                for (int k = 0; k < 16; k++)
                    xb[b].bsums[k] = (int16_t)(alternate ? 8 * (127 - 128) : 16 * -128);
            }
            const int qmax = t == CV_TYPE_Q4_K ? 15 : 31, per_sb_y = alternate ? 128 * -1 : 256 * -128;
            /* per super-block: 63 * qmax * sum(y) - 63 * sum(y) (the mins), times d or dmin */
            for (int mi = 0; mi < 5; mi++) {
                const int m = token_counts[mi];
                cv_matmul_rows(t, w, N, x, x_row, m, y, ROWS, 0, ROWS);
                /* the interleaved kernels sum groups in int16 too */
                check_interleaved_extremes(t, w, N, ROWS, x, x_row, m);
                for (int s = 0; s < m; s++)
                    for (int r = 0; r < ROWS; r++) {
                        const float ref = cv_type_get(t)->vec_dot_ref(N, w + r * w_row, x + s * x_row);
                        double exact = 0;
                        for (int b = 0; b < N / 256; b++) {
                            const double d = (r * (N / 256) + b) % 2 ? 1.0 : -0.5;
                            exact += d * 63.0 * qmax * per_sb_y - 0.25 * 63.0 * per_sb_y;
                        }
                        CHECKF(same_bits(y[s * ROWS + r], ref), "%s m=%d row %d token %d: %.9g, ref %.9g",
                               cv_type_get(t)->name, m, r, s, y[s * ROWS + r], ref);
                        CHECKF(fabs(ref - exact) <= 1e-6 * fabs(exact), "%s row %d: ref %.9g, exact %.9g",
                               cv_type_get(t)->name, r, ref, exact);
                    }
            }
            free(w);
            free(x);
            free(y);
        }
}

/* Q6_K at its largest sums: every quant 63, the scales -128 (or -128 and
 * 127 by turns), activations all -128 or alternating -128 and 127. The
 * AVX2 kernels add two groups of products in int16 before scaling them;
 * every path must still give vec_dot_ref's bits, and vec_dot_ref the exact
 * value. */
static void test_q6_K_extremes(void)
{
    enum { N = 512, ROWS = 16, TOKENS = 64 };
    static const int token_counts[] = {1, 7, 8, 9, 64};
    const size_t w_row = cv_row_bytes(CV_TYPE_Q6_K, N), x_row = cv_row_bytes(CV_TYPE_Q8_K, N);
    block_q6_K *w = malloc(ROWS * w_row);
    block_q8_K *x = malloc(TOKENS * x_row);
    float *y = malloc(TOKENS * ROWS * sizeof(float));
    for (int variant = 0; variant < 4; variant++) {
        const int mixed = variant & 1, alternate = variant >> 1;
        memset(w, 0xFF, ROWS * w_row); /* quants 63 */
        for (int b = 0; b < ROWS * N / QK_K; b++) {
            w[b].d = cv_fp32_to_fp16(b % 2 ? 1.0f : -0.5f);
            for (int s = 0; s < QK_K / 16; s++)
                w[b].scales[s] = (int8_t)(mixed && s % 2 ? 127 : -128);
        }
        for (int b = 0; b < TOKENS * N / QK_K; b++) {
            x[b].d = 1.0f;
            for (int e = 0; e < QK_K; e++)
                x[b].qs[e] = (int8_t)(alternate && e % 2 ? 127 : -128);
            for (int k = 0; k < QK_K / 16; k++)
                x[b].bsums[k] = (int16_t)(alternate ? 8 * (127 - 128) : 16 * -128);
        }
        /* per super-block: d * 31 * sum over sub-blocks of scale * sum(y) */
        const double per_sb = 31.0 * (alternate ? -8 : -2048) * (mixed ? 8 * (127 - 128) : 16 * -128);
        for (int mi = 0; mi < 5; mi++) {
            const int m = token_counts[mi];
            cv_matmul_rows(CV_TYPE_Q6_K, w, N, x, x_row, m, y, ROWS, 0, ROWS);
            check_interleaved_extremes(CV_TYPE_Q6_K, (const uint8_t *)w, N, ROWS, (const uint8_t *)x, x_row, m);
            for (int s = 0; s < m; s++)
                for (int r = 0; r < ROWS; r++) {
                    const float ref =
                        cv_type_get(CV_TYPE_Q6_K)->vec_dot_ref(N, (const char *)w + r * w_row, (const char *)x + s * x_row);
                    double exact = 0;
                    for (int b = 0; b < N / QK_K; b++)
                        exact += ((r * (N / QK_K) + b) % 2 ? 1.0 : -0.5) * per_sb;
                    CHECKF(same_bits(y[s * ROWS + r], ref), "Q6_K m=%d row %d token %d: %.9g, ref %.9g", m, r, s,
                           y[s * ROWS + r], ref);
                    CHECKF(ref == exact, "Q6_K row %d: ref %.9g, exact %.9g", r, ref, exact);
                }
        }
    }
    free(w);
    free(x);
    free(y);
}

/* Where AVX-512 kernels were selected, the AVX2 kernels they replace are
 * checked too: other nodes of a cluster run them. */
static void test_avx2_beside_avx512(void)
{
    if (strcmp(cv_kernels_name(), "avx512") != 0)
        SKIP("no AVX-512 kernels selected here (kernels: %s)", cv_kernels_name());
    const char *was = getenv("CONVOY_KERNELS");
    char *saved = was ? strdup(was) : NULL;
    setenv("CONVOY_KERNELS", "avx2", 1);
    cv_kernels_init(0);
    CHECK(strcmp(cv_kernels_name(), "avx2") == 0);
    test_matmul_rows();
    test_vec_dot_raw_quants32();
    test_kquant_extremes();
    test_q6_K_extremes();
    test_nibble_extremes();
    if (saved)
        setenv("CONVOY_KERNELS", saved, 1);
    else
        unsetenv("CONVOY_KERNELS");
    free(saved);
    cv_kernels_init(0);
}

/* cv_silu_mul: the selected version gives the reference's bits on gates
 * of every size (the exp's range ends, both zeros and infinities
 * included, and each tail length), and each gate is within 4 ulp of
 * silu computed in double. */
static void test_silu_mul(void)
{
    enum { N = 4096 + 7 };
    static float g[N], g_ref[N], u[N];
    static const float edges[] = {0.0f, -0.0f, 87.0f, -87.0f, 88.0f, -88.0f, 87.5f, -87.5f, 88.5f, -88.5f,
                                  100.0f, -100.0f, 1e-30f, -1e-30f, 1e30f, -1e30f, INFINITY, -INFINITY};
    enum { N_EDGES = sizeof edges / sizeof edges[0] };
    for (int i = 0; i < N; i++) {
        const uint64_t r = rng_next();
        g[i] = i < N_EDGES ? edges[i] : rng_float() * ldexpf(1.0f, (int)(r % 16) - 8) * (r >> 8 & 1 ? 100.0f : 1.0f);
        u[i] = i < N_EDGES ? 1.0f : rng_float();
    }
    memcpy(g_ref, g, sizeof g);
    int bad = 0, far = 0;
    for (int n = 0; n <= 17; n++) { /* every tail after whole vectors */
        float a[17], b[17];
        memcpy(a, g, sizeof(float) * (size_t)n);
        memcpy(b, g, sizeof(float) * (size_t)n);
        cv_silu_mul(a, u, n);
        cv_silu_mul_ref(b, u, n);
        for (int i = 0; i < n; i++)
            bad += !same_bits(a[i], b[i]);
    }
    static float want_in[N];
    memcpy(want_in, g_ref, sizeof want_in);
    cv_silu_mul(g, u, N);
    cv_silu_mul_ref(g_ref, u, N);
    for (int i = 0; i < N; i++) {
        bad += !same_bits(g[i], g_ref[i]);
        const double x = want_in[i], want = x / (1.0 + exp(-x)) * u[i];
        if (isfinite(want) && fabs(g_ref[i] - want) > 4 * (nextafterf((float)fabs(want), INFINITY) - (float)fabs(want)) &&
            fabs(want) > 1e-30)
            far++;
    }
    CHECKF(bad == 0, "%s: %d gates differ from the reference", cv_kernels_name(), bad);
    CHECKF(far == 0, "%d gates off silu by more than 4 ulp", far);
    CHECK(same_bits(g_ref[0], 0.0f) && same_bits(g_ref[1], -0.0f) && g_ref[N_EDGES - 2] == INFINITY);
}

int main(void)
{
    cv_kernels_init(0);
    TEST_RUN(test_dispatch);
    TEST_RUN(test_type_table);
    TEST_RUN(test_vec_dot_matches_ref);
    TEST_RUN(test_vec_dot_raw_blocks);
    TEST_RUN(test_vec_dot_raw_quants32);
    TEST_RUN(test_from_float_matches_ref);
    TEST_RUN(test_quantizer_rules);
    TEST_RUN(test_quantizer_rules_quants32);
    TEST_RUN(test_round_trip);
    TEST_RUN(test_vec_dot_accuracy);
    TEST_RUN(test_matmul_rows);
    TEST_RUN(test_kquant_extremes);
    TEST_RUN(test_nibble_extremes);
    TEST_RUN(test_q6_K_extremes);
    TEST_RUN(test_avx2_beside_avx512);
    TEST_RUN(test_silu_mul);
    return test_summary();
}
