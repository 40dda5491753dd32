/* vocab_special.c: see vocab_special.h. The texts are llama.cpp's: the
 * end-of-turn texts it looks EOT up by (the lowest id of any wins), the
 * end-of-generation texts it makes CONTROL and ends generation on, and the
 * FIM texts code models spell their tokens with (the first one found wins). */
#include "model/vocab_special.h"

#include <string.h>

#include "core/err.h"

/* Reads an optional token-id key: absent leaves *id; an id outside the
 * vocabulary is ignored (llama.cpp warns and keeps its default). */
static int read_id_key(const gguf_file *f, const char *key, int32_t n_vocab, int32_t *id, char *err, size_t errlen)
{
    if (!cv_gguf_find_kv(f, key))
        return 0;
    uint32_t value;
    if (cv_gguf_get_u32(f, key, &value, err, errlen) != 0)
        return -1;
    if (value < (uint32_t)n_vocab)
        *id = (int32_t)value;
    return 0;
}

static int read_bool_key(const gguf_file *f, const char *key, bool *out, char *err, size_t errlen)
{
    if (!cv_gguf_find_kv(f, key))
        return 0;
    return cv_gguf_get_bool(f, key, out, err, errlen);
}

static const char *const eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<EOT>",
    "<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>", /* DeepSeek */
};
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>",
};

/* Lowest id whose text is one of texts[0..n), or -1. */
static int32_t find_by_texts(const cv_vocab *v, const char *const *texts, size_t n)
{
    int32_t best = -1;
    for (size_t i = 0; i < n; i++) {
        int32_t id = cv_token_from_text(v, texts[i], strlen(texts[i]));
        if (id >= 0 && (best < 0 || id < best))
            best = id;
    }
    return best;
}

/* Reads the special ids (EOM into *eom: the vocab keeps it only in the EOG
 * set) and the add_* flags; a flag that adds a token the vocabulary lacks
 * is an error. */
int cv_vocab_read_special_keys(cv_vocab *v, const gguf_file *f, int32_t *eom, char *err, size_t errlen)
{
    int32_t n = v->n_vocab;
    if (read_id_key(f, "tokenizer.ggml.bos_token_id", n, &v->bos, err, errlen) != 0 ||
        read_id_key(f, "tokenizer.ggml.eos_token_id", n, &v->eos, err, errlen) != 0 ||
        read_id_key(f, "tokenizer.ggml.unknown_token_id", n, &v->unk, err, errlen) != 0 ||
        read_id_key(f, "tokenizer.ggml.padding_token_id", n, &v->pad, err, errlen) != 0 ||
        read_id_key(f, "tokenizer.ggml.eot_token_id", n, &v->eot, err, errlen) != 0 ||
        read_id_key(f, "tokenizer.ggml.eom_token_id", n, eom, err, errlen) != 0 ||
        read_bool_key(f, "tokenizer.ggml.add_bos_token", &v->add_bos, err, errlen) != 0 ||
        read_bool_key(f, "tokenizer.ggml.add_eos_token", &v->add_eos, err, errlen) != 0 ||
        read_bool_key(f, "tokenizer.ggml.add_space_prefix", &v->add_space_prefix, err, errlen) != 0)
        return -1;
    if ((v->add_bos && v->bos < 0) || (v->add_eos && v->eos < 0))
        return cv_errf(err, errlen, "%s: add_%s_token is set but the vocabulary has no %s token", f->name,
                       v->add_bos && v->bos < 0 ? "bos" : "eos", v->add_bos && v->bos < 0 ? "BOS" : "EOS");
    return 0;
}

/* Finds EOT and EOM by their text when the GGUF names none, and makes every
 * end-of-generation token found by text CONTROL, as llama.cpp does. */
void cv_vocab_find_eog_by_text(cv_vocab *v, int32_t *eom)
{
    int32_t forced[sizeof(eog_texts) / sizeof(eog_texts[0]) + 2];
    size_t n_forced = 0;
    if (v->eot < 0)
        forced[n_forced++] = v->eot = find_by_texts(v, eot_texts, sizeof(eot_texts) / sizeof(eot_texts[0]));
    if (*eom < 0)
        forced[n_forced++] = *eom = cv_token_from_text(v, "<|eom_id|>", 10);
    for (size_t i = 0; i < sizeof(eog_texts) / sizeof(eog_texts[0]); i++)
        forced[n_forced++] = cv_token_from_text(v, eog_texts[i], strlen(eog_texts[i]));
    for (size_t i = 0; i < n_forced; i++)
        if (forced[i] >= 0)
            v->type[forced[i]] = CV_TOKEN_CONTROL;
}

/* The FIM tokens: the GGUF's keys (the current name, then the older one),
 * else the first of the texts code models use that the vocabulary has. */
int cv_vocab_find_fim_tokens(cv_vocab *v, const gguf_file *f, char *err, size_t errlen)
{
    static const char *const keys[CV_FIM_COUNT][2] = {
        {"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"},
        {"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"},
        {"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"},
        {"tokenizer.ggml.fim_rep_token_id", NULL},
        {"tokenizer.ggml.fim_sep_token_id", NULL},
    };
    /* DeepSeek's spell "<｜fim▁begin｜>" (full-width bars, U+2581) */
#define DS_FIM(w) "<\xef\xbd\x9c" "fim\xe2\x96\x81" w "\xef\xbd\x9c>"
#define SPM_SPACE "\xe2\x96\x81"
    static const char *const texts[CV_FIM_COUNT][6] = {
        {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", DS_FIM("begin"), "<PRE>", SPM_SPACE "<PRE>"},
        {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", DS_FIM("hole"), "<SUF>", SPM_SPACE "<SUF>"},
        {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", DS_FIM("end"), "<MID>", SPM_SPACE "<MID>"},
        {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>", NULL},
        {"<|file_sep|>", "<file_sep>", "<|file_separator|>", NULL, NULL, NULL},
    };
#undef DS_FIM
#undef SPM_SPACE

    for (int k = 0; k < CV_FIM_COUNT; k++) {
        v->fim[k] = -1;
        for (int j = 0; j < 2 && keys[k][j] && v->fim[k] < 0; j++)
            if (read_id_key(f, keys[k][j], v->n_vocab, &v->fim[k], err, errlen) != 0)
                return -1;
        for (int j = 0; j < 6 && texts[k][j] && v->fim[k] < 0; j++)
            v->fim[k] = cv_token_from_text(v, texts[k][j], strlen(texts[k][j]));
    }
    return 0;
}

_Static_assert(sizeof(eog_texts) / sizeof(eog_texts[0]) + 3 == CV_VOCAB_EOG_MAX, "the EOG texts, EOS, EOT and EOM");

/* Adds id to the set ids[0..*n) unless it is absent (-1) or there already. */
static void add_eog(int32_t *ids, int32_t *n, int32_t id)
{
    if (id < 0)
        return;
    for (int32_t i = 0; i < *n; i++)
        if (ids[i] == id)
            return;
    ids[(*n)++] = id;
}

int32_t cv_vocab_eog_ids(const cv_vocab *v, int32_t eom, int32_t *out)
{
    int32_t n = 0;
    for (size_t i = 0; i < sizeof(eog_texts) / sizeof(eog_texts[0]); i++)
        add_eog(out, &n, cv_token_from_text(v, eog_texts[i], strlen(eog_texts[i])));
    add_eog(out, &n, v->eos);
    add_eog(out, &n, v->eot);
    add_eog(out, &n, eom);
    return n;
}
