/* cmd_tokenize.c: `convoy tokenize`: prints the ids of a text as a JSON
 * list, BOS added as the model's vocabulary says unless --no-bos. */
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"
#include "core/alloc.h"

int cmd_tokenize(int argc, char **argv)
{
    const char *model_path = NULL, *text = NULL, *v;
    bool add_special = true, parse_special = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-bos"))
            add_special = false;
        else if (!strcmp(argv[i], "--parse-special"))
            parse_special = true;
        else if (!strcmp(argv[i], "-m") || !strcmp(argv[i], "-p")) {
            if (!(v = arg_value(argc, argv, &i)))
                return 2;
            *(argv[i - 1][1] == 'm' ? &model_path : &text) = v;
        } else {
            fprintf(stderr, "convoy tokenize: unknown option '%s'\n", argv[i]);
            model_path = NULL;
            break;
        }
    }
    if (!model_path || !text) {
        fprintf(stderr, "usage: convoy tokenize -m MODEL -p TEXT [--no-bos] [--parse-special]\n");
        return 2;
    }
    char err[512];
    convoy_model *model = convoy_model_load(model_path, err, sizeof err);
    if (!model) {
        fprintf(stderr, "convoy: %s\n", err);
        return 1;
    }
    size_t len = strlen(text);
    int n = convoy_tokenize(model, text, len, add_special, parse_special, NULL, 0);
    int rc = 1;
    if (n == INT_MIN) {
        fprintf(stderr, "convoy: text too long to tokenize\n");
        convoy_model_free(model);
        return 1;
    }
    int32_t *ids = cv_malloc(sizeof(int32_t) * (size_t)(n < 0 ? -n : n));
    if (ids) {
        n = convoy_tokenize(model, text, len, add_special, parse_special, ids, n < 0 ? -n : n);
        putchar('[');
        for (int i = 0; i < n; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        printf("]\n");
        rc = 0;
    }
    cv_free(ids);
    convoy_model_free(model);
    return rc;
}
