/* simulate.c: the chain simulation (see simulate.h). Each batch in flight
 * has one next event: it reaches a stage, its stage finishes it, or its
 * result reaches the head; a batch that reaches a busy stage waits in its
 * queue. Stages running at once on one CPU share it evenly, as the
 * kernel's scheduler shares a core among processes: each one's work left
 * shrinks at 1/n of the wall clock while n run there. The simulation
 * takes the earliest event in turn; when a result comes back the head
 * collects it and sends while the load allows. */
#include "pipe/simulate.h"

#include <stdbool.h>
#include <string.h>

#include "core/splitmix.h"

#define SIM_MAX_USERS 64
#define SIM_MAX_FLIGHTS 32
#define SIM_SEED 0x5eedu

typedef struct sim_user {
    int64_t emitted;
    int32_t in_flight;
    int32_t live;   /* of them, sent since the last cut */
    uint32_t epoch; /* advanced by a window cut short: those sent before it are stale */
} sim_user;

typedef enum flight_state {
    FLIGHT_FREE,      /* no batch */
    FLIGHT_ARRIVING,  /* on the hop into `stage`, there at t */
    FLIGHT_QUEUED,    /* at `stage` since t, the stage busy */
    FLIGHT_RUNNING,   /* computed by `stage`, `left` of its CPU's time to go */
    FLIGHT_RETURNING, /* its result at the head at t */
} flight_state;

typedef struct flight {
    flight_state state;
    int stage;
    double t;
    double left;                  /* running: microseconds of a whole CPU still needed */
    int32_t rows;
    double pos_sum;               /* its rows' positions summed */
    int32_t group;                /* -1: windows of users that left their groups */
    int32_t n;                    /* users with a window in it */
    int32_t user[SIM_MAX_USERS];
    uint32_t epoch[SIM_MAX_USERS];
    int32_t drafts[SIM_MAX_USERS];
    bool behind[SIM_MAX_USERS];   /* sent behind its user's windows in flight: drafts alone */
} flight;

typedef struct sim {
    const cv_sim_chain *c;
    const cv_sim_load *l;
    int cpu_of[CV_CHAIN_MAX_NODES];    /* stage -> the first stage of its CPU, which stands for it */
    int running[CV_CHAIN_MAX_NODES];   /* per CPU, its stages computing now */
    bool stage_busy[CV_CHAIN_MAX_NODES];
    double now;                        /* the running batches' `left` are as of now */
    double busy[CV_CHAIN_MAX_NODES];   /* each stage's computing time */
    sim_user user[SIM_MAX_USERS];
    flight fl[SIM_MAX_FLIGHTS];
    int32_t n_flying, n_users, depth, groups, next_group;
    bool group_busy[SIM_MAX_USERS];
    uint64_t rng;
} sim;

/* T(rows): the measured points joined by lines, the last one's slope
 * past them; the line without them. */
static double per_layer_us(const cv_sim_stage *s, int32_t rows)
{
    static const int32_t size[CV_SIM_ROWS] = CV_SIM_ROW_SIZES;
    if (s->us_rows[0] <= 0)
        return s->us_layer + (rows - 1) * s->us_row;
    int k = 1;
    while (k < CV_SIM_ROWS - 1 && rows > size[k])
        k++;
    const double slope = (s->us_rows[k] - s->us_rows[k - 1]) / (size[k] - size[k - 1]);
    return s->us_rows[k - 1] + (rows - size[k - 1]) * slope;
}

double cv_sim_stage_us(const cv_sim_stage *s, int32_t rows, double pos_sum)
{
    return rows > 0 ? s->work * per_layer_us(s, rows) + s->layers * s->us_pos * pos_sum : 0;
}

/* ---- the chain ---- */

static double hop_us(const sim *s, int hop, int32_t rows)
{
    return s->c->hop[hop].us + rows * s->c->hop[hop].us_per_row;
}

/* Starts the batch that has waited longest at stage st. */
static void start_next(sim *s, int st)
{
    flight *next = NULL;
    for (int i = 0; i < SIM_MAX_FLIGHTS; i++) {
        flight *f = &s->fl[i];
        if (f->state == FLIGHT_QUEUED && f->stage == st && (!next || f->t < next->t))
            next = f;
    }
    s->stage_busy[st] = next != NULL;
    if (!next)
        return;
    next->left = cv_sim_stage_us(&s->c->stage[st], next->rows, next->pos_sum);
    s->busy[st] += next->left;
    s->running[s->cpu_of[st]]++;
    next->state = FLIGHT_RUNNING;
}

/* When batch f's next event comes. */
static double event_t(const sim *s, const flight *f)
{
    return f->state == FLIGHT_RUNNING ? s->now + f->left * s->running[s->cpu_of[f->stage]] : f->t;
}

/* The clock moved to t: each running batch got its share of its CPU. */
static void advance(sim *s, double t)
{
    for (int i = 0; i < SIM_MAX_FLIGHTS; i++) {
        flight *f = &s->fl[i];
        if (f->state == FLIGHT_RUNNING)
            f->left -= (t - s->now) / s->running[s->cpu_of[f->stage]];
    }
    s->now = t;
}

/* A batch sent at t onto the hop into the first stage. */
static void launch(sim *s, flight *f, double t)
{
    f->state = FLIGHT_ARRIVING;
    f->stage = 0;
    f->t = t + hop_us(s, 0, f->rows);
    s->n_flying++;
}

/* Takes the earliest event (false when none is left); *back is the batch
 * whose result it brought to the head, else NULL. */
static bool step(sim *s, flight **back)
{
    flight *f = NULL;
    double t = 0;
    *back = NULL;
    for (int i = 0; i < SIM_MAX_FLIGHTS; i++) {
        flight *g = &s->fl[i];
        if (g->state == FLIGHT_FREE || g->state == FLIGHT_QUEUED)
            continue;
        const double tg = event_t(s, g);
        if (!f || tg < t)
            f = g, t = tg;
    }
    if (!f)
        return false;
    advance(s, t);
    switch (f->state) {
    case FLIGHT_ARRIVING:
        f->state = FLIGHT_QUEUED;
        if (!s->stage_busy[f->stage])
            start_next(s, f->stage);
        return true;
    case FLIGHT_RUNNING: {
        const int st = f->stage++;
        s->running[s->cpu_of[st]]--;
        f->state = f->stage < s->c->n_stages ? FLIGHT_ARRIVING : FLIGHT_RETURNING;
        f->t = t + hop_us(s, f->stage, f->rows);
        start_next(s, st);
        return true;
    }
    default: /* FLIGHT_RETURNING */
        f->state = FLIGHT_FREE;
        s->n_flying--;
        *back = f;
        return true;
    }
}

static flight *free_flight(sim *s)
{
    for (int i = 0; i < SIM_MAX_FLIGHTS; i++)
        if (s->fl[i].state == FLIGHT_FREE)
            return &s->fl[i];
    return NULL;
}

/* ---- the users ---- */

/* A draw in [0, 1). */
static double draw(sim *s)
{
    s->rng = cv_splitmix64(s->rng);
    return (double)(s->rng >> 11) / 9007199254740992.0;
}

/* The drafts a window carries: K, or none, `drafts` on average. */
static int32_t window_drafts(sim *s)
{
    const cv_sim_load *l = s->l;
    return l->spec_k > 0 && draw(s) * l->spec_k < l->drafts ? l->spec_k : 0;
}

/* Of a window's k drafts, those accepted: each in turn with probability accept. */
static int32_t accepted(sim *s, int32_t k)
{
    int32_t j = 0;
    while (j < k && draw(s) < s->l->accept)
        j++;
    return j;
}

/* Whether user u sends a window with the batch being built: a group's
 * member when that group goes, any user below its windows otherwise. */
static bool sends(const sim *s, int32_t u, int32_t group)
{
    return group >= 0 ? u % s->groups == group : s->user[u].in_flight < s->l->windows;
}

/* The next group without a batch in flight, -1 when none; -1 too when
 * users send windows rather than sit in groups. */
static int32_t next_group(sim *s, bool *none)
{
    *none = false;
    if (s->l->windows > 1)
        return -1;
    for (int32_t g = 0; g < s->groups; g++) {
        const int32_t group = (s->next_group + g) % s->groups;
        if (!s->group_busy[group]) {
            s->next_group = (group + 1) % s->groups;
            return group;
        }
    }
    *none = true;
    return -1;
}

/* Builds and sends the next batch at t; false when no user can send. */
static bool send_batch(sim *s, double t)
{
    bool none;
    flight *f = free_flight(s);
    const int32_t group = f ? next_group(s, &none) : -1;
    if (!f || none)
        return false;
    *f = (flight){.group = group};
    for (int32_t u = 0; u < s->n_users; u++) {
        if (!sends(s, u, group))
            continue;
        const int32_t drafts = window_drafts(s), n = 1 + drafts;
        const bool behind = s->user[u].live > 0;
        if (behind && drafts == 0) /* nothing to guess with */
            continue;
        f->user[f->n] = u;
        f->epoch[f->n] = s->user[u].epoch;
        f->behind[f->n] = behind;
        f->drafts[f->n++] = drafts;
        f->pos_sum += n * (double)(s->l->prompt + s->user[u].emitted) + n * (n - 1) / 2.0;
        f->rows += n;
        s->user[u].in_flight++;
        s->user[u].live++;
    }
    if (f->n == 0)
        return false;
    if (group >= 0)
        s->group_busy[group] = true;
    launch(s, f, t);
    return true;
}

/* A result at the head: its windows emit their tokens (a stale one none,
 * a cut one makes its user's later windows stale). A window sent behind
 * others is drafts alone, its first a guess of what the one before it
 * samples last: it emits the token after each row it got right. */
static void collect(sim *s, const flight *f)
{
    for (int32_t k = 0; k < f->n; k++) {
        sim_user *u = &s->user[f->user[k]];
        u->in_flight--;
        if (f->epoch[k] != u->epoch)
            continue;
        const int32_t guesses = f->drafts[k] + f->behind[k], j = accepted(s, guesses);
        u->emitted += j + !f->behind[k];
        u->live--;
        if (j < guesses) {
            u->epoch++;
            u->live = 0;
        }
    }
    if (f->group >= 0)
        s->group_busy[f->group] = false;
}

static int32_t clamp(int32_t v, int32_t lo, int32_t hi) { return v < lo ? lo : v > hi ? hi : v; }

static void sim_init(sim *s, const cv_sim_chain *c, const cv_sim_load *l)
{
    memset(s, 0, sizeof *s);
    s->c = c;
    s->l = l;
    s->rng = SIM_SEED;
    s->n_users = clamp(l->users, 1, SIM_MAX_USERS);
    s->depth = clamp(l->depth, 1, SIM_MAX_FLIGHTS);
    s->groups = clamp(c->n_stages, 1, s->n_users);
    s->groups = s->groups < s->depth ? s->groups : s->depth;
    for (int i = 0; i < c->n_stages; i++) {
        s->cpu_of[i] = i;
        for (int j = 0; j < i && c->stage[i].cpu > 0; j++)
            if (c->stage[j].cpu == c->stage[i].cpu) {
                s->cpu_of[i] = j;
                break;
            }
    }
}

static int64_t emitted(const sim *s)
{
    int64_t n = 0;
    for (int32_t u = 0; u < s->n_users; u++)
        n += s->user[u].emitted;
    return n;
}

/* Decoding: every user until each has its tokens on average. */
static void decode(sim *s, cv_sim_result *out)
{
    const int64_t goal = (int64_t)s->n_users * (s->l->tokens > 0 ? s->l->tokens : 1);
    double now = 0;
    while (s->n_flying < s->depth && send_batch(s, now))
        ;
    flight *f;
    while (emitted(s) < goal && step(s, &f)) {
        if (!f)
            continue;
        collect(s, f);
        now = f->t;
        while (s->n_flying < s->depth && send_batch(s, now + s->c->us_head))
            ;
    }
    const double secs = now * 1e-6;
    out->tok_s = secs > 0 ? emitted(s) / secs : 0;
    out->tok_s_user = out->tok_s / s->n_users;
    out->busiest = 0;
    for (int i = 0; i < s->c->n_stages; i++) {
        out->busy[i] = now > 0 ? (s->busy[i] < now ? s->busy[i] / now : 1) : 0;
        if (out->busy[i] > out->busy[out->busiest])
            out->busiest = i;
    }
}

/* engine.c's convoy_ctx_prefill_chunk: a quarter of a stage's share of
 * what is left, at least 64 tokens, at most a batch. */
static int32_t prefill_chunk(int n_stages, int32_t n_batch, int32_t left)
{
    int32_t n = n_batch;
    if (n_stages > 1) {
        n = (left + 4 * n_stages - 1) / (4 * n_stages);
        n = n < 64 ? 64 : n;
    }
    n = n < n_batch ? n : n_batch;
    return n < left ? n : left;
}

/* One prompt alone: its chunks while fewer than depth fly; the last
 * chunk's result samples the first token. */
static double first_token_us(sim *s)
{
    const int32_t n_batch = s->l->n_batch > 0 ? s->l->n_batch : 512;
    int32_t left = s->l->prompt;
    double now = 0;
    for (;;) {
        flight *f;
        while (left > 0 && s->n_flying < s->depth && (f = free_flight(s))) {
            const int32_t n = prefill_chunk(s->c->n_stages, n_batch, left);
            const double pos = s->l->prompt - left; /* the chunk's first position */
            *f = (flight){.rows = n, .pos_sum = n * pos + n * (n - 1) / 2.0};
            left -= n;
            launch(s, f, now);
        }
        if (!step(s, &f))
            return now;
        if (f)
            now = f->t;
    }
}

void cv_sim_run(const cv_sim_chain *c, const cv_sim_load *l, cv_sim_result *out)
{
    sim s;
    memset(out, 0, sizeof *out);
    sim_init(&s, c, l);
    decode(&s, out);
    if (l->prompt > 0) {
        sim_init(&s, c, l);
        out->ttft_s = first_token_us(&s) * 1e-6;
    }
}
