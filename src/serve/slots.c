/* slots.c: see slots.h. A slot file holds tokens, not KV: restore runs
 * them through the model again, which gives the very bits the saved slot
 * held (the kernels are batch- and chunk-invariant) on one machine or any
 * chain, whatever its split. */
#include "serve/slots.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/cursor.h"
#include "core/err.h"
#include "core/fmap.h"

#define SLOT_MAGIC 0x4C535643u /* "CVSL" */
#define SLOT_VERSION 1u
#define SLOT_HEADER (16u + CONVOY_MODEL_ID_BYTES)
#define NAME_MAX_BYTES 200

static char *fail(oai_error *e, int status, const char *fmt, ...) CV_PRINTF(3, 4);
static char *fail(oai_error *e, int status, const char *fmt, ...)
{
    char msg[CV_ERRLEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    cv_oai_fail(e, status, status >= 500 ? "server_error" : "invalid_request_error", NULL, NULL, "%s", msg);
    return NULL;
}

/* A slot's refusal: 409 while it runs a request, else 400. */
static char *slot_refused(oai_error *e, const char *err)
{
    return fail(e, strstr(err, "running") ? 409 : 400, "%s", err);
}

char *cv_slots_json(cv_sched *s)
{
    cv_sched_stats st;
    cv_sched_get_stats(s, &st);
    cv_slot_info *info = cv_calloc((size_t)st.n_slot, sizeof *info);
    json_t *a = info ? json_array() : NULL;
    const int32_t n = info ? cv_sched_get_slots(s, info) : 0;
    for (int32_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_pack("{s:i,s:i,s:b,s:i}", "id", info[i].id, "n_ctx", info[i].n_ctx,
                                               "is_processing", info[i].processing, "n_tokens", info[i].n_tokens))) {
            json_decref(a);
            a = NULL;
        }
    cv_free(info);
    return cv_oai_json_text(a);
}

/* A file name inside the save directory: never a path. */
static bool name_ok(const char *name)
{
    const size_t n = strlen(name);
    if (n == 0 || n > NAME_MAX_BYTES || name[0] == '.' || strstr(name, ".."))
        return false;
    for (size_t i = 0; i < n; i++) {
        const char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return false;
    }
    return true;
}

/* The body's filename, checked; NULL with e filled. */
static const char *body_filename(json_t *body, oai_error *e)
{
    const char *name = json_string_value(json_object_get(body, "filename"));
    if (!name)
        return fail(e, 400, "the body must be a JSON object with a \"filename\" string");
    if (!name_ok(name))
        return fail(e, 400,
                    "the filename \"%.200s\" is refused: a slot file's name is 1 to 200 letters, digits, '.', '_' "
                    "or '-', not starting with '.', without \"..\"",
                    name);
    return name;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Writes the slot file's bytes to dir/name through a temporary file, so a
 * reader never sees half of one. */
static int write_atomic(const char *dir, const char *name, const uint8_t *bytes, size_t n, char *err, size_t errlen)
{
    char path[4096], tmp[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp", dir, name);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return cv_errf(err, errlen, "cannot write %s: %s", tmp, strerror(errno));
    const bool ok = fwrite(bytes, 1, n, f) == n;
    if (fclose(f) || !ok || rename(tmp, path)) {
        unlink(tmp);
        return cv_errf(err, errlen, "cannot write %s: %s", path, strerror(errno));
    }
    return 0;
}

static char *save(cv_sched *s, const convoy_model *m, const char *dir, int32_t id, const char *name, oai_error *e)
{
    const double t0 = cv_now_s();
    char err[CV_ERRLEN];
    cv_sched_stats st;
    cv_sched_get_stats(s, &st);
    int32_t *tok = cv_malloc(sizeof(int32_t) * (size_t)st.n_ctx);
    uint8_t *bytes = cv_malloc(SLOT_HEADER + 4u * (size_t)st.n_ctx);
    const int32_t n = tok && bytes ? cv_sched_slot_tokens(s, id, tok, err, sizeof err) : -2;
    if (n == -2)
        fail(e, 500, "out of memory");
    else if (n < 0)
        slot_refused(e, err);
    else if (convoy_model_id(m, bytes + 8, err, sizeof err))
        fail(e, 500, "%s", err);
    char *res = NULL;
    if (!e->status) {
        put_u32(bytes, SLOT_MAGIC);
        put_u32(bytes + 4, SLOT_VERSION);
        put_u32(bytes + 8 + CONVOY_MODEL_ID_BYTES, (uint32_t)n);
        put_u32(bytes + 12 + CONVOY_MODEL_ID_BYTES, 0);
        for (int32_t i = 0; i < n; i++)
            put_u32(bytes + SLOT_HEADER + 4 * (size_t)i, (uint32_t)tok[i]);
        const size_t size = SLOT_HEADER + 4u * (size_t)n;
        if (write_atomic(dir, name, bytes, size, err, sizeof err))
            fail(e, 500, "%s", err);
        else
            res = cv_oai_json_text(json_pack("{s:i,s:s,s:i,s:I,s:{s:f}}", "id_slot", id, "filename", name, "n_saved", n,
                                 "n_written", (json_int_t)size, "timings", "save_ms", (cv_now_s() - t0) * 1e3));
    }
    cv_free(tok);
    cv_free(bytes);
    return res;
}

/* Reads dir/name (at most cap bytes) into a new buffer; NULL with e filled. */
static uint8_t *read_file(const char *dir, const char *name, size_t cap, size_t *n, oai_error *e)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    struct stat st;
    char why[CV_ERRLEN];
    const int fd = cv_open_regular(path, &st, why, sizeof why);
    if (fd < 0)
        return (uint8_t *)fail(e, errno == ENOENT ? 404 : 400, "the slot file %s", why);
    uint8_t *buf = cv_malloc(cap + 1);
    FILE *f = fdopen(fd, "rb");
    *n = buf && f ? fread(buf, 1, cap + 1, f) : 0;
    if (f)
        fclose(f);
    else
        close(fd);
    if (!buf || !f) {
        cv_free(buf);
        return (uint8_t *)fail(e, 500, "out of memory");
    }
    if (*n > cap) {
        cv_free(buf);
        return (uint8_t *)fail(e, 400, "the slot file %s holds more tokens than a slot's context", path);
    }
    return buf;
}

/* The tokens of a slot file's bytes into out (room for what the file can
 * hold), checked against the model: their count, or -1 with err naming
 * what is wrong. */
static int32_t parse_slot_file(const uint8_t *bytes, size_t n, const convoy_model *m, int32_t *out, char *err,
                               size_t errlen)
{
    cv_cursor c;
    cv_cursor_init(&c, bytes, n);
    const uint32_t magic = cv_cursor_u32(&c, "magic"), version = cv_cursor_u32(&c, "version");
    const uint8_t *model_id = cv_cursor_bytes(&c, CONVOY_MODEL_ID_BYTES, "model id");
    const uint32_t n_tok = cv_cursor_u32(&c, "n_tokens"), reserved = cv_cursor_u32(&c, "reserved");
    if (c.failed)
        return cv_errf(err, errlen, "it is cut short in its %s", c.fail_what);
    if (magic != SLOT_MAGIC || version != SLOT_VERSION || reserved)
        return cv_errf(err, errlen, "it is not a version-1 convoy slot file");
    if (cv_cursor_left(&c) != 4u * (uint64_t)n_tok)
        return cv_errf(err, errlen, "it announces %u tokens but holds %zu bytes of them", n_tok, cv_cursor_left(&c));
    uint8_t want[CONVOY_MODEL_ID_BYTES];
    if (convoy_model_id(m, want, err, errlen))
        return -1;
    if (memcmp(want, model_id, sizeof want))
        return cv_errf(err, errlen, "it was saved with another model (its tokenizer, hyperparameters or tensors "
                                    "differ from this server's)");
    convoy_model_info info;
    convoy_model_get_info(m, &info);
    for (uint32_t i = 0; i < n_tok; i++) {
        const uint32_t t = cv_cursor_u32(&c, "token");
        if (t >= (uint32_t)info.n_vocab)
            return cv_errf(err, errlen, "its token %u is id %u, outside the vocabulary of %d", i, t, info.n_vocab);
        out[i] = (int32_t)t;
    }
    return (int32_t)n_tok;
}

/* Runs the tokens into slot id: a pinned greedy request of one token,
 * whose prompt they are (the slot then keeps them). */
static int run_into_slot(cv_sched *s, int32_t id, const int32_t *tokens, int32_t n, char *err, size_t errlen)
{
    cv_request_params p = {.prompt = tokens, .n_prompt = n, .max_tokens = 1, .ignore_eos = true,
                           .top_logprobs = -1, .pin = true, .slot = id};
    p.sampler = convoy_sampling_default_params();
    p.sampler.temp = 0.0f;
    cv_request *r;
    if (cv_sched_submit(s, &p, &r, err, errlen) != CV_SUBMIT_OK)
        return -1;
    cv_finish f = CV_RUNNING;
    int32_t seen = 0;
    while (f == CV_RUNNING)
        seen = cv_request_wait(r, seen, 1000, &f);
    const int rc = f == CV_FINISH_LENGTH || f == CV_FINISH_STOP ? 0 : cv_errf(err, errlen, "%s", cv_request_error(r));
    cv_request_release(r);
    return rc;
}

static char *restore(cv_sched *s, const convoy_model *m, const char *dir, int32_t id, const char *name,
                     oai_error *e)
{
    const double t0 = cv_now_s();
    char err[CV_ERRLEN];
    cv_sched_stats st;
    cv_sched_get_stats(s, &st);
    int32_t *tok = cv_malloc(sizeof(int32_t) * (size_t)st.n_ctx);
    if (!tok)
        return fail(e, 500, "out of memory");
    size_t n_read = 0;
    uint8_t *bytes = NULL;
    int32_t n = -1;
    if (cv_sched_slot_tokens(s, id, tok, err, sizeof err) < 0)
        slot_refused(e, err);
    else if ((bytes = read_file(dir, name, SLOT_HEADER + 4u * (size_t)(st.n_ctx - 1), &n_read, e)) &&
             (n = parse_slot_file(bytes, n_read, m, tok, err, sizeof err)) < 0)
        fail(e, 400, "the slot file %s is refused: %s", name, err);
    else if (n >= 0 && (n == 0 ? cv_sched_slot_erase(s, id, err, sizeof err) < 0
                               : run_into_slot(s, id, tok, n, err, sizeof err) != 0))
        fail(e, 500, "restoring slot %d: %s", id, err);
    char *res = NULL;
    if (!e->status)
        res =
            cv_oai_json_text(json_pack("{s:i,s:s,s:i,s:I,s:{s:f}}", "id_slot", id, "filename", name, "n_restored", n,
                                       "n_read", (json_int_t)n_read, "timings", "restore_ms", (cv_now_s() - t0) * 1e3));
    cv_free(tok);
    cv_free(bytes);
    return res;
}

char *cv_slot_action_json(cv_sched *s, const convoy_model *m, const char *dir, int32_t id, const char *action,
                          const char *body, size_t len, oai_error *e)
{
    char err[CV_ERRLEN];
    if (!action || (strcmp(action, "save") && strcmp(action, "restore") && strcmp(action, "erase")))
        return fail(e, 400, "the action must be ?action=save, restore or erase, not \"%.40s\"", action ? action : "");
    if (!strcmp(action, "erase")) {
        const int32_t n = cv_sched_slot_erase(s, id, err, sizeof err);
        if (n < 0)
            return slot_refused(e, err);
        return cv_oai_json_text(json_pack("{s:i,s:i}", "id_slot", id, "n_erased", n));
    }
    if (!dir)
        return fail(e, 400, "slot %s needs a directory for slot files: start the server with --slot-save-path DIR",
                    action);
    json_t *j = json_loadb(body ? body : "", len, 0, NULL);
    const char *name = body_filename(j, e);
    char *res = !name              ? NULL
                : action[0] == 's' ? save(s, m, dir, id, name, e)
                                   : restore(s, m, dir, id, name, e);
    json_decref(j);
    return res;
}
