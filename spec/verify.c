/* verify.c - the verify loop (spec.h). */
#include "spec.h"

int qspec_verify(int d, int (*row)(void *ctx, int j, int *acc), void *ctx)
{
    int kept = 0;
    for (int j = 0; j <= d; j++) {
        int acc = 0;
        const int go = row(ctx, j, &acc);
        kept += acc;
        if (!go || !acc) break;
    }
    return kept;
}
