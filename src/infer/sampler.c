/* sampler.c: penalties, top-k, top-p, min-p, temperature and a seeded draw.
 *
 * Design: the sampler owns every buffer it needs, sized by n_vocab and the
 * slot's context at create, so cv_sampler_sample never allocates.
 *  - Penalty history is a ring of the last max(penalty_last_n, n_ctx)
 *    accepted ids plus a per-id count kept in step with the last
 *    penalty_last_n of them, so a penalized logit costs one lookup and a
 *    rewind of any length within the context brings the ids it uncovers
 *    back into the window exactly.
 *  - Candidates are (logit, id) pairs ranked by logit descending, then id
 *    ascending: a total order, so cuts through ties are fixed. Top-k keeps a
 *    heap of the k best (root: the worst of them); with top-k off the set is
 *    every id in id order. When top-p or min-p is on, the set is heapified
 *    best-first and popped in rank order only until both cuts are decided,
 *    so a peaked row costs O(n) rather than a full sort. With neither on, the
 *    draw walks the set in its (deterministic) array order. No libc qsort,
 *    which may allocate.
 *  - NaN logits count as -inf, so bad rows cannot break the order. Weights
 *    are exp((logit - max) / temp) in double, and exactly 1 for a logit equal
 *    to the max, so infinite logits give a well-defined distribution (ties at
 *    +inf share it; an all -inf row is uniform). Every sum runs in a fixed
 *    order, so the same logits and seed give the same ids.
 *  - The RNG is PCG with 64-bit state and the RXS-M-XS 64-bit output
 *    function, seeded through splitmix64; a uniform double in [0,1) takes the
 *    top 53 bits. Integer arithmetic only, so it is identical everywhere.
 * The steps follow llama.cpp's default order: top-k, top-p and min-p look
 * at the penalized logits before temperature (top-p's probabilities are
 * those of the top-k set); temperature shapes only the final draw. Every
 * non-greedy sample consumes exactly one draw. */
#include "infer/sampler.h"

#include <math.h>

#include <stdbool.h>

#include "core/alloc.h"
#include "core/err.h"
#include "core/splitmix.h"

typedef struct cv_candidate {
    float logit;
    int32_t id;
} cv_candidate;

struct cv_sampler {
    cv_sampler_params params;
    int32_t n_vocab;
    int penalties_on;      /* some penalty differs from its neutral value */
    float *bias;           /* [n_vocab] each id's logit bias, or NULL for none */
    cv_candidate *cand;    /* [n_vocab] the candidate set (a heap while ranking) */
    cv_candidate *ranked;  /* [n_vocab] candidates popped in rank order */
    double *weight;        /* [n_vocab] draw weights, in draw order */
    int32_t *count;        /* [n_vocab] occurrences of each id in the history */
    int32_t *history;      /* [history_cap] ring of the last accepted ids */
    int32_t history_cap;   /* max(penalty_last_n, n_ctx, 1) */
    int64_t n_accepted;    /* ids accepted since the last reset; the ring holds the last min(this, cap) */
    uint64_t rng_state;
};

cv_sampler_params cv_sampler_default_params(void)
{
    cv_sampler_params p = {
        .temp = 0.8f,
        .top_k = 40,
        .top_p = 0.95f,
        .min_p = 0.05f,
        .repeat_penalty = 1.0f,
        .penalty_last_n = 64,
        .freq_penalty = 0.0f,
        .presence_penalty = 0.0f,
        .seed = 0,
    };
    return p;
}

#define RNG_MUL 6364136223846793005ull
#define RNG_INC 1442695040888963407ull

static uint64_t rng_next(cv_sampler *s)
{
    uint64_t old = s->rng_state;
    s->rng_state = old * RNG_MUL + RNG_INC;
    uint64_t word = ((old >> ((old >> 59) + 5)) ^ old) * 12605985483714917081ull;
    return (word >> 43) ^ word;
}

static double rng_uniform(cv_sampler *s)
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

/* The state n steps later, in O(log n) steps: composing the affine map
 * x -> a x + c with itself by squaring (a wire-given n cannot stall us). */
static uint64_t rng_skip(uint64_t state, uint64_t n)
{
    uint64_t a = RNG_MUL, c = RNG_INC, acc_a = 1, acc_c = 0;
    for (; n; n >>= 1) {
        if (n & 1) {
            acc_a *= a;
            acc_c = acc_c * a + c;
        }
        c *= a + 1;
        a *= a;
    }
    return acc_a * state + acc_c;
}

void cv_sampler_reset(cv_sampler *s)
{
    int64_t held = s->n_accepted < s->history_cap ? s->n_accepted : s->history_cap;
    for (int64_t i = 0; i < held; i++)
        s->count[s->history[i]] = 0;
    s->n_accepted = 0;
    s->rng_state = rng_skip(cv_splitmix64(s->params.seed), s->params.n_draws);
}

void cv_sampler_free(cv_sampler *s)
{
    if (!s)
        return;
    cv_free(s->cand);
    cv_free(s->ranked);
    cv_free(s->weight);
    cv_free(s->count);
    cv_free(s->history);
    cv_free(s->bias);
    cv_free(s);
}

cv_sampler *cv_sampler_create(const cv_sampler_params *p, int32_t n_vocab, int32_t n_ctx)
{
    if (n_vocab <= 0)
        return NULL;
    cv_sampler *s = cv_calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->params = p ? *p : cv_sampler_default_params();
    if (s->params.penalty_last_n < 0)
        s->params.penalty_last_n = 0;
    s->n_vocab = n_vocab;
    s->penalties_on = s->params.penalty_last_n > 0 &&
                      (s->params.repeat_penalty != 1.0f || s->params.freq_penalty != 0.0f ||
                       s->params.presence_penalty != 0.0f);
    s->cand = cv_malloc((size_t)n_vocab * sizeof(*s->cand));
    s->ranked = cv_malloc((size_t)n_vocab * sizeof(*s->ranked));
    s->weight = cv_malloc((size_t)n_vocab * sizeof(*s->weight));
    s->count = cv_calloc((size_t)n_vocab, sizeof(*s->count));
    s->history_cap = s->params.penalty_last_n > n_ctx ? s->params.penalty_last_n : n_ctx;
    if (s->history_cap < 1)
        s->history_cap = 1;
    s->history = cv_malloc((size_t)s->history_cap * sizeof(*s->history));
    const bool biased = s->params.n_bias > 0;
    if (biased && (s->bias = cv_calloc((size_t)n_vocab, sizeof(*s->bias))))
        for (int32_t i = 0; i < s->params.n_bias; i++)
            s->bias[s->params.bias[i].id] = s->params.bias[i].bias;
    s->params.bias = NULL; /* the caller's array is not kept: s->bias holds it */
    s->params.n_bias = 0;
    if (!s->cand || !s->ranked || !s->weight || !s->count || !s->history || (biased && !s->bias)) {
        cv_sampler_free(s);
        return NULL;
    }
    cv_sampler_reset(s);
    return s;
}

/* The id accepted at index i of the history (i within the ring). */
static int32_t *history_at(cv_sampler *s, int64_t i)
{
    return &s->history[i % s->history_cap];
}

int cv_logit_bias_check(const cv_logit_bias *b, int32_t n, int32_t n_vocab, char *err, size_t errlen)
{
    for (int32_t i = 0; i < n; i++) {
        if (b[i].id < 0 || b[i].id >= n_vocab)
            return cv_errf(err, errlen, "logit bias for id %d, outside the vocabulary of %d", b[i].id, n_vocab);
        if (isnan(b[i].bias) || b[i].bias == INFINITY)
            return cv_errf(err, errlen, "logit bias of id %d is not finite or -inf", b[i].id);
    }
    return 0;
}

void cv_sampler_accept(cv_sampler *s, int32_t id)
{
    const int32_t window = s->params.penalty_last_n;
    if (id < 0 || id >= s->n_vocab || window == 0)
        return;
    if (s->n_accepted >= window) /* read before the ring's slot is reused */
        s->count[*history_at(s, s->n_accepted - window)]--;
    *history_at(s, s->n_accepted) = id;
    s->count[id]++;
    s->n_accepted++;
}

void cv_sampler_rewind(cv_sampler *s, int32_t n)
{
    const int32_t window = s->params.penalty_last_n;
    for (; n > 0 && s->n_accepted > 0; n--) {
        s->n_accepted--;
        s->count[*history_at(s, s->n_accepted)]--;
        int64_t back = s->n_accepted - window;
        if (back >= 0)
            s->count[*history_at(s, back)]++;
    }
}

/* NaN ranks as -inf (never above anything); n <= 0 gives -1. */
int32_t cv_argmax(const float *x, int32_t n)
{
    if (n <= 0)
        return -1;
    int32_t best = 0;
    float best_x = isnan(x[0]) ? -INFINITY : x[0];
    for (int32_t i = 1; i < n; i++) {
        if (x[i] > best_x) {
            best = i;
            best_x = x[i];
        }
    }
    return best;
}

/* The logit of `id` after its bias and penalties, with NaN as -inf. */
static float penalized_logit(const cv_sampler *s, const float *logits, int32_t id)
{
    float v = s->bias ? logits[id] + s->bias[id] : logits[id];
    if (s->penalties_on) {
        int32_t c = s->count[id];
        if (c > 0) {
            float rp = s->params.repeat_penalty;
            v = v <= 0.0f ? v * rp : v / rp;
            v -= (float)c * s->params.freq_penalty + s->params.presence_penalty;
        }
    }
    return isnan(v) ? -INFINITY : v;
}

/* exp((logit - max) / temp), exactly 1 at the max (also when it is infinite). */
static double relative_weight(float logit, float max_logit, double temp)
{
    if (logit == max_logit)
        return 1.0;
    return exp(((double)logit - (double)max_logit) / temp);
}

/* a ranks below b: smaller logit, or equal logit and larger id. */
static int ranks_below(cv_candidate a, cv_candidate b)
{
    return a.logit < b.logit || (a.logit == b.logit && a.id > b.id);
}

/* Heap order: with worst_on_top every parent ranks below its children (the
 * top-k selection heap); otherwise every parent ranks above them. */
static int goes_above(cv_candidate a, cv_candidate b, int worst_on_top)
{
    return worst_on_top ? ranks_below(a, b) : ranks_below(b, a);
}

static void sift_down(cv_candidate *heap, int32_t n, int32_t i, int worst_on_top)
{
    for (;;) {
        int32_t top = i, l = 2 * i + 1, r = 2 * i + 2;
        if (l < n && goes_above(heap[l], heap[top], worst_on_top))
            top = l;
        if (r < n && goes_above(heap[r], heap[top], worst_on_top))
            top = r;
        if (top == i)
            return;
        cv_candidate t = heap[i];
        heap[i] = heap[top];
        heap[top] = t;
        i = top;
    }
}

/* Fills s->cand with the candidate set and returns its size: the k best
 * (as a heap) when k < n_vocab, otherwise every id in id order. */
static int32_t collect_candidates(cv_sampler *s, const float *logits, int32_t k)
{
    cv_candidate *cand = s->cand;
    if (k >= s->n_vocab) {
        for (int32_t id = 0; id < s->n_vocab; id++)
            cand[id] = (cv_candidate){penalized_logit(s, logits, id), id};
        return s->n_vocab;
    }
    for (int32_t id = 0; id < k; id++)
        cand[id] = (cv_candidate){penalized_logit(s, logits, id), id};
    for (int32_t i = k / 2 - 1; i >= 0; i--)
        sift_down(cand, k, i, 1);
    for (int32_t id = k; id < s->n_vocab; id++) {
        cv_candidate c = {penalized_logit(s, logits, id), id};
        if (ranks_below(cand[0], c)) {
            cand[0] = c;
            sift_down(cand, k, 0, 1);
        }
    }
    return k;
}

/* Greedy choice: argmax of the penalized logits, ties to the lowest id. */
static int32_t greedy_id(const cv_sampler *s, const float *logits)
{
    int32_t best = 0;
    float best_logit = penalized_logit(s, logits, 0);
    for (int32_t id = 1; id < s->n_vocab; id++) {
        float v = penalized_logit(s, logits, id);
        if (v > best_logit) {
            best = id;
            best_logit = v;
        }
    }
    return best;
}

/* The distribution a draw is made from (temp > 0): its ids in draw order
 * (*draw, *n) and their weights in s->weight; returns the weights' sum. */
static double distribution(cv_sampler *s, const float *logits, const cv_candidate **draw_out, int32_t *n_out)
{
    const cv_sampler_params *p = &s->params;
    int32_t k = p->top_k > 0 && p->top_k < s->n_vocab ? p->top_k : s->n_vocab;
    int32_t n_set = collect_candidates(s, logits, k);
    cv_candidate *cand = s->cand;
    float max_logit = cand[0].logit;
    for (int32_t i = 1; i < n_set; i++)
        if (cand[i].logit > max_logit)
            max_logit = cand[i].logit;

    int top_p_on = p->top_p < 1.0f;
    int min_p_on = p->min_p > 0.0f;
    const cv_candidate *draw = cand;
    int32_t n = n_set;
    if (top_p_on || min_p_on) {
        double set_sum = 0.0;
        if (top_p_on)
            for (int32_t i = 0; i < n_set; i++)
                set_sum += relative_weight(cand[i].logit, max_logit, 1.0);
        for (int32_t i = n_set / 2 - 1; i >= 0; i--)
            sift_down(cand, n_set, i, 0);
        /* Pop the best until top-p's mass is reached or min-p cuts. */
        int32_t heap_size = n_set;
        double cum = 0.0;
        n = 0;
        while (heap_size > 0) {
            cv_candidate c = cand[0];
            double w = relative_weight(c.logit, max_logit, 1.0);
            if (n > 0 && min_p_on && w < (double)p->min_p)
                break;
            s->ranked[n++] = c;
            cand[0] = cand[--heap_size];
            sift_down(cand, heap_size, 0, 0);
            if (top_p_on) {
                cum += w / set_sum;
                if (cum >= (double)p->top_p)
                    break;
            }
        }
        draw = s->ranked;
    }

    double temp = p->temp;
    double *w = s->weight;
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        w[i] = relative_weight(draw[i].logit, max_logit, temp);
        sum += w[i];
    }
    *draw_out = draw;
    *n_out = n;
    return sum;
}

int32_t cv_sampler_sample(cv_sampler *s, const float *logits)
{
    if (!(s->params.temp > 0.0f))
        return greedy_id(s, logits);
    const cv_candidate *draw;
    int32_t n;
    const double sum = distribution(s, logits, &draw, &n);
    const double target = rng_uniform(s) * sum;
    double cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += s->weight[i];
        if (target < cum)
            return draw[i].id;
    }
    return draw[n - 1].id;
}
