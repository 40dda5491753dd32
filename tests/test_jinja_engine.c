/* test_jinja_engine.c: the Jinja engine (src/chat/jinja.h) and
 * cv_render_chat (src/chat/template.h) on their own.
 *
 * 1. Snippets: templates that touch every statement, filter, test, method,
 *    operator and whitespace rule chat templates use, each rendered with
 *    one context and compared with what Python's Jinja2 3.1 renders (as
 *    transformers sets it up; the expected texts were made by Jinja2).
 * 2. Parse refusals name the construct and its line; render failures name
 *    the line, and raise_exception's message comes through as it is.
 * 3. Hostile templates stop at each bound (output, memory, iterations,
 *    steps, depth, nesting) with a message naming it, and never crash.
 * 4. cv_render_chat turns a request body into the variables template.h
 *    documents, and refuses bodies it cannot render.
 * 5. One parsed template renders the same text from 8 threads at once.
 * tests/test_jinja.sh compares the real templates with @huggingface/jinja. */
#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

#include "chat/jinja.h"
#include "chat/template.h"
#include "core/alloc.h"
#include "core/err.h"
#include "test.h"

static const char CONTEXT[] = "{\"s\": \"h\303\251llo\", \"n\": null, \"l\": [3, 1, 2], \"d\": {\"a\": 1, \"b\": [1, \"x\"]}, \"t\": true, \"f\": 1.5, \"msgs\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}";
static const struct snippet {
    const char *name, *tmpl, *want;
} SNIPPETS[] = {
    {"printing",
     "{{ d }}{{ l }}{{ n }}{{ t }}{{ f }}{{ 1.0 }}{{ 1e-5 }}{{ 1.5e20 }}{{ 1e16 }}{{ 0.1 + 0.2 }}{{ (1, 'a') }}{{ (1,) }}",
     "{'a': 1, 'b': [1, 'x']}[3, 1, 2]NoneTrue1.51.01e-051.5e+201e+160.30000000000000004(1, 'a')(1,)"},
    {"repr quoting",
     "{{ ['a\"', \"b'\", 'c\\'\"', '\\n\\x01\303\251\\xa0\\u200b'] }}",
     "['a\"', \"b'\", 'c\\'\"', '\\n\\x01\303\251\\xa0\\u200b']"},
    {"loop scope",
     "{% set x = 0 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{% endfor %}{{ x }}",
     "0000"},
    {"undefined",
     "{{ d.c is defined }}[{{ d.c }}][{{ foo|length }}][{{ foo|trim }}][{{ foo|string }}][{% for x in foo %}x{% endfor %}]{{ foo is iterable }}{{ foo == foo }}{{ 'a' in foo }}",
     "False[][0][][][]TrueTrueFalse"},
    {"code points",
     "{{ s[1] }}{{ s[-1] }}{{ s[1:3] }}{{ s|length }}{{ s[::-1] }}{{ l[::2] }}{{ l[-2:] }}{{ 'h\303\251'|list }}",
     "\303\251o\303\251l5oll\303\251h[3, 2][1, 2]['h', '\303\251']"},
    {"arithmetic",
     "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2**-1 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ -3 ** 2 }} {{ 10 // -3 }} {{ 1 + true }}",
     "3 -4 3.5 2 1024 0.5 3.0 0.5 9 -4 2"},
    {"sequences",
     "{{ 'a' * 3 }}{{ [1] * 2 }}{{ 1 ~ 2 ~ none }}{{ [1,2] + [3] }}{{ (1, 2) + (3,) }}{{ 'x' ~ foo ~ 'y' }}",
     "aaa[1, 1]12None[1, 2, 3](1, 2, 3)xy"},
    {"membership",
     "{{ 'e' in s }}{{ 1 in l }}{{ 'a' in d }}{{ 'z' not in d }}{{ 1.0 in [1] }}{{ none in [none] }}{{ ['a'] in [['a']] }}",
     "FalseTrueTrueTrueTrueTrueTrue"},
    {"equality",
     "{{ true == 1 }}{{ 1 == 1.0 }}{{ [1,2] == [1,2] }}{{ d == {'b': [1, 'x'], 'a': 1} }}{{ (1,2) == [1,2] }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ [1, 2] < [1, 3] }}",
     "TrueTrueTrueTrueFalseTrueFalseTrue"},
    {"case",
     "{{ s|upper }}|{{ s.title() }}|{{ 'hello wORLD'|title }}|{{ 'aBc dEF'|capitalize }}|{{ \"they're bill's-friends (x)\"|title }}|{{ \"they're bill's\".title() }}|{{ '\303\200\303\211\303\216'|lower }}|{{ '\320\237\320\240\320\230\320\222\320\225\320\242'|lower }}",
     "H\303\211LLO|H\303\251llo|Hello World|Abc def|They're Bill's-Friends (X)|They'Re Bill'S|\303\240\303\251\303\256|\320\277\321\200\320\270\320\262\320\265\321\202"},
    {"split",
     "{{ ' a b '.split() }}{{ 'a,b,,c'.split(',') }}{{ 'a,b,c'.split(',', 1) }}{{ 'a b c'.rsplit(' ', 1) }}{{ '  a b c  '.split(None, 1) }}{{ '  a b c  '.rsplit(None, 1) }}",
     "['a', 'b']['a', 'b', '', 'c']['a', 'b,c']['a b', 'c']['a', 'b c  ']['  a b', 'c']"},
    {"str methods",
     "{{ 'xxhixx'.strip('x') }}{{ 'hello'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.count('l') }}{{ 'a\\nb\\r\\nc'.splitlines() }}{{ 'ab'.startswith(('x', 'a')) }}{{ 'ab'.endswith('b') }}{{ '-'.join(['1', '2']) }}{{ 'abc'.replace('', '-') }}{{ 'aaa'.replace('a', 'b', 2) }}",
     "hi232['a', 'b', 'c']TrueTrue1-2-a-b-c-bba"},
    {"format",
     "{{ '%s-%d'|format('a', 3) }}|{{ '{} {}'.format(1, 2) }}|{{ '%5.2f|%-4s|%04d' % (3.14159, 'ab', 7) }}|{{ '%(n)s!' % {'n': 5} }}|{{ '%x %o %e %g' % (255, 8, 12345.678, 0.0001) }}|{{ '{0}-{1}-{0}'.format('a', 'b') }}|{{ '{name}{{}}'.format(name='n') }}",
     "a-3|1 2| 3.14|ab  |0007|5!|ff 10 1.234568e+04 0.0001|a-b-a|n{}"},
    {"list filters",
     "{{ l|sort }}{{ l|reverse|list }}{{ l|sum }}{{ l|max }}{{ l|min }}{{ l|first }}{{ l|last }}{{ l|join('-') }}{{ ['b', 'A', 'c']|sort }}{{ ['b', 'A', 'c']|sort(case_sensitive=true) }}{{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }}",
     "[1, 2, 3][2, 1, 3]631323-1-2['A', 'b', 'c']['A', 'b', 'c'][{'n': 1}, {'n': 2}]"},
    {"dict filters",
     "{{ d|dictsort }}{{ d.items()|list }}{{ d.keys()|list }}{{ d.values()|list }}{{ d|list }}{{ d|items|list }}{{ {'b': 2, 'a': 1}|dictsort(by='value', reverse=true) }}{{ d.get('z', 5) }}{{ d.get('a') }}",
     "[('a', 1), ('b', [1, 'x'])][('a', 1), ('b', [1, 'x'])]['a', 'b'][1, [1, 'x']]['a', 'b'][('a', 1), ('b', [1, 'x'])][('b', 2), ('a', 1)]51"},
    {"numbers",
     "{{ 3.14159|round(2) }} {{ 3.5|round }} {{ 2.5|round }} {{ 2.675|round(2) }} {{ -3|abs }} {{ 3|float }} {{ '3.5'|float }} {{ '42'|int }} {{ 'x'|int }} {{ 3.9|int }} {{ 5|round }} {{ '1e3'|int }} {{ 3.7|round(0, 'floor') }}",
     "3.14 4.0 2.0 2.67 3 3.0 3.5 42 0 3 5 1000 3.0"},
    {"text filters",
     "{{ 'abc'|center(9) }}|{{ 'abc'|center(8) }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a b  c'|wordcount }}|{{ 'x\\n\\ny'|indent(blank=true) }}|{{ '<a>&\"\\''|e }}|{{ '  x  '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ 'abc'|replace('b', 'X') }}",
     "   abc   |  abc   |a\n  b\n\n  c|  a\n  b|3|x\n    \n    y|&lt;a&gt;&amp;&#34;&#39;|x|a|aXc"},
    {"batch unique",
     "{{ [1,2,3,4,5]|batch(2)|list }}{{ [1,2,3]|batch(2, 'x')|list }}{{ [1,1,2]|unique|list }}{{ ['a','A','b']|unique|list }}",
     "[[1, 2], [3, 4], [5]][[1, 2], [3, 'x']][1, 2]['a', 'b']"},
    {"select map",
     "{{ l|select('odd')|list }}{{ l|reject('odd')|list }}{{ l|map('string')|list }}{{ ['a','b']|map('upper')|list }}{{ msgs|map(attribute='role')|list }}{{ msgs|selectattr('role', 'equalto', 'user')|list }}{{ msgs|rejectattr('role', '==', 'user')|map(attribute='content')|join(',') }}{{ n|select|list }}{{ ['a', none, '', 0, 1]|select|list }}",
     "[3, 1][2]['3', '1', '2']['A', 'B']['user', 'assistant'][{'role': 'user', 'content': 'hi'}]yo[]['a', 1]"},
    {"tojson",
     "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ l|tojson(separators=(',', ':')) }}|{{ '\303\251\\n\"\\t'|tojson }}|{{ {'b':1,'a':2}|tojson(sort_keys=true) }}|{{ []|tojson(indent=2) }}|{{ 1.0|tojson }}|{{ [1.5, none, true]|tojson }}|{{ '\303\251\360\237\230\200'|tojson(ensure_ascii=true) }}",
     "{\"a\": 1, \"b\": [1, \"x\"]}|{\n  \"a\": 1,\n  \"b\": [\n    1,\n    \"x\"\n  ]\n}|[3,1,2]|\"\303\251\\n\\\"\\t\"|{\"a\": 2, \"b\": 1}|[]|1.0|[1.5, null, true]|\"\\u00e9\\ud83d\\ude00\""},
    {"from_json",
     "{{ '{\"a\": [1, 2.5, \"x\"], \"b\": null}'|from_json }}",
     "{'a': [1, 2.5, 'x'], 'b': None}"},
    {"tests",
     "{{ n is none }}{{ foo is none }}{{ foo is defined }}{{ d is mapping }}{{ l is sequence }}{{ s is iterable }}{{ 3 is number }}{{ t is number }}{{ 3 is integer }}{{ 3.0 is float }}{{ t is boolean }}{{ 4 is even }}{{ 4 is divisibleby 2 }}{{ 4 is divisibleby(3) }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ l is sameas l }}{{ 1 is in [1] }}{{ foo is undefined }}{{ t is true }}{{ n is not string }}",
     "TrueFalseFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTrue"},
    {"ternary logic",
     "{{ 'a' if false }}|{{ x if x is defined else 'y' }}|{{ 1 if t else 2 }}|{{ none or 'd' }}|{{ 0 and 1 }}|{{ [] or {} }}|{{ 'a' and 'b' }}|{{ not 1 == 2 }}",
     "|y|1|d|0|{}|b|True"},
    {"for loops",
     "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for x in l if x > 1 %}{{ loop.index }}/{{ loop.length }}{{ x }}{{ loop.first }}{{ loop.last }}{{ loop.revindex }} {% else %}none{% endfor %}{% for x in [] %}a{% else %}empty{% endfor %}",
     "a=1;b=[1, 'x'];1/23TrueFalse2 2/22FalseTrue1 empty"},
    {"loop vars",
     "{% for m in msgs %}{{ loop.previtem.role if loop.previtem is defined }}>{{ loop.nextitem.content if loop.nextitem }}{{ loop.cycle('a','b') }}{{ loop.index0 }}{{ loop.revindex0 }}{{ loop.depth }};{% endfor %}{% for x in l %}{% for y in l %}{{ loop.index }}{% endfor %}{{ loop.index }}{% endfor %}",
     ">yoa011;user>b101;123112321233"},
    {"loop control",
     "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}{{ range(5, 0, -2)|list }}",
     "0134[5, 3, 1]"},
    {"namespace",
     "{% set ns = namespace(x=0, y=[]) %}{% for i in range(4) %}{% set ns.x = ns.x + i %}{% set ns.y = ns.y + [i] %}{% endfor %}{{ ns.x }}{{ ns.y }}{{ ns }}{{ namespace({'b': 2}).b }}{{ dict(a=1) }}",
     "6[0, 1, 2, 3]<Namespace {'x': 6, 'y': [0, 1, 2, 3]}>2{'a': 1}"},
    {"macros",
     "{% macro m(a, b=2) %}[{{ a }},{{ b }}]{% endmacro %}{{ m(1) }}{{ m(1, 3) }}{{ m(b=5, a=0) }}{% macro v(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ v(1, 2, 3, x=4) }}{{ m }}",
     "[1,2][1,3][0,5]1(2, 3){'x': 4}<Macro 'm'>"},
    {"call blocks",
     "{% macro m(a) %}<{{ caller(a) }}>{% endmacro %}{% call(x) m(5) %}got {{ x }}{% endcall %}{% macro c() %}{{ caller() if caller is defined else 'none' }}{% endmacro %}{{ c() }}",
     "<got 5>none"},
    {"blocks",
     "{% filter upper %}hello {{ s }}{% endfilter %}{% set x %}inner {{ 1 + 1 }}{% endset %}[{{ x }}]{% filter indent(2, true) %}a\nb{% endfilter %}",
     "HELLO H\303\211LLO[inner 2]  a\n  b"},
    {"list methods",
     "{{ l.append(4) }}{{ l }}{{ l.pop() }}{{ l.pop(0) }}{{ l }}{{ l.index(2) }}{{ l.count(1) }}{{ l.insert(0, 9) }}{{ l }}{{ l.extend([7]) }}{{ l }}",
     "None[3, 1, 2, 4]43[1, 2]11None[9, 1, 2]None[9, 1, 2, 7]"},
    {"unpacking",
     "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, e = [3, 4] %}{{ c + e }}{% for a, b in [(1, 2), (3, 4)] %}{{ a * b }}{% endfor %}",
     "127212"},
    {"literals",
     "{{ 1_000 + 0x10 + 0b11 + 0o7 }} {{ 1.5e3 }} {{ 'a' 'b' \"c\" }} {{ '\\x41\\u00e9\\U0001F600\\101\\q' }} {{ l.0 }}{{ {'a': {'b': 1}} }}",
     "1026 1500.0 abc A\303\251\360\237\230\200A\\q 3{'a': {'b': 1}}"},
    {"strftime",
     "{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d') }}|{{ strftime_now('%B %d, %Y') }}|{{ strftime_now('%A %-d %j %H:%M') }}",
     "01 Dec 2026|2026-12-01|December 01, 2026|Tuesday 1 335 00:00"},
    {"whitespace",
     "  {% if true %}\n  yes\n  {% endif %}\n  {{ 'x' }}\n{# comment #}\nafter\na  {%- if true -%}  b  {%- endif -%}  c\n{{- ' d ' -}}\ne {# c -#}\n  f\n  {%+ if true %}g{% endif +%}\nh",
     "  yes\n  x\nafter\nabc d e f\n  g\nh"},
    {"raw",
     "a\n  {% raw -%}\n  {{ y }} {% if %}\n  {%- endraw %}\nb  {% raw %}\n  keep\n  {% endraw %}\nend",
     "a\n{{ y }} {% if %}b  \n  keep\nend"},
    {"newlines",
     "a\r\nb\rc\n",
     "a\nb\nc"},
};

static const cv_jinja_env ENV = {.year = 2026, .month = 12, .day = 1};

/* Renders src with the context; returns the text (free it) or NULL with err. */
static char *render_with(const char *src, const char *context_json, const cv_jinja_env *env, char *err, size_t errlen)
{
    cv_jinja *t;
    if (cv_jinja_parse(src, strlen(src), &t, err, errlen) != 0)
        return NULL;
    json_t *ctx = json_loads(context_json, 0, NULL);
    char *out = NULL;
    size_t len;
    if (!ctx)
        snprintf(err, errlen, "bad test context");
    else if (cv_jinja_render(t, ctx, env, &out, &len, err, errlen) != 0)
        out = NULL;
    else if (strlen(out) != len)
        snprintf(err, errlen, "length %zu but the text has a NUL before it", len);
    json_decref(ctx);
    cv_jinja_free(t);
    return out;
}

static void test_snippets(void)
{
    for (size_t i = 0; i < sizeof SNIPPETS / sizeof SNIPPETS[0]; i++) {
        char err[CV_ERRLEN] = "";
        char *out = render_with(SNIPPETS[i].tmpl, CONTEXT, &ENV, err, sizeof err);
        CHECKF(out && !strcmp(out, SNIPPETS[i].want), "%s: got %s%s%s, want \"%s\"", SNIPPETS[i].name,
               out ? "\"" : "error: ", out ? out : err, out ? "\"" : "", SNIPPETS[i].want);
        free(out);
    }
}

/* Renders (with the snippet context) and checks the failure message. */
static void expect_failure(const char *src, const cv_jinja_env *env, const char *want)
{
    char err[CV_ERRLEN] = "";
    char *out = render_with(src, CONTEXT, env, err, sizeof err);
    CHECKF(!out && strstr(err, want), "%.60s: want a failure with \"%s\", got %s", src, want, out ? out : err);
    free(out);
}

static void test_parse_refusals(void)
{
    static const struct {
        const char *src, *want;
    } cases[] = {
        {"a\n{{ x|wordwrap(3) }}", "line 2: unknown filter 'wordwrap'"},
        {"{% if x is prime %}{% endif %}", "line 1: unknown test 'prime'"},
        {"\n\n{% include 'other.jinja' %}", "line 3: the tag 'include' is not supported"},
        {"{% extends 'base' %}", "the tag 'extends' is not supported"},
        {"{% for x in y %}\n{{ x }}", "the 'for' tag of line 1 is not closed (expected 'endfor')"},
        {"{% endif %}", "unexpected tag 'endif'"},
        {"{% break %}", "'break' outside a for loop"},
        {"{% for x in y recursive %}{% endfor %}", "recursive for loops are not supported"},
        {"{{ f(*args) }}", "*args in a call is not supported"},
        {"{{ f(**kw) }}", "**kwargs in a call is not supported"},
        {"{{ x", "a {{ without its }}"},
        {"{# open", "missing the end of a comment"},
        {"{{ 'abc }}", "a string literal without its closing quote"},
        {"{{ (1 }}", "unexpected '}'"},
        {"{{ f(1 2) }}", "expected ',' or ')', found an integer"},
        {"{{ 1 ] }}", "unexpected ']'"},
        {"{{ 99999999999999999999 }}", "an integer literal larger than 64 bits"},
        {"{% set 1 = 2 %}", "cannot assign"},
        {"{% macro m(a=1, b) %}{% endmacro %}", "a parameter without a default after one with a default"},
        {"{{ x|a.b }}", "dotted filter and test names are not supported"},
        {"{% raw %}no end", "a {% raw %} without its {% endraw %}"},
        {"{{ \"\\x4\" }}", "a truncated \\x, \\u or \\U escape"},
        {"{{ }}", "expected an expression"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cv_jinja *t = NULL;
        char err[CV_ERRLEN] = "";
        int rc = cv_jinja_parse(cases[i].src, strlen(cases[i].src), &t, err, sizeof err);
        CHECKF(rc != 0 && !t && strstr(err, cases[i].want), "%s: want \"%s\", got %s", cases[i].src, cases[i].want,
               rc ? err : "success");
        cv_jinja_free(t);
    }
}

static void test_render_failures(void)
{
    expect_failure("x\n{{ raise_exception('Conversation roles must alternate user/assistant') }}",
                   &ENV, "line 2: Conversation roles must alternate user/assistant");
    expect_failure("{{ foo.bar }}", &ENV, "line 1: 'foo' is undefined");
    expect_failure("{{ d.c.e }}", &ENV, "'dict object' has no attribute 'c'");
    expect_failure("{{ foo + 'a' }}", &ENV, "'foo' is undefined");
    expect_failure("{{ foo|tojson }}", &ENV, "not JSON serializable");
    expect_failure("{{ 'a' + 1 }}", &ENV, "can only concatenate str (not \"int\") to str");
    expect_failure("{{ 1 < 'a' }}", &ENV, "'<' not supported between instances of 'int' and 'str'");
    expect_failure("{{ 1 in 'abc' }}", &ENV, "'in <string>' requires string as left operand");
    expect_failure("{{ 1 // 0 }}", &ENV, "integer division or modulo by zero");
    expect_failure("{{ 9223372036854775807 + 1 }}", &ENV, "integer overflow");
    expect_failure("{% for x in n %}{% endfor %}", &ENV, "'NoneType' object is not iterable");
    expect_failure("{{ s() }}", &ENV, "'str' object is not callable");
    expect_failure("{{ s.nomethod() }}", &ENV, "'str object' has no attribute 'nomethod'");
    expect_failure("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", &ENV, "macro 'm' takes not more than 1 argument(s)");
    expect_failure("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", &ENV, "macro 'm' takes no keyword argument 'b'");
    expect_failure("{{ l|join(1) }}", &ENV, "d must be a string");
    expect_failure("{{ range(200000)|length }}", &ENV, "Range too big");
    expect_failure("{% set x.y = 1 %}", &ENV, "cannot assign attribute on non-namespace object");
    expect_failure("{% set a, b = [1] %}", &ENV, "not enough values to unpack (expected 2, got 1)");
    expect_failure("{{ [].pop() }}", &ENV, "pop from empty list");
    expect_failure("{{ (1, 2).append(3) }}", &ENV, "'tuple object' has no attribute 'append'");
    expect_failure("{{ 'x'|from_json }}", &ENV, "not JSON");
}

static bool stop_now(void *user)
{
    (*(int *)user)++;
    return true;
}

/* Work that was not counted: comparisons in sort, == on values that share
 * their parts (10^12 pairs once), the pool renders share, and a render
 * whose caller stops it. */
static void test_budgets(void)
{
    cv_jinja_limits lim = {.max_steps = 1000000};
    cv_jinja_env env = {.year = 2026, .month = 12, .day = 1, .limits = &lim};
    expect_failure("{% set ns = namespace(l=[]) %}{% set big = 'a' * 100000 %}{% for i in range(300) %}"
                   "{% set _ = ns.l.append(big) %}{% endfor %}{{ ns.l | sort | length }}",
                   &env, "more than 1000000 steps");
    expect_failure("{% set ns = namespace(a=['x'], b=['x']) %}{% for i in range(6) %}{% set ns.a = [ns.a] * 100 %}"
                   "{% set ns.b = [ns.b] * 100 %}{% endfor %}{{ ns.a == ns.b }}",
                   &env, "more than 1000000 steps");
    expect_failure("{% set ns = namespace(a=['x'], b=['x']) %}{% for i in range(6) %}{% set ns.a = [ns.a] * 100 %}"
                   "{% set ns.b = [ns.b] * 100 %}{% endfor %}{{ ns.a in [ns.b] }}",
                   &env, "more than 1000000 steps");
    cv_budget pool;
    cv_budget_init(&pool, 4u << 20);
    env = (cv_jinja_env){.year = 2026, .month = 12, .day = 1, .pool = &pool};
    expect_failure("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{{ ns.l.append('x' * 100) }}"
                   "{% set ns.l = ns.l + ns.l[-2:] %}{% endfor %}",
                   &env, "the memory that chat templates share (4 MiB for all requests at once) is spent");
    CHECKF(atomic_load(&pool.used) == 0, "the pool holds %llu bytes after the render",
           (unsigned long long)atomic_load(&pool.used));
    cv_budget_init(&pool, 0); /* a spent pool: a small render needs only its own bytes */
    char err[CV_ERRLEN] = "";
    char *out = render_with("{% for m in messages %}{{ m.content }}{% endfor %}{{ 'x' * 1000 }}", CONTEXT, &env, err,
                            sizeof err);
    CHECKF(out != NULL, "a small render with the pool spent: %s", err);
    free(out);
    int asked = 0;
    env = (cv_jinja_env){.year = 2026, .month = 12, .day = 1, .stop = stop_now, .stop_user = &asked};
    expect_failure("{% for i in range(100000) %}{{ i }}{% endfor %}", &env, "stopped");
    CHECK(asked == 1);
}

/* Each bound stops a template that would exceed it, naming it. */
static void test_limits(void)
{
    cv_jinja_limits lim = {.max_output = 1000, .max_memory = 1 << 20, .max_steps = 100000, .max_iterations = 5000,
                           .max_depth = 50};
    cv_jinja_env env = {.year = 2026, .month = 12, .day = 1, .limits = &lim};
    expect_failure("{% for i in range(100) %}{{ 'x' * 50 }}{% endfor %}", &env, "would exceed 1000 bytes");
    expect_failure("{{ 'x' * 100000 }}", &env, "a repetition larger than 1000 bytes");
    /* captures alive at once (each under the bound) count together */
    expect_failure("{% macro f(n) %}{{ 'x' * 900 }}{% if n < 5 %}{% set _ = f(n + 1) %}{% endif %}{% endmacro %}"
                   "{% set _ = f(0) %}done",
                   &env, "would exceed 1000 bytes");
    expect_failure("{% set ns = namespace(l=[]) %}{% for i in range(4000) %}{% set ns.l = ns.l + ns.l + [i] %}"
                   "{% endfor %}",
                   &env, "more than");
    expect_failure("{% for i in range(100) %}{% for j in range(100) %}{% endfor %}{% endfor %}", &env,
                   "more than 5000 loop iterations");
    expect_failure("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", &env, "more than 50 deep");
    expect_failure("{% set ns = namespace(l=[1]) %}{% for x in ns.l %}{% endfor %}{% for i in range(4000) %}"
                   "{{ ns.l.append(i) }}{% for y in ns.l %}{% endfor %}{% endfor %}",
                   &env, "more than");
    cv_jinja_limits mem = {.max_memory = 1 << 20};
    cv_jinja_env env_mem = {.year = 2026, .month = 12, .day = 1, .limits = &mem};
    expect_failure("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{{ ns.l.append('x' * 100) }}"
                   "{% set ns.l = ns.l + ns.l[-2:] %}{% endfor %}",
                   &env_mem, "bytes of memory");
    /* nesting: at parse time, however the template nests */
    char deep[4000];
    size_t o = 0;
    o += (size_t)snprintf(deep + o, sizeof deep - o, "{{ ");
    for (int i = 0; i < 150; i++)
        deep[o++] = '(';
    deep[o++] = '1';
    for (int i = 0; i < 150; i++)
        deep[o++] = ')';
    o += (size_t)snprintf(deep + o, sizeof deep - o, " }}");
    cv_jinja *t = NULL;
    char err[CV_ERRLEN] = "";
    CHECK(cv_jinja_parse(deep, o, &t, err, sizeof err) != 0 && strstr(err, "more than 200 deep"));
    size_t n = 3 + 2 * 100000;
    char *chain = malloc(n + 3);
    memcpy(chain, "{{ ", 3);
    for (size_t i = 0; i < 100000; i++)
        memcpy(chain + 3 + 2 * i, i ? "+1" : " 1", 2);
    memcpy(chain + n, "}}", 3);
    CHECKF(cv_jinja_parse(chain, n + 2, &t, err, sizeof err) != 0 && strstr(err, "more than 200 deep"), "%s", err);
    free(chain);
}

/* cv_render_chat's variables, through a template that prints them. */
static void test_render_chat(void)
{
    static const char tmpl[] =
        "{% for m in messages %}[{{ m.role }}|{{ m.content }}|{% if m.tool_calls is defined %}"
        "{{ m.tool_calls[0].function.arguments is mapping }}{{ m.tool_calls[0].function.arguments }}{% endif %}]"
        "{% endfor %}{{ tools is none }}{{ add_generation_prompt }}{{ bos_token }}{{ eos_token }}{{ extra }}"
        "{{ strftime_now('%Y-%m-%d') }}";
    char err[CV_ERRLEN] = "";
    cv_template *t = cv_template_parse(tmpl, strlen(tmpl), err, sizeof err);
    CHECKF(t != NULL, "%s", err);
    if (!t)
        return;
    cv_render_params p = {.bos_token = "<s>", .eos_token = "</s>", .year = 2026, .month = 12, .day = 1};
    static const char req[] =
        "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
        "{\"type\": \"text\", \"text\": \"b\"}]}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": "
        "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}}]}],"
        " \"chat_template_kwargs\": {\"extra\": \"E\"}}";
    char *out = NULL;
    size_t len = 0;
    CHECKF(cv_render_chat(t, req, strlen(req), &p, &out, &len, err, sizeof err) == 0, "%s", err);
    const char *want = "[user|a\nb|][assistant||True{'x': 1}]TrueTrue<s></s>E2026-12-01";
    CHECKF(out && !strcmp(out, want) && len == strlen(want), "got \"%s\", want \"%s\"", out ? out : "", want);
    cv_free(out);
    p.no_generation_prompt = true;
    static const char req2[] = "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], \"tools\": []}";
    CHECKF(cv_render_chat(t, req2, strlen(req2), &p, &out, &len, err, sizeof err) == 0, "%s", err);
    CHECKF(out && !strcmp(out, "[user|q|]FalseFalse<s></s>2026-12-01"), "got \"%s\"", out ? out : "");
    cv_free(out);
    static const struct {
        const char *req, *want;
    } bad[] = {
        {"not json", "not a JSON object"},
        {"{}", "non-empty messages array"},
        {"{\"messages\": [{\"content\": \"x\"}]}", "messages[0] needs a role"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {}}]}]}",
         "messages[0].content[0] is not a text part"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages[0].content must be"},
        {"{\"messages\": [{\"role\": \"user\"}], \"chat_template_kwargs\": 1}", "chat_template_kwargs must be an object"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = cv_render_chat(t, bad[i].req, strlen(bad[i].req), &p, &out, &len, err, sizeof err);
        CHECKF(rc != 0 && !out && strstr(err, bad[i].want), "%s: want \"%s\", got %s", bad[i].req, bad[i].want,
               rc ? err : "success");
    }
    cv_template_free(t);
    const char *raises = "{{ raise_exception('no ' + messages[0].role) }}";
    t = cv_template_parse(raises, strlen(raises), err, sizeof err);
    CHECK(t && cv_render_chat(t, req2, strlen(req2), &p, &out, &len, err, sizeof err) != 0 &&
          !strcmp(err, "chat template line 1: no user"));
    cv_template_free(t);
    CHECK(!cv_template_parse("{{ x|nope }}", 12, err, sizeof err) && strstr(err, "chat template line 1: unknown filter 'nope'"));
}

typedef struct job {
    const cv_jinja *t;
    json_t *ctx;
    char *out;
} job;

static void *render_job(void *arg)
{
    job *j = arg;
    char err[CV_ERRLEN];
    size_t len;
    for (int k = 0; k < 20; k++) {
        char *out = NULL;
        if (cv_jinja_render(j->t, j->ctx, &ENV, &out, &len, err, sizeof err) != 0)
            return NULL;
        free(j->out);
        j->out = out;
    }
    return NULL;
}

static void test_threads(void)
{
    const char *src = SNIPPETS[0].tmpl;
    cv_jinja *t;
    char err[CV_ERRLEN];
    CHECK(cv_jinja_parse(src, strlen(src), &t, err, sizeof err) == 0);
    json_t *ctx = json_loads(CONTEXT, 0, NULL);
    job jobs[8];
    pthread_t th[8];
    for (int i = 0; i < 8; i++) {
        jobs[i] = (job){t, ctx, NULL};
        CHECK(pthread_create(&th[i], NULL, render_job, &jobs[i]) == 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].out && !strcmp(jobs[i].out, SNIPPETS[0].want));
        free(jobs[i].out);
    }
    json_decref(ctx);
    cv_jinja_free(t);
}

int main(void)
{
    TEST_RUN(test_snippets);
    TEST_RUN(test_parse_refusals);
    TEST_RUN(test_render_failures);
    TEST_RUN(test_limits);
    TEST_RUN(test_budgets);
    TEST_RUN(test_render_chat);
    TEST_RUN(test_threads);
    return test_summary();
}
