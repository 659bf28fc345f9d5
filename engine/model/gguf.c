/* gguf.c - the GGUF loader: one file, already in memory, to a qmodel.
 *
 * The format (v2 and v3; v1 used 32-bit counts and is refused), all
 * little-endian:
 *
 *     "GGUF"  u32 version  u64 tensor_count  u64 kv_count
 *     kv_count times:      string key, u32 value type, value
 *     tensor_count times:  string name, u32 n_dims, u64 ne[n_dims],
 *                          u32 ggml type, u64 offset
 *     padding to general.alignment (default 32)
 *     data section:        each tensor at data_start + offset
 *
 * A string is a u64 byte count and that many bytes (no NUL).  A value is one
 * of 13 types: u8 i8 u16 i16 u32 i32 f32 bool string array u64 i64 f64; an
 * array is u32 element type, u64 count, elements, and may nest.  ne[0] is
 * the fastest-varying dimension, so shapes are reversed into PyTorch order:
 * a (out, in) weight is stored as ne = {in, out}.
 *
 * gguf_parse works in three passes over the image:
 *
 *   1. scan every key/value, checking bounds and types but copying nothing,
 *      into a table of (key, type, value offset) with a hash index: a
 *      duplicated key is an error, and later lookups are O(1);
 *   2. read what quire uses from that table: the architecture and its
 *      hyperparameters, then the tokenizer (copied into m->vocab);
 *   3. read the tensor infos, then check each tensor's data range and hand
 *      it to qmodel_add_tensor with data pointing into the image.
 *
 * Invariants, which are what keeps a hostile file harmless:
 *
 *   1. No read goes past len: every read goes through need(), which compares
 *      against the bytes left before touching them.
 *   2. No count from the file sizes an allocation before it is checked
 *      against the bytes that are left: each element of a counted list needs
 *      a known minimum number of bytes (a KV at least 14, a tensor info 33,
 *      a string 8), so count <= left / minimum bounds every allocation by a
 *      small multiple of the file size, whatever the header claims.
 *   3. Arithmetic on sizes and offsets from the file is overflow-checked.
 *   4. Array nesting is limited (GGUF_MAX_DEPTH), so recursion is bounded;
 *      every element consumes at least one byte, so scanning is linear.
 *   5. Every error names the problem: "gguf: ", the key or tensor when
 *      there is one, and what is wrong with it.
 *
 * On error m may hold part of what was read (tensors, vocabulary); the
 * caller releases it with qmodel_destroy as usual.
 */
#include "arch.h"
#include "model.h"
#include "util.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the format's constants -------------------------------------------- */

enum {
    GT_U8 = 0, GT_I8 = 1, GT_U16 = 2, GT_I16 = 3, GT_U32 = 4, GT_I32 = 5, GT_F32 = 6,
    GT_BOOL = 7, GT_STRING = 8, GT_ARRAY = 9, GT_U64 = 10, GT_I64 = 11, GT_F64 = 12,
    GT_COUNT = 13
};

static const char *const gt_name[GT_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

/* Bytes of a scalar; for string and array, the least bytes one can take
 * (an empty string is its u64 length, an empty array its type and count). */
static const uint8_t gt_min_size[GT_COUNT] = { 1, 1, 2, 2, 4, 4, 4, 1, 8, 12, 8, 8, 8 };

/* ggml tensor types, for naming the unsupported ones in messages. */
static const char *ggml_type_name(uint32_t t)
{
    static const char *const names[] = {
        "F32", "F16", "Q4_0", "Q4_1", NULL, NULL, "Q5_0", "Q5_1", "Q8_0", "Q8_1",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
        "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64",
        "IQ1_M", "BF16", NULL, NULL, NULL, "TQ1_0", "TQ2_0", NULL, NULL, NULL, "MXFP4",
    };
    if (t < sizeof names / sizeof names[0] && names[t]) return names[t];
    return "unknown";
}

#define GGUF_DEFAULT_ALIGN 32
#define GGUF_MAX_ALIGN (1u << 20)
#define GGUF_MAX_DEPTH 8
#define GGUF_MAX_KV (1 << 16)
#define GGUF_MAX_DIM_SIZE ((uint64_t)1 << 40) /* qmodel_add_tensor's limit too */
#define GGUF_KV_MIN (8 + 1 + 4 + 1)           /* key length, 1-byte key, type, u8 */
#define GGUF_TI_MIN (8 + 1 + 4 + 8 + 4 + 8)   /* name length, 1-byte name, n_dims, ne[0], type, offset */

/* ---- reading with bounds ------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    size_t len, pos;
    char *err;
    size_t errlen;
    const char *what;            /* "key" / "tensor": the item errors name, or NULL */
    const char *name;
    size_t name_len;
} gctx;

static int gfail(gctx *g, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int gfail(gctx *g, int rc, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (g->what)
        return qerr_set(g->err, g->errlen, rc, "gguf: %s '%.*s': %s", g->what, (int)g->name_len,
                        g->name, msg);
    return qerr_set(g->err, g->errlen, rc, "gguf: %s", msg);
}

static void set_item(gctx *g, const char *what, const char *name, size_t name_len)
{
    g->what = what;
    g->name = name;
    g->name_len = name_len;
}

static int need(gctx *g, size_t n, const char *what)
{
    if (n > g->len - g->pos)
        return gfail(g, QERR_FORMAT, "truncated file: %s at offset %zu needs %zu bytes, %zu left",
                     what, g->pos, n, g->len - g->pos);
    return 0;
}

static uint64_t le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static int rd_u32(gctx *g, uint32_t *v, const char *what)
{
    int rc = need(g, 4, what);
    if (rc) return rc;
    *v = (uint32_t)le(g->p + g->pos, 4);
    g->pos += 4;
    return 0;
}

static int rd_u64(gctx *g, uint64_t *v, const char *what)
{
    int rc = need(g, 8, what);
    if (rc) return rc;
    *v = le(g->p + g->pos, 8);
    g->pos += 8;
    return 0;
}

/* A string: *s points into the image, not NUL-terminated. */
static int rd_str(gctx *g, const char **s, size_t *n, const char *what)
{
    uint64_t len;
    int rc = rd_u64(g, &len, what);
    if (rc) return rc;
    if (len > g->len - g->pos)
        return gfail(g, QERR_FORMAT, "truncated file: %s at offset %zu is %llu bytes long, %zu left",
                     what, g->pos, (unsigned long long)len, g->len - g->pos);
    *s = (const char *)g->p + g->pos;
    *n = (size_t)len;
    g->pos += (size_t)len;
    return 0;
}

/* ---- pass 1: the key/value table ---------------------------------------- */

/* Both kinds of record start with their name, so one hash index serves both. */
typedef struct {
    const char *s;
    size_t n;
} gname;

typedef struct {
    gname key;
    uint32_t type;
    size_t val;                  /* offset of the value */
    uint32_t arr_type;           /* arrays: element type, count, first element */
    uint64_t arr_n;
    size_t arr_data;
} gkv;

typedef struct {
    gname name;
    int ndim;
    uint64_t ne[QT_MAX_DIMS];
    qdtype dt;
    uint64_t offset;
    size_t nbytes;
} gtinfo;

/* Open addressing over records of `stride` bytes that start with a gname;
 * slots hold record index + 1. */
typedef struct {
    uint32_t *slot;
    size_t mask;
    const char *base;
    size_t stride;
} gindex;

static uint64_t name_hash(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ULL;
    return h;
}

static const gname *ix_at(const gindex *ix, uint32_t i)
{
    return (const gname *)(const void *)(ix->base + (size_t)i * ix->stride);
}

/* Indexes n records (n <= 2^30).  Returns 0, or QERR_NOMEM; *dup is the
 * index of the first record whose name repeats an earlier one, or -1. */
static int ix_build(gindex *ix, const void *base, size_t n, size_t stride, long *dup)
{
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    ix->slot = q_callocn(cap, sizeof *ix->slot);
    if (!ix->slot) return QERR_NOMEM;
    ix->mask = cap - 1;
    ix->base = base;
    ix->stride = stride;
    *dup = -1;
    for (size_t i = 0; i < n; i++) {
        const gname *nm = ix_at(ix, (uint32_t)i);
        size_t h = (size_t)name_hash(nm->s, nm->n) & ix->mask;
        for (;; h = (h + 1) & ix->mask) {
            uint32_t s = ix->slot[h];
            if (!s) {
                ix->slot[h] = (uint32_t)i + 1;
                break;
            }
            const gname *o = ix_at(ix, s - 1);
            if (o->n == nm->n && !memcmp(o->s, nm->s, nm->n)) {
                *dup = (long)i;
                return 0;
            }
        }
    }
    return 0;
}

static long ix_find(const gindex *ix, const char *s, size_t n)
{
    for (size_t h = (size_t)name_hash(s, n) & ix->mask;; h = (h + 1) & ix->mask) {
        uint32_t i = ix->slot[h];
        if (!i) return -1;
        const gname *o = ix_at(ix, i - 1);
        if (o->n == n && !memcmp(o->s, s, n)) return (long)i - 1;
    }
}

static int skip_value(gctx *g, uint32_t type, int depth);

/* Reads an array header at g->pos and skips its elements. */
static int skip_array(gctx *g, int depth, uint32_t *et, uint64_t *count, size_t *data)
{
    int rc;
    if (depth > GGUF_MAX_DEPTH)
        return gfail(g, QERR_UNSUPPORTED, "arrays nested deeper than %d levels", GGUF_MAX_DEPTH);
    if ((rc = rd_u32(g, et, "array element type")) || (rc = rd_u64(g, count, "array count")))
        return rc;
    if (*et >= GT_COUNT) return gfail(g, QERR_FORMAT, "unknown array element type %u", *et);
    *data = g->pos;
    size_t min = gt_min_size[*et], left = g->len - g->pos;
    if (*count > left / min)
        return gfail(g, QERR_FORMAT, "array of %llu %s elements does not fit in the %zu bytes left",
                     (unsigned long long)*count, gt_name[*et], left);
    if (*et != GT_STRING && *et != GT_ARRAY) {
        g->pos += (size_t)*count * min;
        return 0;
    }
    for (uint64_t i = 0; i < *count; i++)
        if ((rc = skip_value(g, *et, depth + 1))) return rc;
    return 0;
}

static int skip_value(gctx *g, uint32_t type, int depth)
{
    if (type >= GT_COUNT) return gfail(g, QERR_FORMAT, "unknown value type %u", type);
    if (type == GT_STRING) {
        const char *s;
        size_t n;
        return rd_str(g, &s, &n, "string value");
    }
    if (type == GT_ARRAY) {
        uint32_t et;
        uint64_t count;
        size_t data;
        return skip_array(g, depth, &et, &count, &data);
    }
    int rc = need(g, gt_min_size[type], gt_name[type]);
    if (!rc) g->pos += gt_min_size[type];
    return rc;
}

/* A key or tensor name: 1..QMODEL_MAX_NAME bytes, no NUL. */
static int check_name(gctx *g, const char *kind, uint64_t i, const char *s, size_t n)
{
    if (n == 0) return gfail(g, QERR_FORMAT, "%s %llu has an empty name", kind, (unsigned long long)i);
    if (n > QMODEL_MAX_NAME)
        return gfail(g, QERR_FORMAT, "%s %llu has a name of %zu bytes (limit %d)", kind,
                     (unsigned long long)i, n, QMODEL_MAX_NAME);
    if (memchr(s, 0, n))
        return gfail(g, QERR_FORMAT, "%s %llu: name '%.*s' contains a NUL byte", kind,
                     (unsigned long long)i, (int)n, s);
    return 0;
}

static int scan_kvs(gctx *g, uint64_t n_kv, gkv **out, gindex *ix)
{
    int rc;
    if (n_kv > (g->len - g->pos) / GGUF_KV_MIN)
        return gfail(g, QERR_FORMAT, "kv_count %llu does not fit in the %zu bytes left",
                     (unsigned long long)n_kv, g->len - g->pos);
    gkv *kvs = q_callocn((size_t)n_kv, sizeof *kvs);
    if (!kvs) return gfail(g, QERR_NOMEM, "out of memory for %llu metadata entries", (unsigned long long)n_kv);
    *out = kvs;
    for (uint64_t i = 0; i < n_kv; i++) {
        gkv *kv = &kvs[i];
        set_item(g, NULL, NULL, 0);
        if ((rc = rd_str(g, &kv->key.s, &kv->key.n, "metadata key"))) return rc;
        if ((rc = check_name(g, "metadata key", i, kv->key.s, kv->key.n))) return rc;
        set_item(g, "key", kv->key.s, kv->key.n);
        if ((rc = rd_u32(g, &kv->type, "value type"))) return rc;
        kv->val = g->pos;
        if (kv->type == GT_ARRAY)
            rc = skip_array(g, 1, &kv->arr_type, &kv->arr_n, &kv->arr_data);
        else
            rc = skip_value(g, kv->type, 0);
        if (rc) return rc;
    }
    set_item(g, NULL, NULL, 0);
    long dup;
    if (ix_build(ix, kvs, (size_t)n_kv, sizeof *kvs, &dup))
        return gfail(g, QERR_NOMEM, "out of memory for the metadata index");
    if (dup >= 0)
        return gfail(g, QERR_FORMAT, "metadata key '%.*s' appears twice", (int)kvs[dup].key.n, kvs[dup].key.s);
    return 0;
}

/* ---- pass 2: typed lookups ---------------------------------------------- */

typedef struct {
    gctx *g;
    const gkv *kvs;
    gindex ix;
} gmeta;

static const gkv *meta_get(const gmeta *md, const char *key)
{
    long i = ix_find(&md->ix, key, strlen(key));
    return i < 0 ? NULL : &md->kvs[i];
}

static int is_int_type(uint32_t t)
{
    return t <= GT_I32 || t == GT_U64 || t == GT_I64;
}

static int is_signed_type(uint32_t t)
{
    return t == GT_I8 || t == GT_I16 || t == GT_I32 || t == GT_I64;
}

/* Raw integer of any integer type at offset off: unsigned types in *u,
 * signed ones in *s (with *is_signed set).  Bounds were checked in pass 1. */
static void int_at(const gctx *g, uint32_t type, size_t off, uint64_t *u, int64_t *s, int *is_signed)
{
    int n = gt_min_size[type];
    uint64_t v = le(g->p + off, n);
    *is_signed = is_signed_type(type);
    *u = v;
    if (*is_signed) {
        if (n < 8 && (v >> (8 * n - 1)) & 1) v |= ~(uint64_t)0 << (8 * n); /* sign-extend */
        memcpy(s, &v, sizeof v);
    } else {
        *s = 0;
    }
}

static int wrong_type(gctx *g, const gkv *kv, const char *expected)
{
    if (kv->type == GT_ARRAY)
        return gfail(g, QERR_FORMAT, "key '%.*s' is an array of %s, expected %s", (int)kv->key.n,
                     kv->key.s, gt_name[kv->arr_type], expected);
    return gfail(g, QERR_FORMAT, "key '%.*s' has type %s, expected %s", (int)kv->key.n, kv->key.s,
                 gt_name[kv->type], expected);
}

/* An integer in [lo, hi], stored with any integer type.  Absent: *out =
 * dflt, or an error when required. */
static int meta_int(const gmeta *md, const char *key, int required, int64_t lo, int64_t hi,
                    int64_t dflt, int64_t *out)
{
    gctx *g = md->g;
    const gkv *kv = meta_get(md, key);
    if (!kv) {
        if (required) return gfail(g, QERR_FORMAT, "missing metadata '%s'", key);
        *out = dflt;
        return 0;
    }
    if (!is_int_type(kv->type)) return wrong_type(g, kv, "an integer");
    uint64_t u;
    int64_t s;
    int sg;
    int_at(g, kv->type, kv->val, &u, &s, &sg);
    if (sg ? (s < lo || s > hi) : (u > (uint64_t)hi || (int64_t)u < lo)) {
        if (sg)
            return gfail(g, QERR_RANGE, "key '%s' = %lld is out of range [%lld, %lld]", key,
                         (long long)s, (long long)lo, (long long)hi);
        return gfail(g, QERR_RANGE, "key '%s' = %llu is out of range [%lld, %lld]", key,
                     (unsigned long long)u, (long long)lo, (long long)hi);
    }
    *out = sg ? s : (int64_t)u;
    return 0;
}

/* A float in (0, hi], stored as f32, f64 or an integer. */
static int meta_pos_float(const gmeta *md, const char *key, double hi, float dflt, float *out)
{
    gctx *g = md->g;
    const gkv *kv = meta_get(md, key);
    if (!kv) {
        *out = dflt;
        return 0;
    }
    double v;
    if (kv->type == GT_F32) {
        uint32_t b = (uint32_t)le(g->p + kv->val, 4);
        float f;
        memcpy(&f, &b, sizeof f);
        v = f;
    } else if (kv->type == GT_F64) {
        uint64_t b = le(g->p + kv->val, 8);
        memcpy(&v, &b, sizeof v);
    } else if (is_int_type(kv->type)) {
        uint64_t u;
        int64_t s;
        int sg;
        int_at(g, kv->type, kv->val, &u, &s, &sg);
        v = sg ? (double)s : (double)u;
    } else {
        return wrong_type(g, kv, "a number");
    }
    if (!(v > 0 && v <= hi))
        return gfail(g, QERR_RANGE, "key '%s' = %g is out of range (0, %g]", key, v, hi);
    *out = (float)v;
    return 0;
}

/* A string (not NUL-terminated).  Returns 1 found, 0 absent, or a QERR_*. */
static int meta_str(const gmeta *md, const char *key, const char **s, size_t *n)
{
    const gkv *kv = meta_get(md, key);
    if (!kv) return 0;
    if (kv->type != GT_STRING) return wrong_type(md->g, kv, "a string");
    *n = (size_t)le(md->g->p + kv->val, 8);
    *s = (const char *)md->g->p + kv->val + 8;
    return 1;
}

static int str_is(const char *s, size_t n, const char *lit)
{
    return n == strlen(lit) && !memcmp(s, lit, n);
}

/* Short printable form of a file string for messages. */
static int shown(size_t n)
{
    return n > 64 ? 64 : (int)n;
}

/* The sliding window and the rest that Gemma's files carry, as llama.cpp
 * reads them: "<arch>.attention.sliding_window" with the family's pattern
 * of local layers, the soft-caps "<arch>.attn_logit_softcapping" and
 * "<arch>.final_logit_softcapping" (absent: none), and no attention scale
 * key (head_dim^-1/2, or (dim / n_heads)^-1/2 at the family's 27B depth).
 * The norms already hold (1 + w). */
static int read_local_attention(const gmeta *md, const qfamily *f, qhparams *hp)
{
    char key[80];
    int64_t v;
    int rc;
    snprintf(key, sizeof key, "%s.attention.sliding_window", f->gguf_arch);
    if ((rc = meta_int(md, key, 0, 0, INT_MAX, 0, &v))) return rc;
    hp->window = (int)v;
    snprintf(key, sizeof key, "%s.attn_logit_softcapping", f->gguf_arch);
    if (meta_get(md, key) && (rc = meta_pos_float(md, key, 1e6, 0.0f, &hp->attn_softcap))) return rc;
    snprintf(key, sizeof key, "%s.final_logit_softcapping", f->gguf_arch);
    if (meta_get(md, key) && (rc = meta_pos_float(md, key, 1e6, 0.0f, &hp->final_softcap))) return rc;
    if (f->hf_query_scalar)
        hp->attn_scale = 1.0f / sqrtf((float)(hp->n_layers == f->gguf_wide_scale_layers ? hp->dim / hp->n_heads
                                                                                       : hp->head_dim));
    /* LongRoPE (Phi-3): the converter writes the attention factor, the
     * original context and the two factor tensors. */
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", f->gguf_arch);
    if (f->gguf_names->name[QTN_ROPE_LONG] && meta_get(md, key)) {
        if ((rc = meta_pos_float(md, key, 100, 1.0f, &hp->rope_mscale))) return rc;
        snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", f->gguf_arch);
        if ((rc = meta_int(md, key, 1, 1, INT_MAX, 0, &v))) return rc;
        hp->rope_orig_ctx = (int)v;
        hp->rope_scaling = QROPE_SCALE_LONGROPE;
        hp->rope_factor = hp->max_ctx > 0 ? (float)hp->max_ctx / (float)v : 1.0f;
    }
    return 0;
}

static int read_hparams(const gmeta *md, qmodel *m)
{
    gctx *g = md->g;
    qhparams *hp = &m->hp;
    const char *s, *arch;
    size_t n;
    int rc = meta_str(md, "general.architecture", &s, &n);
    if (rc < 0) return rc;
    if (rc == 0) return gfail(g, QERR_FORMAT, "missing metadata 'general.architecture'");
    const int fam = qfamily_by_gguf(s, n);
    if (fam < 0) {
        char known[128];
        qfamily_list(1, known, sizeof known);
        return gfail(g, QERR_UNSUPPORTED, "architecture '%.*s' is not supported (quire runs %s)", shown(n), s, known);
    }
    arch = qfamily_get(fam)->gguf_arch;
    qfamily_apply(fam, hp);
    /* llama.cpp's converter permutes a Llama's Q/K for adjacent-pair RoPE
     * and keeps rotate-half for the others (the row says which). */
    hp->rope_neox = qfamily_get(fam)->gguf_rope_neox;

    if ((rc = meta_str(md, "general.name", &s, &n)) < 0) return rc;
    if (rc == 1 && !(m->name = q_strndup(s, n))) return gfail(g, QERR_NOMEM, "out of memory");

    char key[64];
    int64_t v;
#define ARCH_INT(suffix, req, lo, hi, dflt, field)                       \
    do {                                                                 \
        snprintf(key, sizeof key, "%s.%s", arch, suffix);                \
        if ((rc = meta_int(md, key, req, lo, hi, dflt, &v))) return rc; \
        hp->field = (int)v;                                              \
    } while (0)
    ARCH_INT("embedding_length", 1, 1, QMODEL_MAX_DIM, 0, dim);
    ARCH_INT("block_count", 1, 1, QMODEL_MAX_LAYERS, 0, n_layers);
    ARCH_INT("feed_forward_length", 1, 1, QMODEL_MAX_DIM * 8, 0, ffn_dim);
    ARCH_INT("attention.head_count", 1, 1, QMODEL_MAX_DIM, 0, n_heads);
    ARCH_INT("attention.head_count_kv", 0, 1, QMODEL_MAX_DIM, hp->n_heads, n_kv_heads);
    ARCH_INT("context_length", 0, 1, INT_MAX, 0, max_ctx);
    ARCH_INT("attention.key_length", 0, 1, QMODEL_MAX_DIM, hp->dim / hp->n_heads, head_dim);
    ARCH_INT("rope.dimension_count", 0, 1, QMODEL_MAX_DIM, hp->head_dim, rope_dim);
    ARCH_INT("vocab_size", 0, 1, QMODEL_MAX_VOCAB, 0, n_vocab);
#undef ARCH_INT

    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", arch);
    if ((rc = meta_pos_float(md, key, 1.0, 1e-5f, &hp->norm_eps))) return rc;
    snprintf(key, sizeof key, "%s.rope.freq_base", arch);
    if ((rc = meta_pos_float(md, key, 1e12, 10000.0f, &hp->rope_theta))) return rc;

    hp->rope_scaling = QROPE_SCALE_NONE;
    hp->rope_factor = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if ((rc = meta_str(md, key, &s, &n)) < 0) return rc;
    if (rc == 1 && !str_is(s, n, "none")) {
        if (!str_is(s, n, "linear"))
            return gfail(g, QERR_UNSUPPORTED, "key '%s': rope scaling '%.*s' is not supported (none and linear are)",
                         key, shown(n), s);
        hp->rope_scaling = QROPE_SCALE_LINEAR;
        snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
        if ((rc = meta_pos_float(md, key, 1e6, 1.0f, &hp->rope_factor))) return rc;
    }
    return read_local_attention(md, qfamily_get(fam), hp);
}

/* A token id: u32 0xFFFFFFFF (or any unsigned all-ones) and negative values
 * mean absent (-1); so does an id past the vocabulary, with a warning, as the
 * binder also drops those. */
static int meta_token_id(const gmeta *md, const char *key, int n_tokens, int *out)
{
    gctx *g = md->g;
    const gkv *kv = meta_get(md, key);
    *out = -1;
    if (!kv) return 0;
    if (!is_int_type(kv->type)) return wrong_type(g, kv, "an integer");
    uint64_t u;
    int64_t s;
    int sg;
    int_at(g, kv->type, kv->val, &u, &s, &sg);
    if (sg ? s < 0 : (u == UINT32_MAX || u == UINT64_MAX)) return 0;
    uint64_t id = sg ? (uint64_t)s : u;
    if (id >= (uint64_t)(n_tokens > 0 ? n_tokens : QMODEL_MAX_VOCAB)) {
        QLOGW("gguf: %s = %llu is past the vocabulary; ignored", key, (unsigned long long)id);
        return 0;
    }
    *out = (int)id;
    return 0;
}

/* An array of element type et with exactly want elements (0: any count;
 * negative: there are no tokens, so the array may not be there at all).
 * Returns 1 found, 0 absent, or a QERR_*. */
static int meta_array(const gmeta *md, const char *key, uint32_t et, int want, const gkv **out)
{
    gctx *g = md->g;
    const gkv *kv = meta_get(md, key);
    if (!kv) return 0;
    if (kv->type != GT_ARRAY || kv->arr_type != et) {
        char what[32];
        snprintf(what, sizeof what, "an array of %s", gt_name[et]);
        return wrong_type(g, kv, what);
    }
    if (want < 0)
        return gfail(g, QERR_FORMAT, "key '%s' is present but tokenizer.ggml.tokens is missing or empty", key);
    if (want > 0 && kv->arr_n != (uint64_t)want)
        return gfail(g, QERR_FORMAT, "key '%s' has %llu entries but tokenizer.ggml.tokens has %d", key,
                     (unsigned long long)kv->arr_n, want);
    *out = kv;
    return 1;
}

/* Copies a string array (already bounds-checked) into owned strings.
 * *dst gets the (calloc'ed) table first, *count its size, so that a failure
 * halfway leaves nothing qmodel_destroy cannot free. */
static int copy_strings(const gmeta *md, const gkv *kv, char ***dst, int *count)
{
    gctx *g = md->g;
    int rc;
    *dst = q_callocn((size_t)kv->arr_n, sizeof **dst);
    if (!*dst) return gfail(g, QERR_NOMEM, "out of memory for %llu strings", (unsigned long long)kv->arr_n);
    *count = (int)kv->arr_n;
    gctx r = *g;
    r.pos = kv->arr_data;
    for (int i = 0; i < *count; i++) {
        const char *s = NULL;
        size_t n = 0;
        if ((rc = rd_str(&r, &s, &n, "string"))) return rc;
        if (memchr(s, 0, n))
            return gfail(g, QERR_FORMAT, "key '%.*s': entry %d contains a NUL byte", (int)kv->key.n, kv->key.s, i);
        if (!((*dst)[i] = q_strndup(s, n))) return gfail(g, QERR_NOMEM, "out of memory");
    }
    return 0;
}

static int read_vocab(const gmeta *md, qmodel *m)
{
    gctx *g = md->g;
    qvocab *v = &m->vocab;
    const char *s;
    size_t n;
    int rc;

    v->kind = QVOCAB_NONE;
    if ((rc = meta_str(md, "tokenizer.ggml.model", &s, &n)) < 0) return rc;
    if (rc == 1) {
        if (str_is(s, n, "llama"))
            v->kind = QVOCAB_SPM;
        else if (str_is(s, n, "gpt2"))
            v->kind = QVOCAB_BPE;
        else if (!str_is(s, n, "none"))
            QLOGW("gguf: tokenizer model '%.*s' is not supported; loading without a tokenizer", shown(n), s);
    }

    const gkv *kv = NULL;
    if ((rc = meta_array(md, "tokenizer.ggml.tokens", GT_STRING, 0, &kv)) < 0) return rc;
    if (rc == 1 && kv->arr_n > QMODEL_MAX_VOCAB)
        return gfail(g, QERR_RANGE, "tokenizer.ggml.tokens has %llu entries (limit %d)",
                     (unsigned long long)kv->arr_n, QMODEL_MAX_VOCAB);
    if (rc == 1 && kv->arr_n > 0 && (rc = copy_strings(md, kv, &v->tokens, &v->n))) return rc;
    if (v->kind != QVOCAB_NONE && v->n == 0)
        return gfail(g, QERR_FORMAT, "tokenizer.ggml.model is set but tokenizer.ggml.tokens is missing or empty");

    /* Per-token arrays must match the token count; -1 makes an absent token
     * list mismatch any present array. */
    int want = v->n ? v->n : -1;
    if ((rc = meta_array(md, "tokenizer.ggml.scores", GT_F32, want, &kv)) < 0) return rc;
    if (rc == 1) {
        if (!(v->scores = q_callocn((size_t)v->n, sizeof *v->scores))) return gfail(g, QERR_NOMEM, "out of memory");
        for (int i = 0; i < v->n; i++) {
            uint32_t b = (uint32_t)le(g->p + kv->arr_data + 4 * (size_t)i, 4);
            memcpy(&v->scores[i], &b, sizeof b);
        }
    }
    if ((rc = meta_array(md, "tokenizer.ggml.token_type", GT_I32, want, &kv)) < 0) return rc;
    if (rc == 1) {
        if (!(v->types = q_callocn((size_t)v->n, sizeof *v->types))) return gfail(g, QERR_NOMEM, "out of memory");
        for (int i = 0; i < v->n; i++)
            v->types[i] = (int32_t)(uint32_t)le(g->p + kv->arr_data + 4 * (size_t)i, 4);
    }
    if ((rc = meta_array(md, "tokenizer.ggml.merges", GT_STRING, 0, &kv)) < 0) return rc;
    if (rc == 1 && kv->arr_n > INT_MAX)
        return gfail(g, QERR_RANGE, "tokenizer.ggml.merges has %llu entries", (unsigned long long)kv->arr_n);
    if (rc == 1 && kv->arr_n > 0 && (rc = copy_strings(md, kv, &v->merges, &v->n_merges))) return rc;
    if ((rc = meta_str(md, "tokenizer.ggml.pre", &s, &n)) < 0) return rc;
    if (rc == 1 && !(v->pre = q_strndup(s, n))) return gfail(g, QERR_NOMEM, "out of memory");
    if ((rc = meta_str(md, "tokenizer.chat_template", &s, &n)) < 0) return rc;
    if (rc == 1 && !(m->chat_template = q_strndup(s, n))) return gfail(g, QERR_NOMEM, "out of memory");

    int eos, extra;
    if ((rc = meta_token_id(md, "tokenizer.ggml.bos_token_id", v->n, &m->bos_id)) ||
        (rc = meta_token_id(md, "tokenizer.ggml.unknown_token_id", v->n, &m->unk_id)) ||
        (rc = meta_token_id(md, "tokenizer.ggml.padding_token_id", v->n, &m->pad_id)) ||
        (rc = meta_token_id(md, "tokenizer.ggml.eos_token_id", v->n, &eos)))
        return rc;
    m->n_eos = 0;
    if (eos >= 0) m->eos_ids[m->n_eos++] = eos;
    static const char *const extra_eos[] = { "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id" };
    for (size_t k = 0; k < sizeof extra_eos / sizeof extra_eos[0]; k++) {
        if ((rc = meta_token_id(md, extra_eos[k], v->n, &extra))) return rc;
        int seen = extra < 0;
        for (int i = 0; i < m->n_eos; i++) seen |= m->eos_ids[i] == extra;
        if (!seen) m->eos_ids[m->n_eos++] = extra;
    }

    m->add_bos = v->kind == QVOCAB_SPM;
    kv = meta_get(md, "tokenizer.ggml.add_bos_token");
    if (kv) {
        if (kv->type != GT_BOOL) return wrong_type(g, kv, "a bool");
        uint8_t b = g->p[kv->val];
        if (b > 1) return gfail(g, QERR_FORMAT, "key 'tokenizer.ggml.add_bos_token' has bool value %u", b);
        m->add_bos = b;
    }
    if (m->hp.n_vocab == 0) m->hp.n_vocab = v->n;
    return 0;
}

/* ---- pass 3: tensors ---------------------------------------------------- */

static int read_tensor_info(gctx *g, uint64_t i, gtinfo *t)
{
    int rc;
    uint32_t nd, type;
    set_item(g, NULL, NULL, 0);
    if ((rc = rd_str(g, &t->name.s, &t->name.n, "tensor name"))) return rc;
    if ((rc = check_name(g, "tensor", i, t->name.s, t->name.n))) return rc;
    set_item(g, "tensor", t->name.s, t->name.n);
    if ((rc = rd_u32(g, &nd, "n_dims"))) return rc;
    if (nd < 1 || nd > QT_MAX_DIMS)
        return gfail(g, QERR_FORMAT, "%u dimensions (1 to %d allowed)", nd, QT_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if ((rc = rd_u64(g, &t->ne[d], "dimension"))) return rc;
        if (t->ne[d] == 0 || t->ne[d] > GGUF_MAX_DIM_SIZE)
            return gfail(g, QERR_FORMAT, "dimension %d is %llu (1 to 2^40 allowed)", d,
                         (unsigned long long)t->ne[d]);
        if (__builtin_mul_overflow(numel, t->ne[d], &numel))
            return gfail(g, QERR_FORMAT, "element count overflows");
    }
    if ((rc = rd_u32(g, &type, "ggml type"))) return rc;
    if (type == 0)
        t->dt = QDT_F32;
    else if (type == 1)
        t->dt = QDT_F16;
    else if (type == 30)
        t->dt = QDT_BF16;
    else
        return gfail(g, QERR_UNSUPPORTED, "ggml type %u (%s) is not supported (F32, F16 and BF16 are)",
                     type, ggml_type_name(type));
    if (numel > SIZE_MAX || q_mul_overflow((size_t)numel, qdt_size(t->dt), &t->nbytes))
        return gfail(g, QERR_FORMAT, "byte size of %llu %s elements overflows", (unsigned long long)numel,
                     qdt_name(t->dt));
    return rd_u64(g, &t->offset, "tensor offset");
}

static int read_tensors(gctx *g, qmodel *m, uint64_t n_t, size_t align)
{
    int rc;
    if (n_t > (g->len - g->pos) / GGUF_TI_MIN)
        return gfail(g, QERR_FORMAT, "tensor_count %llu does not fit in the %zu bytes left",
                     (unsigned long long)n_t, g->len - g->pos);
    gtinfo *ti = q_callocn((size_t)n_t, sizeof *ti);
    gindex ix = { 0 };
    if (!ti) return gfail(g, QERR_NOMEM, "out of memory for %llu tensor infos", (unsigned long long)n_t);
    for (uint64_t i = 0; i < n_t; i++)
        if ((rc = read_tensor_info(g, i, &ti[i]))) goto out;
    set_item(g, NULL, NULL, 0);

    long dup;
    if (ix_build(&ix, ti, (size_t)n_t, sizeof *ti, &dup)) {
        rc = gfail(g, QERR_NOMEM, "out of memory for the tensor index");
        goto out;
    }
    if (dup >= 0) {
        rc = gfail(g, QERR_FORMAT, "tensor '%.*s' appears twice", (int)ti[dup].name.n, ti[dup].name.s);
        goto out;
    }

    size_t data_start;
    if (q_add_overflow(g->pos, align - 1, &data_start)) {
        rc = gfail(g, QERR_FORMAT, "data section offset overflows");
        goto out;
    }
    data_start &= ~(align - 1);
    for (uint64_t i = 0; i < n_t; i++) {
        const gtinfo *t = &ti[i];
        set_item(g, "tensor", t->name.s, t->name.n);
        size_t start, end;
        if (t->offset % align) {
            rc = gfail(g, QERR_FORMAT, "offset %llu is not a multiple of the alignment %zu",
                       (unsigned long long)t->offset, align);
            goto out;
        }
        if (t->offset > g->len || q_add_overflow(data_start, (size_t)t->offset, &start) || start > g->len) {
            rc = gfail(g, QERR_FORMAT, "offset %llu past end of file (data section at %zu, file %zu bytes)",
                       (unsigned long long)t->offset, data_start, g->len);
            goto out;
        }
        if (q_add_overflow(start, t->nbytes, &end) || end > g->len) {
            rc = gfail(g, QERR_FORMAT, "data [%zu, %zu) past end of file (%zu bytes)", start,
                       end >= start ? end : SIZE_MAX, g->len);
            goto out;
        }
        const uint8_t *data = g->p + start;
        if ((uintptr_t)data % qdt_size(t->dt)) {
            rc = gfail(g, QERR_FORMAT, "data at file offset %zu is not aligned for %s", start, qdt_name(t->dt));
            goto out;
        }
        int64_t shape[QT_MAX_DIMS];
        for (int d = 0; d < t->ndim; d++) shape[d] = (int64_t)t->ne[t->ndim - 1 - d];
        char why[256];
        rc = qmodel_add_tensor(m, t->name.s, t->name.n, t->dt, t->ndim, shape, data, t->nbytes, why, sizeof why);
        if (rc) {
            set_item(g, NULL, NULL, 0);
            rc = gfail(g, rc, "%s", why);
            goto out;
        }
    }
    set_item(g, NULL, NULL, 0);
    rc = 0;
out:
    free(ix.slot);
    free(ti);
    return rc;
}

/* ---- the entry point ---------------------------------------------------- */

static int parse(qmodel *m, const void *buf, size_t len, int vocab_only, char *err, size_t errlen)
{
    gctx g = { .p = buf, .len = buf ? len : 0, .err = err, .errlen = errlen };
    gmeta md = { .g = &g };
    gkv *kvs = NULL;
    uint32_t version;
    uint64_t n_t, n_kv;
    int rc;

    m->format = QFMT_GGUF;
    if ((rc = need(&g, 4, "magic"))) return rc;
    if (memcmp(g.p, "GGUF", 4))
        return gfail(&g, QERR_FORMAT, "bad magic %02x %02x %02x %02x (not a GGUF file)", g.p[0], g.p[1],
                     g.p[2], g.p[3]);
    g.pos = 4;
    if ((rc = rd_u32(&g, &version, "version"))) return rc;
    if (version == 1)
        return gfail(&g, QERR_UNSUPPORTED, "version 1 is not supported (only 2 and 3); re-convert the model");
    if (version == 0x02000000u || version == 0x03000000u)
        return gfail(&g, QERR_UNSUPPORTED, "version %u: a big-endian GGUF file, which is not supported",
                     version);
    if (version != 2 && version != 3)
        return gfail(&g, QERR_UNSUPPORTED, "version %u is not supported (only 2 and 3)", version);
    if ((rc = rd_u64(&g, &n_t, "tensor_count")) || (rc = rd_u64(&g, &n_kv, "kv_count"))) return rc;
    if (n_t > QMODEL_MAX_TENSORS)
        return gfail(&g, QERR_RANGE, "tensor_count %llu is above the limit %d", (unsigned long long)n_t,
                     QMODEL_MAX_TENSORS);
    if (n_kv > GGUF_MAX_KV)
        return gfail(&g, QERR_RANGE, "kv_count %llu is above the limit %d", (unsigned long long)n_kv, GGUF_MAX_KV);

    if ((rc = scan_kvs(&g, n_kv, &kvs, &md.ix))) goto out;
    md.kvs = kvs;

    int64_t align;
    if ((rc = meta_int(&md, "general.alignment", 0, 1, GGUF_MAX_ALIGN, GGUF_DEFAULT_ALIGN, &align))) goto out;
    if (align & (align - 1)) {
        rc = gfail(&g, QERR_FORMAT, "general.alignment %lld is not a power of two", (long long)align);
        goto out;
    }
    if (!vocab_only) {
        if ((rc = read_hparams(&md, m))) goto out;
        if ((rc = read_tensors(&g, m, n_t, (size_t)align))) goto out;
    }
    rc = read_vocab(&md, m);
out:
    free(md.ix.slot);
    free(kvs);
    return rc;
}

int gguf_parse(qmodel *m, const void *buf, size_t len, char *err, size_t errlen)
{
    return parse(m, buf, len, 0, err, errlen);
}

int gguf_parse_vocab(qmodel *m, const void *buf, size_t len, char *err, size_t errlen)
{
    return parse(m, buf, len, 1, err, errlen);
}
