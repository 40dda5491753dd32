/* constraint.h: a slot's output held to a grammar (infer/grammar.h), at
 * the span that samples.
 *
 * Contract: the tokens that enter a slot at positions >= `from` (the first
 * generated position: the prompt's length) are matched against the grammar
 * in order, as their pieces (cv_token_piece, special false). A row at
 * position >= from - 1 may emit only a token whose piece the grammar allows
 * next, or an end-of-generation token where the grammar may end:
 * cv_constraint_mask writes every other logit as -inf into a copy of the
 * row. A token that enters and that the grammar refuses (a caller that
 * forces one) breaks the constraint: from then on only end-of-generation
 * tokens are allowed, so the slot ends rather than leave the grammar.
 * Truncation takes back the ids past the new length by matching the kept
 * ones again from the start. Nothing here allocates after create, and every
 * result is a function of the ids alone: one machine, a chain, a batch
 * or a replay after a failover give the same masks.
 *
 * cv_vocab_pieces is the vocabulary as the grammar sees it, built once per
 * span from its model file. */
#ifndef CONVOY_INFER_CONSTRAINT_H
#define CONVOY_INFER_CONSTRAINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "infer/grammar.h"
#include "model/gguf.h"

#define CV_CONSTRAINT_TEXT_MAX 65520u /* bytes of GBNF a slot takes: a SET_GRAMMAR fits any link (pipe/proto.h) */

typedef struct cv_vocab_pieces {
    cv_grammar_pieces *pieces;
    int32_t *eog; /* ids that end generation */
    int32_t n_eog;
    int32_t n_vocab;
} cv_vocab_pieces;

int cv_vocab_pieces_load(cv_vocab_pieces *vp, const gguf_file *f, char *err, size_t errlen);
void cv_vocab_pieces_free(cv_vocab_pieces *vp);

typedef struct cv_constraint cv_constraint;

/* Parses the grammar (errors name the problem) for a slot of n_ctx
 * positions whose generated tokens start at `from`. */
cv_constraint *cv_constraint_create(const char *text, size_t len, int32_t from, int32_t n_ctx, char *err,
                                    size_t errlen);
void cv_constraint_free(cv_constraint *c);
/* The token at pos entered the slot (the span calls it in batch order). */
void cv_constraint_enter(cv_constraint *c, const cv_vocab_pieces *vp, int32_t pos, int32_t id);
/* The slot keeps its first len positions. */
void cv_constraint_truncate(cv_constraint *c, const cv_vocab_pieces *vp, int32_t len);
/* For a row at pos: NULL when the row is not held (before from - 1), else
 * `out` holding the row's logits with what the grammar refuses at -inf. */
const float *cv_constraint_mask(const cv_constraint *c, const cv_vocab_pieces *vp, int32_t pos,
                                const float *logits, float *out);

#endif
