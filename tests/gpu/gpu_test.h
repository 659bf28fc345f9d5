/* gpu_test.h - what the GPU tests share: they run where the build has CUDA
 * and a device is visible, and elsewhere (CI) report that they skipped. */
#ifndef QUIRE_GPU_TEST_H
#define QUIRE_GPU_TEST_H

#include <stdio.h>

#include "qtest.h"
#ifdef QUIRE_HAVE_CUDA
#include "cuda_info.h"
#endif

/* 0 when a CUDA device is visible (its name goes to stderr).  Otherwise
 * prints why the tests skip and returns QT_SKIP_CODE, which main returns:
 * ctest then counts the program as skipped, not passed. */
static inline int qt_gpu_skip(void)
{
#ifdef QUIRE_HAVE_CUDA
    char err[256] = "", name[256];
    if (cuda_device_count(err, sizeof err) > 0) {
        if (cuda_device_name(0, name, sizeof name) == 0) fprintf(stderr, "device: %s\n", name);
        return 0;
    }
    return qt_skip_all("no CUDA device (%s)", err);
#else
    return qt_skip_all("built without CUDA");
#endif
}

#endif
