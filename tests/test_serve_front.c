/* test_serve_front.c: the parts of `convoy serve`'s front that need no
 * socket. API keys (access.h): "Bearer KEY" with one of the keys lets a
 * request in, anything else not; keys from a list and from a file (blank
 * lines and \r skipped; a file others may read, an empty one, a key with a
 * space are refused). CORS origins: "*", a list (any case), "none". The
 * JSON content type, loopback hosts. Escaping (core/utf8.h), which the log
 * and `convoy info` use: control bytes,
 * DEL, C1 controls, invalid UTF-8 and backslashes are escaped, valid text
 * is kept, the output is cut at a character. llama-server's routes
 * (extra.h) on stories260K: /tokenize with and without specials and
 * pieces, /detokenize back to the text, their errors, /props. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "convoy.h"
#include "kernels/kernels.h"
#include "core/utf8.h"
#include "serve/access.h"
#include "serve/extra.h"
#include "serve/log.h"
#include "test.h"
#include "model_test.h"

static convoy_model *model;

static void test_keys(void)
{
    char err[256];
    cv_access a;
    CHECKF(cv_access_init(&a, "k1,sk-two", NULL, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(cv_access_has_keys(&a));
    CHECK(cv_access_key_ok(&a, "Bearer k1") && cv_access_key_ok(&a, "bearer sk-two") &&
          cv_access_key_ok(&a, "Bearer  k1 "));
    CHECK(!cv_access_key_ok(&a, NULL) && !cv_access_key_ok(&a, "k1") && !cv_access_key_ok(&a, "Basic k1") &&
          !cv_access_key_ok(&a, "Bearer k") && !cv_access_key_ok(&a, "Bearer k1x") && !cv_access_key_ok(&a, "Bearer "));
    CHECK(!cv_access_origin_ok(&a, "https://a.example")); /* no --cors: no page */
    cv_access_free(&a);
    CHECK(cv_access_init(&a, NULL, NULL, NULL, err, sizeof err) == 0 && !cv_access_has_keys(&a) &&
          cv_access_key_ok(&a, NULL));
    cv_access_free(&a);
    CHECK(cv_access_init(&a, "a,,b", NULL, NULL, err, sizeof err) == -1 && strstr(err, "API key 2 is empty"));
    CHECK(cv_access_init(&a, "a b", NULL, NULL, err, sizeof err) == -1 && strstr(err, "space"));

    char path[] = "/tmp/convoy-keys-XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, "\nfile-key\r\n\n  \nsecond\n", 22) == 22);
    close(fd);
    chmod(path, 0600);
    CHECKF(cv_access_init(&a, "k1", path, NULL, err, sizeof err) == 0, "%s", err);
    CHECK(a.n_keys == 3 && cv_access_key_ok(&a, "Bearer file-key") && cv_access_key_ok(&a, "Bearer second") &&
          cv_access_key_ok(&a, "Bearer k1"));
    cv_access_free(&a);
    chmod(path, 0644);
    CHECK(cv_access_init(&a, NULL, path, NULL, err, sizeof err) == -1 && strstr(err, "chmod 600"));
    chmod(path, 0600);
    FILE *f = fopen(path, "w");
    fclose(f);
    CHECK(cv_access_init(&a, NULL, path, NULL, err, sizeof err) == -1 && strstr(err, "holds no key"));
    unlink(path);
    CHECK(cv_access_init(&a, NULL, path, NULL, err, sizeof err) == -1 && strstr(err, "cannot open"));
}

static void test_origins_and_types(void)
{
    char err[256];
    cv_access a;
    CHECK(cv_access_init(&a, NULL, NULL, "*", err, sizeof err) == 0 && cv_access_origin_ok(&a, "https://x.example"));
    cv_access_free(&a);
    CHECK(cv_access_init(&a, NULL, NULL, "https://app.example,http://localhost:3000", err, sizeof err) == 0);
    CHECK(cv_access_origin_ok(&a, "https://app.example") && cv_access_origin_ok(&a, "HTTP://LOCALHOST:3000"));
    CHECK(!cv_access_origin_ok(&a, "https://evil.example") && !cv_access_origin_ok(&a, "http://localhost:3001") &&
          !cv_access_origin_ok(&a, NULL));
    cv_access_free(&a);
    CHECK(cv_access_init(&a, NULL, NULL, "none", err, sizeof err) == 0 && !cv_access_origin_ok(&a, "null"));
    cv_access_free(&a);

    CHECK(cv_is_json_type("application/json") && cv_is_json_type("Application/JSON; charset=utf-8"));
    CHECK(!cv_is_json_type(NULL) && !cv_is_json_type("text/plain") && !cv_is_json_type("application/jsonp") &&
          !cv_is_json_type("application/x-www-form-urlencoded"));
    CHECK(cv_is_loopback_host("127.0.0.1") && cv_is_loopback_host("127.8.9.10") && cv_is_loopback_host("::1") &&
          cv_is_loopback_host("localhost"));
    CHECK(!cv_is_loopback_host("0.0.0.0") && !cv_is_loopback_host("::") && !cv_is_loopback_host("10.1.2.3"));
}

static void test_escape(void)
{
    char out[64];
    CHECK(!strcmp(cv_escape(out, sizeof out, "GET /v1/models", 14), "GET /v1/models"));
    CHECK(!strcmp(cv_escape(out, sizeof out, "a\x1b]0;owned\x07z", 12), "a\\x1B]0;owned\\x07z"));
    CHECK(!strcmp(cv_escape(out, sizeof out, "\\ caf\xc3\xa9 \x7f", 9), "\\\\ caf\xc3\xa9 \\x7F"));
    CHECK(!strcmp(cv_escape(out, sizeof out, "\xff\xc2\x9b[2J\xe2\x82", 8), "\\xFF\\xC2\\x9B[2J\\xE2\\x82"));
    CHECK(!strcmp(cv_escape(out, sizeof out, "x\r\ny", 4), "x\\x0D\\x0Ay"));
    CHECK(!strcmp(cv_escape(out, 6, "ab\x01" "cd", 5), "ab")); /* "\x01" would not fit: cut before it */
    CHECK(!strcmp(cv_escape(out, 5, "ab\xc3\xa9", 4), "ab\xc3\xa9"));
    CHECK(!strcmp(cv_escape(out, 4, "ab\xc3\xa9", 4), "ab"));
}

/* The JSON of an extra.h answer, or NULL (then e is filled). */
static json_t *answer(char *(*fn)(const oai_server *, const char *, size_t, oai_error *), const oai_server *srv,
                      const char *body, oai_error *e)
{
    memset(e, 0, sizeof *e);
    char *s = fn(srv, body, strlen(body), e);
    json_t *j = s ? json_loads(s, 0, NULL) : NULL;
    free(s);
    return j;
}

static void test_tokenize(void)
{
    const oai_server srv = {.model = model, .model_id = "stories260K", .n_ctx = 512};
    oai_error e;
    json_t *j = answer(cv_tokenize_json, &srv, "{\"content\":\"Once upon a time\"}", &e);
    json_t *t = json_object_get(j, "tokens");
    CHECKF(json_array_size(t) == 4 && json_integer_value(json_array_get(t, 0)) == 403, "%s", e.message);
    json_decref(j);
    j = answer(cv_tokenize_json, &srv, "{\"content\":\"Once\",\"add_special\":true,\"with_pieces\":true}", &e);
    t = json_object_get(j, "tokens");
    CHECK(json_array_size(t) == 2 && json_integer_value(json_object_get(json_array_get(t, 0), "id")) == 1 &&
          !strcmp(json_string_value(json_object_get(json_array_get(t, 1), "piece")), " Once"));
    json_decref(j);
    j = answer(cv_detokenize_json, &srv, "{\"tokens\":[403,407,261,378]}", &e);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "content")), " Once upon a time"));
    json_decref(j);
    j = answer(cv_detokenize_json, &srv, "{\"tokens\":[]}", &e);
    CHECK(j && !strcmp(json_string_value(json_object_get(j, "content")), ""));
    json_decref(j);

    static const struct {
        char *(*fn)(const oai_server *, const char *, size_t, oai_error *);
        const char *body, *param;
    } bad[] = {
        {cv_tokenize_json, "{\"content\":3}", "content"},
        {cv_tokenize_json, "{}", "content"},
        {cv_tokenize_json, "{\"content\":\"a\",\"with_pieces\":1}", "with_pieces"},
        {cv_tokenize_json, "[1]", ""},
        {cv_tokenize_json, "{\"content\":", ""},
        {cv_detokenize_json, "{\"tokens\":[1,512]}", "tokens"},
        {cv_detokenize_json, "{\"tokens\":[1,-1]}", "tokens"},
        {cv_detokenize_json, "{\"tokens\":\"1\"}", "tokens"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = answer(bad[i].fn, &srv, bad[i].body, &e);
        CHECKF(!j && e.status == 400 && !strcmp(e.param, bad[i].param) && e.message[0], "%s: %d '%s' %s",
               bad[i].body, e.status, e.param, e.message);
    }
}

static void test_props(void)
{
    cv_serve_chat chat;
    char err[256];
    CHECKF(cv_serve_chat_setup(model, NULL, &chat, err, sizeof err) == 0, "%s", err);
    const oai_server srv = {.model = model, .model_id = "tiny", .n_ctx = 1024, .chat = &chat};
    const cv_props p = {.n_slot = 4, .model_path = "m.gguf", .build_info = "convoy 0", .seed = -1};
    const convoy_node_costs nodes = {.n_nodes = 2, .node = {{.addr = "10.0.0.2:7000", .layers = 3},
                                                              {.addr = "10.0.0.3:7000", .layers = 2}}};
    char *s = cv_props_json(&srv, &p, &nodes);
    json_t *j = s ? json_loads(s, 0, NULL) : NULL;
    json_t *d = json_object_get(j, "default_generation_settings");
    CHECKF(json_integer_value(json_object_get(j, "total_slots")) == 4 &&
               json_integer_value(json_object_get(d, "n_ctx")) == 1024 &&
               json_integer_value(json_object_get(json_object_get(d, "params"), "seed")) == -1 &&
               !strcmp(json_string_value(json_object_get(j, "model_alias")), "tiny") &&
               json_is_string(json_object_get(j, "chat_template")) &&
               !strcmp(json_string_value(json_object_get(j, "chat_template_name")), "chatml (built in)") &&
               !strcmp(json_string_value(json_object_get(j, "bos_token")), "<s>") &&
               !strcmp(json_string_value(json_object_get(j, "eos_token")), "</s>") &&
               json_array_size(json_object_get(j, "nodes")) == 2 &&
               json_integer_value(json_object_get(json_array_get(json_object_get(j, "nodes"), 1), "layers")) == 2,
           "%s", s ? s : "NULL");
    json_decref(j);
    free(s);
    cv_serve_chat_free(&chat);
}

int main(void)
{
    cv_kernels_init(0);
    TEST_RUN(test_keys);
    TEST_RUN(test_origins_and_types);
    TEST_RUN(test_escape);
    if (!(model = test_load_stories()))
        return test_summary();
    TEST_RUN(test_tokenize);
    TEST_RUN(test_props);
    convoy_model_free(model);
    return test_summary();
}
