/* spec.c: speculative decoding at the head (include/convoy.h, docs/DESIGN.md §11).
 *
 * A convoy_spec owns a drafter (infer/draft.h) and chooses, per sequence,
 * how many drafts K the next verify carries. The verify itself is an
 * ordinary batch through convoy_submit: the newest token plus its drafts
 * (want 2), checked by the last span (the one holding the output matrix:
 * the last stage's).
 *
 * Choosing K: with a per-draft acceptance rate a (drafts are accepted in
 * order until the first rejection, so a is estimated as accepted drafts
 * over drafts judged, the rejected one included), a round emits on average
 * E(K) = (1 - a^(K+1)) / (1 - a) tokens. A round with K drafts costs
 * T(K): its measured mean when rounds of that K have been seen (a decayed
 * mean, shared by all sequences: the link and the machines are), else
 * t0 + t1 K, a fixed part (the traversal: round trips, one pass over the
 * weights) and a part per draft (drafting it, verifying one more row), from
 * a least-squares fit of every measured round time against K with
 * exponential forgetting. Costs are not always linear in K (frames that
 * cross a size where the network stack behaves differently, batches that
 * fill SIMD tiles, the draft model catching up on accepted tokens), so
 * every eighth round of a sequence probes another K: K = 0 once, then
 * twice or half the best one, alternately, and the measured means take
 * over. A new
 * sequence starts from the acceptance of all sequences so far as a prior. The next K maximizes
 * E(K) / T(K); K = 0 (plain decoding) wins where drafting costs more than
 * it saves, and the probes keep measuring K = 1 meanwhile. A fixed K
 * (--spec-k) skips all of this.
 *
 * Choosing D, the windows in flight (a pipeline): with the K last drafted,
 * a window is accepted whole with p = a^K, takes R from send to result
 * (the measured latency of windows whose result the head waited for: one
 * that came while the head was drafting measures the head, and counting it
 * would make more windows look needed the more there are; before any, the
 * measured round time of that K), and occupies the slowest stage for
 * (K + 1) times its seconds per token, or the head for K times the
 * drafter's measured seconds per draft, or for the head's measured busy
 * time per window: c, the longest. Windows go out every
 * max(R / D, c): beyond D = R / c they only queue. A run of live windows
 * ends at a cut (n = 1 / (1 - p) windows on average): the run's first
 * result comes R after the cut was known, the others every max(R / D, c),
 * and the D - 1 windows sent behind the cut are stale. They cost time
 * only where they hold the slowest stage or the head longer than the
 * round trip hides ((D - 1) c - R, when positive). So the tokens per
 * second are proportional to n / (R + (n - 1) max(R / D, c) +
 * max(0, (D - 1) c - R)), and the next D maximizes it: all the windows
 * allowed behind a long round trip, one where the head or a stage binds.
 * The model takes the machines for separate ones; where the round trip
 * hides only a few windows' work (R < SPEC_DEPTH_TRUST c) its gain is
 * small, and the head and a node sharing a CPU (a LAN's test hosts, a
 * head that is its own first stage) take it away: there the tokens per
 * second measured with one window and with the model's D decide, the one
 * that loses getting SPEC_ARM_TRY of every SPEC_ARM_PERIOD choices so
 * that it stays measured. A fixed D (--spec-windows) skips this. */
#include <math.h>

#include "convoy.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/err.h"
#include "infer/draft.h"

#define SPEC_FORGET 0.05  /* weight of the newest round in the fit's averages */
#define SPEC_K_MEAN 0.3   /* weight of the newest round in the mean time of its K */
#define SPEC_K_START 4    /* K before any round was measured */
#define SPEC_PRIOR 4.0    /* weight, in drafts, of all sequences' acceptance in a new one's */
#define SPEC_PROBE 8      /* every SPEC_PROBE-th round of a sequence probes another K */
#define SPEC_DEPTH_TRUST 4.0 /* a round trip of more windows' work than this: the model's D stands */
#define SPEC_ARM_PERIOD 32   /* of every SPEC_ARM_PERIOD choices between one window and the model's D, */
#define SPEC_ARM_TRY 4       /* SPEC_ARM_TRY go to the one measured slower */

typedef struct spec_seq {
    double judged, accepted; /* decayed counts of drafts judged and accepted */
    uint32_t rounds;
    int32_t last_k;          /* K of its latest proposal with drafts */
    bool many;               /* its windows go by the model's D > 1, not one at a time */
    double out_t;            /* when its latest outputs came (seconds); 0: none yet */
} spec_seq;

struct convoy_spec {
    cv_drafter *drafter;
    int32_t k_fixed, k_max, n_slot, windows;
    spec_seq *seq;           /* [n_slot] */
    cv_draft_req *reqs;      /* [n_slot] */
    int32_t *ask;            /* [n_slot] */
    /* decayed moments of (K, round seconds) over every sequence */
    double n, sk, st, skk, skt;
    double judged, accepted; /* decayed counts over every sequence */
    double *k_time;          /* [k_max + 1] decayed mean seconds of a round with K drafts */
    double draft_s;          /* decayed mean seconds the drafter takes per draft */
    double latency_s;        /* decayed mean seconds from a window's submit to its result, when waited for */
    double busy_s;           /* decayed mean seconds the head spends per window outside waiting */
    double arm_tokens[2], arm_s[2]; /* decayed outputs and seconds with one window [0], the model's D [1] */
    uint32_t arm_turns;      /* choices between them so far */
    int32_t n_sent;          /* batches sent since the last collect */
    double collected;        /* when the last collect returned (seconds); 0: the head idled since */
    bool *k_seen;            /* [k_max + 1] */
    convoy_spec_stats stats;
};

convoy_spec_params convoy_spec_default_params(void)
{
    return (convoy_spec_params){.draft = "ngram", .k = 0, .k_max = 16, .n_threads = 1, .windows = 0};
}

convoy_spec *convoy_spec_create(convoy_ctx *c, const convoy_model *m, const convoy_spec_params *p, char *err,
                                size_t errlen)
{
    if (p->windows < 0 || p->windows > CONVOY_SPEC_WINDOWS_MAX) {
        cv_errf(err, errlen, "speculation: %d windows in flight, not 0 (chosen) to %d", p->windows,
                CONVOY_SPEC_WINDOWS_MAX);
        return NULL;
    }
    if (p->k < 0 || p->k_max < 1 || p->k > p->k_max || p->k_max > CONVOY_SPEC_K_LIMIT) {
        cv_errf(err, errlen, "speculation: K %d and K max %d must satisfy 0 <= K <= K max <= %d", p->k, p->k_max,
                CONVOY_SPEC_K_LIMIT);
        return NULL;
    }
    if (p->k_max + 1 > convoy_ctx_n_batch(c)) {
        cv_errf(err, errlen, "speculation: K max %d does not fit a batch of %d", p->k_max, convoy_ctx_n_batch(c));
        return NULL;
    }
    convoy_spec *s = cv_calloc(1, sizeof *s);
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    const int32_t n_slot = convoy_ctx_n_slot(c);
    if (!s || !(s->seq = cv_calloc((size_t)n_slot, sizeof *s->seq)) ||
        !(s->reqs = cv_calloc((size_t)n_slot, sizeof *s->reqs)) || !(s->ask = cv_calloc((size_t)n_slot, sizeof *s->ask)) ||
        !(s->k_time = cv_calloc((size_t)p->k_max + 1, sizeof *s->k_time)) ||
        !(s->k_seen = cv_calloc((size_t)p->k_max + 1, sizeof *s->k_seen))) {
        convoy_spec_free(s);
        cv_errf(err, errlen, "out of memory");
        return NULL;
    }
    s->k_fixed = p->k;
    s->windows = p->windows;
    s->k_max = p->k_max;
    s->n_slot = n_slot;
    const cv_drafter_params dp = {.n_slot = n_slot, .n_ctx = convoy_ctx_n_ctx(c), .n_threads = p->n_threads,
                                  .n_vocab = info.n_vocab, .k_max = p->k_max};
    if (!(s->drafter = cv_drafter_open(p->draft, &dp, err, errlen))) {
        convoy_spec_free(s);
        return NULL;
    }
    for (int32_t i = 0; i < n_slot; i++)
        convoy_spec_seq_free(s, i);
    return s;
}

void convoy_spec_free(convoy_spec *s)
{
    if (!s)
        return;
    cv_drafter_free(s->drafter);
    cv_free(s->seq);
    cv_free(s->reqs);
    cv_free(s->ask);
    cv_free(s->k_time);
    cv_free(s->k_seen);
    cv_free(s);
}

const char *convoy_spec_drafter(const convoy_spec *s) { return cv_drafter_name(s->drafter); }
int32_t convoy_spec_k_max(const convoy_spec *s) { return s->k_max; }
/* Expected tokens per round over expected seconds per round. */
/* A decayed mean that starts at its first sample. */
static void mean_in(double *mean, double x)
{
    *mean = *mean > 0.0 ? (1.0 - SPEC_K_MEAN) * *mean + SPEC_K_MEAN * x : x;
}

static double spec_rate(const convoy_spec *s, double a, double t0, double t1, int32_t k)
{
    const double emitted = a >= 1.0 ? k + 1.0 : (1.0 - pow(a, k + 1.0)) / (1.0 - a);
    return emitted / (s->k_seen[k] ? s->k_time[k] : t0 + t1 * k);
}

/* The sequence's acceptance, with a prior worth SPEC_PRIOR drafts: the
 * acceptance of every sequence so far (one in two before any). */
static double seq_acceptance(const convoy_spec *s, const spec_seq *q)
{
    const double all = s->judged > 0.0 ? s->accepted / s->judged : 0.5;
    return (q->accepted + SPEC_PRIOR * all) / (q->judged + SPEC_PRIOR);
}

/* The least-squares fit of round seconds t0 + t1 K. */
static void fit_round(const convoy_spec *s, double *t0, double *t1)
{
    const double mk = s->sk / s->n, mt = s->st / s->n;
    const double var = s->skk / s->n - mk * mk;
    *t1 = var > 1e-6 ? (s->skt / s->n - mk * mt) / var : 0.0;
    if (*t1 < 0.0)
        *t1 = 0.0;
    *t0 = mt - *t1 * mk;
    if (*t0 < 1e-6)
        *t0 = 1e-6;
}

static int32_t choose_k(const convoy_spec *s, const spec_seq *q)
{
    if (s->k_fixed)
        return s->k_fixed;
    if (s->n < 1.0) /* no round measured yet */
        return SPEC_K_START < s->k_max ? SPEC_K_START : s->k_max;
    const double a = seq_acceptance(s, q);
    double t0, t1;
    fit_round(s, &t0, &t1);
    int32_t best = 0;
    double best_rate = spec_rate(s, a, t0, t1, 0);
    for (int32_t k = 1; k <= s->k_max; k++) {
        const double rate = spec_rate(s, a, t0, t1, k);
        if (rate > best_rate) {
            best = k;
            best_rate = rate;
        }
    }
    if (q->rounds % SPEC_PROBE == SPEC_PROBE - 1) { /* a plain round first, then twice or half the best K */
        const int32_t twice = best * 2 > s->k_max ? s->k_max : (best ? best * 2 : 1);
        best = !s->k_seen[0] ? 0 : (q->rounds / SPEC_PROBE) % 2 == 0 || best < 2 ? twice : best / 2;
    }
    return best;
}

/* Relative tokens per second of d windows in flight (the header). */
static double windows_rate(double p, double round_s, double window_s, int32_t d)
{
    const double n_live = 1.0 / fmax(1.0 - p, 1e-6);
    const double every = fmax(round_s / d, window_s);
    const double stale = fmax(0.0, (d - 1) * window_s - round_s);
    return n_live / (round_s + (n_live - 1.0) * every + stale);
}

/* Whether the model's D goes ahead of one window, by their measured
 * rates (one not yet measured is tried first), but for SPEC_ARM_TRY of
 * every SPEC_ARM_PERIOD choices, which go to the other. */
static bool many_wins(convoy_spec *s)
{
    const double one = s->arm_s[0] > 0.0 ? s->arm_tokens[0] / s->arm_s[0] : 0.0;
    const double many = s->arm_s[1] > 0.0 ? s->arm_tokens[1] / s->arm_s[1] : 0.0;
    const bool wins = s->arm_s[0] > 0.0 && (s->arm_s[1] == 0.0 || many > one);
    return s->arm_turns++ % SPEC_ARM_PERIOD < SPEC_ARM_TRY ? !wins : wins;
}

int32_t convoy_spec_windows(convoy_spec *s, int32_t seq, double stage_s, int32_t max)
{
    if (max > CONVOY_SPEC_WINDOWS_MAX)
        max = CONVOY_SPEC_WINDOWS_MAX;
    if (s->windows)
        return s->windows < max ? s->windows : max;
    if (seq < 0 || seq >= s->n_slot || s->n < 1.0 || max <= 1 || s->seq[seq].last_k == 0)
        return 1; /* nothing measured, or nothing drafted, yet */
    const spec_seq *q = &s->seq[seq];
    const int32_t k = q->last_k;
    double t0, t1;
    fit_round(s, &t0, &t1);
    const double round_s = s->latency_s > 0.0 ? s->latency_s : s->k_seen[k] ? s->k_time[k] : t0 + t1 * k;
    const double p = pow(seq_acceptance(s, q), k);
    const double window_s = fmax(fmax(stage_s * (k + 1), s->draft_s * k), s->busy_s);
    int32_t best = 1;
    for (int32_t d = 2; d <= max; d++)
        if (windows_rate(p, round_s, window_s, d) > windows_rate(p, round_s, window_s, best))
            best = d;
    if (best > 1 && round_s < SPEC_DEPTH_TRUST * window_s && !many_wins(s))
        best = 1;
    s->seq[seq].many = best > 1;
    return best;
}

int convoy_spec_propose(convoy_spec *s, convoy_spec_req *reqs, int32_t n, char *err, size_t errlen)
{
    if (n > s->n_slot)
        return cv_errf(err, errlen, "speculation: %d proposals, %d slots", n, s->n_slot);
    int32_t n_ask = 0; /* requests with K > 0, in s->reqs; s->ask[j] is the caller's index */
    for (int32_t i = 0; i < n; i++) {
        if (reqs[i].seq < 0 || reqs[i].seq >= s->n_slot)
            return cv_errf(err, errlen, "speculation: slot %d is outside [0, %d)", reqs[i].seq, s->n_slot);
        spec_seq *q = &s->seq[reqs[i].seq];
        const int32_t chosen = choose_k(s, q);
        reqs[i].n_draft = 0;
        const int32_t k = chosen < reqs[i].max_draft ? chosen : reqs[i].max_draft;
        if (k <= 0)
            continue;
        q->last_k = k; /* a plain probe round says nothing of the windows behind it */
        s->ask[n_ask] = i;
        s->reqs[n_ask++] = (cv_draft_req){.slot = reqs[i].seq, .hist = reqs[i].hist, .n_hist = reqs[i].n_hist,
                                          .k = k, .out = reqs[i].drafts};
    }
    const double t0 = cv_now_s();
    if (n_ask && cv_drafter_propose(s->drafter, s->reqs, n_ask, err, errlen))
        return -1;
    int32_t drafted = 0;
    for (int32_t j = 0; j < n_ask; j++)
        drafted += reqs[s->ask[j]].n_draft = s->reqs[j].n_out;
    if (drafted > 0) { /* the head drafts while windows travel: its cost per draft bounds D too */
        const double per = (cv_now_s() - t0) / drafted;
        mean_in(&s->draft_s, per);
    }
    return 0;
}

void convoy_spec_observe(convoy_spec *s, int32_t seq, int32_t n_draft, int32_t n_accepted, double round_s)
{
    if (seq < 0 || seq >= s->n_slot || n_draft < 0 || n_draft > s->k_max)
        return;
    spec_seq *q = &s->seq[seq];
    const double keep = 1.0 - SPEC_FORGET;
    if (n_draft > 0) {
        const int32_t judged = n_accepted < n_draft ? n_accepted + 1 : n_accepted;
        q->judged = q->judged * keep + judged;
        q->accepted = q->accepted * keep + n_accepted;
        s->judged = s->judged * keep + judged;
        s->accepted = s->accepted * keep + n_accepted;
    }
    q->rounds++;
    const double now = cv_now_s();
    if (q->out_t > 0.0) {
        s->arm_tokens[q->many] = s->arm_tokens[q->many] * keep + (n_accepted + 1);
        s->arm_s[q->many] = s->arm_s[q->many] * keep + (now - q->out_t);
    }
    q->out_t = now;
    s->k_time[n_draft] = s->k_seen[n_draft] ? (1.0 - SPEC_K_MEAN) * s->k_time[n_draft] + SPEC_K_MEAN * round_s : round_s;
    s->k_seen[n_draft] = true;
    const double k = n_draft;
    s->n = s->n * keep + 1.0;
    s->sk = s->sk * keep + k;
    s->st = s->st * keep + round_s;
    s->skk = s->skk * keep + k * k;
    s->skt = s->skt * keep + k * round_s;
    s->stats.rounds++;
    s->stats.drafted += (uint64_t)n_draft;
    s->stats.accepted += (uint64_t)n_accepted;
}

void convoy_spec_sent(convoy_spec *s) { s->n_sent++; }

void convoy_spec_collected(convoy_spec *s, double sent_at, double t_call, double t_return, bool waited)
{
    if (waited && sent_at >= 0.0 && t_return > sent_at)
        mean_in(&s->latency_s, t_return - sent_at);
    /* after an idle time (or the prefill) there is no busy time to measure */
    const double busy = (t_call - s->collected) + (waited ? 0.0 : t_return - t_call);
    if (s->collected > 0.0 && busy > 0.0)
        mean_in(&s->busy_s, busy / (s->n_sent > 1 ? s->n_sent : 1));
    s->collected = t_return;
    s->n_sent = 0;
}

void convoy_spec_idle(convoy_spec *s) { s->collected = 0.0; }

void convoy_spec_seq_free(convoy_spec *s, int32_t seq)
{
    if (seq < 0 || seq >= s->n_slot)
        return;
    s->seq[seq] = (spec_seq){0};
    cv_drafter_seq_free(s->drafter, seq);
}

void convoy_spec_get_stats(const convoy_spec *s, convoy_spec_stats *out) { *out = s->stats; }
