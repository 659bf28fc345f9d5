/* cuda_info.h - CUDA devices visible to this process (built only when the
 * CUDA toolkit is found; QUIRE_HAVE_CUDA is then defined). */
#ifndef QUIRE_CUDA_INFO_H
#define QUIRE_CUDA_INFO_H

#include <stddef.h>

/* Number of usable devices; 0 (with the runtime's reason in err) when there
 * is no driver or no device.  Cannot crash without a GPU. */
int cuda_device_count(char *err, size_t errlen);
/* "NVIDIA H200 (sm_90, 139.8 GiB)"; 0 or -1. */
int cuda_device_name(int dev, char *buf, size_t len);

#endif
