/* vocab.h: the tokenizer, built from a GGUF's tokenizer.ggml.* metadata.
 *
 * Contract: cv_vocab_load reads tokenizer.ggml.model ("llama" = SentencePiece
 * with scores and byte fallback; "gpt2" = byte-level BPE with
 * tokenizer.ggml.merges and the pre-tokenizer named by tokenizer.ggml.pre:
 * llama-bpe (Llama 3), qwen2 (Qwen2/3), gpt-2 (also when absent), gpt-4o
 * (o200k: gpt-oss); see
 * bpe.h), tokens, scores, token_type, bos/eos/unk/pad ids, add_bos_token /
 * add_eos_token (defaults as llama.cpp: SPM adds BOS, BPE adds it only for
 * llama-bpe; neither adds EOS) and add_space_prefix (default true for SPM;
 * BPE never adds a space), and the fill-in-the-middle tokens (fim_pre,
 * fim_suf, fim_mid, fim_rep, fim_sep: the tokenizer.ggml.fim_*_token_id
 * keys, the older prefix/suffix/middle_token_id, else found by the texts
 * code models spell them with, as llama.cpp does; -1 when absent). Array
 * lengths are checked against the token
 * count; an id key outside the vocabulary is ignored and the default kept
 * (as llama.cpp does), so every id held is valid or -1. The vocab copies
 * what it needs: the gguf_file may be closed afterwards.
 *
 * cv_tokenize reproduces llama.cpp's llama_tokenize(text, add_special,
 * parse_special): with parse_special false, text that looks like a special
 * token ("<s>", "<|begin_of_text|>") is plain text; USER_DEFINED tokens are
 * matched in the text either way. It returns the number of ids; if that is
 * more than n_max it writes nothing past n_max and returns the negated
 * count needed. It allocates scratch memory (tokenization is not part of
 * the decode step); it returns INT_MIN if that fails or the text is longer
 * than 256 MiB.
 *
 * cv_token_piece writes the bytes a token stands for (SPM: U+2581 becomes
 * a space, <0xXX> becomes that byte; BPE: the byte-level text decoded to
 * its bytes; control and unknown tokens give ""
 * unless `special`; ids outside the vocabulary give ""), returns their
 * length or -(needed) if n is too small.
 *
 * cv_detok turns a stream of ids into text that is always valid UTF-8 at
 * every call: bytes of a character split over several tokens are held back
 * until the character is complete; invalid bytes become U+FFFD (one per
 * maximal ill-formed subpart). Pieces are rendered with special = false and
 * simply concatenated: the leading space of the first piece is kept (as in
 * llama.cpp's token-by-token output, not as in llama_detokenize). */
#ifndef CONVOY_MODEL_VOCAB_H
#define CONVOY_MODEL_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

enum cv_token_type {
    CV_TOKEN_UNDEFINED = 0,
    CV_TOKEN_NORMAL = 1,
    CV_TOKEN_UNKNOWN = 2,
    CV_TOKEN_CONTROL = 3,
    CV_TOKEN_USER_DEFINED = 4,
    CV_TOKEN_UNUSED = 5,
    CV_TOKEN_BYTE = 6,
};

enum cv_vocab_kind { CV_VOCAB_SPM = 1, CV_VOCAB_BPE = 2 };

/* Fill-in-the-middle tokens: prefix, suffix, middle, repository, file separator. */
enum cv_fim { CV_FIM_PRE, CV_FIM_SUF, CV_FIM_MID, CV_FIM_REP, CV_FIM_SEP, CV_FIM_COUNT };

typedef struct cv_vocab_index cv_vocab_index; /* private lookup tables */

typedef struct cv_vocab {
    enum cv_vocab_kind kind;
    int32_t n_vocab;
    char **text;      /* token text as stored in GGUF, NUL-terminated */
    uint32_t *text_len;
    float *score;
    int32_t *type;    /* enum cv_token_type */
    int32_t bos, eos, unk, pad, eot; /* -1 when absent */
    int32_t fim[CV_FIM_COUNT];       /* -1 when absent */
    bool add_bos, add_eos, add_space_prefix;
    int32_t byte_token[256]; /* id of <0xXX> per byte, -1 if absent */
    cv_vocab_index *index;
} cv_vocab;

int cv_vocab_load(cv_vocab *v, const gguf_file *f, char *err, size_t errlen);
void cv_vocab_free(cv_vocab *v);

int cv_tokenize(const cv_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                int32_t *out, int n_max);
/* cv_tokenize, except that inside the plain ranges (cv_text_range: sorted,
 * disjoint, within the text) no CONTROL token is parsed, only USER_DEFINED
 * ones as with parse_special false: a chat's message contents. Text with no
 * special token in a plain range tokenizes as cv_tokenize does. */
typedef struct cv_text_range {
    size_t off, len;
} cv_text_range;
int cv_tokenize_plain(const cv_vocab *v, const char *text, size_t len, bool add_special, bool parse_special,
                      const cv_text_range *plain, int n_plain, int32_t *out, int n_max);
int cv_token_piece(const cv_vocab *v, int32_t id, bool special, char *buf, int n);
/* Id of the token whose text (as stored in the GGUF) is text[0..len), or -1. */
int32_t cv_token_from_text(const cv_vocab *v, const char *text, size_t len);
/* True for ids that end generation: EOS, EOT, EOM and, as in llama.cpp,
 * tokens with an end-of-turn text ("<|eot_id|>", "<|im_end|>", ...). */
bool cv_token_is_eog(const cv_vocab *v, int32_t id);

typedef struct cv_detok {
    const cv_vocab *vocab;
    char held[8];
    int n_held;
} cv_detok;

void cv_detok_init(cv_detok *d, const cv_vocab *v);
/* Appends the text of id; writes the complete UTF-8 it can into out and
 * returns the byte count (0 while a character is still incomplete). It
 * never needs more than 3 + 3 * (piece length) bytes; if n is smaller than
 * what it needs it returns -(needed) and consumes nothing. */
int cv_detok_push(cv_detok *d, int32_t id, char *out, int n);
/* Ends the stream: held bytes (an incomplete character) become one U+FFFD
 * (3 bytes; -3 if n < 3, consuming nothing). Returns the byte count. */
int cv_detok_flush(cv_detok *d, char *out, int n);

#endif
