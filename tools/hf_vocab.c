/* hf_vocab.c: builds a vocabulary-only GGUF (byte-level BPE, tokenizer
 * model "gpt2") from a Hugging Face tokenizer.json and, optionally, its
 * tokenizer_config.json.
 *
 *   hf_vocab -o OUT.gguf --pre NAME [--n-vocab N] [--bos TEXT] [--eos TEXT]
 *            [--eot TEXT] tokenizer.json [tokenizer_config.json]
 *
 * What it writes, following llama.cpp's converter (convert_hf_to_gguf.py):
 * - tokenizer.ggml.model "gpt2" and tokenizer.ggml.pre NAME (llama-bpe,
 *   qwen2, gpt-2/gpt2 or gpt-4o: the pre-tokenizers convoy implements);
 * - tokenizer.ggml.tokens / token_type for ids 0..n-1, n = the largest id
 *   + 1 (or --n-vocab, the model's padded vocab_size): model.vocab entries
 *   are NORMAL; added_tokens are CONTROL when "special" or when they look
 *   special ("<|...|>", "<｜...｜>"), else USER_DEFINED (with U+2581 turned
 *   into a space, as llama.cpp pre-normalizes them); ids with no token
 *   become "[PAD<id>]" UNUSED;
 * - tokenizer.ggml.merges as "left right" strings (both the old string and
 *   the newer pair format of model.merges are read);
 * - bos / eos / pad / eot ids: bos_token, eos_token, pad_token of
 *   tokenizer_config.json (a string or {"content": ...}), overridden by
 *   --bos / --eos; eot is --eot, else "<|eot_id|>" or "<|im_end|>" when the
 *   vocabulary has one;
 * - add_bos_token / add_eos_token: tokenizer_config.json's flags, else
 *   whether the post_processor's TemplateProcessing puts the BOS first /
 *   the EOS last, else llama.cpp's default for the pre-tokenizer (BOS for
 *   llama-bpe only, never EOS);
 * - tokenizer.chat_template from tokenizer_config.json (a string, or the
 *   "default" entry of a list of named templates).
 * Not done: llama.cpp re-encodes non-normalized added tokens with the
 * Python tokenizer to pre-normalize them; this tool has no tokenizer to
 * run and keeps their text (the byte-level models here need nothing).
 * Errors go to stderr with exit status 1; usage errors exit 2. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "model/gguf_write.h"
#include "model/vocab.h"

#define MAX_VOCAB (1 << 24)

typedef struct vocab_out {
    int64_t n;
    char **text;   /* cv_malloc'ed, NULL until set */
    int32_t *type;
} vocab_out;

/* flags: JSON_DECODE_INT_AS_REAL for tokenizer_config.json, whose
 * model_max_length can exceed 64 bits. */
static json_t *load_json(const char *path, size_t flags)
{
    json_error_t e;
    json_t *j = json_load_file(path, flags, &e);
    if (!j)
        fprintf(stderr, "hf_vocab: %s:%d: %s\n", path, e.line, e.text);
    return j;
}

static char *dup_str(const char *s)
{
    size_t n = strlen(s);
    char *d = cv_malloc(n + 1);
    if (d)
        memcpy(d, s, n + 1);
    return d;
}

static bool starts_ends(const char *s, const char *pre, const char *post)
{
    size_t n = strlen(s), a = strlen(pre), b = strlen(post);
    return n >= a + b && memcmp(s, pre, a) == 0 && memcmp(s + n - b, post, b) == 0;
}

/* llama.cpp's does_token_look_special, for the texts these models use. */
static bool looks_special(const char *s)
{
    return starts_ends(s, "<|", "|>") || starts_ends(s, "<\xef\xbd\x9c", "\xef\xbd\x9c>") ||
           strcmp(s, "<pad>") == 0 || strcmp(s, "<mask>") == 0 || starts_ends(s, "<unused", ">");
}

/* U+2581 -> ' ' (user-defined tokens are stored pre-normalized). */
static char *space_unescape(const char *s)
{
    char *d = cv_malloc(strlen(s) + 1), *o = d;
    if (!d)
        return NULL;
    while (*s) {
        if (memcmp(s, "\xe2\x96\x81", 3) == 0) {
            *o++ = ' ';
            s += 3;
        } else {
            *o++ = *s++;
        }
    }
    *o = '\0';
    return d;
}

static int set_token(vocab_out *v, json_int_t id, const char *text, int32_t type)
{
    if (id < 0 || id >= v->n) {
        fprintf(stderr, "hf_vocab: token id %lld out of range (0..%lld)\n", (long long)id, (long long)v->n - 1);
        return -1;
    }
    char *t = type == CV_TOKEN_USER_DEFINED ? space_unescape(text) : dup_str(text);
    if (!t)
        return -1;
    cv_free(v->text[id]);
    v->text[id] = t;
    v->type[id] = type;
    return 0;
}

/* Text of a special-token entry of tokenizer_config.json, or NULL. */
static const char *config_token(json_t *config, const char *key)
{
    json_t *t = config ? json_object_get(config, key) : NULL;
    if (json_is_object(t))
        t = json_object_get(t, "content");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static int32_t find_token(const vocab_out *v, const char *text)
{
    if (!text)
        return -1;
    for (int64_t i = 0; i < v->n; i++)
        if (v->text[i] && strcmp(v->text[i], text) == 0)
            return (int32_t)i;
    return -1;
}

/* The TemplateProcessing of the post_processor (also inside a Sequence). */
static json_t *template_processing(json_t *tok)
{
    json_t *pp = json_object_get(tok, "post_processor");
    if (!json_is_object(pp))
        return NULL;
    const char *type = json_string_value(json_object_get(pp, "type"));
    if (type && strcmp(type, "TemplateProcessing") == 0)
        return pp;
    json_t *seq = json_object_get(pp, "processors");
    size_t i;
    json_t *p;
    json_array_foreach(seq, i, p)
    {
        type = json_string_value(json_object_get(p, "type"));
        if (type && strcmp(type, "TemplateProcessing") == 0)
            return p;
    }
    return NULL;
}

/* Whether the single-sequence template has special token `text` at its
 * start (first) or end. */
static bool template_has(json_t *tp, const char *text, bool first)
{
    json_t *single = tp ? json_object_get(tp, "single") : NULL;
    size_t n = json_array_size(single);
    if (!text || n == 0)
        return false;
    json_t *item = json_object_get(json_array_get(single, first ? 0 : n - 1), "SpecialToken");
    const char *id = json_string_value(json_object_get(item, "id"));
    return id && strcmp(id, text) == 0;
}

static int resolve_flag(json_t *config, const char *key, json_t *tp, const char *text, bool first, bool dflt)
{
    json_t *flag = config ? json_object_get(config, key) : NULL;
    if (json_is_boolean(flag))
        return json_is_true(flag);
    if (tp)
        return template_has(tp, text, first);
    return dflt;
}

static const char *chat_template(json_t *config)
{
    json_t *t = config ? json_object_get(config, "chat_template") : NULL;
    if (json_is_string(t))
        return json_string_value(t);
    size_t i;
    json_t *e;
    json_array_foreach(t, i, e)
    {
        const char *name = json_string_value(json_object_get(e, "name"));
        if (name && strcmp(name, "default") == 0)
            return json_string_value(json_object_get(e, "template"));
    }
    return NULL;
}

/* "left right" strings from model.merges (strings or [left, right] pairs). */
static char **read_merges(json_t *merges, size_t *n_out)
{
    size_t n = json_array_size(merges);
    char **out = cv_calloc(n ? n : 1, sizeof(char *));
    if (!out)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) {
            out[i] = dup_str(json_string_value(m));
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
            size_t la = strlen(a), lb = strlen(b);
            out[i] = cv_malloc(la + lb + 2);
            if (out[i]) {
                memcpy(out[i], a, la);
                out[i][la] = ' ';
                memcpy(out[i] + la + 1, b, lb + 1);
            }
        } else {
            fprintf(stderr, "hf_vocab: model.merges[%zu] is neither a string nor a pair of strings\n", i);
        }
        if (!out[i]) {
            for (size_t k = 0; k < i; k++)
                cv_free(out[k]);
            cv_free(out);
            return NULL;
        }
    }
    *n_out = n;
    return out;
}

static int usage(void)
{
    fprintf(stderr, "usage: hf_vocab -o OUT.gguf --pre llama-bpe|qwen2|gpt-2|gpt-4o [--n-vocab N] [--bos TEXT] "
                    "[--eos TEXT] [--eot TEXT] tokenizer.json [tokenizer_config.json]\n");
    return 2;
}

static bool known_pre(const char *pre)
{
    static const char *const names[] = {"llama-bpe", "llama3", "llama-v3", "qwen2",   "deepseek-r1-qwen", "gpt-2",
                                        "gpt2",      "gpt-4o", "llama4",   "kanana2", "talkie",           "minimax-m2"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (strcmp(pre, names[i]) == 0)
            return true;
    return false;
}

int main(int argc, char **argv)
{
    const char *out_path = NULL, *pre = NULL, *bos_text = NULL, *eos_text = NULL, *eot_text = NULL;
    const char *tok_path = NULL, *config_path = NULL;
    long long n_vocab_arg = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (!strcmp(a, "-o") && has_value)
            out_path = argv[++i];
        else if (!strcmp(a, "--pre") && has_value)
            pre = argv[++i];
        else if (!strcmp(a, "--bos") && has_value)
            bos_text = argv[++i];
        else if (!strcmp(a, "--eos") && has_value)
            eos_text = argv[++i];
        else if (!strcmp(a, "--eot") && has_value)
            eot_text = argv[++i];
        else if (!strcmp(a, "--n-vocab") && has_value)
            n_vocab_arg = strtoll(argv[++i], NULL, 10);
        else if (a[0] == '-')
            return usage();
        else if (!tok_path)
            tok_path = a;
        else if (!config_path)
            config_path = a;
        else
            return usage();
    }
    if (!out_path || !pre || !tok_path)
        return usage();
    if (!known_pre(pre)) {
        fprintf(stderr, "hf_vocab: unsupported --pre '%s' (supported: llama-bpe, qwen2, gpt-2, gpt-4o)\n", pre);
        return 2;
    }

    int rc = 1;
    json_t *tok = load_json(tok_path, 0);
    json_t *config = config_path ? load_json(config_path, JSON_DECODE_INT_AS_REAL) : NULL;
    vocab_out v = {0};
    char **merges = NULL;
    size_t n_merges = 0;
    gguf_writer *w = NULL;
    if (!tok || (config_path && !config))
        goto done;

    json_t *model = json_object_get(tok, "model");
    const char *model_type = json_string_value(json_object_get(model, "type"));
    json_t *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(tok, "added_tokens");
    if (!model_type || strcmp(model_type, "BPE") != 0 || !json_is_object(vocab) ||
        !json_is_array(json_object_get(model, "merges"))) {
        fprintf(stderr, "hf_vocab: %s: model is not a BPE model with vocab and merges\n", tok_path);
        goto done;
    }

    /* n = largest id + 1 */
    json_int_t max_id = -1;
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val)
    {
        if (!json_is_integer(val)) {
            fprintf(stderr, "hf_vocab: %s: model.vocab['%s'] is not an integer\n", tok_path, key);
            goto done;
        }
        if (json_integer_value(val) > max_id)
            max_id = json_integer_value(val);
    }
    size_t i;
    json_array_foreach(added, i, val)
    {
        json_int_t id = json_integer_value(json_object_get(val, "id"));
        if (id > max_id)
            max_id = id;
    }
    if (max_id < 0 || max_id >= MAX_VOCAB || n_vocab_arg > MAX_VOCAB ||
        (n_vocab_arg && n_vocab_arg < max_id + 1)) {
        fprintf(stderr, "hf_vocab: bad vocabulary size (largest id %lld, --n-vocab %lld)\n", (long long)max_id,
                n_vocab_arg);
        goto done;
    }
    v.n = n_vocab_arg ? n_vocab_arg : max_id + 1;
    v.text = cv_calloc((size_t)v.n, sizeof(char *));
    v.type = cv_calloc((size_t)v.n, sizeof(int32_t));
    if (!v.text || !v.type)
        goto oom;
    json_object_foreach(vocab, key, val)
    {
        if (set_token(&v, json_integer_value(val), key, CV_TOKEN_NORMAL) != 0)
            goto done;
    }
    json_array_foreach(added, i, val)
    {
        const char *content = json_string_value(json_object_get(val, "content"));
        json_t *id = json_object_get(val, "id");
        if (!content || !json_is_integer(id)) {
            fprintf(stderr, "hf_vocab: %s: added_tokens[%zu] has no id or content\n", tok_path, i);
            goto done;
        }
        bool special = json_is_true(json_object_get(val, "special")) || looks_special(content);
        if (set_token(&v, json_integer_value(id), content, special ? CV_TOKEN_CONTROL : CV_TOKEN_USER_DEFINED) != 0)
            goto done;
    }
    for (int64_t k = 0; k < v.n; k++) {
        if (!v.text[k]) {
            char pad[32];
            snprintf(pad, sizeof(pad), "[PAD%lld]", (long long)k);
            if (!(v.text[k] = dup_str(pad)))
                goto oom;
            v.type[k] = CV_TOKEN_UNUSED;
        }
    }
    merges = read_merges(json_object_get(model, "merges"), &n_merges);
    if (!merges)
        goto done;

    if (!bos_text)
        bos_text = config_token(config, "bos_token");
    if (!eos_text)
        eos_text = config_token(config, "eos_token");
    int32_t bos = find_token(&v, bos_text), eos = find_token(&v, eos_text);
    int32_t pad = find_token(&v, config_token(config, "pad_token"));
    int32_t eot = eot_text ? find_token(&v, eot_text) : find_token(&v, "<|eot_id|>");
    if (!eot_text && eot < 0)
        eot = find_token(&v, "<|im_end|>");
    if ((bos_text && bos < 0) || (eos_text && eos < 0) || (eot_text && eot < 0)) {
        fprintf(stderr, "hf_vocab: special token '%s' is not in the vocabulary\n",
                bos_text && bos < 0 ? bos_text : eos_text && eos < 0 ? eos_text : eot_text);
        goto done;
    }
    json_t *tp = template_processing(tok);
    bool llama3 = !strcmp(pre, "llama-bpe") || !strcmp(pre, "llama3") || !strcmp(pre, "llama-v3");
    bool add_bos = resolve_flag(config, "add_bos_token", tp, bos_text, true, llama3);
    bool add_eos = resolve_flag(config, "add_eos_token", tp, eos_text, false, false);
    if ((add_bos && bos < 0) || (add_eos && eos < 0)) {
        fprintf(stderr, "hf_vocab: add_%s_token is set but there is no %s token (give --%s)\n",
                add_bos && bos < 0 ? "bos" : "eos", add_bos && bos < 0 ? "BOS" : "EOS",
                add_bos && bos < 0 ? "bos" : "eos");
        goto done;
    }

    w = cv_gguf_writer_create();
    if (!w)
        goto oom;
    cv_gguf_set_str(w, "general.type", "vocab");
    cv_gguf_set_str(w, "tokenizer.ggml.model", "gpt2");
    cv_gguf_set_str(w, "tokenizer.ggml.pre", pre);
    cv_gguf_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.text, (uint64_t)v.n);
    cv_gguf_set_arr(w, "tokenizer.ggml.token_type", GGUF_INT32, v.type, (uint64_t)v.n);
    cv_gguf_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, n_merges);
    if (bos >= 0)
        cv_gguf_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    if (eos >= 0)
        cv_gguf_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (eot >= 0)
        cv_gguf_set_u32(w, "tokenizer.ggml.eot_token_id", (uint32_t)eot);
    if (pad >= 0)
        cv_gguf_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad);
    cv_gguf_set_bool(w, "tokenizer.ggml.add_bos_token", add_bos);
    cv_gguf_set_bool(w, "tokenizer.ggml.add_eos_token", add_eos);
    const char *tmpl = chat_template(config);
    if (tmpl)
        cv_gguf_set_str(w, "tokenizer.chat_template", tmpl);
    char err[CV_ERRLEN];
    if (cv_gguf_write(w, out_path, err, sizeof(err)) != 0) {
        fprintf(stderr, "hf_vocab: %s\n", err);
        goto done;
    }
    printf("%s: %lld tokens, %zu merges, pre %s, bos %d, eos %d, eot %d, add_bos %d, add_eos %d%s\n", out_path,
           (long long)v.n, n_merges, pre, (int)bos, (int)eos, (int)eot, add_bos, add_eos,
           tmpl ? ", chat template" : "");
    rc = 0;
    goto done;
oom:
    fprintf(stderr, "hf_vocab: out of memory\n");
done:
    cv_gguf_writer_free(w);
    for (size_t k = 0; merges && k < n_merges; k++)
        cv_free(merges[k]);
    cv_free(merges);
    for (int64_t k = 0; v.text && k < v.n; k++)
        cv_free(v.text[k]);
    cv_free(v.text);
    cv_free(v.type);
    json_decref(tok);
    json_decref(config);
    return rc;
}
