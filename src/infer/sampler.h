/* sampler.h: turning a row of logits into a token id.
 *
 * Contract: the steps are in llama.cpp's default order: repetition / frequency /
 * presence penalties over the last `penalty_last_n` accepted ids, then
 * top-k, top-p, min-p, temperature, and a draw from the resulting
 * distribution with the sampler's own RNG (a 64-bit PCG-style generator
 * seeded by `seed`, identical on every platform). temp <= 0 is greedy
 * (argmax of the penalized logits, ties to the lowest id). top_k <= 0,
 * top_p >= 1 and min_p <= 0 disable those steps; penalties of 1 / 0
 * disable them. The same seed and the same logits give the same ids.
 * cv_sampler_sample allocates nothing (buffers are sized at create) and does
 * not modify the caller's logits. cv_sampler_accept records an id in the
 * penalty history (sample does not: a caller that forces a token, as in
 * teacher forcing or speculation, accepts it itself); cv_sampler_rewind
 * takes back the last n accepted ids, exactly while the ids accepted (less
 * those taken back) number at most max(penalty_last_n, n_ctx): a slot's
 * context, as the span passes it. Each sample makes one draw of the RNG (none when
 * greedy), and a rewind does not move the RNG back. A sampler created with
 * n_draws = n is the one that has made n draws, so a sequence replayed
 * elsewhere goes on drawing the same numbers.
 *
 * Speculation needs nothing more: a drafted position is sampled as usual
 * and its draft accepted when they are equal, which for a deterministic
 * drafter is the rejection rule (accepted with probability p(draft), else
 * a draw from p without the draft) and emits the very ids plain decoding
 * emits, one draw each. */
#ifndef CONVOY_INFER_SAMPLER_H
#define CONVOY_INFER_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

/* An id's bias: added to its logit before anything else. */
typedef struct cv_logit_bias {
    int32_t id;
    float bias; /* finite, or -INFINITY */
} cv_logit_bias;

typedef struct cv_sampler_params {
    float temp;            /* default 0.8 in the CLI; 0 = greedy */
    int32_t top_k;         /* default 40 */
    float top_p;           /* default 0.95 */
    float min_p;           /* default 0.05 */
    float repeat_penalty;  /* default 1.0 (off) */
    int32_t penalty_last_n;/* default 64 */
    float freq_penalty;    /* default 0 */
    float presence_penalty;/* default 0 */
    uint64_t seed;
    uint64_t n_draws;      /* draws made before: the RNG starts as after them (a replayed sequence) */
    const cv_logit_bias *bias; /* [n_bias], ids below n_vocab (the later of equal ids wins); copied at create */
    int32_t n_bias;
} cv_sampler_params;

typedef struct cv_sampler cv_sampler;

cv_sampler_params cv_sampler_default_params(void);
/* Refuses ids outside [0, n_vocab) and biases that are NaN or +inf. */
int cv_logit_bias_check(const cv_logit_bias *b, int32_t n, int32_t n_vocab, char *err, size_t errlen);
cv_sampler *cv_sampler_create(const cv_sampler_params *p, int32_t n_vocab, int32_t n_ctx);
int32_t cv_sampler_sample(cv_sampler *s, const float *logits);
void cv_sampler_accept(cv_sampler *s, int32_t id);
void cv_sampler_rewind(cv_sampler *s, int32_t n);
void cv_sampler_reset(cv_sampler *s); /* clears history, reseeds */
void cv_sampler_free(cv_sampler *s);

/* Argmax, ties to the lowest id. */
int32_t cv_argmax(const float *x, int32_t n);

#endif
