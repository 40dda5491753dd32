/* render.c: chat templates for the server (see render.h), over the native
 * renderers of model/chat.h. */
#include "serve/render.h"

#include <string.h>

#include "core/alloc.h"
#include "core/err.h"

int sv_chat_setup(const convoy_model *m, const char *override_name, sv_chat *out, char *err, size_t errlen)
{
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    const char *bos = convoy_token_text(m, info.bos), *eos = convoy_token_text(m, info.eos);
    out->bos = bos ? bos : "";
    out->eos = eos ? eos : "";
    if (override_name) {
        const int k = cv_chat_kind_from_name(override_name);
        if (k < 0)
            return cv_errf(err, errlen, "unknown chat template '%s' (known: %s)", override_name,
                           cv_chat_kind_names());
        out->kind = (cv_chat_kind)k;
        return 0;
    }
    const char *tmpl = convoy_model_chat_template(m);
    if (!tmpl) {
        out->kind = (cv_chat_kind)cv_chat_kind_from_name("chatml");
        return 0;
    }
    return cv_chat_detect(tmpl, &out->kind, err, errlen);
}

const char *sv_chat_name(const sv_chat *c) { return cv_chat_kind_name(c->kind); }

int sv_render_chat(const sv_chat *c, const sv_chat_msg *msgs, int n, sv_buf *out, char *err, size_t errlen)
{
    cv_chat_msg *cm = cv_calloc((size_t)(n > 0 ? n : 1), sizeof *cm);
    if (!cm)
        return cv_errf(err, errlen, "out of memory rendering the chat");
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const int role = cv_chat_role_from_name(msgs[i].role);
        if (role < 0)
            rc = cv_errf(err, errlen, "messages[%d]: role '%s' is not supported", i, msgs[i].role);
        cm[i] = (cv_chat_msg){.role = (cv_chat_role)role, .content = msgs[i].content};
    }
    size_t len = 0;
    if (rc == 0)
        rc = cv_chat_render(c->kind, cm, n, true, c->bos, c->eos, NULL, NULL, 0, &len, err, errlen);
    if (rc == 0 && sv_buf_reserve(out, len + 1))
        rc = cv_errf(err, errlen, "out of memory rendering the chat");
    if (rc == 0)
        rc = cv_chat_render(c->kind, cm, n, true, c->bos, c->eos, NULL, out->p + out->n, len + 1, &len, err, errlen);
    if (rc == 0)
        out->n += len;
    cv_free(cm);
    return rc;
}

const char *const *sv_chat_stop_strings(const sv_chat *c) { return cv_chat_stop_strings(c->kind); }
