/* model.c - the format-independent half of model loading.
 *
 * Loading happens in two steps:
 *
 *   1. A format loader (gguf.c or hf.c) fills the qmodel with what the file
 *      says: hyperparameters, a table of tensors under the file's own names,
 *      the vocabulary and special ids.  Loaders check the file's structure
 *      (offsets, sizes, types) but not what the tensors mean.
 *   2. qmodel_bind() checks the hyperparameters against each other, looks up
 *      every tensor the architecture needs under the format's naming scheme,
 *      and checks each one's shape and dtype.  Only then is the qweights
 *      view handed to a backend, so a backend may trust every shape.
 *
 * Invariants after a successful bind:
 *   - every required qtensor in m->w has the exact shape its comment in
 *     backend.h gives, and data != NULL unless the model is a random one
 *     filled by the backend (m->random_fill == QMODEL_RANDOM_DEVICE);
 *   - optional tensors (biases, rope_freqs) are either absent (ndim == 0,
 *     data == NULL) or have the exact shape;
 *   - hp.n_heads % hp.n_kv_heads == 0, hp.rope_dim is even and <= head_dim.
 *
 * The fingerprint is a 128-bit hash of the architecture, the hyperparameters,
 * every bound tensor's dtype and shape, and a fixed sample of each tensor's
 * bytes (head, tail and 16 strided windows).  Hashing every byte of a large
 * model would cost seconds at start-up; the sample tells apart any two
 * checkpoints met in practice (fine-tunes change every window).  A random
 * model (model_random.c) hashes its fill mode and seed instead of bytes,
 * which are the same thing for it and may not exist on the host.
 */
#define _GNU_SOURCE
#include "arch.h"
#include "model.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

qmodel *qmodel_new(void)
{
    qmodel *m = calloc(1, sizeof *m);
    if (!m) return NULL;
    m->bos_id = m->unk_id = m->pad_id = -1;
    m->cfg_add_bos = m->cfg_add_eos = -1;
    return m;
}

/* ---- the tensor-name index ----------------------------------------------
 * Open addressing with linear probing over FNV-1a hashes; slots hold
 * index + 1 (0 = empty); kept at most half full.  Duplicate checks and
 * lookups stay O(1), so a header with many tensors cannot make loading
 * quadratic. */

static size_t name_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return (size_t)h;
}

static int name_lookup(const qmodel *m, const char *name, size_t n)
{
    if (!m->name_index_cap) return -1;
    size_t mask = m->name_index_cap - 1;
    for (size_t i = name_hash(name, n) & mask;; i = (i + 1) & mask) {
        uint32_t v = m->name_index[i];
        if (!v) return -1;
        const char *t = m->tensors[v - 1].name;
        if (!strncmp(t, name, n) && t[n] == 0) return (int)(v - 1);
    }
}

static void name_insert(qmodel *m, int idx)
{
    const char *name = m->tensors[idx].name;
    size_t mask = m->name_index_cap - 1, i = name_hash(name, strlen(name)) & mask;
    while (m->name_index[i]) i = (i + 1) & mask;
    m->name_index[i] = (uint32_t)idx + 1;
}

static int name_index_grow(qmodel *m)
{
    size_t cap = m->name_index_cap ? m->name_index_cap * 2 : 64;
    uint32_t *ni = q_callocn(cap, sizeof *ni);
    if (!ni) return QERR_NOMEM;
    free(m->name_index);
    m->name_index = ni;
    m->name_index_cap = cap;
    for (int i = 0; i < m->n_tensors; i++) name_insert(m, i);
    return 0;
}

int qmodel_add_tensor(qmodel *m, const char *name, size_t name_len, qdtype dt, int ndim,
                      const int64_t *shape, const void *data, size_t nbytes,
                      char *err, size_t errlen)
{
    if (name_len == 0 || name_len > QMODEL_MAX_NAME)
        return qerr_set(err, errlen, QERR_FORMAT, "tensor name of %zu bytes (limit %d)", name_len,
                        QMODEL_MAX_NAME);
    if (memchr(name, 0, name_len))
        return qerr_set(err, errlen, QERR_FORMAT, "tensor name contains a NUL byte");
    if (qdt_size(dt) == 0)
        return qerr_set(err, errlen, QERR_UNSUPPORTED, "tensor '%.*s': unknown dtype %d", (int)name_len, name, (int)dt);
    if (ndim < 1 || ndim > QT_MAX_DIMS)
        return qerr_set(err, errlen, QERR_FORMAT, "tensor '%.*s': %d dimensions (1..%d supported)",
                        (int)name_len, name, ndim, QT_MAX_DIMS);
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || shape[i] > ((int64_t)1 << 40))
            return qerr_set(err, errlen, QERR_FORMAT, "tensor '%.*s': dimension %d is %lld",
                            (int)name_len, name, i, (long long)shape[i]);
        if (q_mul_overflow(numel, (size_t)shape[i], &numel))
            return qerr_set(err, errlen, QERR_FORMAT, "tensor '%.*s': element count overflows", (int)name_len, name);
    }
    size_t want;
    if (q_mul_overflow(numel, qdt_size(dt), &want))
        return qerr_set(err, errlen, QERR_FORMAT, "tensor '%.*s': byte size overflows", (int)name_len, name);
    if (want != nbytes)
        return qerr_set(err, errlen, QERR_FORMAT, "tensor '%.*s': %zu bytes of data for %zu elements of %s",
                        (int)name_len, name, nbytes, numel, qdt_name(dt));
    if (m->n_tensors >= QMODEL_MAX_TENSORS)
        return qerr_set(err, errlen, QERR_LIMIT, "more than %d tensors", QMODEL_MAX_TENSORS);
    if (name_lookup(m, name, name_len) >= 0)
        return qerr_set(err, errlen, QERR_FORMAT, "tensor '%.*s' appears twice", (int)name_len, name);
    if ((m->n_tensors & (m->n_tensors - 1)) == 0) { /* grow at powers of two */
        size_t cap = m->n_tensors ? (size_t)m->n_tensors * 2 : 16;
        qnamed_tensor *nt = q_reallocn(m->tensors, cap, sizeof *nt);
        if (!nt) return qerr_set(err, errlen, QERR_NOMEM, "out of memory for the tensor table");
        m->tensors = nt;
    }
    if ((size_t)(m->n_tensors + 1) * 2 > m->name_index_cap && name_index_grow(m))
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory for the tensor table");
    qnamed_tensor *t = &m->tensors[m->n_tensors];
    memset(t, 0, sizeof *t);
    t->name = q_strndup(name, name_len);
    if (!t->name) return qerr_set(err, errlen, QERR_NOMEM, "out of memory for a tensor name");
    t->t.data = data;
    t->t.dtype = dt;
    t->t.ndim = ndim;
    for (int i = 0; i < ndim; i++) t->t.shape[i] = shape[i];
    name_insert(m, m->n_tensors);
    m->n_tensors++;
    return 0;
}

const qnamed_tensor *qmodel_find(const qmodel *m, const char *name)
{
    int i = name_lookup(m, name, strlen(name));
    return i >= 0 ? &m->tensors[i] : NULL;
}

int qmodel_rename_prefix(qmodel *m, const char *from, const char *to, char *err, size_t errlen)
{
    const size_t nf = strlen(from), nt = strlen(to);
    int renamed = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        char *name = m->tensors[i].name;
        if (strncmp(name, from, nf)) continue;
        const size_t nr = strlen(name + nf);
        if (nt + nr > QMODEL_MAX_NAME)
            return qerr_set(err, errlen, QERR_FORMAT, "tensor '%.200s': its name as '%s...' would be too long", name, to);
        char *nn = q_malloc(nt + nr + 1);
        if (!nn) return qerr_set(err, errlen, QERR_NOMEM, "out of memory for a tensor name");
        memcpy(nn, to, nt);
        memcpy(nn + nt, name + nf, nr + 1);
        free(name);
        m->tensors[i].name = nn;
        renamed++;
    }
    if (!renamed) return 0;
    /* Rebuild the index, refusing two tensors that now share a name. */
    memset(m->name_index, 0, m->name_index_cap * sizeof *m->name_index);
    for (int i = 0; i < m->n_tensors; i++) {
        if (name_lookup(m, m->tensors[i].name, strlen(m->tensors[i].name)) >= 0)
            return qerr_set(err, errlen, QERR_FORMAT, "tensor '%.200s' appears twice once '%s' is read as '%s'",
                            m->tensors[i].name, from, to);
        name_insert(m, i);
    }
    return 0;
}

int qmodel_take_map(qmodel *m, void *addr, size_t len)
{
    if (m->n_maps >= QMODEL_MAX_FILES) return QERR_LIMIT;
    struct qmodel_map *nm = q_reallocn(m->maps, (size_t)m->n_maps + 1, sizeof *nm);
    if (!nm) return QERR_NOMEM;
    m->maps = nm;
    m->maps[m->n_maps].addr = addr;
    m->maps[m->n_maps].len = len;
    m->n_maps++;
    return 0;
}

int qmodel_take_buffer(qmodel *m, void *buf)
{
    void **no = q_reallocn(m->owned, (size_t)m->n_owned + 1, sizeof *no);
    if (!no) return QERR_NOMEM;
    m->owned = no;
    m->owned[m->n_owned++] = buf;
    return 0;
}

static void vocab_free(qvocab *v)
{
    if (v->tokens)
        for (int i = 0; i < v->n; i++) free(v->tokens[i]);
    free(v->tokens);
    free(v->scores);
    free(v->types);
    if (v->merges)
        for (int i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->merges);
    free(v->pre);
    free(v->tokenizer_json);
    memset(v, 0, sizeof *v);
}

void qmodel_destroy(qmodel *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_tensors; i++) free(m->tensors[i].name);
    free(m->tensors);
    free(m->w.layers);
    vocab_free(&m->vocab);
    for (int i = 0; i < m->n_maps; i++) munmap(m->maps[i].addr, m->maps[i].len);
    free(m->maps);
    free(m->name_index);
    for (int i = 0; i < m->n_owned; i++) free(m->owned[i]);
    free(m->owned);
    free(m->path);
    free(m->name);
    free(m->chat_template);
    free(m);
}

/* ---- binding ------------------------------------------------------------ */

/* Looks up fmt (with %d = layer) and checks its shape: (d0) when d1 == 0,
 * else (d0, d1).  Absent + optional leaves *out zeroed. */
static int bind_one(const qmodel *m, const char *fmt, int layer, int64_t d0, int64_t d1,
                    int optional, qtensor *out, char *err, size_t errlen)
{
    char name[QMODEL_MAX_NAME + 32];
    memset(out, 0, sizeof *out);
    if (!fmt) return 0;
    snprintf(name, sizeof name, fmt, layer);
    const qnamed_tensor *t = qmodel_find(m, name);
    if (!t) {
        if (optional) return 0;
        return qerr_set(err, errlen, QERR_NOTFOUND, "missing tensor '%s'", name);
    }
    int want_ndim = d1 ? 2 : 1;
    /* 1-D vectors are sometimes stored as (1, n); accept any shape with
     * exactly the right element count and innermost dimension for vectors. */
    int ok;
    if (want_ndim == 1)
        ok = qt_numel(&t->t) == d0 && t->t.shape[t->t.ndim - 1] == d0;
    else
        ok = t->t.ndim == 2 && t->t.shape[0] == d0 && t->t.shape[1] == d1;
    if (!ok) {
        char got[96] = "", *p = got;
        for (int i = 0; i < t->t.ndim; i++)
            p += snprintf(p, (size_t)(got + sizeof got - p), "%s%lld", i ? ", " : "", (long long)t->t.shape[i]);
        if (d1)
            return qerr_set(err, errlen, QERR_FORMAT, "tensor '%s' has shape (%s), expected (%lld, %lld)",
                            name, got, (long long)d0, (long long)d1);
        return qerr_set(err, errlen, QERR_FORMAT, "tensor '%s' has shape (%s), expected (%lld)",
                        name, got, (long long)d0);
    }
    *out = t->t;
    if (want_ndim == 1) {
        out->ndim = 1;
        out->shape[0] = d0;
    }
    return 0;
}

static int check_hparams(qhparams *hp, char *err, size_t errlen)
{
#define HP_RANGE(field, lo, hi)                                                             \
    if (hp->field < (lo) || hp->field > (hi))                                               \
        return qerr_set(err, errlen, QERR_RANGE, "hyperparameter " #field " = %d (allowed %d..%d)", \
                        (int)hp->field, (int)(lo), (int)(hi));
    HP_RANGE(n_layers, 1, QMODEL_MAX_LAYERS);
    HP_RANGE(dim, 1, QMODEL_MAX_DIM);
    HP_RANGE(n_heads, 1, 4096);
    HP_RANGE(n_kv_heads, 1, hp->n_heads);
    HP_RANGE(head_dim, 2, 4096);
    HP_RANGE(ffn_dim, 1, QMODEL_MAX_DIM * 8);
    HP_RANGE(n_vocab, 1, QMODEL_MAX_VOCAB);
#undef HP_RANGE
    if (hp->n_heads % hp->n_kv_heads)
        return qerr_set(err, errlen, QERR_RANGE, "%d attention heads are not a multiple of %d KV heads",
                        hp->n_heads, hp->n_kv_heads);
    if (hp->rope_dim <= 0) hp->rope_dim = hp->head_dim;
    if (hp->rope_dim > hp->head_dim || hp->rope_dim % 2 || hp->head_dim % 2)
        return qerr_set(err, errlen, QERR_RANGE, "RoPE dimension %d with head dimension %d",
                        hp->rope_dim, hp->head_dim);
    if (!(hp->norm_eps > 0 && hp->norm_eps < 1)) hp->norm_eps = 1e-5f;
    if (!(hp->rope_theta > 0 && hp->rope_theta < 1e12f))
        return qerr_set(err, errlen, QERR_RANGE, "rope_theta = %g", (double)hp->rope_theta);
    if (hp->rope_scaling != QROPE_SCALE_NONE && !(hp->rope_factor > 0 && hp->rope_factor < 1e6f))
        return qerr_set(err, errlen, QERR_RANGE, "rope scaling factor = %g", (double)hp->rope_factor);
    if (hp->rope_scaling == QROPE_SCALE_LONGROPE && (hp->rope_orig_ctx <= 0 || !(hp->rope_mscale > 0 && hp->rope_mscale < 100)))
        return qerr_set(err, errlen, QERR_RANGE, "LongRoPE needs the original context > 0 and an attention factor in (0, 100)");
    if (hp->rope_scaling == QROPE_SCALE_LLAMA3 &&
        (hp->rope_orig_ctx <= 0 || !(hp->rope_low_freq_factor > 0) ||
         !(hp->rope_high_freq_factor > hp->rope_low_freq_factor)))
        return qerr_set(err, errlen, QERR_RANGE, "llama3 rope scaling needs original context > 0 and high_freq_factor > low_freq_factor > 0");
    if (hp->max_ctx <= 0) hp->max_ctx = 2048;
    if (hp->window < 0 || hp->window_pattern < 0 || hp->window_pattern > QMODEL_MAX_LAYERS)
        return qerr_set(err, errlen, QERR_RANGE, "sliding window %d, every %d-th layer global", hp->window,
                        hp->window_pattern);
    if (!(hp->attn_scale >= 0 && hp->attn_scale < 1e6f) || !(hp->attn_softcap >= 0 && hp->attn_softcap < 1e6f) ||
        !(hp->final_softcap >= 0 && hp->final_softcap < 1e6f) ||
        !(hp->rope_theta_local >= 0 && hp->rope_theta_local < 1e12f))
        return qerr_set(err, errlen, QERR_RANGE,
                        "attention scale %g, soft-caps %g and %g, local RoPE base %g (each finite, >= 0)",
                        (double)hp->attn_scale, (double)hp->attn_softcap, (double)hp->final_softcap,
                        (double)hp->rope_theta_local);
    return 0;
}

static void fingerprint_tensor(qhash *h, const qtensor *t, int with_bytes)
{
    qhash_u64(h, (uint64_t)t->dtype);
    qhash_u64(h, (uint64_t)t->ndim);
    for (int i = 0; i < t->ndim; i++) qhash_u64(h, (uint64_t)t->shape[i]);
    if (!t->data || !with_bytes) return;
    size_t n = (size_t)qt_numel(t) * qdt_size(t->dtype);
    const unsigned char *p = t->data;
    const size_t win = 256;
    if (n <= 64 * win) {
        qhash_update(h, p, n);
        return;
    }
    qhash_update(h, p, 4 * win);
    for (int i = 1; i <= 16; i++) qhash_update(h, p + (n / 17) * (size_t)i, win);
    qhash_update(h, p + n - 4 * win, 4 * win);
}

/* Rows [r0, r0 + n) of a bound 2-D tensor, as a tensor of its own (no copy). */
static qtensor rows_of(const qtensor *t, int64_t r0, int64_t n)
{
    qtensor v = *t;
    v.shape[0] = n;
    if (t->data) v.data = (const char *)t->data + (size_t)r0 * (size_t)t->shape[1] * qdt_size(t->dtype);
    return v;
}

/* A family with fused projections (Phi-3): q, k and v are rows of one
 * tensor, gate and up of another; layer l's are bound as views. */
static int bind_fused(qmodel *m, const char *const *nm, int l, char *err, size_t errlen)
{
    const qhparams *hp = &m->hp;
    qlayer *L = &m->w.layers[l];
    const int64_t dim = hp->dim, q = (int64_t)hp->n_heads * hp->head_dim, kv = (int64_t)hp->n_kv_heads * hp->head_dim;
    qtensor t;
    int rc;
    if (nm[QTN_WQKV]) {
        if ((rc = bind_one(m, nm[QTN_WQKV], l, q + 2 * kv, dim, 0, &t, err, errlen))) return rc;
        L->wq = rows_of(&t, 0, q), L->wk = rows_of(&t, q, kv), L->wv = rows_of(&t, q + kv, kv);
    }
    if (nm[QTN_GATE_UP]) {
        if ((rc = bind_one(m, nm[QTN_GATE_UP], l, 2 * (int64_t)hp->ffn_dim, dim, 0, &t, err, errlen))) return rc;
        L->w_gate = rows_of(&t, 0, hp->ffn_dim), L->w_up = rows_of(&t, hp->ffn_dim, hp->ffn_dim);
    }
    return 0;
}

/* LongRoPE: the long factors when the model's context passes the original
 * one (as llama.cpp picks by its context), else the short ones, into
 * rope_freqs (the divisors of the frequencies).  Both must be there, F32. */
static int bind_longrope(qmodel *m, const char *const *nm, char *err, size_t errlen)
{
    qhparams *hp = &m->hp;
    qtensor lf, sf;
    int rc;
    if ((rc = bind_one(m, nm[QTN_ROPE_LONG], 0, hp->rope_dim / 2, 0, 0, &lf, err, errlen)) ||
        (rc = bind_one(m, nm[QTN_ROPE_SHORT], 0, hp->rope_dim / 2, 0, 0, &sf, err, errlen)))
        return rc;
    if (lf.dtype != QDT_F32 || sf.dtype != QDT_F32)
        return qerr_set(err, errlen, QERR_UNSUPPORTED, "LongRoPE factors '%s' and '%s' must be F32", nm[QTN_ROPE_LONG],
                        nm[QTN_ROPE_SHORT]);
    hp->rope_long = hp->max_ctx > hp->rope_orig_ctx;
    m->w.rope_freqs = hp->rope_long ? lf : sf;
    for (int i = 0; i < hp->rope_dim / 2; i++) {
        const float f = ((const float *)m->w.rope_freqs.data)[i];
        if (!(f > 0 && f < 1e6f))
            return qerr_set(err, errlen, QERR_RANGE, "LongRoPE factor %d = %g (each must be in (0, 1e6))", i, (double)f);
    }
    return 0;
}

int qmodel_bind(qmodel *m, char *err, size_t errlen)
{
    qhparams *hp = &m->hp;
    const qfamily *fam = qfamily_get(hp->family);
    if (!fam) return qerr_set(err, errlen, QERR_INTERNAL, "model family %d is not in the table", hp->family);
    const char *const *nm = (m->format == QFMT_GGUF ? fam->gguf_names : fam->hf_names)->name;
    int rc;

    const qnamed_tensor *embd = qmodel_find(m, nm[QTN_EMBD]);
    if (!embd) return qerr_set(err, errlen, QERR_NOTFOUND, "missing tensor '%s'", nm[QTN_EMBD]);
    if (embd->t.ndim != 2)
        return qerr_set(err, errlen, QERR_FORMAT, "tensor '%s' has %d dimensions, expected 2", nm[QTN_EMBD], embd->t.ndim);
    if (hp->n_vocab <= 0 && embd->t.shape[0] <= QMODEL_MAX_VOCAB) hp->n_vocab = (int)embd->t.shape[0];
    if (hp->head_dim <= 0 && hp->n_heads > 0) hp->head_dim = hp->dim / hp->n_heads;
    if ((rc = check_hparams(hp, err, errlen))) return rc;

    const int64_t dim = hp->dim, hd = hp->head_dim, V = hp->n_vocab;
    const int64_t q_out = (int64_t)hp->n_heads * hd, kv_out = (int64_t)hp->n_kv_heads * hd;
    qweights *w = &m->w;
    free(w->layers);
    memset(w, 0, sizeof *w);
    w->layers = q_callocn((size_t)hp->n_layers, sizeof *w->layers);
    if (!w->layers) return qerr_set(err, errlen, QERR_NOMEM, "out of memory for %d layers", hp->n_layers);

    if ((rc = bind_one(m, nm[QTN_EMBD], 0, V, dim, 0, &w->tok_embd, err, errlen))) return rc;
    if ((rc = bind_one(m, nm[QTN_NORM], 0, dim, 0, 0, &w->out_norm, err, errlen))) return rc;
    if ((rc = bind_one(m, nm[QTN_OUTPUT], 0, V, dim, 1, &w->output, err, errlen))) return rc;
    /* Presence is ndim != 0, not data != NULL: a random model's tensors may
     * have no host bytes yet. */
    if (!w->output.ndim || fam->tied_head || (m->format == QFMT_HF && hp->tied_embeddings)) {
        w->output = w->tok_embd;
        hp->tied_embeddings = 1;
    } else {
        hp->tied_embeddings = 0;
    }
    if (hp->rope_scaling != QROPE_SCALE_LONGROPE &&
        (rc = bind_one(m, nm[QTN_ROPE_FREQS], 0, hp->rope_dim / 2, 0, 1, &w->rope_freqs, err, errlen)))
        return rc;
    if (w->rope_freqs.data && w->rope_freqs.dtype != QDT_F32)
        return qerr_set(err, errlen, QERR_UNSUPPORTED, "tensor '%s' must be F32", nm[QTN_ROPE_FREQS]);

    if (hp->rope_scaling == QROPE_SCALE_LONGROPE && (rc = bind_longrope(m, nm, err, errlen))) return rc;

    int any_bias = 0;
    for (int l = 0; l < hp->n_layers; l++) {
        qlayer *L = &w->layers[l];
        if ((rc = bind_one(m, nm[QTN_ATTN_NORM], l, dim, 0, 0, &L->attn_norm, err, errlen)) ||
            (rc = bind_fused(m, nm, l, err, errlen)) ||
            (!nm[QTN_WQKV] && ((rc = bind_one(m, nm[QTN_WQ], l, q_out, dim, 0, &L->wq, err, errlen)) ||
                               (rc = bind_one(m, nm[QTN_WK], l, kv_out, dim, 0, &L->wk, err, errlen)) ||
                               (rc = bind_one(m, nm[QTN_WV], l, kv_out, dim, 0, &L->wv, err, errlen)))) ||
            (rc = bind_one(m, nm[QTN_BQ], l, q_out, 0, !hp->attn_bias, &L->bq, err, errlen)) ||
            (rc = bind_one(m, nm[QTN_BK], l, kv_out, 0, !hp->attn_bias, &L->bk, err, errlen)) ||
            (rc = bind_one(m, nm[QTN_BV], l, kv_out, 0, !hp->attn_bias, &L->bv, err, errlen)) ||
            (rc = bind_one(m, nm[QTN_WO], l, dim, q_out, 0, &L->wo, err, errlen)) ||
            (rc = bind_one(m, nm[QTN_FFN_NORM], l, dim, 0, 0, &L->ffn_norm, err, errlen)) ||
            (!nm[QTN_GATE_UP] && ((rc = bind_one(m, nm[QTN_GATE], l, hp->ffn_dim, dim, 0, &L->w_gate, err, errlen)) ||
                                  (rc = bind_one(m, nm[QTN_UP], l, hp->ffn_dim, dim, 0, &L->w_up, err, errlen)))) ||
            (rc = bind_one(m, nm[QTN_DOWN], l, dim, hp->ffn_dim, 0, &L->w_down, err, errlen)) ||
            (hp->qk_norm && (rc = bind_one(m, nm[QTN_Q_NORM], l, hd, 0, 0, &L->q_norm, err, errlen))) ||
            (hp->qk_norm && (rc = bind_one(m, nm[QTN_K_NORM], l, hd, 0, 0, &L->k_norm, err, errlen))) ||
            (hp->norm_place == QNORM_SANDWICH &&
             ((rc = bind_one(m, nm[QTN_POST_ATTN_NORM], l, dim, 0, 0, &L->post_attn_norm, err, errlen)) ||
              (rc = bind_one(m, nm[QTN_POST_FFN_NORM], l, dim, 0, 0, &L->post_ffn_norm, err, errlen)))))
            return rc;
        any_bias |= L->bq.ndim || L->bk.ndim || L->bv.ndim;
    }
    hp->attn_bias = any_bias;
    w->hp = *hp;

    /* Special ids must index the vocabulary; out-of-range ones are dropped. */
    if (m->bos_id >= V) m->bos_id = -1;
    if (m->unk_id >= V) m->unk_id = -1;
    if (m->pad_id >= V) m->pad_id = -1;
    int k = 0;
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos_ids[i] >= 0 && m->eos_ids[i] < V) m->eos_ids[k++] = m->eos_ids[i];
    m->n_eos = k;

    qhash h;
    qhash_init(&h, 0x71756972u /* "quir" */);
    int64_t hv[] = { fam->fingerprint_id, hp->n_vocab, hp->dim, hp->n_layers, hp->n_heads, hp->n_kv_heads,
                     hp->head_dim, hp->ffn_dim, hp->rope_dim, hp->rope_neox, hp->rope_scaling,
                     hp->rope_orig_ctx, hp->tied_embeddings };
    for (size_t i = 0; i < sizeof hv / sizeof hv[0]; i++) qhash_u64(&h, (uint64_t)hv[i]);
    float hf[] = { hp->norm_eps, hp->rope_theta, hp->rope_factor, hp->rope_low_freq_factor, hp->rope_high_freq_factor };
    qhash_update(&h, hf, sizeof hf);
    /* The features beyond Llama's, where set (absent before they existed:
     * the other fingerprints stay). */
    if (hp->act || hp->norm_place || hp->qk_norm || hp->embed_scale || hp->norm_add_one || hp->window ||
        hp->attn_softcap > 0 || hp->final_softcap > 0 || hp->attn_scale > 0 || hp->rope_theta_local > 0) {
        int64_t fv[] = { hp->act, hp->norm_place, hp->qk_norm, hp->embed_scale, hp->norm_add_one, hp->window,
                         hp->window_pattern };
        for (size_t i = 0; i < sizeof fv / sizeof fv[0]; i++) qhash_u64(&h, (uint64_t)fv[i]);
        float ff[] = { hp->attn_softcap, hp->final_softcap, hp->attn_scale, hp->rope_theta_local };
        qhash_update(&h, ff, sizeof ff);
    }
    if (hp->nope_interval > 0) qhash_u64(&h, 0x6e6f7065u + (uint64_t)hp->nope_interval); /* "nope" */
    if (hp->rope_scaling == QROPE_SCALE_LONGROPE) {
        qhash_u64(&h, (uint64_t)hp->rope_long);
        qhash_update(&h, &hp->rope_mscale, sizeof hp->rope_mscale);
    }
    /* A bf16 HF checkpoint's K once came from bf16-rounded RoPE frequencies
     * (until issue 26, hence the number): blocks a persistent tier holds from
     * then must not match. */
    if (m->format == QFMT_HF && w->tok_embd.dtype == QDT_BF16) qhash_u64(&h, 26);
    int bytes = !m->random_fill;
    if (m->random_fill) {
        qhash_update(&h, "random", 6);
        qhash_u64(&h, (uint64_t)m->random_fill);
        qhash_u64(&h, m->random_seed);
        if (m->random_fill == QMODEL_RANDOM_DEVICE) qhash_u64(&h, 2); /* the device fill's version: by place since session 4 */
        if (m->random_residual > 0) { /* (absent before it existed: the other fingerprints stay) */
            uint32_t bits;
            memcpy(&bits, &m->random_residual, sizeof bits);
            qhash_u64(&h, bits);
        }
    }
    fingerprint_tensor(&h, &w->tok_embd, bytes);
    fingerprint_tensor(&h, &w->out_norm, bytes);
    fingerprint_tensor(&h, &w->output, bytes);
    fingerprint_tensor(&h, &w->rope_freqs, bytes);
    for (int l = 0; l < hp->n_layers; l++) {
        const qtensor *ts = &w->layers[l].attn_norm;
        for (size_t i = 0; i < sizeof(qlayer) / sizeof(qtensor); i++)
            if (i < QLAYER_BASE || ts[i].ndim) fingerprint_tensor(&h, &ts[i], bytes); /* the later ones where present */
    }
    qhash_final(&h, m->fingerprint);
    q_hex(m->fingerprint, 16, m->fingerprint_hex);
    return 0;
}

int64_t qmodel_param_count(const qmodel *m)
{
    const qweights *w = &m->w;
    int64_t n = qt_numel(&w->tok_embd) + qt_numel(&w->out_norm);
    if (!m->hp.tied_embeddings) n += qt_numel(&w->output);
    if (w->rope_freqs.ndim) n += qt_numel(&w->rope_freqs);
    for (int l = 0; w->layers && l < m->hp.n_layers; l++) {
        const qtensor *ts = &w->layers[l].attn_norm;
        for (size_t i = 0; i < sizeof(qlayer) / sizeof(qtensor); i++)
            if (ts[i].ndim) n += qt_numel(&ts[i]);
    }
    return n;
}

/* ---- loading ------------------------------------------------------------ */

int qmodel_map_file(qmodel *m, const char *path, size_t min_len, const char *what, const void **addr_out,
                    size_t *len_out, char *err, size_t errlen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return qerr_set(err, errlen, QERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return qerr_set(err, errlen, QERR_IO, "%s: not a readable regular file", path);
    }
    if ((size_t)st.st_size < min_len) {
        close(fd);
        return qerr_set(err, errlen, QERR_FORMAT, "%s: file of %lld bytes is too small for %s", path,
                        (long long)st.st_size, what);
    }
    size_t len = (size_t)st.st_size;
    /* MAP_POPULATE reads the file in now: loading pays for the page faults
     * once, instead of the first forward pass paying for them. */
    void *addr = mmap(NULL, len, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
    int e = errno;
    close(fd);
    if (addr == MAP_FAILED) return qerr_set(err, errlen, QERR_IO, "%s: mmap: %s", path, strerror(e));
    if (qmodel_take_map(m, addr, len)) {
        munmap(addr, len);
        return qerr_set(err, errlen, QERR_LIMIT, "%s: too many mapped files", path);
    }
    *addr_out = addr;
    *len_out = len;
    return 0;
}

static int load_gguf_file(qmodel *m, const char *path, char *err, size_t errlen)
{
    const void *addr;
    size_t len;
    int rc = qmodel_map_file(m, path, 8, "a model", &addr, &len, err, errlen);
    if (rc) return rc;
    if (memcmp(addr, "GGUF", 4))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: not a GGUF file (bad magic) and not a folder", path);
    return gguf_parse(m, addr, len, err, errlen);
}

int qmodel_load(const char *path, qmodel **out, char *err, size_t errlen)
{
    *out = NULL;
    struct stat st;
    if (stat(path, &st) < 0) return qerr_set(err, errlen, QERR_IO, "%s: %s", path, strerror(errno));
    qmodel *m = qmodel_new();
    if (!m || !(m->path = q_strdup(path))) {
        qmodel_destroy(m);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    int rc;
    if (S_ISDIR(st.st_mode)) {
        m->format = QFMT_HF;
        rc = hf_load_dir(m, path, err, errlen);
    } else {
        m->format = QFMT_GGUF;
        rc = load_gguf_file(m, path, err, errlen);
    }
    if (!rc) rc = qmodel_bind(m, err, errlen);
    if (rc) {
        qmodel_destroy(m);
        return rc;
    }
    if (!m->name) {
        const char *b = strrchr(path, '/');
        m->name = q_strdup(b && b[1] ? b + 1 : path);
    }
    *out = m;
    return 0;
}
