/* budget.h: a byte budget that threads share.
 *
 * Work on untrusted input that allocates as it goes (a chat template's
 * render) takes its bytes from a budget before allocating them and gives
 * them back when it frees them, so that concurrent requests together stay
 * within one limit, whatever each may take alone.
 *
 * Contract: cv_budget_take adds n to the bytes in use and returns true, or
 * returns false and changes nothing when they would pass the limit;
 * cv_budget_give takes n back. Both are lock-free and any thread may call
 * them. A limit of 0 refuses every take. */
#ifndef CONVOY_CORE_BUDGET_H
#define CONVOY_CORE_BUDGET_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cv_budget {
    uint64_t limit;
    _Atomic uint64_t used;
    _Atomic uint64_t peak; /* the most used at once, for logs and tests */
} cv_budget;

void cv_budget_init(cv_budget *b, uint64_t limit);
bool cv_budget_take(cv_budget *b, size_t n);
void cv_budget_give(cv_budget *b, size_t n);

#endif
