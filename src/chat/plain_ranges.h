/* plain_ranges.h: the plain ranges of a rendered chat, the byte ranges of
 * the prompt that are message contents. Tokenization parses special tokens
 * outside them only, so that what users write stays text and never becomes
 * a control token ("<|im_start|>" typed in a message).
 *
 * Contract. The caller renders a conversation twice through the same
 * template: once as it is (the prompt), once with each message's content
 * replaced by its marker (cv_plain_mark: private-use characters around the
 * message's index, which no template writes). cv_plain_ranges_find maps the
 * marked rendering back: when putting each content in place of its marker
 * gives the prompt byte for byte, the plain ranges are where the contents
 * stand in it (in order, disjoint; a content the template writes twice has
 * two). A template that changes contents (trims them, splits them) so that
 * the markers do not map back gives no plain ranges: the caller must then
 * keep user text from becoming control tokens another way (serve/ refuses
 * a message whose content holds a control token's text). */
#ifndef CONVOY_CHAT_PLAIN_RANGES_H
#define CONVOY_CHAT_PLAIN_RANGES_H

#include <stddef.h>

/* The bytes a marker takes, its NUL included. */
#define CV_PLAIN_MARK_MAX 32

/* One plain range: len bytes of the prompt from off. */
typedef struct cv_plain_range {
    size_t off, len;
} cv_plain_range;

/* The marker that stands for message i's content, into out (n bytes). */
void cv_plain_mark(char *out, size_t n, int i);

/* prompt: the rendering (len bytes); marked: the marked rendering (mlen
 * bytes and a NUL); contents: the n messages' contents. Returns 1 with
 * *ranges (release with cv_free; NULL when none) holding *n_ranges plain
 * ranges of prompt when the contents map back, 0 with none when they do
 * not, -1 with none when out of memory. */
int cv_plain_ranges_find(const char *prompt, size_t len, const char *marked, size_t mlen, const char *const *contents,
                         int n, cv_plain_range **ranges, int *n_ranges);

#endif
