/* vocab_special.h: the finders of a vocabulary's special tokens, by the
 * GGUF's id keys or by their usual texts (private to src/model/vocab*.c:
 * phases 4 and 5 of vocab.c's load, and the end-of-generation set it
 * builds in phase 6).
 *
 * Contract: each runs on a vocabulary whose tokens are read (cv_token_from_text
 * finds them). cv_vocab_read_special_keys reads the special ids (EOM into
 * *eom: the vocab keeps it only in the EOG set) and the add_* flags; a key
 * absent keeps the default, an id outside the vocabulary is ignored (as
 * llama.cpp does), and a flag that adds a token the vocabulary lacks is an
 * error. cv_vocab_find_eog_by_text finds EOT and EOM by their text when the
 * GGUF names none, and makes every end-of-generation token found by text
 * CONTROL, as llama.cpp does. cv_vocab_find_fim_tokens sets the FIM tokens:
 * the GGUF's keys (the current name, then the older one), else the first
 * of the texts code models use that the vocabulary has, else -1.
 * cv_vocab_eog_ids writes the end-of-generation ids (the tokens with an
 * end-of-generation text, then EOS, EOT and eom; each once, absent ones
 * left out) into out, which has room for CV_VOCAB_EOG_MAX, and returns
 * their count. */
#ifndef CONVOY_MODEL_VOCAB_SPECIAL_H
#define CONVOY_MODEL_VOCAB_SPECIAL_H

#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "model/vocab.h"

#define CV_VOCAB_EOG_MAX 10 /* the end-of-generation texts, EOS, EOT and EOM */

int cv_vocab_read_special_keys(cv_vocab *v, const gguf_file *f, int32_t *eom, char *err, size_t errlen);
void cv_vocab_find_eog_by_text(cv_vocab *v, int32_t *eom);
int cv_vocab_find_fim_tokens(cv_vocab *v, const gguf_file *f, char *err, size_t errlen);
int32_t cv_vocab_eog_ids(const cv_vocab *v, int32_t eom, int32_t *out);

#endif
