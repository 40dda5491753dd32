/* bpe.h: byte-level BPE (tokenizer model "gpt2"), private to the vocabulary.
 *
 * Direction: vocab.c calls this file (for "gpt2" vocabularies), never the
 * reverse. BPE knows no cv_vocab: it finds token ids through the
 * cv_bpe_lookup passed to cv_bpe_tokenize, so the vocabulary keeps its one
 * map from text to id.
 *
 * Contract: cv_bpe_load reads tokenizer.ggml.merges (required: strings
 * "left right", rank = position; the first occurrence of a pair wins) and
 * tokenizer.ggml.pre, which selects the pre-tokenizer split:
 *   "llama-bpe" / "llama3" / "llama-v3"   Llama 3
 *   "qwen2" / "deepseek-r1-qwen"          Qwen2 and Qwen3
 *   "gpt-2" / "gpt2" / key absent         GPT-2
 *   "gpt-4o" / "llama4" / "minimax-m2" /  o200k (gpt-oss, GPT-4o, Llama 4)
 *   "kanana2" / "talkie"
 * Any other name is an error that names the supported ones. Llama 3 also
 * turns on "ignore merges" (a whole pre-token that is a token is taken as
 * is) and adds BOS by default, as llama.cpp does; cv_bpe_adds_bos says so.
 *
 * cv_bpe_tokenize appends the ids of one raw fragment (text without special
 * tokens), as tokens->token_id gives them, to the growable array *ids
 * (*n_ids used, *cap allocated; grown with cv_realloc). It returns 0, or
 * -1 when out of memory (the ids appended so far stay valid). Text that is
 * not UTF-8 is read as cv_utf8_decode reads it (each bad byte becomes
 * U+FFFD).
 *
 * cv_bpe_decode_text turns the text of a byte-level token (bytes shown as
 * the GPT-2 code points U+0021..U+0143) back into bytes; code points outside
 * that mapping are copied as they are. With dst NULL it only measures; the
 * result is never longer than n. */
#ifndef CONVOY_MODEL_BPE_H
#define CONVOY_MODEL_BPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

typedef struct cv_bpe cv_bpe;

/* How BPE finds a token: token_id(ctx, text, len) is the id of the token
 * whose text is text[0..len), or -1. */
typedef struct cv_bpe_lookup {
    int32_t (*token_id)(const void *ctx, const char *text, size_t len);
    const void *ctx;
} cv_bpe_lookup;

int cv_bpe_load(cv_bpe **out, const gguf_file *f, char *err, size_t errlen);
void cv_bpe_free(cv_bpe *b);
bool cv_bpe_adds_bos(const cv_bpe *b);
int cv_bpe_tokenize(const cv_bpe *b, const cv_bpe_lookup *tokens, const char *text, size_t len, int32_t **ids,
                    size_t *n_ids, size_t *cap);
uint32_t cv_bpe_decode_text(const char *s, uint32_t n, char *dst);

#endif
