/* render.c: chat templates rendered natively (see render.h). */
#include "serve/render.h"

#include <string.h>

#include "core/err.h"

bool sv_chat_template_known(const char *name) { return !strcmp(name, "chatml"); }

static int render_chatml(const sv_chat_msg *msgs, int n, sv_buf *out)
{
    for (int i = 0; i < n; i++)
        if (sv_buf_puts(out, "<|im_start|>") || sv_buf_puts(out, msgs[i].role) || sv_buf_puts(out, "\n") ||
            sv_buf_puts(out, msgs[i].content) || sv_buf_puts(out, "<|im_end|>\n"))
            return -1;
    return sv_buf_puts(out, "<|im_start|>assistant\n");
}

int sv_render_chat(const char *tmpl, const sv_chat_msg *msgs, int n, sv_buf *out, char *err, size_t errlen)
{
    if (!strcmp(tmpl, "chatml"))
        return render_chatml(msgs, n, out) ? cv_errf(err, errlen, "out of memory rendering the chat") : 0;
    return cv_errf(err, errlen, "unknown chat template '%s'", tmpl);
}

const char *const *sv_chat_stop_strings(const char *tmpl)
{
    static const char *const chatml[] = {"<|im_end|>", NULL};
    static const char *const none[] = {NULL};
    return !strcmp(tmpl, "chatml") ? chatml : none;
}
