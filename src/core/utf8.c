/* utf8.c: see utf8.h. */
#include "core/utf8.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

size_t cv_utf8_len(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n == 0)
        return 0;
    const size_t len = u[0] < 0x80 ? 1 : (u[0] & 0xE0) == 0xC0 ? 2 : (u[0] & 0xF0) == 0xE0 ? 3
                     : (u[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t k = 1; k < len; k++)
        if ((u[k] & 0xC0) != 0x80)
            return 0;
    if (len == 2 && u[0] < 0xC2)
        return 0;
    if (len == 3) {
        const unsigned cp = ((u[0] & 0x0Fu) << 12) | ((u[1] & 0x3Fu) << 6);
        if (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
    }
    if (len == 4) {
        const unsigned cp = ((u[0] & 0x07u) << 18) | ((u[1] & 0x3Fu) << 12);
        if (cp < 0x10000 || cp > 0x10FFFF)
            return 0;
    }
    return len;
}

char *cv_escape(char *out, size_t n, const char *text, size_t len)
{
    size_t at = 0;
    for (size_t i = 0; i < len;) {
        const unsigned char c = (unsigned char)text[i];
        size_t k = cv_utf8_len(text + i, len - i);
        /* U+0080..U+009F, the C1 controls, are C2 80..C2 9F */
        const bool c1 = k == 2 && c == 0xC2 && (unsigned char)text[i + 1] < 0xA0;
        char esc[16];
        const char *piece = text + i;
        size_t m = k;
        if (k == 0 || c1 || (k == 1 && (c < 0x20 || c == 0x7F || c == '\\'))) {
            m = c == '\\' ? (size_t)snprintf(esc, sizeof esc, "\\\\") : (size_t)snprintf(esc, sizeof esc, "\\x%02X", c);
            piece = esc;
            k = 1;
        }
        if (at + m >= n)
            break;
        memcpy(out + at, piece, m);
        at += m;
        i += k;
    }
    if (n)
        out[at] = 0;
    return out;
}

int cv_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}
