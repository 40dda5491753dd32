/* logprobs.h: the log-probabilities a sampled row reports (OpenAI's
 * logprobs / top_logprobs), computed in one place so that one machine and
 * the last stage of a pipeline give the same bits.
 *
 * Contract: cv_logprobs_row fills out[0] with the chosen id's
 * log-probability and out[1 .. k] with the k most likely ids, most likely
 * first, ties to the lower id; the log-sum-exp runs in double in id order.
 * NaN logits count as -inf. out holds 1 + k entries; nothing is allocated. */
#ifndef CONVOY_INFER_LOGPROBS_H
#define CONVOY_INFER_LOGPROBS_H

#include <stdint.h>

/* The most alternatives a row may ask for (OpenAI's top_logprobs limit). */
#define CV_MAX_TOP_LOGPROBS 20

typedef struct cv_logprob {
    int32_t id;
    float logprob;
} cv_logprob;

void cv_logprobs_row(const float *logits, int32_t n_vocab, int32_t chosen, int32_t k, cv_logprob *out);

#endif
