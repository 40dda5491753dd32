/* fim.c: fill-in-the-middle prompts (fim.h). */
#include "serve/fim.h"


#include "core/err.h"

typedef struct fim_out {
    const convoy_model *m;
    int32_t *ids;
    int n, cap;
    bool full;
} fim_out;

static void put_id(fim_out *o, int32_t id)
{
    if (o->n < o->cap)
        o->ids[o->n++] = id;
    else
        o->full = true;
}

static void put_text(fim_out *o, const char *p, size_t n)
{
    if (n == 0 || o->full)
        return;
    const int k = convoy_tokenize(o->m, p, n, false, false, o->ids + o->n, o->cap - o->n);
    if (k < 0)
        o->full = true;
    else
        o->n += k;
}

static void put_files(fim_out *o, const convoy_model_info *info, const cv_fim_parts *p)
{
    const bool repo = info->fim_rep >= 0 && info->fim_sep >= 0;
    if (repo && p->n_files > 0) {
        put_id(o, info->fim_rep);
        put_text(o, "myproject\n", 10);
    }
    for (int i = 0; i < p->n_files; i++) {
        if (repo) {
            put_id(o, info->fim_sep);
            put_text(o, p->files[i].name.p, p->files[i].name.n);
            put_text(o, "\n", 1);
        }
        put_text(o, p->files[i].text.p, p->files[i].text.n);
    }
    if (repo && p->n_files > 0) {
        put_id(o, info->fim_sep);
        put_text(o, "filename", 8);
    }
}

int cv_fim_prompt(const convoy_model *m, const cv_fim_parts *p, int32_t *out, int n_max, char *why, size_t whylen)
{
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    if (info.fim_pre < 0 || info.fim_suf < 0 || info.fim_mid < 0)
        return cv_errf(why, whylen, "the model has no fill-in-the-middle tokens (prefix, suffix and middle)");
    fim_out o = {.m = m, .ids = out, .cap = n_max};
    if (info.add_bos && info.bos >= 0)
        put_id(&o, info.bos);
    put_files(&o, &info, p);
    put_id(&o, info.fim_pre);
    put_text(&o, p->prefix.p, p->prefix.n);
    put_id(&o, info.fim_suf);
    put_text(&o, p->suffix.p, p->suffix.n);
    put_id(&o, info.fim_mid);
    put_text(&o, p->middle.p, p->middle.n);
    if (o.full)
        return cv_errf(why, whylen, "the fill-in-the-middle prompt has more than %d tokens", n_max);
    return o.n;
}
