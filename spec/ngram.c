/* ngram.c - n-gram prompt lookup (spec.h). */
#include "spec.h"

#include <string.h>

int qspec_ngram(const int32_t *hist, int n, int min_n, int max_n, int k, int32_t *out)
{
    if (!hist || !out || n < 2 || k < 1 || min_n < 1 || max_n < min_n) return 0;
    if (k > QSPEC_MAX_K) k = QSPEC_MAX_K;
    for (int g = max_n < n - 1 ? max_n : n - 1; g >= min_n; g--) {
        const int32_t *suf = hist + n - g;
        /* The latest occurrence followed by k tokens; failing that (a
         * repeat close to the end, as in a loop), the one followed by the
         * most.  An earlier occurrence ends before the suffix's last token,
         * so that at least one token follows it. */
        int best = -1, best_c = 0;
        for (int p = n - g - 1; p >= 0; p--) {
            if (hist[p + g - 1] != suf[g - 1] || memcmp(hist + p, suf, sizeof *suf * (size_t)g)) continue;
            const int c = n - (p + g);
            if (c > best_c) best = p, best_c = c;
            if (c >= k) break;
        }
        if (best >= 0) {
            const int c = best_c < k ? best_c : k;
            memcpy(out, hist + best + g, sizeof *out * (size_t)c);
            return c;
        }
    }
    return 0;
}
