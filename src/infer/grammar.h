/* grammar.h: GBNF grammars (llama.cpp's grammar language) for constrained
 * sampling.
 *
 * Contract: cv_grammar_parse compiles GBNF text (untrusted, `len` bytes, NUL
 * bytes included) whose start rule is `root`: rules `name ::= alternatives`
 * (names [a-zA-Z0-9-]+) ending at a newline outside parentheses, `|`,
 * concatenations, "literals" and [classes] / [^negated] with the escapes \n \r \t
 * \\ \" \[ \] \- \xHH \uHHHH \UHHHHHHHH and ranges a-z, `.` (any code
 * point), ( groups ), * + ? {m} {m,} {m,n}, # comments. A refused text gives
 * NULL and a message "line L:C: ..." naming the problem: a syntax error, an
 * unterminated literal or class, a bad escape, bad repetition bounds, an
 * undefined rule, a rule defined twice, a missing root, left recursion (a
 * rule that can reach itself before consuming a character, repetitions of
 * what can be empty included), or a limit below. A grammar is immutable and
 * may be shared between threads.
 *
 * Matching is over the Unicode code points of UTF-8 text; invalid UTF-8
 * (overlong forms, surrogates, past U+10FFFF, stray continuation bytes) is
 * never allowed. Bytes may stop inside a code point: a state then holds the
 * partial code point, and the partial bytes are allowed exactly when some
 * code point that a class the grammar expects next would match begins with
 * them. Ambiguity is followed in full (every parse at once), within fixed
 * caps: a code point whose step would need more than CV_GRAMMAR_MAX_STACKS
 * simultaneous parse stacks, a stack deeper than CV_GRAMMAR_MAX_DEPTH
 * rules, more than CV_GRAMMAR_MAX_NODES stack entries in all or more than
 * twice that many (position, stack) pairs visited is not allowed (partial
 * bytes before it may have been); a grammar whose start already exceeds
 * them is refused at parse. A state takes about 1.2 MiB.
 * Everything is deterministic: the same calls give the same results on
 * every machine.
 *
 * A state is one sequence's position, used by one thread at a time (the
 * const functions use scratch space it owns). allows, accept, complete and
 * mask never allocate. allows(s, b, n) is exactly whether accept(s, b, n)
 * would succeed; accept over b then c is the same as accept over b+c.
 * cv_grammar_mask(s, p, logits) gives the very result of allows on every
 * piece (empty pieces always masked). */
#ifndef CONVOY_INFER_GRAMMAR_H
#define CONVOY_INFER_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CV_GRAMMAR_MAX_TEXT (256u * 1024u) /* bytes of GBNF text */
#define CV_GRAMMAR_MAX_RULES 16384u        /* rules, with those made for groups and repetitions */
#define CV_GRAMMAR_MAX_ELEMENTS 65536u     /* rule elements after expanding repetitions */
#define CV_GRAMMAR_MAX_NESTING 64u         /* parentheses nested in parentheses */
#define CV_GRAMMAR_MAX_STACKS 1024u        /* parse stacks alive at once */
#define CV_GRAMMAR_MAX_DEPTH 1024u         /* rules open on one stack */
#define CV_GRAMMAR_MAX_NODES 4096u         /* stack entries of all stacks (shared tails count once) */

typedef struct cv_grammar cv_grammar;               /* compiled rules: immutable, shareable between threads */
typedef struct cv_grammar_state cv_grammar_state;   /* a matcher position (one per sequence) */
typedef struct cv_grammar_pieces cv_grammar_pieces; /* the byte strings of a vocabulary's tokens */

/* Parses GBNF text (len bytes, not NUL-terminated necessarily). The start
 * rule is `root`. NULL and a message naming the problem and its line:col on
 * error. */
cv_grammar *cv_grammar_parse(const char *text, size_t len, char *err, size_t errlen);
void cv_grammar_free(cv_grammar *g);

cv_grammar_state *cv_grammar_state_create(const cv_grammar *g); /* at the start; NULL when out of memory */
void cv_grammar_state_free(cv_grammar_state *s);
void cv_grammar_state_reset(cv_grammar_state *s); /* back to the start */
/* Whether the grammar accepts these bytes next (n may be 0: then true). Does not change s. */
bool cv_grammar_allows(const cv_grammar_state *s, const char *bytes, size_t n);
/* Advances over the bytes: 0, or -1 leaving s unchanged when they are not allowed. */
int cv_grammar_accept(cv_grammar_state *s, const char *bytes, size_t n);
/* Whether root may end here (the text so far is a complete sentence, no partial UTF-8 pending). */
bool cv_grammar_complete(const cv_grammar_state *s);

/* A vocabulary's pieces: piece i is bytes[i] of len[i] bytes (copied; a
 * NULL bytes[i] is an empty piece). NULL when out of memory or n_tokens < 0. */
cv_grammar_pieces *cv_grammar_pieces_create(int32_t n_tokens, const char *const *bytes, const uint32_t *len);
void cv_grammar_pieces_free(cv_grammar_pieces *p);
/* The length of piece id and, in *bytes, its bytes (0 and "" for an id out of range). */
uint32_t cv_grammar_piece(const cv_grammar_pieces *p, int32_t id, const char **bytes);
/* Sets logits[i] = -INFINITY for every token i (of the pieces' n_tokens)
 * whose piece the state does not allow; empty pieces are always masked (the
 * caller deals with end-of-generation tokens using cv_grammar_complete). */
void cv_grammar_mask(const cv_grammar_state *s, const cv_grammar_pieces *p, float *logits);

#endif
