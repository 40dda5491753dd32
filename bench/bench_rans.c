/* bench_rans.c: convoy's lossless tensor coder (codec/planes.h over
 * codec/rans.h) against zstd -19, per weight type.
 *
 * Models (made once, cached in bench/out/models): stories260K (F32, from
 * ../shared) and its `convoy quantize` F16 and BF16 conversions; the
 * llama-3.2-1b-shaped `convoy synth` models in Q4_0, Q8_0, Q4_K, Q6_K.
 * For each: the packed/original size of all tensor bytes (rANS, every
 * tensor, each checked to decode bit for bit), and on a sample (each
 * tensor's first SAMPLE_KIB, whole blocks) rANS beside zstd -19, which is
 * too slow to run on gigabytes; encode and decode speed on one core, in GB
 * of tensor bytes per second of thread CPU time. libzstd is linked here only, as a yardstick.
 * Raw lines: bench/out/rans.jsonl.
 *
 * Usage: bench_rans [SAMPLE_KIB] (default 256) */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zstd.h>

#include "bench_raw.h"
#include "codec/planes.h"
#include "convoy.h"
#include "core/clock.h"
#include "core/err.h"
#include "kernels/types.h"
#include "model/gguf.h"

#define MODELS "bench/out/models/"
#define STORIES "../shared/models/stories260K.gguf"

typedef struct model_case {
    const char *type, *file;
    const char *quantize; /* F16/BF16 of stories260K; NULL: synth of `type`, or the shared file itself */
} model_case;

static const model_case cases[] = {
    {"F32", STORIES, NULL},
    {"F16", MODELS "stories260K-f16.gguf", "F16"},
    {"BF16", MODELS "stories260K-bf16.gguf", "BF16"},
    {"Q4_0", MODELS "llama-1b-q4_0.gguf", NULL},
    {"Q8_0", MODELS "llama-1b-q8_0.gguf", NULL},
    {"Q4_K", MODELS "llama-1b-q4_k.gguf", NULL},
    {"Q6_K", MODELS "llama-1b-q6_k.gguf", NULL},
};

typedef struct totals {
    uint64_t bytes, coded;                     /* every tensor */
    uint64_t sample, sample_rans, sample_zstd; /* the samples */
    double enc_s, dec_s;
} totals;

/* Makes a case's model when it is not there yet. */
static int ensure_model(const model_case *m, char *err, size_t errlen)
{
    if (access(m->file, R_OK) == 0)
        return 0;
    fprintf(stderr, "making %s\n", m->file);
    if (m->quantize)
        return convoy_quantize_file(STORIES, m->file, m->quantize, NULL, 0, NULL, NULL, err, errlen);
    convoy_synth_params p = convoy_synth_default_params();
    p.type = m->type;
    return convoy_synth_set_shape(&p, "llama-3.2-1b", err, errlen) ||
           convoy_synth_file(&p, m->file, NULL, NULL, err, errlen);
}

/* Codes n bytes of a tensor; returns the coded size, adding the times to
 * *t; 0 when it does not decode to itself. */
static uint64_t code(uint32_t type, const uint8_t *src, uint64_t n, uint8_t *buf, uint8_t *back, totals *t)
{
    uint64_t len;
    char err[CV_ERRLEN];
    double t0 = cv_thread_cpu_s();
    if (cv_planes_encode(type, src, n, buf, cv_planes_bound(type, n), &len, err, sizeof err))
        return fprintf(stderr, "%s\n", err), 0;
    double t1 = cv_thread_cpu_s();
    cv_cursor c;
    cv_cursor_init(&c, buf, len);
    const int rc = cv_planes_decode(type, &c, back, n, err, sizeof err);
    double t2 = cv_thread_cpu_s();
    if (t) {
        t->enc_s += t1 - t0;
        t->dec_s += t2 - t1;
    }
    return rc || memcmp(src, back, n) ? (fprintf(stderr, "round trip failed: %s\n", err), 0) : len;
}

/* The tensor's sample: its first `sample` bytes, cut to whole blocks. */
static uint64_t sample_of(const gguf_tensor *g, uint64_t sample)
{
    const char *name;
    int blck;
    size_t type_size;
    cv_ggml_type_info(g->type, &name, &blck, &type_size);
    const uint64_t n = g->size < sample ? g->size : sample;
    return n - n % type_size;
}

static int measure_tensor(const gguf_tensor *g, uint64_t sample, uint8_t *buf, uint8_t *back, totals *t)
{
    const uint64_t coded = code(g->type, g->data, g->size, buf, back, t);
    const uint64_t s = sample_of(g, sample);
    const uint64_t s_coded = code(g->type, g->data, s, buf, back, NULL);
    const size_t z = ZSTD_compress(buf, cv_planes_bound(g->type, g->size) + ZSTD_compressBound(s), g->data, s, 19);
    if (!coded || !s_coded || ZSTD_isError(z))
        return -1;
    t->bytes += g->size;
    t->coded += coded;
    t->sample += s;
    t->sample_rans += s_coded;
    t->sample_zstd += z;
    return 0;
}

static int measure(const char *path, uint64_t sample, totals *t)
{
    gguf_file f;
    char err[CV_ERRLEN];
    if (cv_gguf_open(&f, path, err, sizeof err))
        return fprintf(stderr, "%s\n", err), -1;
    uint64_t most = 0;
    for (uint64_t i = 0; i < f.n_tensors; i++)
        most = f.tensors[i].size > most ? f.tensors[i].size : most;
    const uint64_t room = most + CV_PLANES_MAX_STREAMS * 16 + ZSTD_compressBound(sample);
    uint8_t *buf = malloc(room), *back = malloc(most);
    int rc = buf && back ? 0 : -1;
    for (uint64_t i = 0; !rc && i < f.n_tensors; i++)
        rc = measure_tensor(&f.tensors[i], sample, buf, back, t);
    free(buf);
    free(back);
    cv_gguf_close(&f);
    return rc;
}

static void report(FILE *raw, const model_case *m, const totals *t, uint64_t sample_kib)
{
    const double rans = (double)t->coded / (double)t->bytes;
    const double s_rans = (double)t->sample_rans / (double)t->sample;
    const double s_zstd = (double)t->sample_zstd / (double)t->sample;
    const double enc = (double)t->bytes / t->enc_s / 1e9, dec = (double)t->bytes / t->dec_s / 1e9;
    printf("| %-4s | %-24s | %13" PRIu64 " | %7.2f%% | %7.2f%% | %7.2f%% | %8.3f | %8.3f |\n", m->type,
           strrchr(m->file, '/') + 1, t->bytes, 100 * rans, 100 * s_rans, 100 * s_zstd, enc, dec);
    fflush(stdout);
    bench_raw_append(raw, json_pack("{s:s, s:s, s:I, s:f, s:I, s:f, s:f, s:f, s:f}", "type", m->type, "model",
                                    m->file, "bytes", (json_int_t)t->bytes, "rans_ratio", rans, "sample_kib",
                                    (json_int_t)sample_kib, "sample_rans_ratio", s_rans, "sample_zstd19_ratio",
                                    s_zstd, "encode_gbps", enc, "decode_gbps", dec));
}

int main(int argc, char **argv)
{
    const uint64_t sample_kib = argc > 1 ? strtoull(argv[1], NULL, 10) : 256;
    FILE *raw = bench_raw_open("bench/out/rans.jsonl");
    char err[CV_ERRLEN];
    printf("| %-4s | %-24s | %13s | %8s | %8s | %8s | %8s | %8s |\n", "type", "model", "tensor bytes", "rANS", "rANS*",
           "zstd-19*", "enc GB/s", "dec GB/s");
    printf("|------|--------------------------|---------------|----------|----------|----------|----------|----------|\n");
    int rc = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        totals t = {0};
        if (ensure_model(&cases[i], err, sizeof err) || measure(cases[i].file, sample_kib << 10, &t)) {
            fprintf(stderr, "%s: %s\n", cases[i].file, err);
            rc = 1;
            continue;
        }
        report(raw, &cases[i], &t, sample_kib);
    }
    printf("(sizes: coded / original tensor bytes; *: on each tensor's first %" PRIu64 " KiB; one core)\n",
           sample_kib);
    bench_raw_close(raw);
    return rc;
}
