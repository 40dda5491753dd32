/* fim.h: fill-in-the-middle prompts, as code editors ask for them.
 *
 * Contract: cv_fim_prompt writes the token ids of a FIM prompt in
 * llama-server's layout, with the model's own FIM tokens (convoy.h's
 * convoy_model_info): BOS (when the model adds it), the extra files, then
 * <FIM_PRE> prefix <FIM_SUF> suffix <FIM_MID> middle (text the
 * completion starts with). Extra files, with the model's repository and
 * file-separator tokens, come as the repo-level pattern: <FIM_REP>
 * "myproject\n", then <FIM_SEP> "NAME\n" TEXT per file, then <FIM_SEP>
 * "filename"; without those tokens their texts are simply put first. Texts
 * are tokenized as plain text (no special tokens parsed). Returns the
 * number of ids (at most n_max), or -1 with why naming the problem: the
 * model has no FIM tokens, or the prompt has more than n_max tokens. */
#ifndef CONVOY_SERVE_FIM_H
#define CONVOY_SERVE_FIM_H

#include <stddef.h>
#include <stdint.h>

#include "convoy.h"

typedef struct cv_fim_text {
    const char *p;
    size_t n;
} cv_fim_text;

typedef struct cv_fim_file {
    cv_fim_text name, text;
} cv_fim_file;

typedef struct cv_fim_parts {
    cv_fim_text prefix, suffix, middle;
    const cv_fim_file *files;
    int n_files;
} cv_fim_parts;

int cv_fim_prompt(const convoy_model *m, const cv_fim_parts *p, int32_t *out, int n_max, char *why, size_t whylen);

#endif
