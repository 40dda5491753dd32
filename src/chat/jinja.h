/* jinja.h: a Jinja engine for chat templates (a model's own
 * tokenizer.chat_template, rendered as is).
 *
 * Contract. cv_jinja_parse reads a template once (at start-up) into an
 * immutable cv_jinja that any number of threads may render at once.
 * cv_jinja_render renders it for one context, a JSON object whose members
 * are the template's variables, into a new NUL-terminated text (release it
 * with cv_free). Both return 0, or -1 with a message in err.
 *
 * The language is Jinja2's as Hugging Face transformers configures it for
 * chat templates: trim_blocks and lstrip_blocks on, a single trailing
 * newline of the template dropped, \r\n and \r read as \n, autoescape off,
 * the loopcontrols extension (break, continue), raise_exception(msg) (the
 * render fails with msg) and strftime_now(fmt) (the date the caller gives,
 * at 00:00:00), and tojson as transformers defines it (ensure_ascii false,
 * indent, separators, sort_keys). Lists may be changed (append, pop), as in
 * Jinja2's plain sandbox. Semantics follow Python's Jinja2 3.1: printing
 * uses Python's str() (None, True, 1.0, ['a'] and {'k': 1} print as Python
 * prints them), and Undefined is Jinja's default one: it prints as nothing,
 * iterates as empty, is false, has length 0, and fails where Jinja fails
 * (an attribute or item of it, arithmetic with it, tojson of it).
 *
 *   tags        {{ }} {% %} {# #}, whitespace control with - and + on either side,
 *               {% raw %}, transformers' {% generation %} (renders its body)
 *   statements  if/elif/else, for (else, `if` filter, tuple targets, loop.index,
 *               index0, revindex, revindex0, first, last, length, previtem, nextitem,
 *               depth, depth0, cycle()), break, continue, set (names, tuples,
 *               namespace attributes, block set), macro (defaults, varargs, kwargs),
 *               call (with caller arguments), filter
 *   expressions literals (strings, integers, floats, lists, tuples, dicts, true/false/
 *               none), + - * / // % ** ~, comparisons (chained), in, not in, and/or/not,
 *               a if c else b, attribute, item and slice access, calls, filters, tests
 *   filters     abs attr batch capitalize center count d default dictsort e escape
 *               first float format from_json indent int items join last length list
 *               lower map max min reject rejectattr replace reverse round safe select
 *               selectattr sort string sum title tojson trim unique upper wordcount
 *   tests       boolean callable defined divisibleby eq equalto escaped even false
 *               float ge greaterthan gt in integer iterable le lessthan lower lt
 *               mapping ne none number odd sameas sequence string true undefined
 *               upper, and == != < <= > >= by name in select and selectattr
 *   globals     range (at most 100000 items, as Jinja's sandbox), namespace, dict,
 *               raise_exception, strftime_now
 *   methods     str: capitalize count endswith find format isalnum isalpha isdigit
 *               islower isspace isupper join lower lstrip replace rfind rsplit rstrip
 *               split splitlines startswith strip title upper;
 *               list: append count extend index insert pop; dict: get items keys values
 *
 * from_json (not a Jinja2 filter; llama.cpp's templates of DeepSeek V3.2
 * and V4 call it) parses a JSON text into values.
 *
 * Two Python artefacts are left out, as llama.cpp's and Hugging Face's
 * JavaScript engines leave them out: filters that give generators in
 * Python (map, select, reject, selectattr, rejectattr, reverse, batch,
 * items) give lists, so tojson accepts their result; and safe, e and
 * escape give plain strings, not Markup, so a string added to a "safe" one
 * is not HTML-escaped (functionary's template adds tojson's text to safe
 * strings: Jinja2 escapes its quotes as &#34;, convoy does not).
 *
 * Anything else is refused by cv_jinja_parse with a message that names the
 * construct and its line ("line 12: unknown filter 'wordwrap'", "line 3:
 * the tag 'include' is not supported"): an unknown tag, filter or test
 * (Jinja2 3.1 fails only if it is reached; convoy knows at start-up), a
 * recursive loop, *args or **kwargs in a call. A method that does not
 * exist is undefined (as in Jinja), so calling it fails when rendering,
 * naming it.
 *
 * Strings are UTF-8 and index, slice and count by code point as Python
 * does. Case mappings (upper, lower, title, capitalize) cover the one-to-one
 * mappings of Latin, Greek, Cyrillic, Armenian and fullwidth letters;
 * Python's special cases (ß to SS, a final sigma) are not made. Integers
 * are 64-bit: an operation whose result does not fit fails.
 *
 * Hostile templates (a GGUF's is untrusted): parsing bounds the template's
 * size (1 MiB) and the nesting of its blocks and expressions; rendering
 * bounds the output, the memory of the values it makes, the nesting of calls and
 * blocks, the loop iterations and the evaluation steps (a template that
 * does not end fails; comparisons count their work, so sorting and == are
 * steps too), and a pool shared with other renders bounds their memory
 * together (cv_jinja_env). Exceeding any bound fails with a message naming it;
 * no input makes either function crash, hang or write out of bounds. */
#ifndef CONVOY_CHAT_JINJA_H
#define CONVOY_CHAT_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/budget.h"

struct json_t; /* jansson's: the context */

typedef struct cv_jinja cv_jinja;

/* The bounds of one render; a zero field takes its default. */
typedef struct cv_jinja_limits {
    size_t max_output;       /* bytes of the rendered text; default 16 MiB */
    size_t max_memory;       /* bytes of values and scopes; default 256 MiB */
    uint64_t max_steps;      /* expressions and statements evaluated; default 50 million */
    uint64_t max_iterations; /* loop iterations, all loops together; default 1 million */
    int max_depth;           /* nested blocks, expressions and macro calls; default 400 */
} cv_jinja_limits;

/* The caller's side of a render. */
typedef struct cv_jinja_env {
    int year, month, day;          /* strftime_now's date (month 1..12) */
    const cv_jinja_limits *limits; /* NULL: the defaults */
    /* The memory that concurrent renders share, or NULL: every byte a render
     * holds (values, scopes, text) beyond its first CV_JINJA_OWN_BYTES is
     * taken from it, and a render that finds it spent fails, naming it. */
    cv_budget *pool;
    /* Asked every CV_JINJA_STOP_STEPS steps when not NULL: true ends the
     * render with "stopped" (its client left). */
    bool (*stop)(void *user);
    void *stop_user;
} cv_jinja_env;

/* What a render holds without asking the pool: an honest chat needs less,
 * so hostile renders that spend the pool never refuse it. */
#define CV_JINJA_OWN_BYTES ((size_t)1 << 20)
#define CV_JINJA_STOP_STEPS 65536 /* about a millisecond of work */

/* Parses len bytes (a template is at most 1 MiB and nests at most 200
 * blocks or expressions deep). */
int cv_jinja_parse(const char *src, size_t len, cv_jinja **out, char *err, size_t errlen);
void cv_jinja_free(cv_jinja *t);

/* Renders t with the members of the JSON object context as variables
 * (JSON null is none, integers are int, reals float, objects dicts in their
 * order). The caller keeps context alive during the call. On success *out
 * holds the text (NUL-terminated, *len bytes without the NUL). A failure
 * names the template line: "line 29: Conversation roles must alternate
 * user/assistant/user/assistant/..." for raise_exception. */
int cv_jinja_render(const cv_jinja *t, const struct json_t *context, const cv_jinja_env *env, char **out,
                    size_t *len, char *err, size_t errlen);

#endif
