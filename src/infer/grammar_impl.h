/* grammar_impl.h: a compiled GBNF grammar, as the parser (grammar_parse.c)
 * builds it and the matcher (grammar_match.c) runs it; private to those two.
 *
 * Contract: the rules are llama.cpp's rule form flattened into one element
 * array: rule r's alternatives start at alt_start[rule_alt[r] ..
 * rule_alt[r+1]), each a run of elements ended by E_ALT, the rule's last by
 * E_END. A set is a class: sorted, disjoint, not adjacent code point ranges,
 * matched or (neg) refused. cv_grammar_start_fits is the matcher's answer to
 * the parser's last check, whether the start is within the matcher's caps:
 * 0 it is, 1 it is not, -1 out of memory. */
#ifndef CONVOY_INFER_GRAMMAR_IMPL_H
#define CONVOY_INFER_GRAMMAR_IMPL_H

#include <stdint.h>

#include "infer/grammar.h"

enum { E_END, E_ALT, E_REF, E_CHAR, E_SET, E_ANY };

typedef struct gelem {
    uint32_t type;
    uint32_t v; /* E_REF: rule, E_CHAR: code point, E_SET: set index */
} gelem;

typedef struct gset {
    uint32_t off, n; /* ranges[off .. off+n): sorted, disjoint, not adjacent */
    uint32_t neg;
} gset;

struct cv_grammar {
    gelem *el;
    uint32_t n_el;
    uint32_t n_rules, root;
    uint32_t *rule_alt; /* rule r's alternatives: alt_start[rule_alt[r] .. rule_alt[r+1]) */
    uint32_t *alt_start;
    uint32_t n_alts;
    gset *sets;
    uint32_t *ranges; /* pairs lo, hi */
};

int cv_grammar_start_fits(const cv_grammar *g);

#endif
