/* main.c: the convoy binary: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "args.h"
#include "commands.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} commands[] = {
    {"run", cmd_run, "run -m MODEL -p PROMPT -n N [sampling flags] [-t THREADS] [--nodes HOST:PORT,...]"},
    {"chat", cmd_chat, "chat -m MODEL [--nodes HOST:PORT,...]: a conversation in the terminal"},
    {"serve", cmd_serve, "serve -m MODEL [--port N] [-np N] [-c N] [--api-key KEY] [--nodes HOST:PORT,...]: OpenAI API"},
    {"stage", cmd_stage, "stage --listen HOST:PORT -m MODEL|SHARD [--mem BYTES]: a pipeline node"},
    {"info", cmd_info, "info MODEL: hyperparameters, tensors, types, sizes, fingerprint"},
    {"tokenize", cmd_tokenize, "tokenize -m MODEL -p TEXT: print the token ids"},
    {"eval", cmd_eval, "eval -m MODEL --tokens IDS.json --logits OUT.f32: teacher-forced logits"},
    {"quantize", cmd_quantize, "quantize IN OUT TYPE: convert weights to F16/BF16/Q8_0/Q4_0"},
    {"keygen", cmd_keygen, "keygen FILE: a new cluster key for --key (mode 0600)"},
    {"pack", cmd_pack, "pack IN.gguf OUT: every tensor losslessly coded (rANS); unpack gives IN back"},
    {"unpack", cmd_unpack, "unpack IN OUT.gguf: the GGUF a pack file holds, byte for byte"},
    {"split", cmd_split, "split MODEL --stages N|--split A,B,... -o DIR: per-stage shard files for `convoy stage`"},
    {"render-template", cmd_render_template,
     "render-template --template FILE --request REQ.json: the prompt a chat template makes of a request"},
    {"pull", cmd_pull, "pull hf://OWNER/REPO/FILE.gguf | OWNER/REPO[:QUANT]: download a model into the cache"},
    {"plan", cmd_plan, "plan -m MODEL (--nodes HOST:PORT,...|--fleet FLEET.json): predicted tokens/s of a fleet"},
    {"synth", cmd_synth, "synth --shape NAME|--dims ... --type T -o OUT: deterministic random model"},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: convoy COMMAND [ARGS]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %s\n", commands[i].help);
}

int main(int argc, char **argv)
{
    /* Progress lines reach a pipe or a file (journald, | tee) as they are
     * written, not in blocks: stdout is line-buffered whatever it is
     * (stderr is unbuffered). */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("%s\n", arg_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "convoy: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
