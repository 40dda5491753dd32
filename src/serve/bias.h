/* bias.h: a request's logit_bias read into the sampler's pairs.
 *
 * Contract: cv_logit_bias_parse reads OpenAI's object {"ID": BIAS, ...}
 * (ID a token id in decimal) and llama-server's forms: a key that is not
 * a number is a text whose every token gets the bias, and a list of
 * [ID or TEXT, BIAS] pairs. BIAS is a number in [-100, 100] or false (the
 * id is banned: -inf), as llama-server takes it. Ids must be in the
 * vocabulary; at most CONVOY_MAX_LOGIT_BIAS pairs. On success *out is a
 * malloc'd array of *n pairs (NULL when none); on failure -1 with why
 * naming the entry at fault (or "out of memory"). */
#ifndef CONVOY_SERVE_BIAS_H
#define CONVOY_SERVE_BIAS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "convoy.h"

int cv_logit_bias_parse(const convoy_model *m, const json_t *v, convoy_logit_bias **out, int32_t *n, char *why,
                        size_t whylen);

#endif
