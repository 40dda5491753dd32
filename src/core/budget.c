/* budget.c: see budget.h. */
#include "core/budget.h"

void cv_budget_init(cv_budget *b, uint64_t limit)
{
    b->limit = limit;
    atomic_init(&b->used, 0);
    atomic_init(&b->peak, 0);
}

bool cv_budget_take(cv_budget *b, size_t n)
{
    uint64_t used = atomic_load(&b->used);
    do {
        if (n > b->limit || used > b->limit - n)
            return false;
    } while (!atomic_compare_exchange_weak(&b->used, &used, used + n));
    uint64_t peak = atomic_load(&b->peak);
    while (used + n > peak && !atomic_compare_exchange_weak(&b->peak, &peak, used + n))
        ;
    return true;
}

void cv_budget_give(cv_budget *b, size_t n) { atomic_fetch_sub(&b->used, n); }
