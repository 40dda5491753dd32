/* bias.c: logit_bias bodies into sampler pairs (bias.h). */
#include "serve/bias.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"

typedef struct bias_list {
    convoy_logit_bias *pair;
    int32_t n, cap;
    int32_t n_vocab;
} bias_list;

static int add_pair(bias_list *l, int32_t id, float bias, char *why, size_t whylen)
{
    if (id < 0 || id >= l->n_vocab)
        return cv_errf(why, whylen, "token id %d is outside the vocabulary of %d", id, l->n_vocab);
    if (l->n == CONVOY_MAX_LOGIT_BIAS)
        return cv_errf(why, whylen, "more than %d biased tokens", CONVOY_MAX_LOGIT_BIAS);
    if (l->n == l->cap) {
        const int32_t cap = l->cap ? 2 * l->cap : 16;
        convoy_logit_bias *p = cv_realloc(l->pair, sizeof *p * (size_t)cap);
        if (!p)
            return cv_errf(why, whylen, "out of memory");
        l->pair = p;
        l->cap = cap;
    }
    l->pair[l->n++] = (convoy_logit_bias){id, bias};
    return 0;
}

/* A bias value: a number in [-100, 100], or false for a ban. */
static int read_bias(const json_t *v, const char *what, float *out, char *why, size_t whylen)
{
    if (json_is_false(v)) {
        *out = -INFINITY;
        return 0;
    }
    const double x = json_number_value(v);
    if (!json_is_number(v) || !(x >= -100.0 && x <= 100.0))
        return cv_errf(why, whylen, "the bias of %s must be a number in [-100, 100] or false", what);
    *out = (float)x;
    return 0;
}

/* A key: a decimal token id, else a text whose every token is biased. */
static int add_key(const convoy_model *m, bias_list *l, const char *key, size_t len, float bias, char *why,
                   size_t whylen)
{
    char *end;
    errno = 0;
    const long id = strtol(key, &end, 10);
    if (len > 0 && end == key + len && errno == 0)
        return add_pair(l, id < INT32_MIN ? INT32_MIN : id > INT32_MAX ? INT32_MAX : (int32_t)id, bias, why,
                        whylen);
    int32_t ids[64];
    const int n = convoy_tokenize(m, key, len, false, false, ids, 64);
    if (n <= 0)
        return cv_errf(why, whylen, "the text \"%.40s\" is empty or has over 64 tokens", key);
    for (int i = 0; i < n; i++)
        if (add_pair(l, ids[i], bias, why, whylen))
            return -1;
    return 0;
}

static int add_pairs_list(const convoy_model *m, bias_list *l, const json_t *v, char *why, size_t whylen)
{
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e)
    {
        const json_t *k = json_array_get(e, 0);
        float bias;
        if (!json_is_array(e) || json_array_size(e) != 2 || !(json_is_integer(k) || json_is_string(k)))
            return cv_errf(why, whylen, "entry %zu is not a pair [id or text, bias]", i);
        if (read_bias(json_array_get(e, 1), "a pair", &bias, why, whylen))
            return -1;
        if (json_is_integer(k) ? add_pair(l, (int32_t)json_integer_value(k), bias, why, whylen)
                               : add_key(m, l, json_string_value(k), json_string_length(k), bias, why, whylen))
            return -1;
    }
    return 0;
}

int cv_logit_bias_parse(const convoy_model *m, const json_t *v, convoy_logit_bias **out, int32_t *n, char *why,
                        size_t whylen)
{
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    bias_list l = {.n_vocab = info.n_vocab};
    int rc = 0;
    if (json_is_array(v)) {
        rc = add_pairs_list(m, &l, v, why, whylen);
    } else if (json_is_object(v)) {
        const char *key;
        json_t *b;
        json_object_foreach((json_t *)v, key, b)
        {
            float bias;
            if ((rc = read_bias(b, key, &bias, why, whylen)) || (rc = add_key(m, &l, key, strlen(key), bias, why,
                                                                               whylen)))
                break;
        }
    } else {
        rc = cv_errf(why, whylen, "it must be an object {\"id\": bias} or a list of [id, bias] pairs");
    }
    if (rc) {
        cv_free(l.pair);
        return -1;
    }
    *out = l.pair;
    *n = l.n;
    return 0;
}
