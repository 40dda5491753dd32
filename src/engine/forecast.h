/* forecast.h: what forecast.c needs of engine.c: a model's parsed file.
 * The forecast's contract is include/convoy.h's (fleets). */
#ifndef CONVOY_ENGINE_FORECAST_H
#define CONVOY_ENGINE_FORECAST_H

#include "convoy.h"
#include "model/llama.h"

const cv_llama *cv_engine_model_meta(const convoy_model *m);

#endif
