/* splitmix.h: SplitMix64 (Steele, Lea, Flood 2014), the one 64-bit mixer
 * of the project: it seeds the sampler's PCG, makes request ids, and draws
 * synthetic weights. cv_splitmix64_mix is the finalizer alone (a bijection
 * of 64-bit values); cv_splitmix64 steps the state by the golden gamma and
 * mixes, as one call of the generator does. */
#ifndef CONVOY_CORE_SPLITMIX_H
#define CONVOY_CORE_SPLITMIX_H

#include <stdint.h>

#define CV_SPLITMIX_GAMMA 0x9e3779b97f4a7c15ull

static inline uint64_t cv_splitmix64_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t cv_splitmix64(uint64_t x) { return cv_splitmix64_mix(x + CV_SPLITMIX_GAMMA); }

#endif
