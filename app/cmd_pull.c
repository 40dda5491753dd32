/* cmd_pull.c: `convoy pull REF`: a model from the Hugging Face hub (or
 * $HF_ENDPOINT) into the local cache, or -o PATH; prints the file's path
 * on stdout, so that `convoy run -m "$(convoy pull REF)"` works (hub.h). */
#include <stdio.h>

#include "args.h"
#include "commands.h"
#include "convoy.h"
#include "hub.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy pull (hf://OWNER/REPO/FILE.gguf | OWNER/REPO[:QUANT]) [-o PATH]\n"
               "  Downloads the file (resuming a cut download; checked against the SHA-256 the hub states)\n"
               "  into $CONVOY_MODELS, else $XDG_CACHE_HOME/convoy/models, else ~/.cache/convoy/models, as\n"
               "  OWNER/REPO/FILE, unless the same revision is there already; prints its path.\n"
               "  OWNER/REPO[:QUANT]: the repository's GGUF whose name holds QUANT (default Q4_K_M, or its\n"
               "  only GGUF), as llama.cpp's -hf. HF_ENDPOINT: the hub (default https://huggingface.co);\n"
               "  HF_TOKEN: a token for gated and private repositories.\n"
               "  -o PATH   the file's path instead of the cache\n");
}

int cmd_pull(int argc, char **argv)
{
    const char *ref = NULL, *out = NULL;
    const arg_opt opts[] = {
        {"output", 'o', ARG_STR, .dst = &out},
        {0},
    };
    const arg_cmd cmd = {.name = "pull", .usage = usage, .opts = opts, .args = &ref, .n_args = 1};
    const int status = arg_parse(&cmd, argc, argv);
    if (status != ARG_GO)
        return status;
    char path[4096], err[CONVOY_ERR_MAX];
    if (hub_pull(ref, &(hub_pull_params){.out_path = out, .cmd = "pull"}, path, sizeof path, err, sizeof err)) {
        fprintf(stderr, "convoy pull: %s\n", err);
        return 1;
    }
    printf("%s\n", path);
    return 0;
}
