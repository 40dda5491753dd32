/* jinja_text.c: text helpers of the Jinja engine (jinja_impl.h): UTF-8 by
 * code point (through core/unicode.h), Python's whitespace and a compact
 * case mapping, float and number text as Python writes and reads it, and
 * strftime.
 *
 * Case mapping: the one-to-one mappings of Latin (ASCII, Latin-1, Latin
 * Extended-A, Latin Extended Additional), Greek, Cyrillic, Armenian and
 * fullwidth Latin, as ranges shifted by a constant and ranges of
 * upper/lower pairs. Letters outside them map to themselves. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat/jinja_impl.h"
#include "core/unicode.h"

uint32_t cv_jt_decode(const char *p, size_t n, size_t *len) { return cv_utf8_decode((const uint8_t *)p, n, len); }

size_t cv_jt_encode(uint32_t cp, char *out) { return cv_utf8_encode(cp > 0x10FFFF ? 0xFFFD : cp, out); }

size_t cv_jt_count(jstr s)
{
    size_t k = 0;
    for (size_t i = 0, len; i < s.n; i += len, k++)
        cv_jt_decode(s.p + i, s.n - i, &len);
    return k;
}

size_t cv_jt_offset(jstr s, size_t k)
{
    size_t i = 0, len;
    for (; k > 0 && i < s.n; k--, i += len)
        cv_jt_decode(s.p + i, s.n - i, &len);
    return i;
}

bool cv_jt_is_space(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20);
    return cp == 0x85 || (cv_unicode_class(cp) & CV_UC_SPACE) != 0;
}

bool cv_jt_is_alpha(uint32_t cp)
{
    if (cp < 0x80)
        return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
    return (cv_unicode_class(cp) & CV_UC_LETTER) != 0;
}

bool cv_jt_is_digit(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    return (cv_unicode_class(cp) & CV_UC_NUMBER) != 0;
}

size_t cv_jt_space_at(const char *p, const char *end)
{
    if (p >= end)
        return 0;
    size_t len;
    uint32_t cp = cv_jt_decode(p, (size_t)(end - p), &len);
    return cv_jt_is_space(cp) ? len : 0;
}

size_t cv_jt_space_before(const char *start, const char *end)
{
    for (size_t k = 1; k <= 4 && k <= (size_t)(end - start); k++)
        if (cv_jt_space_at(end - k, end) == k)
            return k;
    return 0;
}

jstr cv_jt_strip(jstr s, bool left, bool right)
{
    const char *p = s.p, *end = s.p + s.n;
    size_t k;
    while (left && (k = cv_jt_space_at(p, end)) > 0)
        p += k;
    while (right && (k = cv_jt_space_before(p, end)) > 0)
        end -= k;
    return (jstr){p, (size_t)(end - p)};
}

/* ---- case ---- */

static const struct {
    uint32_t lo, hi; /* lower-case range */
    int32_t delta;   /* to its upper case */
} SHIFTS[] = {
    {0x61, 0x7a, -32},     {0xe0, 0xf6, -32},   {0xf8, 0xfe, -32},   {0x3b1, 0x3c1, -32}, {0x3c3, 0x3cb, -32},
    {0x3ad, 0x3af, -37},   {0x3cd, 0x3ce, -63}, {0x430, 0x44f, -32}, {0x450, 0x45f, -80}, {0x561, 0x586, -48},
    {0xff41, 0xff5a, -32},
};

static const struct {
    uint32_t first, last;
    uint32_t upper_parity; /* the upper-case letter of a pair has this parity */
} PAIRS[] = {
    {0x100, 0x12f, 0}, {0x132, 0x137, 0}, {0x139, 0x148, 1},   {0x14a, 0x177, 0},   {0x179, 0x17e, 1},
    {0x460, 0x481, 0}, {0x48a, 0x4bf, 0}, {0x4c1, 0x4ce, 1},   {0x4d0, 0x52f, 0},   {0x1e00, 0x1e95, 0},
    {0x1ea0, 0x1eff, 0},
};

static const uint32_t TO_UPPER[][2] = {{0xb5, 0x39c},  {0xff, 0x178},  {0x131, 0x49},  {0x17f, 0x53},
                                       {0x3c2, 0x3a3}, {0x3ac, 0x386}, {0x3cc, 0x38c}, {0x4cf, 0x4c0}};
static const uint32_t TO_LOWER[][2] = {{0x178, 0xff},  {0x386, 0x3ac}, {0x38c, 0x3cc},
                                       {0x130, 0x69},  {0x4c0, 0x4cf}, {0x1e9e, 0xdf}};

/* The other letter of a pair, when cp is of the wanted case's opposite. */
static uint32_t pair_map(uint32_t cp, bool to_upper)
{
    for (size_t k = 0; k < sizeof PAIRS / sizeof PAIRS[0]; k++) {
        if (cp < PAIRS[k].first || cp > PAIRS[k].last)
            continue;
        bool is_upper = (cp & 1) == PAIRS[k].upper_parity;
        if (to_upper && !is_upper && cp > PAIRS[k].first)
            return cp - 1;
        if (!to_upper && is_upper && cp < PAIRS[k].last)
            return cp + 1;
        return cp;
    }
    return cp;
}

uint32_t cv_jt_upper(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
    for (size_t k = 0; k < sizeof SHIFTS / sizeof SHIFTS[0]; k++)
        if (cp >= SHIFTS[k].lo && cp <= SHIFTS[k].hi)
            return (uint32_t)((int32_t)cp + SHIFTS[k].delta);
    for (size_t k = 0; k < sizeof TO_UPPER / sizeof TO_UPPER[0]; k++)
        if (cp == TO_UPPER[k][0])
            return TO_UPPER[k][1];
    return pair_map(cp, true);
}

uint32_t cv_jt_lower(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
    for (size_t k = 0; k < sizeof SHIFTS / sizeof SHIFTS[0]; k++) {
        int64_t lo = (int64_t)SHIFTS[k].lo + SHIFTS[k].delta, hi = (int64_t)SHIFTS[k].hi + SHIFTS[k].delta;
        if ((int64_t)cp >= lo && (int64_t)cp <= hi)
            return (uint32_t)((int32_t)cp - SHIFTS[k].delta);
    }
    for (size_t k = 0; k < sizeof TO_LOWER / sizeof TO_LOWER[0]; k++)
        if (cp == TO_LOWER[k][0])
            return TO_LOWER[k][1];
    return pair_map(cp, false);
}

/* ---- numbers ---- */

void cv_jt_float_repr(double f, char *buf)
{
    if (isnan(f) || isinf(f)) {
        strcpy(buf, isnan(f) ? "nan" : f > 0 ? "inf" : "-inf");
        return;
    }
    if (f == 0) {
        strcpy(buf, signbit(f) ? "-0.0" : "0.0");
        return;
    }
    char e[40];
    for (int prec = 1; prec <= 17; prec++) { /* the shortest text that reads back as f */
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f)
            break;
    }
    char digits[24];
    size_t nd = 0;
    const char *p = e;
    bool neg = *p == '-';
    p += neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int decpt = atoi(p + 1) + 1, o = 0;
    if (neg)
        buf[o++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            o += sprintf(buf + o, "0.%.*s%.*s", -decpt, "0000", (int)nd, digits);
        } else if ((size_t)decpt >= nd) {
            o += sprintf(buf + o, "%.*s%.*s.0", (int)nd, digits, decpt - (int)nd, "0000000000000000");
        } else {
            o += sprintf(buf + o, "%.*s.%.*s", decpt, digits, (int)nd - decpt, digits + decpt);
        }
        return;
    }
    buf[o++] = digits[0];
    if (nd > 1)
        o += sprintf(buf + o, ".%.*s", (int)nd - 1, digits + 1);
    sprintf(buf + o, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
}

static int digit_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')
        return (c | 0x20) - 'a' + 10;
    return 99;
}

bool cv_jt_parse_int(jstr s, int base, int64_t *out)
{
    s = cv_jt_strip(s, true, true);
    size_t i = 0;
    bool neg = false;
    if (i < s.n && (s.p[i] == '+' || s.p[i] == '-'))
        neg = s.p[i++] == '-';
    char pfx = base == 16 ? 'x' : base == 8 ? 'o' : base == 2 ? 'b' : 0;
    if (pfx && i + 1 < s.n && s.p[i] == '0' && (s.p[i + 1] | 0x20) == pfx)
        i += 2 + (i + 2 < s.n && s.p[i + 2] == '_');
    uint64_t v = 0;
    bool any = false, prev_digit = false;
    for (; i < s.n; i++) {
        if (s.p[i] == '_' && prev_digit && i + 1 < s.n && digit_value(s.p[i + 1]) < base) {
            prev_digit = false;
            continue;
        }
        int d = digit_value(s.p[i]);
        if (d >= base || v > (UINT64_MAX - (uint64_t)d) / (uint64_t)base)
            return false;
        v = v * (uint64_t)base + (uint64_t)d;
        any = prev_digit = true;
    }
    if (!any || v > (uint64_t)INT64_MAX + neg)
        return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

/* Digits with single underscores between them, copied without them. */
static size_t copy_digits(jstr s, size_t i, char *buf, size_t *o, size_t cap)
{
    while (i < s.n && *o + 1 < cap) {
        if (s.p[i] >= '0' && s.p[i] <= '9')
            buf[(*o)++] = s.p[i++];
        else if (s.p[i] == '_' && i > 0 && s.p[i - 1] >= '0' && s.p[i - 1] <= '9' && i + 1 < s.n && s.p[i + 1] >= '0' &&
                 s.p[i + 1] <= '9')
            i++;
        else
            break;
    }
    return i;
}

bool cv_jt_parse_float(jstr s, double *out)
{
    s = cv_jt_strip(s, true, true);
    char buf[400];
    size_t i = 0, o = 0;
    if (i < s.n && (s.p[i] == '+' || s.p[i] == '-'))
        buf[o++] = s.p[i++];
    static const char *const words[] = {"inf", "infinity", "nan"};
    for (int k = 0; k < 3; k++)
        if (s.n - i == strlen(words[k]) && strncasecmp(s.p + i, words[k], s.n - i) == 0) {
            *out = k < 2 ? (buf[0] == '-' ? -INFINITY : INFINITY) : NAN;
            return true;
        }
    size_t mant = o;
    i = copy_digits(s, i, buf, &o, sizeof buf);
    if (i < s.n && s.p[i] == '.' && o + 1 < sizeof buf)
        buf[o++] = s.p[i++], i = copy_digits(s, i, buf, &o, sizeof buf);
    if (o == mant || (o == mant + 1 && buf[mant] == '.'))
        return false;
    if (i < s.n && (s.p[i] | 0x20) == 'e' && o + 2 < sizeof buf) {
        buf[o++] = 'e';
        i++;
        if (i < s.n && (s.p[i] == '+' || s.p[i] == '-'))
            buf[o++] = s.p[i++];
        size_t before = o;
        i = copy_digits(s, i, buf, &o, sizeof buf);
        if (o == before)
            return false;
    }
    if (i != s.n)
        return false;
    buf[o] = '\0';
    *out = strtod(buf, NULL);
    return true;
}

/* ---- strftime ---- */

static const char *const MONTHS[] = {"January", "February", "March",     "April",   "May",      "June",
                                     "July",    "August",   "September", "October", "November", "December"};
static const char *const DAYS[] = {"Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"};

static bool leap(int y) { return (y % 4 == 0 && y % 100 != 0) || y % 400 == 0; }

/* Day of the week, 0 = Sunday (Sakamoto's method). */
static int weekday(int y, int m, int d)
{
    static const int t[] = {0, 3, 2, 5, 0, 3, 5, 1, 4, 6, 2, 4};
    y -= m < 3;
    return (y + y / 4 - y / 100 + y / 400 + t[m - 1] + d) % 7;
}

static int day_of_year(int y, int m, int d)
{
    static const int before[] = {0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334};
    return before[m - 1] + d + (m > 2 && leap(y));
}

/* One conversion; pad false for GNU's "%-d" form. */
static int conversion(char c, bool pad, int y, int m, int d, char *out, size_t cap)
{
    const char *num = pad ? "%02d" : "%d";
    switch (c) {
    case 'Y': return snprintf(out, cap, "%d", y);
    case 'y': return snprintf(out, cap, num, y % 100);
    case 'm': return snprintf(out, cap, num, m);
    case 'd': return snprintf(out, cap, num, d);
    case 'e': return snprintf(out, cap, pad ? "%2d" : "%d", d);
    case 'j': return snprintf(out, cap, pad ? "%03d" : "%d", day_of_year(y, m, d));
    case 'H':
    case 'M':
    case 'S': return snprintf(out, cap, num, 0);
    case 'I': return snprintf(out, cap, num, 12);
    case 'p': return snprintf(out, cap, "AM");
    case 'b':
    case 'h': return snprintf(out, cap, "%.3s", MONTHS[m - 1]);
    case 'B': return snprintf(out, cap, "%s", MONTHS[m - 1]);
    case 'a': return snprintf(out, cap, "%.3s", DAYS[weekday(y, m, d)]);
    case 'A': return snprintf(out, cap, "%s", DAYS[weekday(y, m, d)]);
    case 'F': return snprintf(out, cap, "%d-%02d-%02d", y, m, d);
    case '%': return snprintf(out, cap, "%%");
    default: return -1;
    }
}

int cv_jt_strftime(jrender *r, jbuf *b, int line, jstr fmt, int year, int month, int day)
{
    for (size_t i = 0; i < fmt.n; i++) {
        char buf[48];
        bool pad = !(i + 2 < fmt.n && fmt.p[i + 1] == '-');
        size_t skip = pad ? 1 : 2;
        int n = fmt.p[i] == '%' && i + skip < fmt.n
                    ? conversion(fmt.p[i + skip], pad, year, month, day, buf, sizeof buf)
                    : -1;
        if (n < 0) {
            if (cv_jb_put(r, b, line, fmt.p + i, 1) != 0)
                return -1;
            continue;
        }
        if (cv_jb_put(r, b, line, buf, (size_t)n) != 0)
            return -1;
        i += skip;
    }
    return 0;
}
