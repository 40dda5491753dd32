/* cmd_tokenize.c: `convoy tokenize`: prints the ids of a text as a JSON
 * list, BOS added as the model's vocabulary says unless --no-bos. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy tokenize -m MODEL -p TEXT [--no-bos] [--parse-special]\n");
}

/* Tokenizes twice: once to learn the count, once into an array that fits. */
static int print_ids(const convoy_model *model, const char *text, bool add_special, bool parse_special)
{
    const size_t len = strlen(text);
    int n = convoy_tokenize(model, text, len, add_special, parse_special, NULL, 0);
    if (n == INT_MIN) {
        fprintf(stderr, "convoy: text too long to tokenize\n");
        return 1;
    }
    const int n_max = n < 0 ? -n : n;
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(n_max ? n_max : 1));
    if (!ids) {
        fprintf(stderr, "convoy: out of memory\n");
        return 1;
    }
    n = convoy_tokenize(model, text, len, add_special, parse_special, ids, n_max);
    putchar('[');
    for (int i = 0; i < n; i++)
        printf(i ? ", %d" : "%d", ids[i]);
    printf("]\n");
    free(ids);
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model_path = NULL, *text = NULL;
    bool no_bos = false, parse_special = false;
    const arg_opt opts[] = {
        {"model", 'm', ARG_STR, .dst = &model_path, .required = true},
        {"prompt", 'p', ARG_STR, .dst = &text, .required = true},
        {"no-bos", 0, ARG_FLAG, .dst = &no_bos},
        {"parse-special", 0, ARG_FLAG, .dst = &parse_special},
        {0},
    };
    const arg_cmd cmd = {.name = "tokenize", .usage = usage, .opts = opts};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    char err[CONVOY_ERR_MAX];
    convoy_model *model = convoy_model_load(model_path, err, sizeof err);
    if (!model) {
        fprintf(stderr, "convoy: %s\n", err);
        return 1;
    }
    const int rc = print_ids(model, text, !no_bos, parse_special);
    convoy_model_free(model);
    return rc;
}
