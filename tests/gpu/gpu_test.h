/* gpu_test.h - what the GPU tests share: they run where the build has CUDA
 * and a device is visible, and elsewhere (CI) report that they skipped. */
#ifndef QUIRE_GPU_TEST_H
#define QUIRE_GPU_TEST_H

#include <stdio.h>
#ifdef QUIRE_HAVE_CUDA
#include "cuda_info.h"
#endif

/* 1 when a CUDA device is visible (its name goes to stderr).  Otherwise
 * prints why the tests are skipped and the harness's empty summary, and
 * returns 0: main then returns 0. */
static inline int qt_gpu_present(void)
{
#ifdef QUIRE_HAVE_CUDA
    char err[256] = "", name[256];
    if (cuda_device_count(err, sizeof err) > 0) {
        if (cuda_device_name(0, name, sizeof name) == 0) fprintf(stderr, "device: %s\n", name);
        return 1;
    }
    printf("skipped: no CUDA device (%s)\n", err);
#else
    printf("skipped: built without CUDA\n");
#endif
    printf("0 passed, 0 failed\n");
    return 0;
}

#endif
