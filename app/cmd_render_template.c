/* cmd_render_template.c: `convoy render-template`: prints, byte for byte
 * and with nothing added, the prompt a chat template makes of an OpenAI
 * chat request body (chat/template.h's cv_render_chat says how the request
 * becomes the template's variables), as the server would feed it to the
 * model; --requests renders a list of bodies in one run. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "args.h"
#include "chat/template.h"
#include "commands.h"
#include "core/alloc.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy render-template --template FILE (--request REQ.json | --requests LIST.json)\n"
               "                              [--bos TEXT] [--eos TEXT] [--date \"01 Dec 2026\"] [--no-generation-prompt]\n"
               "  --template FILE          a Jinja chat template (a model's tokenizer.chat_template)\n"
               "  --request REQ.json       an OpenAI chat request body (messages, tools, chat_template_kwargs); - "
               "reads stdin\n"
               "  --requests LIST.json     a JSON array of such bodies: prints a JSON array, for each\n"
               "                           {\"prompt\": TEXT} or {\"error\": WHY}\n"
               "  --bos, --eos TEXT        the model's BOS and EOS texts (default: empty)\n"
               "  --date DATE              strftime_now's date, \"01 Dec 2026\" or 2026-12-01 (default: today)\n"
               "  --no-generation-prompt   add_generation_prompt false unless the request says\n");
}

/* "01 Dec 2026" (day, English month name or its first three letters,
 * year) or "2026-12-01". */
static int parse_date(const char *s, cv_render_params *p)
{
    static const char *const months[] = {"january", "february", "march",     "april",   "may",      "june",
                                         "july",    "august",   "september", "october", "november", "december"};
    int d, y, m = 0, used = 0;
    char name[16];
    if (sscanf(s, "%d-%d-%d%n", &y, &m, &d, &used) == 3 && !s[used]) {
        p->year = y, p->month = m, p->day = d;
    } else if (sscanf(s, "%d %15s %d%n", &d, name, &y, &used) == 3 && !s[used]) {
        for (int k = 0; k < 12 && !m; k++)
            if ((strlen(name) == 3 && strncasecmp(name, months[k], 3) == 0) || strcasecmp(name, months[k]) == 0)
                m = k + 1;
        p->year = y, p->month = m, p->day = d;
    }
    if (m < 1 || m > 12 || p->day < 1 || p->day > 31 || p->year < 1 || p->year > 9999) {
        fprintf(stderr,
                "convoy render-template: --date expects a date such as \"01 Dec 2026\" or 2026-12-01, got '%s'\n", s);
        return -1;
    }
    return 0;
}

/* --requests: each body of the array rendered, the answers as one JSON array. */
static int render_each(const cv_template *t, const char *list, size_t len, const char *path,
                       const cv_render_params *p)
{
    json_error_t jerr;
    json_t *reqs = json_loadb(list, len, 0, &jerr), *answers = json_array(), *req;
    size_t i;
    char err[CONVOY_ERR_MAX];
    if (!json_is_array(reqs)) {
        fprintf(stderr, "convoy render-template: %s: not a JSON array of request bodies\n", path);
        json_decref(reqs);
        json_decref(answers);
        return 1;
    }
    json_array_foreach(reqs, i, req)
    {
        char *body = json_dumps(req, JSON_COMPACT | JSON_ENCODE_ANY), *out = NULL;
        size_t out_len;
        const int rc = body ? cv_render_chat(t, body, strlen(body), p, &out, &out_len, err, sizeof err) : -1;
        json_array_append_new(answers, rc == 0 ? json_pack("{s:s%}", "prompt", out, out_len)
                                               : json_pack("{s:s}", "error", body ? err : "out of memory"));
        cv_free(out);
        free(body);
    }
    const int rc = json_dumpf(answers, stdout, JSON_COMPACT) == 0 && fflush(stdout) == 0 ? 0 : 1;
    json_decref(reqs);
    json_decref(answers);
    return rc;
}

static int render(const char *tmpl_path, const char *req_path, bool many, const cv_render_params *p)
{
    size_t tlen, rlen, out_len;
    char *tmpl = arg_read_file("render-template", tmpl_path, &tlen);
    char *req = tmpl ? arg_read_file("render-template", req_path, &rlen) : NULL, *out = NULL;
    char err[CONVOY_ERR_MAX];
    int rc = 1;
    cv_template *t = req ? cv_template_parse(tmpl, tlen, err, sizeof err) : NULL;
    if (req && !t)
        fprintf(stderr, "convoy render-template: %s: %s\n", tmpl_path, err);
    else if (t && many)
        rc = render_each(t, req, rlen, req_path, p);
    else if (t && cv_render_chat(t, req, rlen, p, &out, &out_len, err, sizeof err) != 0)
        fprintf(stderr, "convoy render-template: %s: %s\n", req_path, err);
    else if (t)
        rc = fwrite(out, 1, out_len, stdout) == out_len && fflush(stdout) == 0 ? 0 : 1;
    cv_free(out);
    cv_template_free(t);
    free(req);
    free(tmpl);
    return rc;
}

int cmd_render_template(int argc, char **argv)
{
    const char *tmpl = NULL, *req = NULL, *reqs = NULL, *date = NULL;
    cv_render_params p = {0};
    const arg_opt opts[] = {
        {"template", 0, ARG_STR, .dst = &tmpl, .required = true},
        {"request", 0, ARG_STR, .dst = &req},
        {"requests", 0, ARG_STR, .dst = &reqs},
        {"bos", 0, ARG_STR, .dst = &p.bos_token},
        {"eos", 0, ARG_STR, .dst = &p.eos_token},
        {"date", 0, ARG_STR, .dst = &date},
        {"no-generation-prompt", 0, ARG_FLAG, .dst = &p.no_generation_prompt},
        {0},
    };
    const arg_cmd cmd = {.name = "render-template", .usage = usage, .opts = opts};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    if (!req == !reqs) {
        fprintf(stderr, "convoy render-template: give one of --request and --requests\n");
        usage(stderr);
        return 2;
    }
    if (date && parse_date(date, &p) != 0)
        return 2;
    return render(tmpl, req ? req : reqs, reqs != NULL, &p);
}
