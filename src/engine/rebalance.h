/* rebalance.h: layers moved while a pipeline serves, when the stages'
 * measured costs say another plan is faster (issue #37).
 *
 * Contract: cv_rebalance_due runs before each collect and decides at most once
 * every REBALANCE_CHECK_MS. It plans the nodes again from what the chain
 * measured (pipe/chain.h's cv_chain_replan; a node without measurements
 * counts at what it measured on an earlier chain of this context, else its
 * probe): a plan predicted faster by more than REBALANCE_GAIN for
 * REBALANCE_HOLD_MS in a row is a move, written into *move, when what it
 * saves repays the move's pause (the last move's, at first
 * REBALANCE_FIRST_PAUSE_S) within REBALANCE_PAYBACK_S. The engine
 * moves as a failover does (the chain closed, a new one opened with the
 * move's split, the journal replayed: output stays identical) and calls
 * cv_rebalance_moved. The trial: REBALANCE_TRIAL_MS after a move, the new
 * plan's time from its own measurements is compared with the old plan's
 * just before the move; unless it is faster, cv_rebalance_due asks to move
 * back, and the plan that lost is not moved to again for
 * REBALANCE_COOL_MS. Nothing is probed: no node loads layers to be
 * measured, the measurements are those of the serving chain.
 *
 * A test hook: CONVOY_TEST_MOVE="a,b,c" in the environment stands for the
 * drift watch: every decision is a move to that split, which the trial
 * judges like any (and the cooling then refuses). */
#ifndef CONVOY_ENGINE_REBALANCE_H
#define CONVOY_ENGINE_REBALANCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pipe/chain.h"

#define REBALANCE_CHECK_MS 1000
#define REBALANCE_GAIN 0.15
#define REBALANCE_HOLD_MS 5000
#define REBALANCE_SETTLE_MS 3000 /* a new chain's measurements are taken from then on */
#define REBALANCE_TRIAL_MS 6000
#define REBALANCE_COOL_MS 120000
#define REBALANCE_FIRST_PAUSE_S 1.0
#define REBALANCE_PAYBACK_S 60.0

typedef struct rebalance_move {
    int n_nodes;
    char addr[CV_CHAIN_MAX_NODES][CV_PROTO_ADDR_MAX + 1]; /* the chain's nodes, in order */
    int32_t split[CV_CHAIN_MAX_NODES];
    bool undo;     /* back to the plan before the last move: no trial follows */
    char why[512]; /* a line for the log, also when no move is due (empty: none) */
} rebalance_move;

typedef struct rebalance {
    int64_t chain_since_ms;  /* when the serving chain opened */
    int64_t check_at_ms;
    int64_t faster_since_ms; /* a faster plan predicted since, 0: none */
    bool trial;              /* a move awaits its trial: */
    rebalance_move back;     /* the plan moved from */
    double back_us;          /* its time from its measurements before the move */
    int32_t lost[CV_CHAIN_MAX_NODES]; /* the last plan a trial undid, and until when it cools */
    int64_t cool_until_ms;
    bool cool_noted;
    double pause_s;          /* the last move's pause: closing, opening, replaying */
    int32_t test_split[CV_CHAIN_MAX_NODES]; /* CONVOY_TEST_MOVE's, n_test counts */
    int n_test;
    /* what each node measured last (us per layer and token), by address */
    char known_addr[CV_CHAIN_MAX_NODES][CV_PROTO_ADDR_MAX + 1];
    double known_us[CV_CHAIN_MAX_NODES];
    int n_known;
} rebalance;

void cv_rebalance_init(rebalance *r, int64_t now_ms);
/* A chain opened (a failover's, or a move's: cv_rebalance_moved says which). */
void cv_rebalance_new_chain(rebalance *r, int64_t now_ms);
/* Whether to move now: 1 with *move filled, 0 not, -1 when planning failed (err). */
int cv_rebalance_due(rebalance *r, cv_chain *chain, int64_t now_ms, rebalance_move *move, char *err, size_t errlen);
/* The move was made (the new chain serves) in pause_s. */
void cv_rebalance_moved(rebalance *r, const rebalance_move *move, int64_t now_ms, double pause_s);

#endif
