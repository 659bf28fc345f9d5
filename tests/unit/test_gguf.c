/* test_gguf.c - the GGUF loader: the real stories260K file, crafted files
 * that must load, and one crafted file for every way a file can be wrong.
 *
 * A small GGUF writer (gfile) builds files in memory: key/values are
 * serialised as they are added, tensors are kept as a list so that a test
 * can bend one field (type, dims, offset) before serialising.  Parsed
 * buffers are exact-size heap copies, so ASan sees any read past the end. */
#define _GNU_SOURCE /* memmem */
#include "arch.h"
#include "model.h"
#include "qtest.h"
#include "util.h"

#include <stdint.h>

/* ---- a tiny GGUF writer --------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} gbuf;

static void gb_put(gbuf *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *np = realloc(b->p, cap);
        if (!np) {
            fprintf(stderr, "test_gguf: out of memory\n");
            exit(2);
        }
        b->p = np;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void gb_le(gbuf *b, uint64_t v, int n)
{
    uint8_t x[8];
    for (int i = 0; i < n; i++) x[i] = (uint8_t)(v >> (8 * i));
    gb_put(b, x, (size_t)n);
}
static void gb_u32(gbuf *b, uint32_t v) { gb_le(b, v, 4); }
static void gb_u64(gbuf *b, uint64_t v) { gb_le(b, v, 8); }
static void gb_f32(gbuf *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    gb_u32(b, u);
}
static void gb_strn(gbuf *b, const char *s, size_t n)
{
    gb_u64(b, n);
    gb_put(b, s, n);
}
static void gb_str(gbuf *b, const char *s) { gb_strn(b, s, strlen(s)); }

enum { T_U8 = 0, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR, T_U64, T_I64, T_F64 };
enum { G_F32 = 0, G_F16 = 1, G_Q4_0 = 2, G_BF16 = 30 };

typedef struct {
    char name[320];
    uint32_t ndim;
    uint64_t ne[6];
    uint32_t type;
    uint64_t offset;
    int fixed_offset;            /* else laid out in order at the alignment */
} gt;

typedef struct {
    char magic[4];
    uint32_t version;
    gbuf kv;
    uint64_t n_kv;
    gt t[40];
    int n_t;
    uint64_t align;              /* layout of the data section */
    int64_t tcount, kvcount;     /* header counts when >= 0 (else the real ones) */
    const char *omit[4];         /* keys or tensors the builders leave out */
} gfile;

static void gf_init(gfile *f)
{
    memset(f, 0, sizeof *f);
    memcpy(f->magic, "GGUF", 4);
    f->version = 3;
    f->align = 32;
    f->tcount = f->kvcount = -1;
}

static void gf_free(gfile *f) { free(f->kv.p); }

static int omitted(const gfile *f, const char *name)
{
    for (int i = 0; i < 4; i++)
        if (f->omit[i] && !strcmp(f->omit[i], name)) return 1;
    return 0;
}

/* Starts a key/value: writes the key and type; returns 0 when omitted. */
static int kv_key(gfile *f, const char *key, uint32_t type)
{
    if (omitted(f, key)) return 0;
    gb_str(&f->kv, key);
    gb_u32(&f->kv, type);
    f->n_kv++;
    return 1;
}
static void kv_u32(gfile *f, const char *k, uint32_t v) { if (kv_key(f, k, T_U32)) gb_u32(&f->kv, v); }
static void kv_i32(gfile *f, const char *k, int32_t v) { if (kv_key(f, k, T_I32)) gb_u32(&f->kv, (uint32_t)v); }
static void kv_u64(gfile *f, const char *k, uint64_t v) { if (kv_key(f, k, T_U64)) gb_u64(&f->kv, v); }
static void kv_f32(gfile *f, const char *k, float v) { if (kv_key(f, k, T_F32)) gb_f32(&f->kv, v); }
static void kv_str(gfile *f, const char *k, const char *v) { if (kv_key(f, k, T_STR)) gb_str(&f->kv, v); }
static void kv_bool(gfile *f, const char *k, uint8_t v) { if (kv_key(f, k, T_BOOL)) gb_put(&f->kv, &v, 1); }
static void kv_small(gfile *f, const char *k, uint32_t type, uint64_t v, int nbytes)
{
    if (kv_key(f, k, type)) gb_le(&f->kv, v, nbytes);
}
static void kv_arr_str(gfile *f, const char *k, int n, const char *const *v)
{
    if (!kv_key(f, k, T_ARR)) return;
    gb_u32(&f->kv, T_STR);
    gb_u64(&f->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) gb_str(&f->kv, v[i]);
}
static void kv_arr_f32(gfile *f, const char *k, int n)
{
    if (!kv_key(f, k, T_ARR)) return;
    gb_u32(&f->kv, T_F32);
    gb_u64(&f->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) gb_f32(&f->kv, -(float)i);
}
static void kv_arr_i32(gfile *f, const char *k, int n, const int32_t *v)
{
    if (!kv_key(f, k, T_ARR)) return;
    gb_u32(&f->kv, T_I32);
    gb_u64(&f->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) gb_u32(&f->kv, (uint32_t)(v ? v[i] : 1));
}

/* Adds a tensor; ne is in GGUF order (fastest dimension first). */
static gt *add_t(gfile *f, const char *name, uint32_t type, uint32_t ndim, uint64_t ne0, uint64_t ne1)
{
    if (omitted(f, name)) return NULL;
    gt *t = &f->t[f->n_t++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->type = type;
    t->ndim = ndim;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    return t;
}

/* Bytes of a tensor's data, or 0 when it gets none (odd type or huge). */
static uint64_t t_bytes(const gt *t)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->ndim && d < 6; d++)
        if (__builtin_mul_overflow(n, t->ne[d], &n)) return 0;
    uint64_t es = t->type == G_F32 ? 4 : (t->type == G_F16 || t->type == G_BF16) ? 2 : 0;
    return n <= (1u << 20) ? n * es : 0;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Serialises f into an exact-size heap buffer (ASan catches over-reads). */
static uint8_t *gf_bytes(const gfile *f, size_t *len)
{
    gbuf b = { 0 };
    uint64_t off[40], run = 0, end = 0;
    gb_put(&b, f->magic, 4);
    gb_u32(&b, f->version);
    gb_u64(&b, f->tcount >= 0 ? (uint64_t)f->tcount : (uint64_t)f->n_t);
    gb_u64(&b, f->kvcount >= 0 ? (uint64_t)f->kvcount : f->n_kv);
    gb_put(&b, f->kv.p, f->kv.n);
    for (int i = 0; i < f->n_t; i++) {
        const gt *t = &f->t[i];
        if (t->fixed_offset) {
            off[i] = t->offset;
        } else {
            off[i] = run = align_up(run, f->align);
            run += t_bytes(t);
        }
        gb_strn(&b, t->name, strlen(t->name));
        gb_u32(&b, t->ndim);
        for (uint32_t d = 0; d < t->ndim && d < 6; d++) gb_u64(&b, t->ne[d]);
        gb_u32(&b, t->type);
        gb_u64(&b, off[i]);
        if (t_bytes(t) && off[i] + t_bytes(t) > end && off[i] < (1u << 24)) end = off[i] + t_bytes(t);
    }
    if (f->n_t) {
        size_t data = (size_t)align_up(b.n, f->align);
        uint8_t *zero = calloc(1, data - b.n + (size_t)end + 1);
        gb_put(&b, zero, data - b.n + (size_t)end);
        free(zero);
        for (int i = 0; i < f->n_t; i++) {
            const gt *t = &f->t[i];
            uint64_t nb = t_bytes(t), es = t->type == G_F32 ? 4 : 2;
            if (!nb || off[i] >= (1u << 24)) continue;
            uint8_t *p = b.p + data + off[i];
            for (uint64_t k = 0; k < nb / es; k++) {
                float v = (float)((int)((k * 7 + (uint64_t)i) % 13) - 6) * 0.05f;
                uint32_t u;
                uint16_t h = t->type == G_F16 ? q_f32_to_f16(v) : q_f32_to_bf16(v);
                memcpy(&u, &v, 4);
                if (es == 4) memcpy(p + 4 * k, &u, 4);
                else memcpy(p + 2 * k, &h, 2);
            }
        }
    }
    uint8_t *out = malloc(b.n ? b.n : 1);
    memcpy(out, b.p, b.n);
    *len = b.n;
    free(b.p);
    return out;
}

static const char *const tiny_tokens[10] = { "<unk>", "<s>", "</s>", "\xe2\x96\x81" "a", "\xe2\x96\x81" "b",
                                              "c", "d", "e", "f", "g" };

/* A complete 1-layer Llama: dim 8, 2 heads, 1 KV head (head_dim 4), ffn 16,
 * a 10-token SentencePiece vocabulary; it parses and binds.  Leaves out the
 * keys and tensors in f->omit, then clears it, so that a test can add its
 * own version of them afterwards. */
static void tiny_llama(gfile *f)
{
    static const int32_t types[10] = { 2, 3, 3, 1, 1, 1, 1, 1, 1, 1 };
    kv_str(f, "general.architecture", "llama");
    kv_str(f, "general.name", "tiny");
    kv_u32(f, "llama.context_length", 64);
    kv_u32(f, "llama.embedding_length", 8);
    kv_u32(f, "llama.block_count", 1);
    kv_u32(f, "llama.feed_forward_length", 16);
    kv_u32(f, "llama.attention.head_count", 2);
    kv_u32(f, "llama.attention.head_count_kv", 1);
    kv_f32(f, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    kv_f32(f, "llama.rope.freq_base", 10000.0f);
    kv_str(f, "tokenizer.ggml.model", "llama");
    kv_arr_str(f, "tokenizer.ggml.tokens", 10, tiny_tokens);
    kv_arr_f32(f, "tokenizer.ggml.scores", 10);
    kv_arr_i32(f, "tokenizer.ggml.token_type", 10, types);
    kv_u32(f, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(f, "tokenizer.ggml.eos_token_id", 2);
    kv_u32(f, "tokenizer.ggml.unknown_token_id", 0);
    kv_u32(f, "tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
    add_t(f, "token_embd.weight", G_F32, 2, 8, 10);
    add_t(f, "output_norm.weight", G_F32, 1, 8, 0);
    add_t(f, "output.weight", G_F32, 2, 8, 10);
    add_t(f, "blk.0.attn_norm.weight", G_F32, 1, 8, 0);
    add_t(f, "blk.0.attn_q.weight", G_F32, 2, 8, 8);
    add_t(f, "blk.0.attn_k.weight", G_F32, 2, 8, 4);
    add_t(f, "blk.0.attn_v.weight", G_F32, 2, 8, 4);
    add_t(f, "blk.0.attn_output.weight", G_F32, 2, 8, 8);
    add_t(f, "blk.0.ffn_norm.weight", G_F32, 1, 8, 0);
    add_t(f, "blk.0.ffn_gate.weight", G_F32, 2, 8, 16);
    add_t(f, "blk.0.ffn_up.weight", G_F32, 2, 8, 16);
    add_t(f, "blk.0.ffn_down.weight", G_F32, 2, 16, 8);
    memset(f->omit, 0, sizeof f->omit);
}

/* Parses a copy of buf[0..len) on a fresh model.  With keep, the model (and
 * the copy, which it then owns) is returned; else both are released. */
static int parse_bytes(const uint8_t *buf, size_t len, qmodel **keep, char *err, size_t errlen)
{
    qmodel *m = qmodel_new();
    uint8_t *copy = malloc(len ? len : 1);
    if (!m || !copy) exit(2);
    if (len) memcpy(copy, buf, len);
    err[0] = 0;
    int rc = gguf_parse(m, copy, len, err, errlen);
    if (keep) {
        qmodel_take_buffer(m, copy);
        *keep = m;
    } else {
        qmodel_destroy(m);
        free(copy);
    }
    return rc;
}

static int parse_gf(const gfile *f, qmodel **keep, char *err, size_t errlen)
{
    size_t len;
    uint8_t *b = gf_bytes(f, &len);
    int rc = parse_bytes(b, len, keep, err, errlen);
    free(b);
    return rc;
}

/* Parses f and checks the code and two pieces of the message. */
#define EXPECT_ERR(f, want_rc, needle1, needle2)                     \
    do {                                                             \
        char e_[512];                                                \
        int rc_ = parse_gf((f), NULL, e_, sizeof e_);                \
        CHECK_EQ_INT(rc_, (want_rc));                                \
        CHECK_STR_CONTAINS(e_, "gguf: ");                            \
        CHECK_STR_CONTAINS(e_, (needle1));                           \
        CHECK_STR_CONTAINS(e_, (needle2));                           \
    } while (0)

static const qtensor *find_t(const qmodel *m, const char *name)
{
    const qnamed_tensor *t = qmodel_find(m, name);
    return t ? &t->t : NULL;
}

/* ---- the real file ------------------------------------------------------ */

static char g_path[1024];

static const char *stories_path(void)
{
    snprintf(g_path, sizeof g_path, "%s/models/stories260K.gguf", qt_root());
    return g_path;
}

static void test_stories_parses(void)
{
    char err[512] = "", *buf;
    size_t len;
    REQUIRE(q_read_file(stories_path(), 8 << 20, &buf, &len, err, sizeof err) == 0);
    REQUIRE(len == 1185376);
    qmodel *m = qmodel_new();
    REQUIRE(m);
    int rc = gguf_parse(m, buf, len, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(m->format, QFMT_GGUF);
    CHECK(!strcmp(qfamily_get(m->hp.family)->name, "llama"));
    CHECK_EQ_INT(m->hp.dim, 64);
    CHECK_EQ_INT(m->hp.n_layers, 5);
    CHECK_EQ_INT(m->hp.n_heads, 8);
    CHECK_EQ_INT(m->hp.n_kv_heads, 4);
    CHECK_EQ_INT(m->hp.ffn_dim, 172);
    CHECK_EQ_INT(m->hp.head_dim, 8);
    CHECK_EQ_INT(m->hp.rope_dim, 8);
    CHECK_EQ_INT(m->hp.max_ctx, 2048);
    CHECK_EQ_INT(m->hp.n_vocab, 512);
    CHECK_EQ_INT(m->hp.rope_neox, 0);
    CHECK_EQ_INT(m->hp.attn_bias, 0);
    CHECK_EQ_INT(m->hp.rope_scaling, QROPE_SCALE_NONE);
    CHECK(fabsf(m->hp.norm_eps - 1e-5f) < 1e-9f);
    CHECK(m->hp.rope_theta == 10000.0f);
    CHECK(m->name && !strcmp(m->name, "llama"));

    CHECK_EQ_INT(m->vocab.kind, QVOCAB_SPM);
    CHECK_EQ_INT(m->vocab.n, 512);
    REQUIRE(m->vocab.tokens && m->vocab.scores && m->vocab.types);
    CHECK(!strcmp(m->vocab.tokens[0], "<unk>"));
    CHECK(!strcmp(m->vocab.tokens[1], "<s>"));
    CHECK(!strcmp(m->vocab.tokens[3], "<0x00>"));
    CHECK_EQ_INT(m->vocab.types[0], QTOK_UNKNOWN);
    CHECK_EQ_INT(m->vocab.types[1], QTOK_CONTROL);
    CHECK_EQ_INT(m->vocab.types[3], QTOK_BYTE);
    CHECK(m->vocab.merges == NULL && m->vocab.pre == NULL);
    CHECK_EQ_INT(m->bos_id, 1);
    CHECK_EQ_INT(m->n_eos, 1);
    CHECK_EQ_INT(m->eos_ids[0], 2);
    CHECK_EQ_INT(m->unk_id, 0);
    CHECK_EQ_INT(m->pad_id, -1); /* stored as u32 0xFFFFFFFF */
    CHECK_EQ_INT(m->add_bos, 1);

    CHECK_EQ_INT(m->n_tensors, 48);
    const qtensor *k = find_t(m, "blk.0.attn_k.weight");
    REQUIRE(k);
    CHECK_EQ_INT(k->dtype, QDT_F32);
    CHECK_EQ_INT(k->ndim, 2);
    CHECK_EQ_INT(k->shape[0], 32); /* (n_kv_heads * head_dim, dim): ne was {64, 32} */
    CHECK_EQ_INT(k->shape[1], 64);
    /* infos end at 14152; aligned to 32 the data section starts at 14176 */
    CHECK((const char *)k->data == buf + 14176 + 278784);
    const qtensor *e = find_t(m, "token_embd.weight");
    REQUIRE(e);
    CHECK_EQ_INT(e->shape[0], 512);
    CHECK_EQ_INT(e->shape[1], 64);
    const qtensor *d = find_t(m, "blk.4.ffn_down.weight");
    REQUIRE(d);
    CHECK_EQ_INT(d->shape[0], 64);
    CHECK_EQ_INT(d->shape[1], 172);
    const qtensor *n = find_t(m, "blk.4.ffn_norm.weight");
    REQUIRE(n);
    CHECK((const char *)n->data + 64 * 4 == buf + len); /* the last tensor ends the file */

    rc = qmodel_bind(m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  bind: %s\n", err);
    CHECK_EQ_INT(m->hp.tied_embeddings, 0);
    qmodel_destroy(m);
    free(buf);
}

static void test_stories_loads(void)
{
    char err[512] = "";
    qmodel *m = NULL;
    int rc = qmodel_load(stories_path(), &m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err);
    REQUIRE(m);
    CHECK_EQ_INT(m->format, QFMT_GGUF);
    REQUIRE(m->w.layers);
    CHECK_EQ_INT(m->w.layers[4].w_down.shape[0], 64);
    CHECK_EQ_INT(m->w.layers[4].w_down.shape[1], 172);
    CHECK_EQ_INT(m->w.tok_embd.shape[0], 512);
    CHECK(m->w.output.data && m->w.output.data != m->w.tok_embd.data);
    CHECK_EQ_INT(strlen(m->fingerprint_hex), 32);
    qmodel_destroy(m);

    /* the 4-layer draft shares the vocabulary */
    char path[1100];
    snprintf(path, sizeof path, "%s/tests/fixtures/models/stories260K-draft4.gguf", qt_root());
    rc = qmodel_load(path, &m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (!rc) {
        CHECK_EQ_INT(m->hp.n_layers, 4);
        CHECK_EQ_INT(m->vocab.n, 512);
        qmodel_destroy(m);
    }
}

/* Cutting the real file anywhere in its header and metadata, or in its
 * data, gives an error, never a crash or an over-read. */
static void test_stories_truncated(void)
{
    char err[512], *buf;
    size_t len;
    REQUIRE(q_read_file(stories_path(), 8 << 20, &buf, &len, err, sizeof err) == 0);
    int fails = 0;
    for (size_t cut = 0; cut < 14400; cut++) {
        int rc = parse_bytes((const uint8_t *)buf, cut, NULL, err, sizeof err);
        if (rc >= 0 || strncmp(err, "gguf: ", 6)) fails++;
    }
    for (size_t cut = 14400; cut < len; cut += 4099)
        if (parse_bytes((const uint8_t *)buf, cut, NULL, err, sizeof err) >= 0) fails++;
    CHECK_EQ_INT(fails, 0);
    CHECK_EQ_INT(parse_bytes((const uint8_t *)buf, len - 1, NULL, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "tensor 'blk.4.ffn_norm.weight': data [1185120, 1185376) past end of file (1185375 bytes)");
    free(buf);
}

/* ---- crafted files that load -------------------------------------------- */

static void test_tiny_binds(void)
{
    gfile f;
    gf_init(&f);
    tiny_llama(&f);
    char err[512];
    qmodel *m;
    int rc = parse_gf(&f, &m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(m->hp.dim, 8);
    CHECK_EQ_INT(m->hp.head_dim, 4);      /* default: embedding_length / head_count */
    CHECK_EQ_INT(m->hp.rope_dim, 4);      /* default: head_dim */
    CHECK_EQ_INT(m->hp.n_vocab, 10);      /* from the token list */
    CHECK_EQ_INT(m->vocab.n, 10);
    CHECK(!strcmp(m->vocab.tokens[3], "\xe2\x96\x81" "a"));
    CHECK(m->vocab.scores[4] == -4.0f);
    CHECK_EQ_INT(m->pad_id, -1);
    CHECK_EQ_INT(m->add_bos, 1);
    const qtensor *q = find_t(m, "blk.0.ffn_down.weight");
    REQUIRE(q);
    CHECK_EQ_INT(q->shape[0], 8);
    CHECK_EQ_INT(q->shape[1], 16);
    rc = qmodel_bind(m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  bind: %s\n", err);
    qmodel_destroy(m);

    /* without output.weight the binder ties the head to the embedding */
    gf_free(&f);
    gf_init(&f);
    f.omit[0] = "output.weight";
    tiny_llama(&f);
    rc = parse_gf(&f, &m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(m->hp.tied_embeddings, 0);
    CHECK_EQ_INT(qmodel_bind(m, err, sizeof err), 0);
    CHECK_EQ_INT(m->hp.tied_embeddings, 1);
    qmodel_destroy(m);
    gf_free(&f);
}

/* A Qwen2 with biases, F16/BF16 weights, a GPT-2 vocabulary with merges,
 * eot/eom ids, explicit key_length and rope dimension, an alignment of 64. */
static void test_qwen2(void)
{
    static const char *const merges[2] = { "a b", "ab c" };
    gfile f;
    gf_init(&f);
    f.align = 64;
    kv_u32(&f, "general.alignment", 64);
    kv_str(&f, "general.architecture", "qwen2");
    kv_u32(&f, "qwen2.embedding_length", 8);
    kv_u32(&f, "qwen2.block_count", 1);
    kv_u32(&f, "qwen2.feed_forward_length", 16);
    kv_u32(&f, "qwen2.attention.head_count", 2);
    kv_u32(&f, "qwen2.attention.head_count_kv", 2);
    kv_u32(&f, "qwen2.attention.key_length", 4);
    kv_u32(&f, "qwen2.rope.dimension_count", 4);
    kv_f32(&f, "qwen2.rope.freq_base", 1000000.0f);
    kv_f32(&f, "qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
    kv_u32(&f, "qwen2.vocab_size", 10);
    kv_str(&f, "tokenizer.ggml.model", "gpt2");
    kv_str(&f, "tokenizer.ggml.pre", "qwen2");
    kv_arr_str(&f, "tokenizer.ggml.tokens", 10, tiny_tokens);
    kv_arr_i32(&f, "tokenizer.ggml.token_type", 10, NULL);
    kv_arr_str(&f, "tokenizer.ggml.merges", 2, merges);
    kv_u32(&f, "tokenizer.ggml.eos_token_id", 2);
    kv_i32(&f, "tokenizer.ggml.bos_token_id", -1);
    kv_u32(&f, "tokenizer.ggml.eot_token_id", 9);
    kv_u32(&f, "tokenizer.ggml.eom_token_id", 2); /* same as eos: not repeated */
    add_t(&f, "token_embd.weight", G_BF16, 2, 8, 10);
    add_t(&f, "output_norm.weight", G_F32, 1, 8, 0);
    add_t(&f, "blk.0.attn_norm.weight", G_F32, 1, 8, 0);
    add_t(&f, "blk.0.attn_q.weight", G_F16, 2, 8, 8);
    add_t(&f, "blk.0.attn_q.bias", G_F32, 1, 8, 0);
    add_t(&f, "blk.0.attn_k.weight", G_F16, 2, 8, 8);
    add_t(&f, "blk.0.attn_k.bias", G_F32, 1, 8, 0);
    add_t(&f, "blk.0.attn_v.weight", G_F16, 2, 8, 8);
    add_t(&f, "blk.0.attn_v.bias", G_F32, 1, 8, 0);
    add_t(&f, "blk.0.attn_output.weight", G_F16, 2, 8, 8);
    add_t(&f, "blk.0.ffn_norm.weight", G_F32, 1, 8, 0);
    add_t(&f, "blk.0.ffn_gate.weight", G_BF16, 2, 8, 16);
    add_t(&f, "blk.0.ffn_up.weight", G_BF16, 2, 8, 16);
    add_t(&f, "blk.0.ffn_down.weight", G_BF16, 2, 16, 8);
    char err[512];
    qmodel *m;
    int rc = parse_gf(&f, &m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK(!strcmp(qfamily_get(m->hp.family)->name, "qwen2"));
    CHECK_EQ_INT(m->hp.rope_neox, 1);
    CHECK_EQ_INT(m->hp.attn_bias, 1);
    CHECK(m->hp.rope_theta == 1000000.0f);
    CHECK_EQ_INT(m->hp.max_ctx, 0); /* absent: the binder picks the default */
    CHECK_EQ_INT(m->hp.n_vocab, 10);
    CHECK(m->name == NULL);
    CHECK_EQ_INT(m->vocab.kind, QVOCAB_BPE);
    CHECK_EQ_INT(m->vocab.n_merges, 2);
    CHECK(m->vocab.merges && !strcmp(m->vocab.merges[1], "ab c"));
    CHECK(m->vocab.pre && !strcmp(m->vocab.pre, "qwen2"));
    CHECK(m->vocab.scores == NULL);
    CHECK_EQ_INT(m->bos_id, -1);
    CHECK_EQ_INT(m->add_bos, 0);
    CHECK_EQ_INT(m->n_eos, 2);
    CHECK_EQ_INT(m->eos_ids[0], 2);
    CHECK_EQ_INT(m->eos_ids[1], 9);
    const qtensor *e = find_t(m, "token_embd.weight"), *q = find_t(m, "blk.0.attn_q.weight");
    REQUIRE(e && q);
    CHECK_EQ_INT(e->dtype, QDT_BF16);
    CHECK_EQ_INT(q->dtype, QDT_F16);
    CHECK(((uintptr_t)q->data - (uintptr_t)e->data) % 64 == 0);
    rc = qmodel_bind(m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  bind: %s\n", err);
    CHECK_EQ_INT(m->hp.tied_embeddings, 1);
    qmodel_destroy(m);
    gf_free(&f);
}

/* Integer metadata may use any integer type; GGUF v2 reads like v3; unused
 * keys of every type (nested arrays too) are skipped. */
static void test_metadata_types(void)
{
    gfile f;
    gf_init(&f);
    f.version = 2;
    kv_u64(&f, "llama.embedding_length", 8);
    kv_small(&f, "llama.vocab_size", T_I16, 10, 2);
    kv_small(&f, "general.u8", T_U8, 200, 1);
    kv_small(&f, "general.i8", T_I8, 0x80, 1);
    kv_small(&f, "general.u16", T_U16, 7, 2);
    kv_small(&f, "general.i64", T_I64, 5, 8);
    kv_small(&f, "general.f64", T_F64, 0, 8);
    kv_bool(&f, "general.flag", 1);
    kv_bool(&f, "tokenizer.ggml.add_bos_token", 0);
    kv_str(&f, "llama.rope.scaling.type", "linear");
    kv_small(&f, "llama.rope.scaling.factor", T_F64, 0x4010000000000000ULL /* 4.0 */, 8);
    if (kv_key(&f, "general.nested", T_ARR)) { /* [[1, 2], ["x"], []] */
        gb_u32(&f.kv, T_ARR);
        gb_u64(&f.kv, 3);
        gb_u32(&f.kv, T_U16);
        gb_u64(&f.kv, 2);
        gb_le(&f.kv, 1, 2);
        gb_le(&f.kv, 2, 2);
        gb_u32(&f.kv, T_STR);
        gb_u64(&f.kv, 1);
        gb_str(&f.kv, "x");
        gb_u32(&f.kv, T_BOOL);
        gb_u64(&f.kv, 0);
    }
    f.omit[0] = "llama.embedding_length";
    tiny_llama(&f);
    char err[512];
    qmodel *m;
    int rc = parse_gf(&f, &m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(m->hp.dim, 8);
    CHECK_EQ_INT(m->hp.n_vocab, 10);
    CHECK_EQ_INT(m->add_bos, 0);
    CHECK_EQ_INT(m->hp.rope_scaling, QROPE_SCALE_LINEAR);
    CHECK(m->hp.rope_factor == 4.0f);
    CHECK_EQ_INT(qmodel_bind(m, err, sizeof err), 0);
    qmodel_destroy(m);
    gf_free(&f);
}

/* ---- crafted files that must fail --------------------------------------- */

static void test_bad_magic_and_version(void)
{
    gfile f;
    gf_init(&f);
    tiny_llama(&f);
    memcpy(f.magic, "GGML", 4);
    EXPECT_ERR(&f, QERR_FORMAT, "bad magic 47 47 4d 4c", "not a GGUF file");
    memcpy(f.magic, "GGUF", 4);
    f.version = 1;
    EXPECT_ERR(&f, QERR_UNSUPPORTED, "version 1 is not supported", "only 2 and 3");
    f.version = 4;
    EXPECT_ERR(&f, QERR_UNSUPPORTED, "version 4 is not supported", "only 2 and 3");
    f.version = 0x03000000u;
    EXPECT_ERR(&f, QERR_UNSUPPORTED, "big-endian", "version 50331648");
    gf_free(&f);

    char err[256];
    qmodel *m = qmodel_new();
    REQUIRE(m);
    CHECK_EQ_INT(gguf_parse(m, NULL, 0, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "truncated file: magic");
    qmodel_destroy(m);
}

/* Every prefix of a valid file is an error with a message, never a crash. */
static void test_truncated_everywhere(void)
{
    gfile f;
    gf_init(&f);
    tiny_llama(&f);
    size_t len;
    uint8_t *b = gf_bytes(&f, &len);
    char err[512];
    REQUIRE(parse_bytes(b, len, NULL, err, sizeof err) == 0);
    int fails = 0, truncated = 0, past_end = 0;
    for (size_t cut = 0; cut < len; cut++) {
        int rc = parse_bytes(b, cut, NULL, err, sizeof err);
        if (rc >= 0 || strncmp(err, "gguf: ", 6)) {
            fprintf(stderr, "  cut at %zu: rc %d '%s'\n", cut, rc, err);
            fails++;
        }
        truncated += strstr(err, "truncated file") != NULL;
        past_end += strstr(err, "past end of file") != NULL;
    }
    CHECK_EQ_INT(fails, 0);
    CHECK(truncated > 500);  /* the metadata and tensor infos */
    CHECK(past_end > 2000);  /* the data section */
    /* inside the last token string, the message names the key */
    uint8_t *g = memmem(b, len, "\x01\0\0\0\0\0\0\0g", 9);
    REQUIRE(g);
    CHECK_EQ_INT(parse_bytes(b, (size_t)(g - b) + 8, NULL, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "key 'tokenizer.ggml.tokens': truncated file: string value");
    CHECK_STR_CONTAINS(err, "is 1 bytes long, 0 left");
    free(b);
    gf_free(&f);
}

/* Counts and lengths far beyond the file fail before any allocation: with
 * allocations capped at 1 MiB, each must be QERR_FORMAT/RANGE, not NOMEM. */
static void test_hostile_counts(void)
{
    q_set_alloc_limit(1 << 20);
    gfile f;
    gf_init(&f);
    tiny_llama(&f);
    f.kvcount = (int64_t)1 << 62;
    EXPECT_ERR(&f, QERR_RANGE, "kv_count 4611686018427387904", "above the limit");
    f.kvcount = 60000;
    EXPECT_ERR(&f, QERR_FORMAT, "kv_count 60000", "does not fit in the");
    f.kvcount = -1;
    f.tcount = (int64_t)1 << 62;
    EXPECT_ERR(&f, QERR_RANGE, "tensor_count 4611686018427387904", "above the limit");
    f.tcount = 100000;
    EXPECT_ERR(&f, QERR_FORMAT, "tensor_count 100000", "does not fit in the");
    gf_free(&f);

    /* a key, a string value and a tensor name claiming 2^62 bytes */
    gf_init(&f);
    gb_u64(&f.kv, (uint64_t)1 << 62);
    gb_put(&f.kv, "general.architecture", 20);
    f.n_kv = 1;
    EXPECT_ERR(&f, QERR_FORMAT, "truncated file: metadata key", "is 4611686018427387904 bytes long");
    gf_free(&f);
    gf_init(&f);
    if (kv_key(&f, "general.architecture", T_STR)) gb_u64(&f.kv, (uint64_t)1 << 62);
    EXPECT_ERR(&f, QERR_FORMAT, "key 'general.architecture': truncated file: string value", "4611686018427387904");
    gf_free(&f);
    gf_init(&f);
    tiny_llama(&f);
    snprintf(f.t[0].name, sizeof f.t[0].name, "%s", "x");
    size_t len;
    uint8_t *b = gf_bytes(&f, &len);
    uint8_t *p = memmem(b, len, "\x01\0\0\0\0\0\0\0x", 9); /* the name's length */
    REQUIRE(p);
    memcpy(p, "\0\0\0\0\0\0\0\x40", 8);
    char err[512];
    CHECK_EQ_INT(parse_bytes(b, len, NULL, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "truncated file: tensor name");
    free(b);
    gf_free(&f);

    /* arrays: huge counts of fixed-size, string and array elements */
    static const uint32_t et[3] = { T_U8, T_STR, T_ARR };
    for (int i = 0; i < 3; i++) {
        gf_init(&f);
        if (kv_key(&f, "tokenizer.ggml.tokens", T_ARR)) {
            gb_u32(&f.kv, et[i]);
            gb_u64(&f.kv, (uint64_t)1 << 61);
        }
        tiny_llama(&f);
        EXPECT_ERR(&f, QERR_FORMAT, "array of 2305843009213693952", "does not fit in the");
        gf_free(&f);
    }
    /* more tokens than the vocabulary limit: refused before the table */
    gf_init(&f);
    if (kv_key(&f, "tokenizer.ggml.tokens", T_ARR)) {
        size_t n = (size_t)QMODEL_MAX_VOCAB + 1;
        uint8_t *empty = calloc(n, 8); /* n empty strings */
        REQUIRE(empty);
        gb_u32(&f.kv, T_STR);
        gb_u64(&f.kv, n);
        gb_put(&f.kv, empty, n * 8);
        free(empty);
    }
    f.omit[0] = "tokenizer.ggml.tokens";
    f.omit[1] = "tokenizer.ggml.scores";
    f.omit[2] = "tokenizer.ggml.token_type";
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_RANGE, "tokenizer.ggml.tokens has 4194305 entries (limit 4194304)", "gguf: ");
    gf_free(&f);
    q_set_alloc_limit((size_t)64 << 30);
}

static void test_unknown_types(void)
{
    gfile f;
    gf_init(&f);
    if (kv_key(&f, "general.weird", 13)) gb_u32(&f.kv, 0);
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_FORMAT, "key 'general.weird'", "unknown value type 13");
    gf_free(&f);
    gf_init(&f);
    if (kv_key(&f, "general.weird", T_ARR)) {
        gb_u32(&f.kv, 99);
        gb_u64(&f.kv, 0);
    }
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_FORMAT, "key 'general.weird'", "unknown array element type 99");
    gf_free(&f);

    /* arrays nested too deep */
    gf_init(&f);
    if (kv_key(&f, "general.deep", T_ARR)) {
        for (int i = 0; i < 9; i++) {
            gb_u32(&f.kv, T_ARR);
            gb_u64(&f.kv, 1);
        }
        gb_u32(&f.kv, T_U8);
        gb_u64(&f.kv, 0);
    }
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_UNSUPPORTED, "key 'general.deep'", "nested deeper than 8 levels");
    gf_free(&f);

    /* quantised and unknown ggml types */
    gf_init(&f);
    tiny_llama(&f);
    f.t[4].type = G_Q4_0;
    EXPECT_ERR(&f, QERR_UNSUPPORTED, "tensor 'blk.0.attn_q.weight'", "ggml type 2 (Q4_0) is not supported");
    f.t[4].type = 12345;
    EXPECT_ERR(&f, QERR_UNSUPPORTED, "tensor 'blk.0.attn_q.weight'", "ggml type 12345 (unknown)");
    gf_free(&f);
}

static void test_bad_dims(void)
{
    gfile f;
    gf_init(&f);
    tiny_llama(&f);
    gt *t = &f.t[4];
    t->ndim = 5;
    t->ne[2] = t->ne[3] = t->ne[4] = 1;
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 'blk.0.attn_q.weight'", "5 dimensions (1 to 4 allowed)");
    t->ndim = 0;
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 'blk.0.attn_q.weight'", "0 dimensions");
    t->ndim = 2;
    t->ne[1] = 0;
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 'blk.0.attn_q.weight'", "dimension 1 is 0");
    t->ne[1] = (uint64_t)1 << 41;
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 'blk.0.attn_q.weight'", "dimension 1 is 2199023255552");
    t->ndim = 3;
    t->ne[0] = t->ne[1] = t->ne[2] = (uint64_t)1 << 40;
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 'blk.0.attn_q.weight'", "element count overflows");
    t->ndim = 2;
    t->ne[0] = (uint64_t)1 << 40;
    t->ne[1] = (uint64_t)1 << 23; /* 2^63 elements fit, 2^65 bytes do not */
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 'blk.0.attn_q.weight'", "byte size of 9223372036854775808 F32 elements overflows");
    t->ne[1] = (uint64_t)1 << 20; /* 2^62 bytes: past the end */
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 'blk.0.attn_q.weight'", "past end of file");
    gf_free(&f);
}

static void test_bad_offsets(void)
{
    gfile f;
    gf_init(&f);
    tiny_llama(&f);
    gt *t = &f.t[11]; /* ffn_down, the last: data at 2528 of 3040 */
    t->fixed_offset = 1;
    t->offset = 3040 - 512 + 4;
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 'blk.0.ffn_down.weight'", "offset 2532 is not a multiple of the alignment 32");
    t->offset = (uint64_t)1 << 63;
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 'blk.0.ffn_down.weight'", "offset 9223372036854775808 past end of file");
    /* the last tensor's data runs past the end of a shortened file */
    t->fixed_offset = 0;
    size_t len;
    uint8_t *b = gf_bytes(&f, &len);
    char err[512], want[160];
    size_t data_start = len - 3040;
    CHECK_EQ_INT(parse_bytes(b, len - 32, NULL, err, sizeof err), QERR_FORMAT);
    snprintf(want, sizeof want, "tensor 'blk.0.ffn_down.weight': data [%zu, %zu) past end of file (%zu bytes)",
             data_start + 2528, data_start + 3040, len - 32);
    CHECK_STR_CONTAINS(err, want);
    free(b);
    gf_free(&f);
}

static void test_bad_alignment(void)
{
    static const struct { uint32_t v; int rc; const char *msg; } cases[] = {
        { 0, QERR_RANGE, "key 'general.alignment' = 0 is out of range [1, 1048576]" },
        { 48, QERR_FORMAT, "general.alignment 48 is not a power of two" },
        { 1u << 30, QERR_RANGE, "key 'general.alignment' = 1073741824 is out of range" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gfile f;
        gf_init(&f);
        kv_u32(&f, "general.alignment", cases[i].v);
        tiny_llama(&f);
        EXPECT_ERR(&f, cases[i].rc, cases[i].msg, "gguf: ");
        gf_free(&f);
    }
    gfile f;
    gf_init(&f);
    kv_str(&f, "general.alignment", "32");
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_FORMAT, "key 'general.alignment' has type string", "expected an integer");
    gf_free(&f);

    /* Alignment 1 is legal, but F32 data must still sit on 4-byte
     * boundaries: shifting the data section by 0..3 bytes (through the
     * length of general.name) loads exactly once. */
    int ok = 0, misaligned = 0;
    for (int shift = 0; shift < 4; shift++) {
        char name[8] = "abcd";
        name[shift] = 0;
        gf_init(&f);
        f.align = 1;
        kv_u32(&f, "general.alignment", 1);
        kv_str(&f, "general.name", name);
        f.omit[0] = "general.name";
        tiny_llama(&f);
        char err[512];
        int rc = parse_gf(&f, NULL, err, sizeof err);
        ok += rc == 0;
        misaligned += rc == QERR_FORMAT && strstr(err, "is not aligned for F32");
        gf_free(&f);
    }
    CHECK_EQ_INT(ok, 1);
    CHECK_EQ_INT(misaligned, 3);
}

static void test_duplicates(void)
{
    gfile f;
    gf_init(&f);
    tiny_llama(&f);
    kv_u32(&f, "llama.block_count", 2);
    EXPECT_ERR(&f, QERR_FORMAT, "metadata key 'llama.block_count' appears twice", "gguf: ");
    gf_free(&f);
    gf_init(&f);
    tiny_llama(&f);
    add_t(&f, "output_norm.weight", G_F32, 1, 8, 0);
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 'output_norm.weight' appears twice", "gguf: ");
    gf_free(&f);
}

static void test_bad_names(void)
{
    char longname[300];
    memset(longname, 'k', 257);
    longname[257] = 0;
    gfile f;
    gf_init(&f);
    kv_u32(&f, longname, 1);
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_FORMAT, "metadata key 0 has a name of 257 bytes", "limit 256");
    gf_free(&f);
    gf_init(&f);
    gb_strn(&f.kv, "gen\0eral", 8);
    gb_u32(&f.kv, T_U8);
    gb_put(&f.kv, "", 1);
    f.n_kv = 1;
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_FORMAT, "metadata key 0: name 'gen", "contains a NUL byte");
    gf_free(&f);
    gf_init(&f);
    kv_u32(&f, "", 1);
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_FORMAT, "metadata key 0 has an empty name", "gguf: ");
    gf_free(&f);
    gf_init(&f);
    tiny_llama(&f);
    snprintf(f.t[2].name, sizeof f.t[2].name, "%s", longname);
    EXPECT_ERR(&f, QERR_FORMAT, "tensor 2 has a name of 257 bytes", "limit 256");
    gf_free(&f);
}

static void test_wrong_metadata_types(void)
{
    static const struct { const char *key; const char *msg; } cases[] = {
        { "llama.embedding_length", "key 'llama.embedding_length' has type string, expected an integer" },
        { "general.architecture", "key 'general.architecture' has type u32, expected a string" },
        { "llama.attention.layer_norm_rms_epsilon", "key 'llama.attention.layer_norm_rms_epsilon' has type string, expected a number" },
        { "tokenizer.ggml.tokens", "key 'tokenizer.ggml.tokens' has type u32, expected an array of string" },
        { "tokenizer.ggml.bos_token_id", "key 'tokenizer.ggml.bos_token_id' has type string, expected an integer" },
        { "tokenizer.ggml.model", "key 'tokenizer.ggml.model' has type u32, expected a string" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gfile f;
        gf_init(&f);
        f.omit[0] = cases[i].key;
        tiny_llama(&f);
        if (strstr(cases[i].msg, "has type string")) kv_str(&f, cases[i].key, "8");
        else kv_u32(&f, cases[i].key, 8);
        EXPECT_ERR(&f, QERR_FORMAT, cases[i].msg, "gguf: ");
        gf_free(&f);
    }
    gfile f;
    gf_init(&f);
    f.omit[0] = "llama.feed_forward_length";
    tiny_llama(&f);
    kv_arr_i32(&f, "llama.feed_forward_length", 1, NULL);
    EXPECT_ERR(&f, QERR_FORMAT, "key 'llama.feed_forward_length' is an array of i32", "expected an integer");
    gf_free(&f);
    gf_init(&f);
    tiny_llama(&f);
    kv_bool(&f, "tokenizer.ggml.add_bos_token", 2);
    EXPECT_ERR(&f, QERR_FORMAT, "tokenizer.ggml.add_bos_token' has bool value 2", "gguf: ");
    gf_free(&f);
    gf_init(&f);
    tiny_llama(&f);
    kv_u32(&f, "tokenizer.ggml.add_bos_token", 1);
    EXPECT_ERR(&f, QERR_FORMAT, "key 'tokenizer.ggml.add_bos_token' has type u32", "expected a bool");
    gf_free(&f);
}

static void test_hparam_values(void)
{
    gfile f;
    gf_init(&f);
    f.omit[0] = "llama.embedding_length";
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_FORMAT, "missing metadata 'llama.embedding_length'", "gguf: ");
    kv_i32(&f, "llama.embedding_length", -8);
    EXPECT_ERR(&f, QERR_RANGE, "key 'llama.embedding_length' = -8 is out of range [1, 1048576]", "gguf: ");
    gf_free(&f);
    gf_init(&f);
    f.omit[0] = "llama.embedding_length";
    tiny_llama(&f);
    kv_u64(&f, "llama.embedding_length", (uint64_t)1 << 32);
    EXPECT_ERR(&f, QERR_RANGE, "key 'llama.embedding_length' = 4294967296 is out of range", "gguf: ");
    gf_free(&f);
    /* a zero head count is refused before it can divide anything */
    gf_init(&f);
    f.omit[0] = "llama.attention.head_count";
    tiny_llama(&f);
    kv_u32(&f, "llama.attention.head_count", 0);
    EXPECT_ERR(&f, QERR_RANGE, "key 'llama.attention.head_count' = 0 is out of range", "gguf: ");
    gf_free(&f);
    gf_init(&f);
    f.omit[0] = "llama.rope.freq_base";
    tiny_llama(&f);
    kv_f32(&f, "llama.rope.freq_base", -1.0f);
    EXPECT_ERR(&f, QERR_RANGE, "key 'llama.rope.freq_base' = -1 is out of range", "gguf: ");
    gf_free(&f);
    gf_init(&f);
    tiny_llama(&f);
    kv_str(&f, "llama.rope.scaling.type", "yarn");
    EXPECT_ERR(&f, QERR_UNSUPPORTED, "rope scaling 'yarn' is not supported", "llama.rope.scaling.type");
    gf_free(&f);
}

static void test_unsupported_arch(void)
{
    gfile f;
    gf_init(&f);
    f.omit[0] = "general.architecture";
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_FORMAT, "missing metadata 'general.architecture'", "gguf: ");
    kv_str(&f, "general.architecture", "gptx");
    EXPECT_ERR(&f, QERR_UNSUPPORTED, "architecture 'gptx' is not supported", "(quire runs llama, qwen2, qwen3, gemma2, gemma3, phi3, smollm3)");
    gf_free(&f);
}

static void test_vocab_errors(void)
{
    gfile f;
    gf_init(&f);
    f.omit[0] = "tokenizer.ggml.scores";
    tiny_llama(&f);
    kv_arr_f32(&f, "tokenizer.ggml.scores", 9);
    EXPECT_ERR(&f, QERR_FORMAT, "key 'tokenizer.ggml.scores' has 9 entries", "tokenizer.ggml.tokens has 10");
    gf_free(&f);
    gf_init(&f);
    f.omit[0] = "tokenizer.ggml.token_type";
    tiny_llama(&f);
    kv_arr_i32(&f, "tokenizer.ggml.token_type", 11, NULL);
    EXPECT_ERR(&f, QERR_FORMAT, "key 'tokenizer.ggml.token_type' has 11 entries", "tokenizer.ggml.tokens has 10");
    gf_free(&f);
    gf_init(&f);
    f.omit[0] = "tokenizer.ggml.tokens";
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_FORMAT, "tokenizer.ggml.model is set but tokenizer.ggml.tokens is missing", "gguf: ");
    gf_free(&f);
    /* scores without tokens (and no tokenizer model) */
    gf_init(&f);
    kv_str(&f, "tokenizer.ggml.model", "none");
    f.omit[0] = "tokenizer.ggml.tokens";
    f.omit[1] = "tokenizer.ggml.model";
    tiny_llama(&f);
    EXPECT_ERR(&f, QERR_FORMAT, "key 'tokenizer.ggml.scores' is present but tokenizer.ggml.tokens is missing", "gguf: ");
    gf_free(&f);
    /* a token with a NUL byte cannot be a C string */
    gf_init(&f);
    f.omit[0] = "tokenizer.ggml.tokens";
    tiny_llama(&f);
    if (kv_key(&f, "tokenizer.ggml.tokens", T_ARR)) {
        gb_u32(&f.kv, T_STR);
        gb_u64(&f.kv, 10);
        for (int i = 0; i < 10; i++) gb_strn(&f.kv, i == 7 ? "a\0b" : "t", i == 7 ? 3 : 1);
    }
    EXPECT_ERR(&f, QERR_FORMAT, "key 'tokenizer.ggml.tokens': entry 7 contains a NUL byte", "gguf: ");
    gf_free(&f);
}

/* Tokenizer settings that load: an unknown tokenizer model is not fatal,
 * absent / sentinel / out-of-range ids become -1. */
static void test_vocab_lenient(void)
{
    gfile f;
    gf_init(&f);
    kv_str(&f, "tokenizer.ggml.model", "bert");
    kv_u32(&f, "tokenizer.ggml.bos_token_id", 999);
    kv_small(&f, "tokenizer.ggml.eos_token_id", T_I64, (uint64_t)-5, 8);
    kv_small(&f, "tokenizer.ggml.eot_token_id", T_U16, 7, 2);
    f.omit[0] = "tokenizer.ggml.model";
    f.omit[1] = "tokenizer.ggml.bos_token_id";
    f.omit[2] = "tokenizer.ggml.eos_token_id";
    tiny_llama(&f);
    char err[512];
    qmodel *m;
    qlog_level lv = qlog_get_level();
    qlog_set_level(QLOG_ERROR);
    int rc = parse_gf(&f, &m, err, sizeof err);
    qlog_set_level(lv);
    CHECK_EQ_INT(rc, 0);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(m->vocab.kind, QVOCAB_NONE);
    CHECK_EQ_INT(m->vocab.n, 10); /* the tokens are still kept */
    CHECK_EQ_INT(m->add_bos, 0);
    CHECK_EQ_INT(m->bos_id, -1);
    CHECK_EQ_INT(m->n_eos, 1);
    CHECK_EQ_INT(m->eos_ids[0], 7);
    qmodel_destroy(m);
    gf_free(&f);
}

int main(void)
{
    QT_RUN(test_stories_parses);
    QT_RUN(test_stories_loads);
    QT_RUN(test_stories_truncated);
    QT_RUN(test_tiny_binds);
    QT_RUN(test_qwen2);
    QT_RUN(test_metadata_types);
    QT_RUN(test_bad_magic_and_version);
    QT_RUN(test_truncated_everywhere);
    QT_RUN(test_hostile_counts);
    QT_RUN(test_unknown_types);
    QT_RUN(test_bad_dims);
    QT_RUN(test_bad_offsets);
    QT_RUN(test_bad_alignment);
    QT_RUN(test_duplicates);
    QT_RUN(test_bad_names);
    QT_RUN(test_wrong_metadata_types);
    QT_RUN(test_hparam_values);
    QT_RUN(test_unsupported_arch);
    QT_RUN(test_vocab_errors);
    QT_RUN(test_vocab_lenient);
    QT_MAIN_END();
}
