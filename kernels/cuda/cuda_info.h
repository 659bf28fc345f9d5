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

/* ---- self-tests and ceilings (kernels/cuda/cuda_selftest.cu) ---------- */

#include <stdint.h>

/* One attention kernel run on host data: K/V caches of num_blocks blocks of
 * (KV, bs, hd) floats, n_tok query tokens (H heads of hd), each with its
 * position and sequence; sequence s's block table starts at
 * tables[seq_info[2s]].  prefill: the tensor-core kernel over runs of
 * consecutive positions (bf16/f16, hd 64 or 128); otherwise the decode
 * kernel with n_split splits of split_len positions.  Inputs are rounded
 * to dtype on the device. */
typedef struct {
    int dtype, prefill;
    int H, KV, hd, bs, num_blocks;
    const float *kc, *vc, *q;
    int n_tok;
    const int32_t *pos, *seq;
    int n_seqs;
    const int32_t *seq_info, *tables;
    int n_table;
    int n_split, split_len;
} cuda_attn_case;

/* Writes n_tok * H * hd floats into out; 0 or a QERR_* code. */
int cuda_selftest_attention(const cuda_attn_case *c, float *out);
/* Rounds x in place to dtype (QDT_BF16 / QDT_F16) as the device does. */
int cuda_selftest_round(int dtype, float *x, size_t n);
/* Device-to-device copy bandwidth (TB/s, bytes read + written, 4 GiB) and
 * cuBLAS bf16 8192^3 product rate (TFLOP/s) on random data. */
int cuda_measure_ceilings(double *copy_tbs, double *bf16_tflops);
/* Prints a table of the small-batch projection kernels' weight-streaming
 * rates against cuBLAS for n tokens (bench/gpu). */
#include <stdio.h>
int cuda_bench_gemv(FILE *f, int n);

#endif
