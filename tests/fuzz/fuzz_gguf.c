/* fuzz_gguf.c: libFuzzer target for the GGUF reader.
 *
 * Parses the input with cv_gguf_parse; when it is accepted, touches what the
 * reader promised: every key is findable, every array element and string
 * lies inside the input, every tensor's first and last data byte is inside
 * it (AddressSanitizer reports any byte that is not, since libFuzzer hands
 * over an exact-size heap copy). A rejection must come with a message that
 * begins with the file name. Seed corpus: `test_gguf --corpus DIR`. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/err.h"
#include "model/gguf.h"

static volatile uint64_t sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file f;
    char err[CV_ERRLEN] = "";
    if (cv_gguf_parse(&f, data, size, "fuzz.gguf", err, sizeof err) != 0) {
        if (strncmp(err, "fuzz.gguf: ", 11) != 0)
            abort();
        return 0;
    }
    for (uint64_t i = 0; i < f.n_kv; i++) {
        const gguf_kv *kv = &f.kv[i];
        char *key = cv_gguf_str_dup(kv->key);
        if (!key || cv_gguf_find_kv(&f, key) != kv)
            abort();
        uint32_t u;
        float x;
        cv_gguf_get_u32(&f, key, &u, err, sizeof err);
        cv_gguf_get_f32(&f, key, &x, err, sizeof err);
        cv_free(key);
        if (kv->type == GGUF_STRING && kv->v.str.len)
            sink += (uint8_t)kv->v.str.ptr[kv->v.str.len - 1];
        if (kv->type != GGUF_ARRAY)
            continue;
        for (uint64_t j = 0; j < kv->arr_n; j++) {
            if (kv->arr_type == GGUF_STRING) {
                if (kv->arr_strs[j].len)
                    sink += (uint8_t)kv->arr_strs[j].ptr[kv->arr_strs[j].len - 1];
            } else {
                double d = cv_gguf_arr_f64(kv, j);
                uint64_t bits;
                memcpy(&bits, &d, sizeof bits);
                sink += (uint64_t)cv_gguf_arr_i64(kv, j) + bits;
            }
        }
    }
    for (uint64_t i = 0; i < f.n_tensors; i++) {
        const gguf_tensor *t = &f.tensors[i];
        const uint8_t *d = t->data;
        if (d < data || d + t->size > data + size || t->size == 0)
            abort();
        sink += d[0] + d[t->size - 1];
    }
    cv_gguf_close(&f);
    return 0;
}
