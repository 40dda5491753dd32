/* unicode.c: class lookup and UTF-8 coding (see unicode.h).
 *
 * The class table is a sorted list of runs (unicode_data.c); a lookup is a
 * binary search for the last run starting at or before the code point. */
#include "core/unicode.h"

#include <stdbool.h>

unsigned cv_unicode_class(uint32_t cp)
{
    if (cp > 0x10FFFF)
        return 0;
    uint32_t lo = 0, hi = cv_unicode_n_runs; /* answer in [lo, hi) */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if ((cv_unicode_runs[mid] >> 8) <= cp)
            lo = mid;
        else
            hi = mid;
    }
    return cv_unicode_runs[lo] & 0xff;
}

static bool is_cont(uint8_t b)
{
    return (b & 0xC0) == 0x80;
}

uint32_t cv_utf8_decode(const uint8_t *s, size_t n, size_t *len)
{
    uint8_t c = s[0];
    *len = 1;
    if (c < 0x80)
        return c;
    uint32_t cp, min;
    size_t need;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
        cp = c & 0x1F;
        min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        cp = c & 0x0F;
        min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        cp = c & 0x07;
        min = 0x10000;
    } else {
        return 0xFFFD;
    }
    if (need > n)
        return 0xFFFD;
    for (size_t i = 1; i < need; i++) {
        if (!is_cont(s[i]))
            return 0xFFFD;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0xFFFD;
    *len = need;
    return cp;
}

size_t cv_utf8_encode(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}
