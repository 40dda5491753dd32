/* bench_raw.h: the raw lines every benchmark appends beside its table
 * (docs/DESIGN.md §13): one JSON object per run, with the commit and the machine
 * (CPU model) added to the run's own fields, so that a figure quoted in a
 * note can be traced to its run. Header-only: each benchmark is one program.
 *
 *   FILE *raw = bench_raw_open("bench/out/NAME.jsonl");   (NULL: not written)
 *   bench_raw_append(raw, json_pack(...));                 (takes the object)
 *   bench_raw_close(raw); */
#ifndef CONVOY_BENCH_RAW_H
#define CONVOY_BENCH_RAW_H

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The first line a shell command prints, or "unknown". */
static inline void bench_command_line(const char *cmd, char *out, size_t n)
{
    snprintf(out, n, "unknown");
    FILE *p = popen(cmd, "r");
    if (!p)
        return;
    if (fgets(out, (int)n, p))
        out[strcspn(out, "\n")] = 0;
    pclose(p);
}

static char bench_raw_commit[64], bench_raw_cpu[256];

static inline FILE *bench_raw_open(const char *path)
{
    bench_command_line("git rev-parse --short HEAD 2>/dev/null", bench_raw_commit, sizeof bench_raw_commit);
    bench_command_line("sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1", bench_raw_cpu,
                       sizeof bench_raw_cpu);
    return fopen(path, "a");
}

static inline void bench_raw_append(FILE *raw, json_t *o)
{
    if (raw && o) {
        json_object_set_new(o, "commit", json_string(bench_raw_commit));
        json_object_set_new(o, "cpu", json_string(bench_raw_cpu));
        char *line = json_dumps(o, JSON_COMPACT);
        if (line)
            fprintf(raw, "%s\n", line);
        free(line);
    }
    json_decref(o);
}

static inline void bench_raw_close(FILE *raw)
{
    if (raw)
        fclose(raw);
}

#endif
