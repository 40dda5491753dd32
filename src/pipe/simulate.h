/* simulate.h: a discrete-event simulation of a chain serving users, the
 * engine of `convoy plan`: the tokens per second a plan gives, before it
 * runs.
 *
 * The chain: stages, each computing one batch at a time, the
 * earliest-arrived first, as soon as it is free; stages on one CPU
 * (several stages of one machine) that compute at once share it evenly,
 * as the kernel time-slices processes; between them hops, each a delay of
 * its latency plus the batch's rows times a row's time on the wire (a hop
 * carries one batch at a time in practice, so links are not queues). Hop 0
 * goes from the head to the first stage, hop s into stage s, the last hop
 * from the last stage back to the head; the head spends us_head on each
 * result before it sends again. A stage computes b rows in
 * work * T(b) + layers * us_pos * P microseconds: work in mean layers
 * (plan.h's cv_plan_stage_work, the output matrix on the last stage), T(b)
 * the time per mean layer of b rows, us_pos what attention adds per layer
 * for each position of context a row attends to, P the rows' positions
 * summed. T is measured at CV_SIM_ROW_SIZES rows (us_rows: batched
 * kernels share the weights' reads among a few rows, then computing
 * binds, so T bends upward) and followed between them and past the last;
 * without measurements it is the line us_layer + (b - 1) * us_row.
 *
 * The load, as serve/sched.c runs it: `users` streams decode at once, the
 * head keeps up to `depth` batches in flight. Without windows in flight
 * the users sit in groups, one per stage (user u in group u % groups), and
 * a group has one batch in flight at a time: while the last stage works on
 * one group the first works on another. Speculating, a user's rows are its
 * newest token and its drafts (a window): K drafts, or none where the
 * drafter finds nothing (prompt lookup where the text does not repeat),
 * so that windows carry `drafts` on average; each draft is accepted in
 * turn with probability `accept` until the first rejection (draws from a
 * fixed seed), and the window emits its accepted drafts plus one token.
 * Each user's context starts at `prompt` positions and grows by the tokens
 * it emits. A user with D > 1 windows in flight leaves its group and
 * sends a window with any batch while fewer than D of its own fly; a
 * window behind others holds drafts alone (none found: none sent), its
 * first a guess of what the one before it samples last, and emits the
 * token after each row it got right; a window cut short makes the windows
 * sent behind it stale (they emit nothing) and the next one goes out when
 * the cut is known. Time to first token: one prompt alone,
 * its chunks (the engine's chunk rule, convoy_ctx_prefill_chunk) sent
 * while fewer than `depth` fly.
 *
 * Not modelled: the head's drafting time, the CPU the head shares with a
 * stage. Nothing allocates; the simulation is deterministic. */
#ifndef CONVOY_PIPE_SIMULATE_H
#define CONVOY_PIPE_SIMULATE_H

#include <stdint.h>

#include "pipe/proto.h"

/* The batch sizes a stage's time is measured at. */
#define CV_SIM_ROWS 5
#define CV_SIM_ROW_SIZES {1, 2, 4, 8, 16}

typedef struct cv_sim_stage {
    double work;     /* mean layers, the output matrix included on the last */
    int32_t layers;
    double us_rows[CV_SIM_ROWS]; /* per mean layer at CV_SIM_ROW_SIZES rows; 0: the line below */
    double us_layer; /* per mean layer, a batch of one row */
    double us_row;   /* per mean layer, each further row */
    double us_pos;   /* per layer, each position a row attends to */
    int cpu;         /* stages with the same cpu > 0 share one; 0: its own */
} cv_sim_stage;

typedef struct cv_sim_hop {
    double us;         /* latency */
    double us_per_row; /* a row's bytes over the bandwidth */
} cv_sim_hop;

typedef struct cv_sim_chain {
    int n_stages;                           /* 1..CV_CHAIN_MAX_NODES */
    cv_sim_stage stage[CV_CHAIN_MAX_NODES];
    cv_sim_hop hop[CV_CHAIN_MAX_NODES + 1]; /* [0] head -> stage 0, [s] into stage s, [n_stages] back */
    double us_head;                         /* the head's time per result */
} cv_sim_chain;

typedef struct cv_sim_load {
    int32_t users;   /* streams decoding at once, >= 1 */
    int32_t depth;   /* batches in flight at most, >= 1 */
    int32_t spec_k;  /* drafts per window; 0: no speculation */
    double drafts;   /* the drafts a window carries on average, 0..spec_k (K or none each) */
    int32_t windows; /* windows in flight per user (speculating); 1: one at a time */
    double accept;   /* a draft's acceptance, 0..1 */
    int32_t tokens;  /* tokens each user decodes */
    int32_t prompt;  /* each user's prompt: its context's start, and the time to first token of
                        one alone is predicted; 0: none */
    int32_t n_batch; /* rows of a batch at most (prefill chunks) */
} cv_sim_load;

typedef struct cv_sim_result {
    double tok_s;                    /* every user's decoded tokens together, per second */
    double tok_s_user;               /* one user's */
    double ttft_s;                   /* the prompt's time to first token; 0 without a prompt */
    double busy[CV_CHAIN_MAX_NODES]; /* each stage's busy fraction while decoding */
    int busiest;                     /* the stage busy longest */
} cv_sim_result;

void cv_sim_run(const cv_sim_chain *c, const cv_sim_load *l, cv_sim_result *out);

/* A stage's time for a batch of `rows` at positions summing to pos_sum, microseconds. */
double cv_sim_stage_us(const cv_sim_stage *s, int32_t rows, double pos_sum);

#endif
