/* util.c - logging, checked allocation, the 128-bit hash, the monotonic
 * clock, fp16/bf16 conversion and whole-file reads (see util.h). */
#define _GNU_SOURCE
#include "util.h"
#include "qerr.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <strings.h>
#include <time.h>
#include <stdatomic.h>
#include <sys/random.h>

/* ---- logging ---------------------------------------------------------- */

static int g_log_level = -1;
static pthread_mutex_t g_log_mu = PTHREAD_MUTEX_INITIALIZER;

static qlog_level log_level_from_env(void)
{
    const char *e = getenv("QUIRE_LOG");
    if (!e) return QLOG_INFO;
    if (!strcasecmp(e, "debug")) return QLOG_DEBUG;
    if (!strcasecmp(e, "warn")) return QLOG_WARN;
    if (!strcasecmp(e, "error")) return QLOG_ERROR;
    if (!strcasecmp(e, "off")) return QLOG_OFF;
    return QLOG_INFO;
}

void qlog_set_level(qlog_level level) { __atomic_store_n(&g_log_level, (int)level, __ATOMIC_RELAXED); }

qlog_level qlog_get_level(void)
{
    int l = __atomic_load_n(&g_log_level, __ATOMIC_RELAXED);
    if (l < 0) {
        l = (int)log_level_from_env();
        __atomic_store_n(&g_log_level, l, __ATOMIC_RELAXED);
    }
    return (qlog_level)l;
}

void qlog(qlog_level level, const char *fmt, ...)
{
    if (level < qlog_get_level()) return;
    static const char tags[] = "DIWE";
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&g_log_mu);
    fprintf(stderr, "[quire] %c %s\n", tags[level & 3], line);
    pthread_mutex_unlock(&g_log_mu);
}

/* ---- allocation ------------------------------------------------------- */

static size_t g_alloc_limit = (size_t)64 << 30;

void q_set_alloc_limit(size_t bytes) { g_alloc_limit = bytes; }

void *q_malloc(size_t size)
{
    if (size > g_alloc_limit) return NULL;
    return malloc(size ? size : 1);
}

void *q_mallocn(size_t n, size_t size)
{
    size_t total;
    if (q_mul_overflow(n, size, &total)) return NULL;
    return q_malloc(total);
}

void *q_callocn(size_t n, size_t size)
{
    size_t total;
    if (q_mul_overflow(n, size, &total) || total > g_alloc_limit) return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *q_reallocn(void *p, size_t n, size_t size)
{
    size_t total;
    if (q_mul_overflow(n, size, &total) || total > g_alloc_limit) return NULL;
    return realloc(p, total ? total : 1);
}

char *q_strndup(const char *s, size_t n)
{
    char *d = q_malloc(n + 1);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

char *q_strdup(const char *s) { return q_strndup(s, strlen(s)); }

void *q_malloc_aligned(size_t size)
{
    if (size > g_alloc_limit) return NULL;
    void *p = NULL;
    size = (size + 63) & ~(size_t)63;
    if (posix_memalign(&p, 64, size ? size : 64)) return NULL;
    return p;
}

void q_free_aligned(void *p) { free(p); }

/* ---- hashing ---------------------------------------------------------- */

/* Each lane absorbs 8-byte words with a multiply-xorshift round (the
 * finaliser of SplitMix64 / Murmur3).  Not cryptographic: the prefix cache
 * also compares token ids where it matters. */
static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

void qhash_init(qhash *h, uint64_t seed)
{
    h->a = mix64(seed ^ 0x9e3779b97f4a7c15ULL);
    h->b = mix64(seed + 0x632be59bd9b4e019ULL);
    h->len = 0;
}

static inline void absorb(qhash *h, uint64_t w)
{
    h->a = mix64(h->a ^ w) + 0x9e3779b97f4a7c15ULL;
    h->b = mix64(h->b + (w ^ 0xd6e8feb86659fd93ULL)) ^ (h->a >> 17);
}

void qhash_update(qhash *h, const void *data, size_t n)
{
    const unsigned char *p = data;
    h->len += n;
    while (n >= 8) {
        uint64_t w = 0;
        for (int i = 0; i < 8; i++) w |= (uint64_t)p[i] << (8 * i);
        absorb(h, w);
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0x80;
        for (size_t i = 0; i < n; i++) w = (w << 8) | p[i];
        absorb(h, w);
    }
}

void qhash_u64(qhash *h, uint64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    qhash_update(h, b, 8);
}

void qhash_final(const qhash *h, uint8_t out[16])
{
    uint64_t a = mix64(h->a ^ h->len), b = mix64(h->b ^ (h->len * 31 + 7) ^ a);
    for (int i = 0; i < 8; i++) {
        out[i] = (uint8_t)(a >> (8 * i));
        out[8 + i] = (uint8_t)(b >> (8 * i));
    }
}

void q_hex(const uint8_t *bytes, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[bytes[i] >> 4];
        out[2 * i + 1] = d[bytes[i] & 15];
    }
    out[2 * n] = 0;
}

/* ---- time ------------------------------------------------------------- */

double q_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- fp16 / bf16 ------------------------------------------------------ */

float q_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            man &= 0x3ff;
            bits = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp - 15 + 127) << 23) | (man << 13);
    }
    union { uint32_t u; float f; } v = { .u = bits };
    return v.f;
}

uint16_t q_f32_to_f16(float f)
{
    union { float f; uint32_t u; } v = { .f = f };
    uint32_t x = v.u, sign = (x >> 16) & 0x8000;
    int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
    return (uint16_t)half;
}

uint16_t q_f32_to_bf16(float f)
{
    union { float f; uint32_t u; } v = { .f = f };
    if ((v.u & 0x7fffffff) > 0x7f800000) return (uint16_t)((v.u >> 16) | 0x40);
    uint32_t r = v.u + 0x7fff + ((v.u >> 16) & 1);
    return (uint16_t)(r >> 16);
}

/* ---- files ------------------------------------------------------------ */

int q_read_file(const char *path, size_t max_bytes, char **out, size_t *len,
                char *err, size_t errlen)
{
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return qerr_set(err, errlen, QERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 4096, n = 0;
    char *buf = q_malloc(cap);
    if (!buf) { fclose(f); return qerr_set(err, errlen, QERR_NOMEM, "%s: out of memory", path); }
    for (;;) {
        if (n + 1 >= cap) {
            if (cap > max_bytes) {
                free(buf);
                fclose(f);
                return qerr_set(err, errlen, QERR_LIMIT, "%s: larger than %zu bytes", path, max_bytes);
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) { free(buf); fclose(f); return qerr_set(err, errlen, QERR_NOMEM, "%s: out of memory", path); }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        if (r == 0) break;
        n += r;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad || n > max_bytes) {
        free(buf);
        return qerr_set(err, errlen, bad ? QERR_IO : QERR_LIMIT, "%s: %s", path,
                        bad ? "read error" : "file too large");
    }
    buf[n] = 0;
    *out = buf;
    if (len) *len = n;
    return 0;
}

int q_ncpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* Appends n bytes (and keeps a NUL after them): 0, or QERR_NOMEM with the
 * buffer unchanged. */
uint64_t q_random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) == (ssize_t)sizeof v) return v;
    /* No entropy source: the clock and a counter, mixed (splitmix64). */
    static _Atomic uint64_t counter;
    v = (uint64_t)(q_now() * 1e9) ^ (atomic_fetch_add(&counter, 1) * 0x9e3779b97f4a7c15ULL);
    v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ULL;
    v = (v ^ (v >> 27)) * 0x94d049bb133111ebULL;
    return v ^ (v >> 31);
}
