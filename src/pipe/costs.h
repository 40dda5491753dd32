/* costs.h: what a chain measures of its stages while it serves.
 *
 * Contract: every RESULT carries the time each stage spent computing its
 * batch (proto.h's trail). cv_costs_add takes one batch's: a stage's time
 * over its work (plan.h's cv_plan_stage_work: its layers in mean layers,
 * the output matrix counted on the last) and over the batch's tokens is a
 * sample of microseconds per layer and token, the unit of the speed probe
 * and of the plan's cost model, so a plan can be made from measurements.
 * Each stage's mean weighs a sample by its age, halving every
 * CV_COSTS_HALF_LIFE_MS: a stage that slows shows within seconds, and one
 * slow batch does not swing it. A batch that was alone in flight also
 * measures the hops: its round trip less the stages' times, over the
 * hops it took. The last batch's times are kept as they came, for a
 * calibration that runs batches of chosen sizes. Nothing allocates. */
#ifndef CONVOY_PIPE_COSTS_H
#define CONVOY_PIPE_COSTS_H

#include <stdint.h>

#include "pipe/proto.h"

#define CV_COSTS_HALF_LIFE_MS 2000

typedef struct cv_costs {
    int n_stages;
    double us[CV_TRAIL_MAX];   /* per stage: us per layer and token, 0 before the first sample */
    double hop_us;             /* one hop's mean time, 0 before the first batch alone in flight */
    uint32_t last_us[CV_TRAIL_MAX]; /* the last batch's stage times as they came */
    double last_round_trip_us; /* its round trip when it was alone in flight, else 0 */
    int64_t at_ns, hop_at_ns;  /* when the last samples came */
    uint64_t batches;          /* batches measured */
} cv_costs;

void cv_costs_init(cv_costs *c, int n_stages);
/* One batch of n_tokens: each stage's time (trail, us) and work; its round
 * trip through n_hops hops when it was alone in flight, else round_trip_ns < 0. */
void cv_costs_add(cv_costs *c, const uint32_t *trail, const double *work, int32_t n_tokens, int64_t round_trip_ns,
                  int n_hops, int64_t now_ns);

#endif
