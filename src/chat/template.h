/* template.h: chat templates: a model's own Jinja tokenizer.chat_template
 * (chat/jinja.h describes the language) and an OpenAI chat request body
 * rendered through it. serve/ and the app's render-template command use it.
 *
 * Contract. cv_template_parse reads a template once (at start-up), refusing
 * one it cannot render with a message naming the construct and its line;
 * the parsed template is immutable and any threads may render it at once.
 *
 * cv_render_chat renders an OpenAI chat request body (JSON) into the
 * prompt the model is fed: *out (release with cv_free, core/alloc.h) holds
 * *out_len bytes and a NUL. The template's variables, as transformers and
 * vLLM pass them: messages (each as the request has it, except that its
 * content is a string: "" when null or absent, the texts of a list of
 * text parts joined by "\n"; and a tool call's function.arguments string
 * that holds a JSON object becomes that object); tools (the request's, or
 * none); add_generation_prompt (the request's, else true unless
 * no_generation_prompt); bos_token and eos_token; and every member of the
 * request's chat_template_kwargs object, over the others. A request that
 * is not such a body, content parts other than text, or a template that
 * raises (raise_exception) or fails make it return -1 with the reason
 * ("chat template line 29: Conversation roles must alternate
 * user/assistant/user/assistant/..."). */
#ifndef CONVOY_CHAT_TEMPLATE_H
#define CONVOY_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cv_template cv_template;

/* The memory that concurrent renders share (a server's): each render holds
 * its first MiB alone and takes the rest from the pool; one that finds the
 * pool spent fails, naming it. cv_template_pool_peak: the most it held
 * at once. Any thread may use a pool. */
typedef struct cv_template_pool cv_template_pool;
cv_template_pool *cv_template_pool_create(uint64_t bytes);
void cv_template_pool_free(cv_template_pool *p);
uint64_t cv_template_pool_peak(const cv_template_pool *p);

typedef struct cv_render_params {
    const char *bos_token, *eos_token; /* the model's texts of BOS and EOS; NULL: "" */
    int32_t year, month, day;          /* strftime_now's date; year 0: today, local time */
    bool no_generation_prompt;         /* add_generation_prompt false unless the request says */
    cv_template_pool *pool;            /* NULL: none (each render still has its own bounds) */
    bool (*stop)(void *user);          /* asked about every millisecond of work, when not NULL: */
    void *stop_user;                   /* true ends the render ("stopped"): its client left */
} cv_render_params;

cv_template *cv_template_parse(const char *text, size_t len, char *err, size_t errlen);
void cv_template_free(cv_template *t);
int cv_render_chat(const cv_template *t, const char *request, size_t len, const cv_render_params *p, char **out,
                   size_t *out_len, char *err, size_t errlen);

#endif
