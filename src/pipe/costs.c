/* costs.c: a chain's measured stage and hop times (see costs.h). */
#include "pipe/costs.h"

#include <math.h>

void cv_costs_init(cv_costs *c, int n_stages) { *c = (cv_costs){.n_stages = n_stages}; }

/* The mean m moved toward x by a sample's weight after dt_ns; the first sample is taken whole. */
static double decay_toward(double m, double x, int64_t dt_ns)
{
    if (m <= 0)
        return x;
    const double keep = exp2(-(double)dt_ns / (CV_COSTS_HALF_LIFE_MS * 1e6));
    return m * keep + x * (1 - keep);
}

void cv_costs_add(cv_costs *c, const uint32_t *trail, const double *work, int32_t n_tokens, int64_t round_trip_ns,
                  int n_hops, int64_t now_ns)
{
    const int64_t dt = now_ns - c->at_ns;
    double stages_ns = 0;
    c->last_round_trip_us = round_trip_ns < 0 ? 0 : round_trip_ns / 1e3;
    for (int s = 0; s < c->n_stages; s++) {
        c->last_us[s] = trail[s];
        stages_ns += 1e3 * trail[s];
        if (work[s] > 0 && n_tokens > 0)
            c->us[s] = decay_toward(c->us[s], trail[s] / (work[s] * n_tokens), dt);
    }
    c->at_ns = now_ns;
    c->batches++;
    if (round_trip_ns < 0 || n_hops < 1)
        return;
    const double hop_us = (round_trip_ns > stages_ns ? round_trip_ns - stages_ns : 0) / 1e3 / n_hops;
    c->hop_us = decay_toward(c->hop_us, hop_us, now_ns - c->hop_at_ns);
    c->hop_at_ns = now_ns;
}
