/* logprobs.c: log-softmax of one logits row, the chosen id and the top k
 * (see logprobs.h). */
#include "infer/logprobs.h"

#include <math.h>

void cv_logprobs_row(const float *x, int32_t n, int32_t chosen, int32_t k, cv_logprob *out)
{
    float mx = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > mx)
            mx = x[i];
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > -INFINITY)
            sum += exp((double)x[i] - (double)mx);
    const double lse = (double)mx + log(sum);
    cv_logprob *top = out + 1;
    int32_t m = 0;
    for (int32_t i = 0; i < n && k > 0; i++) {
        const float v = x[i] == x[i] ? x[i] : -INFINITY;
        if (m == k && !(v > top[m - 1].logprob))
            continue;
        int32_t j = m < k ? m++ : k - 1;
        while (j > 0 && v > top[j - 1].logprob) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = (cv_logprob){.id = i, .logprob = v};
    }
    for (int32_t j = 0; j < m; j++)
        top[j].logprob = (float)((double)top[j].logprob - lse);
    const float xc = x[chosen] == x[chosen] ? x[chosen] : -INFINITY;
    out[0] = (cv_logprob){.id = chosen, .logprob = (float)((double)xc - lse)};
}
