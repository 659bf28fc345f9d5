/* util.h - logging, checked allocation, overflow-checked arithmetic, hashing,
 * a monotonic clock.  Small things every module uses.
 *
 * base/ is the floor every other folder stands on: the error table (qerr.h),
 * these utilities, UTF-8 (utf8.h), growable buffers (buf.h) and the worker
 * pool (pool.h).  Anything in the project may include base/; base/ includes
 * nothing of the project but itself (scripts/check_includes.py checks). */
#ifndef QUIRE_UTIL_H
#define QUIRE_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* ---- logging ---------------------------------------------------------- */

typedef enum { QLOG_DEBUG = 0, QLOG_INFO = 1, QLOG_WARN = 2, QLOG_ERROR = 3, QLOG_OFF = 4 } qlog_level;

/* Sets the least severe level that is printed (default QLOG_INFO, or the
 * QUIRE_LOG environment variable: debug|info|warn|error|off). */
void qlog_set_level(qlog_level level);
qlog_level qlog_get_level(void);
/* Writes one line to stderr, "[quire] W message".  Thread-safe. */
void qlog(qlog_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define QLOGD(...) qlog(QLOG_DEBUG, __VA_ARGS__)
#define QLOGI(...) qlog(QLOG_INFO, __VA_ARGS__)
#define QLOGW(...) qlog(QLOG_WARN, __VA_ARGS__)
#define QLOGE(...) qlog(QLOG_ERROR, __VA_ARGS__)

/* ---- checked allocation ----------------------------------------------- */

/* Allocation that input can drive goes through these.  They return NULL on
 * failure (never abort), and q_mallocn/q_callocn return NULL when n * size
 * overflows.  Sizes above QUIRE_ALLOC_LIMIT (default 64 GiB, settable for
 * fuzzing) are refused as well, so that a hostile header cannot make the
 * process try a huge allocation. */
void *q_malloc(size_t size);
void *q_mallocn(size_t n, size_t size);
void *q_callocn(size_t n, size_t size);
void *q_reallocn(void *p, size_t n, size_t size);
char *q_strdup(const char *s);
char *q_strndup(const char *s, size_t n);
void q_set_alloc_limit(size_t bytes);
/* Allocates size bytes aligned to 64 (for SIMD); free with q_free_aligned. */
void *q_malloc_aligned(size_t size);
void q_free_aligned(void *p);

/* Overflow-checked arithmetic: return 1 on overflow, else store and return 0. */
static inline int q_mul_overflow(size_t a, size_t b, size_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}
static inline int q_add_overflow(size_t a, size_t b, size_t *out)
{
    return __builtin_add_overflow(a, b, out);
}

/* ---- hashing ---------------------------------------------------------- */

/* A 128-bit non-cryptographic hash state (two independently seeded 64-bit
 * lanes).  Used for model fingerprints and prefix-block hashes: equal input
 * gives equal output on every platform (little-endian byte order). */
typedef struct { uint64_t a, b; uint64_t len; } qhash;

void qhash_init(qhash *h, uint64_t seed);
void qhash_update(qhash *h, const void *data, size_t n);
void qhash_u64(qhash *h, uint64_t v);
/* Writes 16 bytes. */
void qhash_final(const qhash *h, uint8_t out[16]);
/* Writes 32 lowercase hex digits and a NUL into out. */
void q_hex(const uint8_t *bytes, size_t n, char *out);

/* ---- time ------------------------------------------------------------- */

/* Monotonic seconds. */
double q_now(void);

/* 64 random bits from the system's entropy (getrandom), else from the
 * clock and a counter.  Cannot fail. */
uint64_t q_random_u64(void);

/* Online processors (>= 1). */
int q_ncpus(void);

/* ---- fp16 / bf16 ------------------------------------------------------ */

float q_f16_to_f32(uint16_t h);
uint16_t q_f32_to_f16(float f);
static inline float q_bf16_to_f32(uint16_t h)
{
    union { uint32_t u; float f; } v = { .u = (uint32_t)h << 16 };
    return v.f;
}
/* Round to nearest even. */
uint16_t q_f32_to_bf16(float f);

/* ---- files ------------------------------------------------------------ */

/* Reads a whole file (at most max_bytes) into a NUL-terminated buffer owned
 * by the caller.  Returns 0 or a QERR_* code with a message in err. */
int q_read_file(const char *path, size_t max_bytes, char **out, size_t *len,
                char *err, size_t errlen);

#endif
