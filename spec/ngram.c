#include "ngram.h"

#include <string.h>

int tdm_ngram_propose(const uint32_t *ctx, int len, int n_min, int n_max, int k, uint32_t *out)
{
    if (k <= 0 || len < 2)
        return 0;
    if (n_min < 1)
        n_min = 1;
    for (int n = n_max; n >= n_min; n--) {
        if (n >= len)
            continue;
        const uint32_t *tail = ctx + len - n;
        /* Latest match first: recent context predicts best. The match must
         * end before the tail starts so that a continuation exists. */
        for (int start = len - n - 1; start >= 0; start--) {
            if (memcmp(ctx + start, tail, sizeof(uint32_t) * (size_t)n) != 0)
                continue;
            int avail = len - (start + n);
            int m = avail < k ? avail : k;
            memcpy(out, ctx + start + n, sizeof(uint32_t) * (size_t)m);
            return m;
        }
    }
    return 0;
}
