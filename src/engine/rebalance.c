/* rebalance.c: layers moved while a pipeline serves (see rebalance.h).
 *
 * The phases of a decision, once a second: remember what each node
 * measured; plan again from it; then judge the last move in its trial,
 * else make the test hook's move, else watch for drift: a faster
 * plan that holds becomes a move unless it lost lately. */
#include "engine/rebalance.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cv_rebalance_init(rebalance *r, int64_t now_ms)
{
    *r = (rebalance){.pause_s = REBALANCE_FIRST_PAUSE_S};
    cv_rebalance_new_chain(r, now_ms);
    const char *test = getenv("CONVOY_TEST_MOVE");
    for (const char *p = test; p && *p && r->n_test < CV_CHAIN_MAX_NODES; p += *p == ',') {
        char *end;
        r->test_split[r->n_test++] = (int32_t)strtol(p, &end, 10);
        p = end;
    }
}

void cv_rebalance_new_chain(rebalance *r, int64_t now_ms)
{
    r->chain_since_ms = now_ms;
    r->check_at_ms = now_ms + REBALANCE_CHECK_MS;
    r->faster_since_ms = 0;
    r->trial = false;
}

void cv_rebalance_moved(rebalance *r, const rebalance_move *move, int64_t now_ms, double pause_s)
{
    r->pause_s = pause_s;
    cv_rebalance_new_chain(r, now_ms);
    r->trial = !move->undo;
}

/* Keeps what each node of m measured, by address. */
static void remember(rebalance *r, const cv_chain_costs *m)
{
    for (int i = 0; i < m->n_nodes; i++) {
        if (m->us_measured[i] <= 0)
            continue;
        int k = 0;
        while (k < r->n_known && strcmp(r->known_addr[k], m->addr[i]))
            k++;
        if (k == r->n_known && r->n_known == CV_CHAIN_MAX_NODES)
            continue;
        r->n_known += k == r->n_known;
        snprintf(r->known_addr[k], sizeof r->known_addr[k], "%s", m->addr[i]);
        r->known_us[k] = m->us_measured[i];
    }
}

static void known_speeds(const rebalance *r, const cv_chain_costs *m, double *us)
{
    for (int i = 0; i < m->n_nodes; i++) {
        us[i] = 0;
        for (int k = 0; k < r->n_known; k++)
            if (!strcmp(r->known_addr[k], m->addr[i]))
                us[i] = r->known_us[k];
    }
}

/* "2,3,1" */
static void counts_text(const int32_t *count, int n, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < n && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%d", i ? "," : "", count[i]);
}

/* The present plan as a move (its nodes and counts; why is left as it is). */
static void present(const cv_chain_costs *m, rebalance_move *move)
{
    move->n_nodes = m->n_nodes;
    move->undo = false;
    for (int i = 0; i < m->n_nodes; i++) {
        snprintf(move->addr[i], sizeof move->addr[i], "%s", m->addr[i]);
        move->split[i] = m->last[i] - m->first[i];
    }
}

/* "10.0.0.2:7000 58.1, 10.0.0.3:7000 240.6 us per layer and token" */
static size_t costs_text(const cv_chain_costs *m, char *buf, size_t len)
{
    size_t at = 0;
    for (int i = 0; i < m->n_nodes && at < len; i++)
        if (m->us_measured[i] > 0)
            at += (size_t)snprintf(buf + at, len - at, "%s%s %.1f", at ? ", " : "", m->addr[i], m->us_measured[i]);
    if (at < len)
        at += (size_t)snprintf(buf + at, len - at, " us per layer and token measured");
    return at < len ? at : len;
}

/* The trial: the last move's plan against the one before it, each by its own measurements. */
static int judge(rebalance *r, const cv_chain_costs *m, double us_now, int64_t now_ms, rebalance_move *move)
{
    if (now_ms - r->chain_since_ms < REBALANCE_TRIAL_MS)
        return 0;
    r->trial = false;
    if (us_now < r->back_us) {
        snprintf(move->why, sizeof move->why, "the move holds: a token in %.2f ms measured, %.2f ms before it",
                 us_now / 1e3, r->back_us / 1e3);
        return 0;
    }
    rebalance_move lost;
    present(m, &lost);
    memcpy(r->lost, lost.split, sizeof r->lost);
    r->cool_until_ms = now_ms + REBALANCE_COOL_MS;
    r->cool_noted = false;
    *move = r->back;
    move->undo = true;
    snprintf(move->why, sizeof move->why,
             "the move lost: a token in %.2f ms measured, %.2f ms before it: moving back (not again for %d s)",
             us_now / 1e3, r->back_us / 1e3, REBALANCE_COOL_MS / 1000);
    return 1;
}

/* A move to counts from the present plan (kept for the trial). */
static int move_to(rebalance *r, const cv_chain_costs *m, const int32_t *count, double us_now, rebalance_move *move)
{
    present(m, &r->back);
    r->back_us = us_now;
    present(m, move);
    memcpy(move->split, count, sizeof(int32_t) * (size_t)m->n_nodes);
    return 1;
}

static bool cooling(rebalance *r, const int32_t *count, int n, int64_t now_ms, rebalance_move *move)
{
    if (now_ms >= r->cool_until_ms || memcmp(count, r->lost, sizeof(int32_t) * (size_t)n))
        return false;
    if (!r->cool_noted) {
        char text[128];
        counts_text(count, n, text, sizeof text);
        snprintf(move->why, sizeof move->why, "not moving to layers %s again: it lost %lld s ago", text,
                 (long long)(now_ms - (r->cool_until_ms - REBALANCE_COOL_MS)) / 1000);
        r->cool_noted = true;
    }
    return true;
}

static int test_move(rebalance *r, const cv_chain_costs *m, double us_now, int64_t now_ms, rebalance_move *move)
{
    rebalance_move now;
    present(m, &now);
    if (r->n_test != m->n_nodes || !memcmp(now.split, r->test_split, sizeof(int32_t) * (size_t)r->n_test) ||
        cooling(r, r->test_split, r->n_test, now_ms, move))
        return 0;
    char text[128];
    counts_text(r->test_split, r->n_test, text, sizeof text);
    snprintf(move->why, sizeof move->why, "CONVOY_TEST_MOVE: moving to layers %s", text);
    return move_to(r, m, r->test_split, us_now, move);
}

/* A plan faster by more than REBALANCE_GAIN for REBALANCE_HOLD_MS is moved
 * to, when the time it saves repays the move's pause soon enough. */
static int drift(rebalance *r, const cv_chain_costs *m, const cv_plan_result *best, double us_now, int64_t now_ms,
                 rebalance_move *move)
{
    int32_t count[CV_CHAIN_MAX_NODES];
    for (int i = 0; i < m->n_nodes; i++)
        count[i] = best->last[i] - best->first[i];
    if (!(best->us_token > 0 && us_now > best->us_token * (1 + REBALANCE_GAIN))) {
        r->faster_since_ms = 0;
        return 0;
    }
    if (!r->faster_since_ms)
        r->faster_since_ms = now_ms;
    const double payback_s = r->pause_s / (1 - best->us_token / us_now);
    if (now_ms - r->faster_since_ms < REBALANCE_HOLD_MS || payback_s > REBALANCE_PAYBACK_S ||
        cooling(r, count, m->n_nodes, now_ms, move))
        return 0;
    char text[128];
    counts_text(count, m->n_nodes, text, sizeof text);
    const size_t at = costs_text(m, move->why, sizeof move->why);
    snprintf(move->why + at, sizeof move->why - at,
             "; a token in %.2f ms now, %.2f ms predicted with layers %s: moving (a pause of about %.1f s, repaid "
             "in %.0f s)",
             us_now / 1e3, best->us_token / 1e3, text, r->pause_s, payback_s);
    return move_to(r, m, count, us_now, move);
}

int cv_rebalance_due(rebalance *r, cv_chain *chain, int64_t now_ms, rebalance_move *move, char *err, size_t errlen)
{
    move->why[0] = 0;
    if (now_ms < r->check_at_ms || now_ms - r->chain_since_ms < REBALANCE_SETTLE_MS)
        return 0;
    r->check_at_ms = now_ms + REBALANCE_CHECK_MS;
    cv_chain_costs m;
    cv_chain_get_costs(chain, &m);
    if (m.batches == 0)
        return 0;
    remember(r, &m);
    double known[CV_CHAIN_MAX_NODES];
    known_speeds(r, &m, known);
    cv_plan_result best;
    double us_now;
    if (cv_chain_replan(chain, known, &best, &us_now, err, errlen))
        return -1;
    if (r->trial)
        return judge(r, &m, us_now, now_ms, move);
    if (r->n_test)
        return test_move(r, &m, us_now, now_ms, move);
    return drift(r, &m, &best, us_now, now_ms, move);
}
