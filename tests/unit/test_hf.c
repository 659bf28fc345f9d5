/* test_hf.c - the Hugging Face folder loader (hf.c) and safetensors.c.
 *
 * The shared model folders must load, through hf_load_dir and through
 * qmodel_load (which binds), with the hyperparameters their config.json
 * states.  Everything else here is an error path: crafted configs, crafted
 * safetensors images and crafted folders in a mkdtemp directory, each of
 * which must fail with the right code and a message naming the problem,
 * and never crash (run under ASan/UBSan too). */
#define _GNU_SOURCE
#include "arch.h"
#include "backend.h"
#include "model.h"
#include "qtest.h"
#include "util.h"

#include <ftw.h>
#include <math.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_tmp[256];

/* ---- helpers ------------------------------------------------------------ */

static const char *model_dir(const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, sizeof buf[0], "%s/tests/fixtures/models/%s", qt_root(), name);
    return p;
}

/* A fresh folder under the temporary root. */
static const char *mkfolder(const char *name)
{
    static char buf[4][512];
    static int k;
    char *p = buf[k++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", g_tmp, name);
    mkdir(p, 0755);
    return p;
}

static void put(const char *dir, const char *file, const void *data, size_t len)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "wb");
    if (!f) {
        fprintf(stderr, "cannot write %s\n", path);
        return;
    }
    if (len) fwrite(data, 1, len, f);
    fclose(f);
}

static void put_text(const char *dir, const char *file, const char *text)
{
    put(dir, file, text, strlen(text));
}

/* A safetensors image: the header text (padded with spaces to a multiple of
 * 8 when pad), then data_len bytes where byte i is (i * 7 + 3) & 0xff. */
typedef struct {
    uint8_t *buf;
    size_t len, hlen;
} blob;

static blob st_make(const char *header, int pad, size_t data_len)
{
    blob b;
    size_t h = strlen(header);
    b.hlen = pad ? (h + 7) / 8 * 8 : h;
    b.len = 8 + b.hlen + data_len;
    b.buf = malloc(b.len);
    for (int i = 0; i < 8; i++) b.buf[i] = (uint8_t)((uint64_t)b.hlen >> (8 * i));
    memcpy(b.buf + 8, header, h);
    memset(b.buf + 8 + h, ' ', b.hlen - h);
    for (size_t i = 0; i < data_len; i++) b.buf[8 + b.hlen + i] = (uint8_t)((i * 7 + 3) & 0xff);
    return b;
}

static int st_parse(const blob *b, qmodel **out, char *err, size_t errlen)
{
    qmodel *m = qmodel_new();
    int rc = safetensors_parse(m, b->buf, b->len, "t.safetensors", err, errlen);
    if (out) *out = m;
    else qmodel_destroy(m);
    return rc;
}

static int load_dir(const char *dir, qmodel **out, char *err, size_t errlen)
{
    qmodel *m = qmodel_new();
    err[0] = 0;
    int rc = hf_load_dir(m, dir, err, errlen);
    if (out) *out = m;
    else qmodel_destroy(m);
    return rc;
}

/* A small valid config.json (llama, dim 64, 8 heads, 4 KV heads, vocab 512). */
static const char BASE_CFG[] =
    "{\"model_type\": \"llama\", \"hidden_size\": 64, \"intermediate_size\": 128,"
    " \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"num_key_value_heads\": 4,"
    " \"vocab_size\": 512, \"max_position_embeddings\": 256, \"rms_norm_eps\": 1e-5,"
    " \"bos_token_id\": 1, \"eos_token_id\": 2}";

/* BASE_CFG with (key, value-as-JSON-text) pairs applied, NULL key ends;
 * a NULL value deletes the key.  Caller frees. */
static char *cfg(const char *first_key, ...)
{
    json_t *root = json_loads(BASE_CFG, 0, NULL);
    va_list ap;
    va_start(ap, first_key);
    for (const char *key = first_key; key; key = va_arg(ap, const char *)) {
        const char *val = va_arg(ap, const char *);
        if (!val) {
            json_object_del(root, key);
            continue;
        }
        json_t *v = json_loads(val, JSON_DECODE_ANY, NULL);
        if (!v) fprintf(stderr, "bad test value %s\n", val);
        json_object_set_new(root, key, v);
    }
    va_end(ap);
    char *s = json_dumps(root, 0);
    json_decref(root);
    return s;
}

static int parse_cfg(qmodel *m, const char *text, char *err, size_t errlen)
{
    err[0] = 0;
    return hf_parse_config(m, text, strlen(text), err, errlen);
}

/* Two tensors "a" (F32 2x2) and "b" (BF16 3) in 22 bytes of data. */
static const char ST_AB[] =
    "{\"__metadata__\": {\"format\": \"pt\"},"
    " \"a\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]},"
    " \"b\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [16, 22]}}";

/* ---- the shared folders ------------------------------------------------- */

static void test_stories_dir(void)
{
    char err[512];
    qmodel *m;
    int rc = load_dir(model_dir("stories260K-hf/"), &m, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(rc, 0);
    const qhparams *hp = &m->hp;
    CHECK_EQ_INT(m->format, QFMT_HF);
    CHECK(m->name && !strcmp(m->name, "stories260K-hf"));
    CHECK(!strcmp(qfamily_get(hp->family)->name, "llama"));
    CHECK_EQ_INT(hp->dim, 64);
    CHECK_EQ_INT(hp->n_layers, 5);
    CHECK_EQ_INT(hp->n_heads, 8);
    CHECK_EQ_INT(hp->n_kv_heads, 4);
    CHECK_EQ_INT(hp->head_dim, 8);
    CHECK_EQ_INT(hp->rope_dim, 8);
    CHECK_EQ_INT(hp->ffn_dim, 172);
    CHECK_EQ_INT(hp->n_vocab, 512);
    CHECK_EQ_INT(hp->max_ctx, 2048);
    CHECK(fabsf(hp->norm_eps - 1e-5f) < 1e-9f);
    CHECK(hp->rope_theta == 10000.0f);
    CHECK_EQ_INT(hp->rope_scaling, QROPE_SCALE_NONE);
    CHECK_EQ_INT(hp->rope_neox, 1);
    CHECK_EQ_INT(hp->tied_embeddings, 0);
    CHECK_EQ_INT(hp->attn_bias, 0);
    CHECK_EQ_INT(m->bos_id, 1);
    CHECK_EQ_INT(m->n_eos, 1);
    CHECK_EQ_INT(m->eos_ids[0], 2);
    CHECK_EQ_INT(m->unk_id, 0);
    CHECK_EQ_INT(m->add_bos, 1);
    CHECK_EQ_INT(m->n_tensors, 48);
    CHECK_EQ_INT(m->n_maps, 1);

    /* The vocabulary. */
    CHECK_EQ_INT(m->vocab.kind, QVOCAB_SPM);
    REQUIRE(m->vocab.n == 512 && m->vocab.tokens && m->vocab.types);
    CHECK(m->vocab.tokens[1] && !strcmp(m->vocab.tokens[1], "<s>"));
    CHECK_EQ_INT(m->vocab.types[1], QTOK_CONTROL);
    CHECK_EQ_INT(m->vocab.types[0], QTOK_UNKNOWN);
    CHECK(m->vocab.tokens[3] && !strcmp(m->vocab.tokens[3], "<0x00>"));
    CHECK_EQ_INT(m->vocab.types[3], QTOK_BYTE);
    CHECK(m->vocab.tokens[265] && !strcmp(m->vocab.tokens[265], "\xe2\x96\x81the"));
    CHECK_EQ_INT(m->vocab.types[265], QTOK_NORMAL);
    for (int i = 0; i < m->vocab.n; i++) CHECK(m->vocab.tokens[i] != NULL);
    CHECK(m->vocab.tokenizer_json && strstr(m->vocab.tokenizer_json, "stories260K-hf/tokenizer.json"));

    /* Tensors point at the right bytes: the first floats of the embedding,
     * as Python's safetensors reads them. */
    const qnamed_tensor *e = qmodel_find(m, "model.embed_tokens.weight");
    REQUIRE(e);
    CHECK_EQ_INT(e->t.dtype, QDT_F32);
    CHECK_EQ_INT(e->t.ndim, 2);
    CHECK_EQ_INT(e->t.shape[0], 512);
    CHECK_EQ_INT(e->t.shape[1], 64);
    const float *f = e->t.data;
    CHECK(fabsf(f[0] - -0.29474878f) < 1e-6f);
    CHECK(fabsf(f[1] - 0.56189561f) < 1e-6f);
    CHECK(fabsf(f[3] - 0.34057361f) < 1e-6f);
    qmodel_destroy(m);
}

static void test_llama3_dir(void)
{
    char err[512];
    qmodel *m;
    int rc = load_dir(model_dir("tiny-llama3-random"), &m, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(rc, 0);
    const qhparams *hp = &m->hp;
    CHECK(!strcmp(qfamily_get(hp->family)->name, "llama"));
    CHECK_EQ_INT(hp->dim, 128);
    CHECK_EQ_INT(hp->n_layers, 3);
    CHECK_EQ_INT(hp->n_heads, 8);
    CHECK_EQ_INT(hp->n_kv_heads, 2);
    CHECK_EQ_INT(hp->head_dim, 16);
    CHECK_EQ_INT(hp->ffn_dim, 344);
    CHECK_EQ_INT(hp->max_ctx, 4096);
    CHECK(hp->rope_theta == 500000.0f);
    CHECK_EQ_INT(hp->rope_scaling, QROPE_SCALE_LLAMA3);
    CHECK(hp->rope_factor == 8.0f);
    CHECK(hp->rope_low_freq_factor == 1.0f);
    CHECK(hp->rope_high_freq_factor == 4.0f);
    CHECK_EQ_INT(hp->rope_orig_ctx, 256);
    CHECK_EQ_INT(hp->tied_embeddings, 0);
    const qnamed_tensor *k = qmodel_find(m, "model.layers.0.self_attn.k_proj.weight");
    REQUIRE(k);
    CHECK_EQ_INT(k->t.dtype, QDT_BF16);
    CHECK_EQ_INT(k->t.shape[0], 32);
    CHECK_EQ_INT(k->t.shape[1], 128);
    CHECK(qmodel_find(m, "lm_head.weight") != NULL);
    qmodel_destroy(m);
}

static void test_qwen2_dir(void)
{
    char err[512];
    qmodel *m;
    int rc = load_dir(model_dir("tiny-qwen2-random"), &m, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(rc, 0);
    const qhparams *hp = &m->hp;
    CHECK(!strcmp(qfamily_get(hp->family)->name, "qwen2"));
    CHECK_EQ_INT(hp->n_heads, 4);
    CHECK_EQ_INT(hp->n_kv_heads, 2);
    CHECK_EQ_INT(hp->head_dim, 32);
    CHECK(hp->rope_theta == 1e6f);
    CHECK_EQ_INT(hp->rope_scaling, QROPE_SCALE_NONE);
    CHECK_EQ_INT(hp->tied_embeddings, 1);
    CHECK_EQ_INT(hp->attn_bias, 1);
    CHECK(fabsf(hp->norm_eps - 1e-6f) < 1e-10f);
    const qnamed_tensor *b = qmodel_find(m, "model.layers.0.self_attn.q_proj.bias");
    REQUIRE(b);
    CHECK_EQ_INT(b->t.dtype, QDT_BF16);
    CHECK_EQ_INT(b->t.shape[0], 128);
    CHECK(qmodel_find(m, "lm_head.weight") == NULL);
    qmodel_destroy(m);
}

static void test_qmodel_load_binds(void)
{
    static const char *const names[] = { "stories260K-hf", "tiny-llama3-random", "tiny-qwen2-random",
                                         "stories260K-draft4-hf" };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char err[512] = "";
        qmodel *m = NULL;
        int rc = qmodel_load(model_dir(names[i]), &m, err, sizeof err);
        if (rc) fprintf(stderr, "  %s: %s\n", names[i], err);
        CHECK_EQ_INT(rc, 0);
        if (!m) continue;
        CHECK_EQ_INT(m->format, QFMT_HF);
        CHECK(m->name && !strcmp(m->name, names[i]));
        CHECK(m->w.layers != NULL);
        CHECK(m->w.tok_embd.data == qmodel_find(m, "model.embed_tokens.weight")->t.data);
        CHECK_EQ_INT(strlen(m->fingerprint_hex), 32);
        if (i == 2) { /* qwen2: tied, biased */
            CHECK(m->w.output.data == m->w.tok_embd.data);
            CHECK(m->w.layers[0].bq.data != NULL);
            CHECK(m->hp.attn_bias);
        } else {
            CHECK(m->w.output.data == qmodel_find(m, "lm_head.weight")->t.data);
            CHECK(m->w.layers[0].bq.data == NULL);
        }
        if (i == 1) {
            CHECK_EQ_INT(m->hp.rope_scaling, QROPE_SCALE_LLAMA3);
            CHECK_EQ_INT(m->w.layers[2].wk.dtype, QDT_BF16);
        }
        if (i == 3) CHECK_EQ_INT(m->hp.n_layers, 4);
        CHECK_EQ_INT(m->bos_id, 1);
        qmodel_destroy(m);
    }
}

/* ---- config.json -------------------------------------------------------- */

static void test_config_real(void)
{
    static const struct {
        const char *file;
        const char *family; int n_kv, head_dim, n_eos, tied, bias, scaling, max_ctx;
        float theta;
    } want[] = {
        { "llama-3.2-3b-instruct.json", "llama", 8, 128, 3, 1, 0, QROPE_SCALE_LLAMA3, 131072, 500000.0f },
        { "llama-3.1-8b.json", "llama", 8, 128, 1, 0, 0, QROPE_SCALE_LLAMA3, 131072, 500000.0f },
        { "llama-3.2-1b.json", "llama", 8, 64, 1, 1, 0, QROPE_SCALE_LLAMA3, 131072, 500000.0f },
        { "mistral-7b-instruct-v0.3.json", "mistral", 8, 128, 1, 0, 0, QROPE_SCALE_NONE, 32768, 1e6f },
        { "qwen2.5-7b-instruct.json", "qwen2", 4, 128, 1, 0, 1, QROPE_SCALE_NONE, 32768, 1e6f },
        { "bench-8b-v32k.json", "llama", 8, 128, 1, 0, 0, QROPE_SCALE_NONE, 8192, 500000.0f },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char path[512], err[512] = "", *text = NULL;
        size_t len;
        snprintf(path, sizeof path, "%s/tests/fixtures/configs/%s", qt_root(), want[i].file);
        REQUIRE(q_read_file(path, 1 << 20, &text, &len, err, sizeof err) == 0);
        qmodel *m = qmodel_new();
        int rc = hf_parse_config(m, text, len, err, sizeof err);
        if (rc) fprintf(stderr, "  %s: %s\n", want[i].file, err);
        CHECK_EQ_INT(rc, 0);
        CHECK(!strcmp(qfamily_get(m->hp.family)->name, want[i].family));
        CHECK_EQ_INT(m->hp.n_kv_heads, want[i].n_kv);
        CHECK_EQ_INT(m->hp.head_dim, want[i].head_dim);
        CHECK_EQ_INT(m->n_eos, want[i].n_eos);
        CHECK_EQ_INT(m->hp.tied_embeddings, want[i].tied);
        CHECK_EQ_INT(m->hp.attn_bias, want[i].bias);
        CHECK_EQ_INT(m->hp.rope_scaling, want[i].scaling);
        CHECK_EQ_INT(m->hp.max_ctx, want[i].max_ctx);
        CHECK(m->hp.rope_theta == want[i].theta);
        if (i == 0) {
            CHECK_EQ_INT(m->eos_ids[2], 128009);
            CHECK(m->hp.rope_factor == 32.0f);
            CHECK_EQ_INT(m->hp.rope_orig_ctx, 8192);
        }
        qmodel_destroy(m);
        free(text);
    }
}

static void test_config_variants(void)
{
    char err[512];
    qmodel *m = qmodel_new();
    char *s;

    /* architectures[0] when model_type is absent. */
    s = cfg("model_type", NULL, "architectures", "[\"MistralForCausalLM\"]", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(!strcmp(qfamily_get(m->hp.family)->name, "mistral"));
    free(s);
    s = cfg("model_type", NULL, "architectures", "[\"Qwen2ForCausalLM\"]", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(!strcmp(qfamily_get(m->hp.family)->name, "qwen2"));
    CHECK_EQ_INT(m->hp.attn_bias, 1);
    free(s);

    /* head_dim null means hidden_size / heads; kv heads default to heads. */
    s = cfg("head_dim", "null", "num_key_value_heads", NULL, NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK_EQ_INT(m->hp.head_dim, 8);
    CHECK_EQ_INT(m->hp.n_kv_heads, 8);
    CHECK_EQ_INT(m->hp.rope_dim, 8);
    free(s);

    /* Defaults. */
    s = cfg("rms_norm_eps", NULL, "max_position_embeddings", NULL, "bos_token_id", "null", "eos_token_id", NULL, NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(fabsf(m->hp.norm_eps - 1e-6f) < 1e-10f);
    CHECK_EQ_INT(m->hp.max_ctx, 2048);
    CHECK(m->hp.rope_theta == 10000.0f);
    CHECK_EQ_INT(m->bos_id, -1);
    CHECK_EQ_INT(m->n_eos, 0);
    CHECK_EQ_INT(m->hp.tied_embeddings, 0);
    free(s);

    /* Linear scaling, older "type" key. */
    s = cfg("rope_scaling", "{\"type\": \"linear\", \"factor\": 2.0}", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK_EQ_INT(m->hp.rope_scaling, QROPE_SCALE_LINEAR);
    CHECK(m->hp.rope_factor == 2.0f);
    free(s);

    /* rope_parameters (newer layout) with llama3 scaling inside; its theta wins. */
    s = cfg("rope_theta", "10000.0", "rope_parameters",
            "{\"rope_theta\": 500000.0, \"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
            " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 128}", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(m->hp.rope_theta == 500000.0f);
    CHECK_EQ_INT(m->hp.rope_scaling, QROPE_SCALE_LLAMA3);
    CHECK_EQ_INT(m->hp.rope_orig_ctx, 128);
    free(s);

    /* rope_scaling of type default is no scaling. */
    s = cfg("rope_scaling", "{\"rope_type\": \"default\"}", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK_EQ_INT(m->hp.rope_scaling, QROPE_SCALE_NONE);
    free(s);

    /* eos as a list, duplicates dropped. */
    s = cfg("eos_token_id", "[2, 2, 7]", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK_EQ_INT(m->n_eos, 2);
    CHECK_EQ_INT(m->eos_ids[1], 7);
    free(s);

    /* A Mistral sliding window makes every layer local, the context stays;
     * Qwen2's only when use_sliding_window is true, from max_window_layers on. */
    s = cfg("model_type", "\"mistral\"", "sliding_window", "128", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK_EQ_INT(m->hp.max_ctx, 256);
    CHECK_EQ_INT(m->hp.window, 128);
    CHECK(qhp_layer_local(&m->hp, 0) && qhp_layer_local(&m->hp, 1));
    CHECK_EQ_INT(qhp_all_local_window(&m->hp), 128);
    free(s);
    s = cfg("model_type", "\"qwen2\"", "sliding_window", "128", "use_sliding_window", "false", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK_EQ_INT(m->hp.window, 0);
    free(s);
    s = cfg("model_type", "\"qwen2\"", "sliding_window", "128", "use_sliding_window", "true", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK_EQ_INT(m->hp.window, 128);
    CHECK_EQ_INT(qhp_all_local_window(&m->hp), 128);
    free(s);
    s = cfg("model_type", "\"qwen2\"", "sliding_window", "128", "use_sliding_window", "true", "max_window_layers", "1",
            NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), QERR_UNSUPPORTED); /* global, then local: no pattern */
    CHECK_STR_CONTAINS(err, "every n-th layer global");
    free(s);

    /* Gemma 2: local and global in turn, soft-caps by default, the scale from
     * query_pre_attn_scalar, (1 + w) norms. */
    s = cfg("model_type", "\"gemma2\"", "sliding_window", "16", "query_pre_attn_scalar", "64",
            "hidden_activation", "\"gelu_pytorch_tanh\"", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(m->hp.window == 16 && m->hp.window_pattern == 2 && qhp_layer_local(&m->hp, 0) && !qhp_layer_local(&m->hp, 1));
    CHECK(m->hp.attn_softcap == 50.0f && m->hp.final_softcap == 30.0f && m->hp.attn_scale == 0.125f);
    CHECK(m->hp.norm_add_one && m->hp.embed_scale && m->hp.act == QACT_GELU_TANH && m->hp.norm_place == QNORM_SANDWICH);
    CHECK_EQ_INT(qhp_all_local_window(&m->hp), 0);
    free(s);
    s = cfg("model_type", "\"gemma2\"", "final_logit_softcapping", "null", "hidden_act", "\"silu\"", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), QERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err, "hidden_act \"silu\"");
    free(s);
    s = cfg("model_type", "\"gemma2\"", "final_logit_softcapping", "null", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(m->hp.final_softcap == 0 && m->hp.attn_softcap == 50.0f);
    free(s);
    /* Gemma 3: layer_types, RoPE per layer type in either layout. */
    s = cfg("model_type", "\"gemma3_text\"", "sliding_window", "32",
            "layer_types", "[\"sliding_attention\", \"full_attention\"]",
            "rope_parameters", "{\"full_attention\": {\"rope_type\": \"linear\", \"factor\": 8.0, \"rope_theta\": 1000000.0},"
            " \"sliding_attention\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}}", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(m->hp.window == 32 && m->hp.window_pattern == 2);
    CHECK(m->hp.rope_theta == 1e6f && m->hp.rope_theta_local == 1e4f && m->hp.rope_scaling == QROPE_SCALE_LINEAR &&
          m->hp.rope_factor == 8.0f && m->hp.qk_norm && m->hp.attn_softcap == 0);
    free(s);
    s = cfg("model_type", "\"gemma3_text\"", "sliding_window", "32", "rope_theta", "1000000.0", "num_hidden_layers", "7",
            "rope_local_base_freq", "5000.0", "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": 4.0}", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(m->hp.window_pattern == 6 && m->hp.rope_theta_local == 5000.0f && m->hp.rope_factor == 4.0f);
    CHECK(qhp_layer_local(&m->hp, 4) && !qhp_layer_local(&m->hp, 5) && qhp_layer_local(&m->hp, 6));
    free(s);
    s = cfg("model_type", "\"gemma3_text\"", "sliding_window", "32",
            "rope_parameters", "{\"sliding_attention\": {\"rope_type\": \"linear\", \"factor\": 2.0}}", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), QERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err, "scaled RoPE for local layers");
    free(s);
    s = cfg("model_type", "\"gemma3_text\"", "sliding_window", "32", "layer_types", "[\"sliding_attention\", \"chunked\"]",
            NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), QERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err, "layer_types[1]");
    free(s);
    /* SmolLM3: every fourth layer without RoPE by default, tied, rope_theta
     * 2e6 unless stated; no_rope_layers where given, refused when no
     * interval makes it; a window on the NoPE layers (transformers' rule
     * without layer_types) is not a layout quire computes. */
    s = cfg("model_type", "\"smollm3\"", "num_hidden_layers", "8", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(m->hp.nope_interval == 4 && m->hp.tied_embeddings && m->hp.rope_theta == 2e6f && m->hp.window == 0);
    CHECK(qhp_layer_rope(&m->hp, 2) && !qhp_layer_rope(&m->hp, 3) && qhp_layer_rope(&m->hp, 4) && !qhp_layer_rope(&m->hp, 7));
    free(s);
    s = cfg("model_type", "\"smollm3\"", "no_rope_layers", "[1, 0]", "tie_word_embeddings", "false", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(m->hp.nope_interval == 2 && !m->hp.tied_embeddings);
    free(s);
    s = cfg("model_type", "\"smollm3\"", "no_rope_layers", "[1, 1]", "no_rope_layer_interval", "2", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), 0);
    CHECK(m->hp.nope_interval == 0 && qhp_layer_rope(&m->hp, 1));
    free(s);
    s = cfg("model_type", "\"smollm3\"", "num_hidden_layers", "4", "no_rope_layers", "[0, 1, 1, 0]", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), QERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err, "no_rope_layers other than");
    free(s);
    s = cfg("model_type", "\"smollm3\"", "no_rope_layers", "[1, 2]", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "no_rope_layers[1]");
    free(s);
    s = cfg("model_type", "\"smollm3\"", "no_rope_layers", "[1]", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "must list 2");
    free(s);
    s = cfg("model_type", "\"smollm3\"", "no_rope_layer_interval", "0", NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), QERR_RANGE);
    CHECK_STR_CONTAINS(err, "no_rope_layer_interval");
    free(s);
    s = cfg("model_type", "\"smollm3\"", "num_hidden_layers", "8", "use_sliding_window", "true", "sliding_window", "64",
            NULL);
    CHECK_EQ_INT(parse_cfg(m, s, err, sizeof err), QERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err, "sliding-window layers");
    free(s);

    qmodel_destroy(m);
}

static void test_config_errors(void)
{
    static const struct {
        const char *key, *val;
        int rc;
        const char *needle;
    } cases[] = {
        { "hidden_size", "-64", QERR_RANGE, "hidden_size" },
        { "hidden_size", "0", QERR_RANGE, "hidden_size" },
        { "hidden_size", "1073741824", QERR_RANGE, "hidden_size" },
        { "hidden_size", "99999999999999999", QERR_RANGE, "hidden_size" },
        { "hidden_size", "\"64\"", QERR_FORMAT, "hidden_size" },
        { "hidden_size", "64.5", QERR_FORMAT, "hidden_size" },
        { "hidden_size", NULL, QERR_FORMAT, "hidden_size" },
        { "hidden_size", "65", QERR_RANGE, "divisible" },
        { "intermediate_size", "-1", QERR_RANGE, "intermediate_size" },
        { "num_hidden_layers", "100000", QERR_RANGE, "num_hidden_layers" },
        { "num_hidden_layers", "[2]", QERR_FORMAT, "num_hidden_layers" },
        { "num_attention_heads", "0", QERR_RANGE, "num_attention_heads" },
        { "num_key_value_heads", "3", QERR_RANGE, "num_key_value_heads" },
        { "num_key_value_heads", "16", QERR_RANGE, "num_key_value_heads" },
        { "vocab_size", "99999999999", QERR_RANGE, "vocab_size" },
        { "vocab_size", "[512]", QERR_FORMAT, "vocab_size" },
        { "max_position_embeddings", "0", QERR_RANGE, "max_position_embeddings" },
        { "head_dim", "7", QERR_RANGE, "even" },
        { "head_dim", "1000000", QERR_RANGE, "head_dim" },
        { "head_dim", "4098", QERR_RANGE, "head_dim" },
        { "rms_norm_eps", "0", QERR_RANGE, "rms_norm_eps" },
        { "rms_norm_eps", "2e-46", QERR_RANGE, "rms_norm_eps" }, /* 0 as a float */
        { "rms_norm_eps", "\"1e-5\"", QERR_FORMAT, "rms_norm_eps" },
        { "rope_theta", "-1", QERR_RANGE, "rope_theta" },
        { "rope_theta", "true", QERR_FORMAT, "rope_theta" },
        { "tie_word_embeddings", "\"yes\"", QERR_FORMAT, "tie_word_embeddings" },
        { "attention_bias", "1", QERR_FORMAT, "attention_bias" },
        { "model_type", "\"gemma\"", QERR_UNSUPPORTED, "gemma" },
        { "model_type", "42", QERR_FORMAT, "model_type" },
        { "hidden_act", "\"gelu\"", QERR_UNSUPPORTED, "gelu" },
        { "mlp_bias", "true", QERR_UNSUPPORTED, "mlp_bias" },
        { "rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", QERR_UNSUPPORTED, "yarn" },
        { "rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}", QERR_UNSUPPORTED, "dynamic" },
        { "rope_scaling", "\"llama3\"", QERR_FORMAT, "rope_scaling" },
        { "rope_scaling", "{\"rope_type\": 3}", QERR_FORMAT, "rope_type" },
        { "rope_scaling", "{\"rope_type\": \"linear\"}", QERR_FORMAT, "factor" },
        { "rope_scaling", "{\"rope_type\": \"linear\", \"factor\": -2}", QERR_RANGE, "factor" },
        { "rope_scaling",
          "{\"rope_type\": \"llama3\", \"low_freq_factor\": 1, \"high_freq_factor\": 4,"
          " \"original_max_position_embeddings\": 64}", QERR_FORMAT, "factor" },
        { "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 4, \"high_freq_factor\": 1,"
          " \"original_max_position_embeddings\": 64}", QERR_RANGE, "high_freq_factor" },
        { "rope_scaling",
          "{\"rope_type\": \"llama3\", \"factor\": 8, \"low_freq_factor\": 1, \"high_freq_factor\": 4,"
          " \"original_max_position_embeddings\": -64}", QERR_RANGE, "original_max_position_embeddings" },
        { "rope_parameters", "{\"rope_type\": \"yarn\"}", QERR_UNSUPPORTED, "yarn" },
        { "rope_parameters", "{\"rope_type\": \"longrope\"}", QERR_FORMAT, "\"original_max_position_embeddings\" is missing" },
        { "rope_parameters", "{\"rope_type\": \"longrope\", \"original_max_position_embeddings\": 64,"
                             " \"long_factor\": [1, 2], \"short_factor\": [1, 1, 1, 1]}", QERR_FORMAT,
          "\"long_factor\" must be a list of 4 numbers" },
        { "rope_parameters", "{\"rope_type\": \"longrope\", \"original_max_position_embeddings\": 64,"
                             " \"long_factor\": [1, 2, 3, 0], \"short_factor\": [1, 1, 1, 1]}", QERR_RANGE,
          "\"long_factor\"[3] must be a number in (0, 1e6)" },
        { "partial_rotary_factor", "0.1", QERR_RANGE, "leaves 0 rotated dimensions" },
        { "rope_parameters", "[1]", QERR_FORMAT, "rope_parameters" },
        { "rope_parameters", "{\"rope_theta\": 0}", QERR_RANGE, "rope_theta" },
        { "eos_token_id", "[1, 2, 3, 4, 5, 6, 7, 8, 9]", QERR_LIMIT, "eos_token_id" },
        { "eos_token_id", "512", QERR_RANGE, "eos_token_id" },
        { "eos_token_id", "\"2\"", QERR_FORMAT, "eos_token_id" },
        { "eos_token_id", "[1, \"x\"]", QERR_FORMAT, "eos_token_id" },
        { "bos_token_id", "-1", QERR_RANGE, "bos_token_id" },
        { "bos_token_id", "[1]", QERR_FORMAT, "bos_token_id" },
    };
    char err[512];
    qmodel *m = qmodel_new();
    REQUIRE(parse_cfg(m, BASE_CFG, err, sizeof err) == 0);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *s = cfg(cases[i].key, cases[i].val, NULL);
        int rc = parse_cfg(m, s, err, sizeof err);
        if (rc != cases[i].rc) fprintf(stderr, "  case %zu (%s = %s): %s\n", i, cases[i].key, cases[i].val, err);
        CHECK_EQ_INT(rc, cases[i].rc);
        CHECK_STR_CONTAINS(err, cases[i].needle);
        CHECK_STR_CONTAINS(err, "config.json");
        free(s);
    }
    /* A failed parse leaves the model as the last good one left it. */
    CHECK_EQ_INT(m->hp.dim, 64);
    CHECK_EQ_INT(m->hp.n_kv_heads, 4);
    CHECK_EQ_INT(m->n_eos, 1);
    CHECK_EQ_INT(m->bos_id, 1);

    static const struct {
        const char *text;
        int rc;
        const char *needle;
    } raw[] = {
        { "not json", QERR_FORMAT, "invalid JSON" },
        { "", QERR_FORMAT, "invalid JSON" },
        { "{\"model_type\": \"llama\", \"hidden_size\": 6", QERR_FORMAT, "invalid JSON" },
        { "[1, 2]", QERR_FORMAT, "object" },
        { "{}", QERR_FORMAT, "model_type" },
        { "{\"architectures\": [\"GPT2LMHeadModel\"]}", QERR_UNSUPPORTED, "GPT2LMHeadModel" },
        { "{\"architectures\": \"LlamaForCausalLM\"}", QERR_FORMAT, "architectures" },
        { "{\"architectures\": [7]}", QERR_FORMAT, "architectures" },
    };
    for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
        CHECK_EQ_INT(parse_cfg(m, raw[i].text, err, sizeof err), raw[i].rc);
        CHECK_STR_CONTAINS(err, raw[i].needle);
    }
    /* Length is honoured: the valid text cut short is invalid. */
    CHECK_EQ_INT(hf_parse_config(m, BASE_CFG, sizeof BASE_CFG - 10, err, sizeof err), QERR_FORMAT);
    qmodel_destroy(m);
}

/* ---- safetensors -------------------------------------------------------- */

static void test_safetensors_valid(void)
{
    char err[512] = "";
    blob b = st_make(ST_AB, 1, 22);
    qmodel *m;
    int rc = st_parse(&b, &m, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(m->n_tensors, 2);
    const qnamed_tensor *a = qmodel_find(m, "a"), *bt = qmodel_find(m, "b");
    REQUIRE(a && bt);
    CHECK_EQ_INT(a->t.dtype, QDT_F32);
    CHECK_EQ_INT(a->t.ndim, 2);
    CHECK_EQ_INT(a->t.shape[1], 2);
    CHECK(a->t.data == b.buf + 8 + b.hlen);
    CHECK_EQ_INT(bt->t.dtype, QDT_BF16);
    CHECK(bt->t.data == b.buf + 8 + b.hlen + 16);
    CHECK(qmodel_find(m, "__metadata__") == NULL);
    qmodel_destroy(m);
    free(b.buf);

    /* Unpadded header: the data region starts misaligned, and the F32
     * tensor is copied to aligned memory with the same bytes. */
    b = st_make(ST_AB, 0, 22);
    REQUIRE((8 + b.hlen) % 4 != 0);
    rc = st_parse(&b, &m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    a = qmodel_find(m, "a");
    REQUIRE(a);
    CHECK((uintptr_t)a->t.data % 4 == 0);
    CHECK(memcmp(a->t.data, b.buf + 8 + b.hlen, 16) == 0);
    qmodel_destroy(m);
    free(b.buf);
}

static void test_safetensors_errors(void)
{
    static const struct {
        const char *header;
        int rc;
        const char *needle, *needle2;
    } cases[] = {
        { "{\"a\": {\"dtype\": \"I8\", \"shape\": [4], \"data_offsets\": [0, 4]}}", QERR_UNSUPPORTED, "I8", "'a'" },
        { "{\"w\": {\"dtype\": \"F64\", \"shape\": [2], \"data_offsets\": [0, 16]}}", QERR_UNSUPPORTED, "F64", "'w'" },
        { "{\"a\": {\"shape\": [4], \"data_offsets\": [0, 16]}}", QERR_FORMAT, "dtype", "'a'" },
        { "{\"a\": {\"dtype\": 5, \"shape\": [4], \"data_offsets\": [0, 16]}}", QERR_FORMAT, "dtype", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 16]}}", QERR_FORMAT, "shape", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]}}", QERR_UNSUPPORTED, "0 dimensions", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 1], \"data_offsets\": [0, 4]}}", QERR_UNSUPPORTED, "5 dimensions", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [-1], \"data_offsets\": [0, 4]}}", QERR_FORMAT, "shape", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}", QERR_FORMAT, "shape", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [2.5], \"data_offsets\": [0, 8]}}", QERR_FORMAT, "shape", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904, 4611686018427387904], \"data_offsets\": [0, 4]}}",
          QERR_FORMAT, "overflow", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [4611686018427387904], \"data_offsets\": [0, 4]}}",
          QERR_FORMAT, "overflow", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [250], \"data_offsets\": [0, 1000]}}", QERR_FORMAT, "out of range", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", QERR_FORMAT, "out of range", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [9223372036854775807, 9223372036854775807]}}",
          QERR_FORMAT, "out of range", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", QERR_FORMAT, "data_offsets", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", QERR_FORMAT, "data_offsets", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [\"0\", \"4\"]}}", QERR_FORMAT, "data_offsets", "'a'" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}", QERR_FORMAT, "need 24", "'a'" },
        { "{\"a\": {\"dtype\": \"BF16\", \"shape\": [0], \"data_offsets\": [0, 0]}}", QERR_FORMAT, "dimension", "'a'" },
        { "{\"a\": 5}", QERR_FORMAT, "not a JSON object", "'a'" },
        { "[]", QERR_FORMAT, "not a JSON object", "header" },
        { "{\"a\": {\"dtype\": \"F32\"", QERR_FORMAT, "JSON", "header" },
        { "\x01\x02garbage", QERR_FORMAT, "JSON", "header" },
        { "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
          " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}", QERR_FORMAT, "duplicate", "JSON" },
    };
    char err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        blob b = st_make(cases[i].header, 1, 64);
        err[0] = 0;
        int rc = st_parse(&b, NULL, err, sizeof err);
        if (rc != cases[i].rc) fprintf(stderr, "  case %zu: %s\n", i, err);
        CHECK_EQ_INT(rc, cases[i].rc);
        CHECK_STR_CONTAINS(err, cases[i].needle);
        CHECK_STR_CONTAINS(err, cases[i].needle2);
        CHECK_STR_CONTAINS(err, "t.safetensors");
        free(b.buf);
    }

    /* A name over the model's limit. */
    char hdr[1024], name[301];
    memset(name, 'n', 300);
    name[300] = 0;
    snprintf(hdr, sizeof hdr, "{\"%s\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", name);
    blob b = st_make(hdr, 1, 4);
    CHECK_EQ_INT(st_parse(&b, NULL, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "name");
    free(b.buf);

    /* The header length itself. */
    b = st_make(ST_AB, 1, 22);
    uint64_t lens[] = { b.len - 7, b.len, (uint64_t)1 << 40, UINT64_MAX };
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        for (int k = 0; k < 8; k++) b.buf[k] = (uint8_t)(lens[i] >> (8 * k));
        CHECK_EQ_INT(st_parse(&b, NULL, err, sizeof err), i < 2 ? QERR_FORMAT : QERR_LIMIT);
        CHECK_STR_CONTAINS(err, "header length");
        if (i < 2) CHECK_STR_CONTAINS(err, "past the end");
    }
    free(b.buf);
    qmodel *m = qmodel_new();
    CHECK_EQ_INT(safetensors_parse(m, "\x02\0\0\0", 4, "t.safetensors", err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "too short");
    qmodel_destroy(m);
}

/* Every prefix of a valid image fails cleanly (and ASan sees any read past
 * the copy); the whole image parses.  Then every header byte is mangled a
 * few ways: whatever the result, nothing crashes. */
static void test_safetensors_truncated(void)
{
    char err[512];
    blob b = st_make(ST_AB, 1, 22);
    for (size_t n = 0; n <= b.len; n++) {
        uint8_t *cut = malloc(n ? n : 1);
        memcpy(cut, b.buf, n);
        qmodel *m = qmodel_new();
        int rc = safetensors_parse(m, cut, n, "cut.safetensors", err, sizeof err);
        if (n < b.len) {
            CHECK(rc < 0);
            CHECK_STR_CONTAINS(err, "cut.safetensors");
        } else {
            CHECK_EQ_INT(rc, 0);
        }
        qmodel_destroy(m);
        free(cut);
    }
    static const uint8_t subst[] = { 0, '"', '}', '9', 0xff };
    for (size_t i = 0; i < 8 + b.hlen; i++) {
        for (size_t k = 0; k < sizeof subst; k++) {
            uint8_t *c = malloc(b.len);
            memcpy(c, b.buf, b.len);
            c[i] = subst[k];
            qmodel *m = qmodel_new();
            int rc = safetensors_parse(m, c, b.len, "x", err, sizeof err);
            CHECK(rc <= 0);
            for (int t = 0; !rc && t < m->n_tensors; t++) CHECK(m->tensors[t].t.data != NULL);
            qmodel_destroy(m);
            free(c);
        }
    }
    free(b.buf);
}

/* ---- folders ------------------------------------------------------------ */

static void expect_dir(const char *dir, int want, const char *needle, const char *needle2)
{
    char err[512];
    int rc = load_dir(dir, NULL, err, sizeof err);
    if (rc != want) fprintf(stderr, "  %s: rc %d: %s\n", dir, rc, err);
    CHECK_EQ_INT(rc, want);
    CHECK_STR_CONTAINS(err, needle);
    if (needle2) CHECK_STR_CONTAINS(err, needle2);
}

static void put_st(const char *dir, const char *file, const char *header, size_t data_len)
{
    blob b = st_make(header, 1, data_len);
    put(dir, file, b.buf, b.len);
    free(b.buf);
}

static void test_dir_errors(void)
{
    const char *d;

    d = mkfolder("empty");
    expect_dir(d, QERR_IO, "config.json", NULL);

    d = mkfolder("badjson");
    put_text(d, "config.json", "{\"model_type\": \"llama\",");
    expect_dir(d, QERR_FORMAT, "config.json", "invalid JSON");

    d = mkfolder("gemma");
    char *s = cfg("model_type", "\"gemma\"", NULL);
    put_text(d, "config.json", s);
    free(s);
    expect_dir(d, QERR_UNSUPPORTED, "gemma", NULL);

    d = mkfolder("yarn");
    s = cfg("rope_scaling", "{\"rope_type\": \"yarn\", \"factor\": 4.0}", NULL);
    put_text(d, "config.json", s);
    free(s);
    expect_dir(d, QERR_UNSUPPORTED, "yarn", NULL);

    d = mkfolder("negative");
    s = cfg("num_hidden_layers", "-3", NULL);
    put_text(d, "config.json", s);
    free(s);
    expect_dir(d, QERR_RANGE, "num_hidden_layers", NULL);

    d = mkfolder("noweights");
    put_text(d, "config.json", BASE_CFG);
    expect_dir(d, QERR_NOTFOUND, "model.safetensors", NULL);

    d = mkfolder("pastend");
    put_text(d, "config.json", BASE_CFG);
    {
        blob b = st_make(ST_AB, 1, 22);
        b.buf[0] = 0xff;
        b.buf[1] = 0xff;
        put(d, "model.safetensors", b.buf, b.len);
        free(b.buf);
    }
    expect_dir(d, QERR_FORMAT, "model.safetensors", "past the end");

    d = mkfolder("zero");
    put_text(d, "config.json", BASE_CFG);
    put(d, "model.safetensors", "", 0);
    expect_dir(d, QERR_FORMAT, "model.safetensors", "too small");

    d = mkfolder("dtype");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "model.safetensors", "{\"x.weight\": {\"dtype\": \"I8\", \"shape\": [4], \"data_offsets\": [0, 4]}}", 4);
    expect_dir(d, QERR_UNSUPPORTED, "I8", "x.weight");

    d = mkfolder("badtok");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "model.safetensors", ST_AB, 22);
    put_text(d, "tokenizer.json", "{\"model\": {\"vocab\": {\"a\": 0,}}");
    expect_dir(d, QERR_FORMAT, "tokenizer.json", "invalid JSON");

    d = mkfolder("tokrange");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "model.safetensors", ST_AB, 22);
    put_text(d, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 4000000}}}");
    expect_dir(d, QERR_RANGE, "tokenizer.json", "4000000");

    d = mkfolder("toktype");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "model.safetensors", ST_AB, 22);
    put_text(d, "tokenizer.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"0\"}}}");
    expect_dir(d, QERR_FORMAT, "tokenizer.json", "\"a\"");

    d = mkfolder("badgen");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "model.safetensors", ST_AB, 22);
    put_text(d, "generation_config.json", "{\"eos_token_id\": [2, 9999]}");
    expect_dir(d, QERR_RANGE, "generation_config.json", "eos_token_id");

    d = mkfolder("badtokcfg");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "model.safetensors", ST_AB, 22);
    put_text(d, "tokenizer_config.json", "{\"bos_token\": 5}");
    expect_dir(d, QERR_FORMAT, "tokenizer_config.json", "bos_token");
}

static const char IDX_HEAD[] = "{\"metadata\": {\"total_size\": 38}, \"weight_map\": ";

static void put_index(const char *dir, const char *weight_map)
{
    char text[1024];
    snprintf(text, sizeof text, "%s%s}", IDX_HEAD, weight_map);
    put_text(dir, "model.safetensors.index.json", text);
}

static void test_dir_sharded(void)
{
    char err[512];
    static const char S2[] = "{\"c\": {\"dtype\": \"F16\", \"shape\": [2, 4], \"data_offsets\": [0, 16]}}";

    const char *d = mkfolder("sharded");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "s1.safetensors", ST_AB, 22);
    put_st(d, "s2.safetensors", S2, 16);
    put_index(d, "{\"a\": \"s1.safetensors\", \"c\": \"s2.safetensors\", \"b\": \"s1.safetensors\"}");
    qmodel *m;
    int rc = load_dir(d, &m, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(m->n_tensors, 3);
    CHECK_EQ_INT(m->n_maps, 2);
    CHECK(qmodel_find(m, "c") && qmodel_find(m, "c")->t.dtype == QDT_F16);
    CHECK(m->name && !strcmp(m->name, "sharded"));
    qmodel_destroy(m);

    /* Shard names that would leave the folder. */
    static const char *const escapes[] = { "../s1.safetensors", "/etc/passwd", "sub/s1.safetensors", "..", "", "." };
    for (size_t i = 0; i < sizeof escapes / sizeof escapes[0]; i++) {
        char map[256];
        d = mkfolder("escape");
        snprintf(map, sizeof map, "{\"a\": \"s1.safetensors\", \"c\": \"%s\"}", escapes[i]);
        put_index(d, map);
        put_text(d, "config.json", BASE_CFG);
        put_st(d, "s1.safetensors", ST_AB, 22);
        expect_dir(d, QERR_FORMAT, "plain file name", escapes[i]);
    }

    d = mkfolder("missingshard");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "s1.safetensors", ST_AB, 22);
    put_index(d, "{\"a\": \"s1.safetensors\", \"c\": \"s9.safetensors\"}");
    expect_dir(d, QERR_IO, "s9.safetensors", NULL);

    d = mkfolder("missingweight");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "s1.safetensors", ST_AB, 22);
    put_st(d, "s2.safetensors", S2, 16);
    put_index(d, "{\"a\": \"s1.safetensors\", \"c\": \"s1.safetensors\", \"z\": \"s2.safetensors\"}");
    expect_dir(d, QERR_FORMAT, "'c'", "s1.safetensors");

    d = mkfolder("twice");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "s1.safetensors", ST_AB, 22);
    put_st(d, "s3.safetensors", ST_AB, 22);
    put_index(d, "{\"a\": \"s1.safetensors\", \"b\": \"s3.safetensors\"}");
    expect_dir(d, QERR_FORMAT, "'a'", "twice");

    d = mkfolder("badshard");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "s1.safetensors", ST_AB, 22);
    put_st(d, "s4.safetensors", "{\"c\": {\"dtype\": \"F16\", \"shape\": [2, 4], \"data_offsets\": [0, 18]}}", 18);
    put_index(d, "{\"a\": \"s1.safetensors\", \"c\": \"s4.safetensors\"}");
    expect_dir(d, QERR_FORMAT, "s4.safetensors", "'c'");

    static const char *const bad_maps[] = { "[\"s1.safetensors\"]", "{}", "{\"a\": 1}", "null" };
    for (size_t i = 0; i < sizeof bad_maps / sizeof bad_maps[0]; i++) {
        d = mkfolder("badmap");
        put_index(d, bad_maps[i]);
        put_text(d, "config.json", BASE_CFG);
        expect_dir(d, QERR_FORMAT, "model.safetensors.index.json", NULL);
    }
    d = mkfolder("badindex");
    put_text(d, "config.json", BASE_CFG);
    put_text(d, "model.safetensors.index.json", "{\"weight_map\": ");
    expect_dir(d, QERR_FORMAT, "model.safetensors.index.json", "invalid JSON");
}

static void test_dir_special_tokens(void)
{
    char err[512];
    qmodel *m;
    const char *d = mkfolder("special");
    char *s = cfg("bos_token_id", NULL, "eos_token_id", NULL, NULL);
    put_text(d, "config.json", s);
    free(s);
    put_st(d, "model.safetensors", ST_AB, 22);
    put_text(d, "tokenizer.json",
             "{\"added_tokens\": [{\"id\": 1, \"content\": \"<s>\", \"special\": true},"
             " {\"id\": 2, \"content\": \"</s>\", \"special\": true}, {\"id\": 9, \"content\": \"<extra>\", \"special\": false}],"
             " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\"}, {\"type\": \"ByteLevel\"}]},"
             " \"model\": {\"type\": \"BPE\", \"vocab\": {\"<unk>\": 0, \"<0x41>\": 3, \"hello\": 4}, \"unk_token\": \"<unk>\"}}");
    /* model_max_length as a huge integer, as transformers writes it. */
    put_text(d, "tokenizer_config.json",
             "{\"add_bos_token\": false, \"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<s>\"},"
             " \"eos_token\": \"</s>\", \"model_max_length\": 1000000000000000019884624838656}");
    int rc = load_dir(d, &m, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(m->bos_id, 1);
    CHECK_EQ_INT(m->n_eos, 1);
    CHECK_EQ_INT(m->eos_ids[0], 2);
    CHECK_EQ_INT(m->add_bos, 0);
    CHECK_EQ_INT(m->unk_id, 0);
    CHECK_EQ_INT(m->vocab.kind, QVOCAB_BPE);
    REQUIRE(m->vocab.n == 10);
    CHECK(m->vocab.tokens[5] == NULL);
    CHECK_EQ_INT(m->vocab.types[5], QTOK_UNUSED);
    CHECK_EQ_INT(m->vocab.types[3], QTOK_NORMAL); /* <0x41> is text in a byte-level vocabulary */
    CHECK_EQ_INT(m->vocab.types[9], QTOK_USER);
    CHECK_EQ_INT(m->vocab.types[2], QTOK_CONTROL);
    CHECK_EQ_INT(m->vocab.types[0], QTOK_UNKNOWN);
    qmodel_destroy(m);

    /* generation_config.json replaces bos and adds to eos. */
    put_text(d, "generation_config.json", "{\"bos_token_id\": 4, \"eos_token_id\": [2, 9], \"do_sample\": true}");
    rc = load_dir(d, &m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(m->bos_id, 4);
    CHECK_EQ_INT(m->n_eos, 2);
    CHECK_EQ_INT(m->eos_ids[1], 9);
    qmodel_destroy(m);

    /* A Unigram vocabulary: a list of [piece, score], ids by position. */
    put_text(d, "tokenizer.json",
             "{\"model\": {\"type\": \"Unigram\", \"unk_id\": 0,"
             " \"vocab\": [[\"<unk>\", 0.0], [\"\xe2\x96\x81" "a\", -1.5], [\"<0x41>\", -2]]}}");
    rc = load_dir(d, &m, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(m->vocab.kind, QVOCAB_SPM);
    REQUIRE(m->vocab.n == 3 && m->vocab.scores);
    CHECK(m->vocab.scores[1] == -1.5f);
    CHECK_EQ_INT(m->vocab.types[2], QTOK_BYTE);
    CHECK_EQ_INT(m->vocab.types[0], QTOK_UNKNOWN);
    CHECK_EQ_INT(m->bos_id, 4);  /* generation_config.json; tokenizer_config's <s> is not in this vocabulary */
    qmodel_destroy(m);
    put_text(d, "tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", \"x\"]]}}");
    expect_dir(d, QERR_FORMAT, "tokenizer.json", "[piece, score]");
    put_text(d, "tokenizer.json", "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0]]}}");

    put_text(d, "generation_config.json", "{\"eos_token_id\": 2");
    expect_dir(d, QERR_FORMAT, "generation_config.json", "invalid JSON");
    put_text(d, "generation_config.json", "{\"eos_token_id\": 2.5}");
    expect_dir(d, QERR_FORMAT, "generation_config.json", "eos_token_id");
    put_text(d, "generation_config.json", "{}");
    put_text(d, "tokenizer_config.json", "{\"add_bos_token\": \"yes\"}");
    expect_dir(d, QERR_FORMAT, "tokenizer_config.json", "add_bos_token");
    put_text(d, "tokenizer_config.json", "{\"add_bos_token\": ");
    expect_dir(d, QERR_FORMAT, "tokenizer_config.json", "invalid JSON");
}

/* Llama 3's tokenizer.json says "prepend BOS" only through its
 * post-processor template; tokenizer_config.json does not say it. */
static void test_dir_template_bos(void)
{
    char err[512];
    qmodel *m;
    const char *d = mkfolder("template");
    put_text(d, "config.json", BASE_CFG);
    put_st(d, "model.safetensors", ST_AB, 22);
    put_text(d, "tokenizer.json",
             "{\"added_tokens\": [{\"id\": 1, \"content\": \"<|begin_of_text|>\", \"special\": true}],"
             " \"decoder\": {\"type\": \"ByteLevel\"},"
             " \"post_processor\": {\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"},"
             " {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|begin_of_text|>\"}},"
             " {\"Sequence\": {\"id\": \"A\"}}]}]},"
             " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2}}}");
    int rc = load_dir(d, &m, err, sizeof err);
    if (rc) fprintf(stderr, "  %s\n", err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(m->vocab.kind, QVOCAB_BPE);
    CHECK_EQ_INT(m->add_bos, 1);
    qmodel_destroy(m);

    /* Without the template's special token: no BOS for a byte-level vocabulary. */
    put_text(d, "tokenizer.json",
             "{\"decoder\": {\"type\": \"ByteLevel\"}, \"post_processor\": {\"type\": \"ByteLevel\"},"
             " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 2}}}");
    rc = load_dir(d, &m, err, sizeof err);
    CHECK_EQ_INT(rc, 0);
    CHECK_EQ_INT(m->add_bos, 0);
    qmodel_destroy(m);
}

/* The real tokenizers of the fixtures, each beside a minimal model. */
static void test_dir_real_tokenizers(void)
{
    static const struct {
        const char *name;
        int vocab_size, kind, n, add_bos, probe_id, probe_type;
        const char *probe;
    } want[] = {
        { "llama2", 32000, QVOCAB_SPM, 32000, 1, 13, QTOK_BYTE, "<0x0A>" },
        { "mistral-v0.3", 32768, QVOCAB_SPM, 32768, 1, 1, QTOK_CONTROL, "<s>" },
        { "phi-3", 32064, QVOCAB_SPM, 32011, 0, 32000, QTOK_CONTROL, "<|endoftext|>" },
        { "qwen2.5", 152064, QVOCAB_BPE, 151665, 0, 151643, QTOK_CONTROL, "<|endoftext|>" },
        { "gpt2", 50257, QVOCAB_BPE, 50257, 0, 50256, QTOK_CONTROL, "<|endoftext|>" },
        { "deepseek-coder-instruct", 32256, QVOCAB_BPE, 32022, 1, 32000, QTOK_USER, "\xc3\xb5" },
    };
    char err[512];
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *d = mkfolder(want[i].name);
        char v[32], src[512], dst[600];
        snprintf(v, sizeof v, "%d", want[i].vocab_size);
        char *s = cfg("vocab_size", v, "bos_token_id", NULL, "eos_token_id", NULL, NULL);
        put_text(d, "config.json", s);
        free(s);
        put_st(d, "model.safetensors", ST_AB, 22);
        /* The project's copy, else the team's shared folder (the largest
         * tokenizer files are not copied into the project). */
        int missing = 0;
        for (int f = 0; f < 2; f++) {
            const char *file = f ? "tokenizer_config.json" : "tokenizer.json";
            snprintf(src, sizeof src, "%s/tests/fixtures/tokenizers/%s/%s", qt_root(), want[i].name, file);
            if (access(src, R_OK))
                snprintf(src, sizeof src, "%s/fixtures/tokenizers/%s/%s", qt_shared(), want[i].name, file);
            if (access(src, R_OK)) missing = 1;
            snprintf(dst, sizeof dst, "%s/%s", d, file);
            unlink(dst);
            CHECK(symlink(src, dst) == 0);
        }
        if (missing) {
            QT_SKIP("%s: its tokenizer files are neither in tests/fixtures nor in shared/", want[i].name);
            continue;
        }
        qmodel *m;
        int rc = load_dir(d, &m, err, sizeof err);
        if (rc) fprintf(stderr, "  %s: %s\n", want[i].name, err);
        CHECK_EQ_INT(rc, 0);
        CHECK_EQ_INT(m->vocab.kind, want[i].kind);
        CHECK_EQ_INT(m->vocab.n, want[i].n);
        CHECK_EQ_INT(m->add_bos, want[i].add_bos);
        if (m->vocab.n > want[i].probe_id) {
            CHECK(m->vocab.tokens[want[i].probe_id] && !strcmp(m->vocab.tokens[want[i].probe_id], want[i].probe));
            CHECK_EQ_INT(m->vocab.types[want[i].probe_id], want[i].probe_type);
        }
        /* eos comes from tokenizer_config.json's eos_token here. */
        CHECK_EQ_INT(m->n_eos, 1);
        qmodel_destroy(m);
    }
}

/* ---- image-text checkpoints (Gemma 3 4B/12B/27B) ------------------------ */

/* The language model's logits of n ids, one pass on the CPU backend. */
static float *cpu_logits(qmodel *m, const int32_t *ids, int n)
{
    char err[256];
    qbackend_opts o = { .n_threads = 1, .num_blocks = (n + 15) / 16, .block_size = 16 };
    qbackend *be = NULL;
    if (cpu_backend_create(&m->w, &o, &be, err, sizeof err)) {
        fprintf(stderr, "  cpu backend: %s\n", err);
        return NULL;
    }
    int32_t table[8], li[128];
    for (int i = 0; i < o.num_blocks; i++) table[i] = i;
    for (int i = 0; i < n; i++) li[i] = i;
    float *out = malloc(sizeof(float) * (size_t)n * (size_t)m->hp.n_vocab);
    qbatch_seq sq = { 0, n, 0, table, o.num_blocks };
    qbatch b = { n, ids, 1, &sq, n, li, NULL, NULL, NULL, NULL, NULL };
    if (be->ops->forward(be, &b, out)) free(out), out = NULL;
    qbackend_destroy(be);
    return out;
}

/* Writes dir/model.safetensors holding every tensor tensors.json lists
 * (scripts/gen_tiny_families.py gemma3-mm: the names and shapes transformers
 * saved), under its name rewritten by (from, to) prefix pairs: the language
 * model's from the text model's tensor of equal value, the vision tower's
 * zeros.  extra: one more tensor's name, a copy of the embedding (NULL:
 * none).  Returns 0, or -1 when the fixture does not fit the text model. */
static int put_mm_weights(const char *dir, const qmodel *text, const char *const (*ren)[2], int n_ren,
                          const char *extra)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/tiny-gemma3-mm/tensors.json", model_dir(""));
    json_t *root = json_load_file(path, 0, NULL), *list = json_object_get(root, "tensors"), *e;
    json_t *hdr = json_object();
    size_t i, off = 0;
    uint8_t *data = NULL;
    int ok = json_array_size(list) > 0;
    for (int pass = 0; pass < 2 && ok; pass++) { /* sizes, then bytes */
        off = 0;
        json_array_foreach(list, i, e) {
            const char *name = json_string_value(json_object_get(e, "name"));
            json_t *shape = json_object_get(e, "shape"), *from = json_object_get(e, "from");
            size_t n = 4;
            for (size_t k = 0; k < json_array_size(shape); k++) n *= (size_t)json_integer_value(json_array_get(shape, k));
            const qnamed_tensor *src = json_is_string(from) ? qmodel_find(text, json_string_value(from)) : NULL;
            if (json_is_string(from) && (!src || src->t.dtype != QDT_F32 || (size_t)qt_numel(&src->t) * 4 != n)) {
                fprintf(stderr, "  %s: no F32 tensor %s of %zu bytes in the text model\n", name, json_string_value(from), n);
                ok = 0;
                break;
            }
            if (pass == 0) {
                char nm[256];
                snprintf(nm, sizeof nm, "%s", name);
                for (int r = 0; r < n_ren; r++)
                    if (!strncmp(name, ren[r][0], strlen(ren[r][0]))) {
                        snprintf(nm, sizeof nm, "%s%s", ren[r][1], name + strlen(ren[r][0]));
                        break;
                    }
                json_object_set_new(hdr, nm, json_pack("{s:s, s:O, s:[I, I]}", "dtype", "F32", "shape", shape,
                                                       "data_offsets", (json_int_t)off, (json_int_t)(off + n)));
            } else if (src) {
                memcpy(data + off, src->t.data, n);
            }
            off += n;
        }
        if (pass == 0 && ok && extra) {
            const qnamed_tensor *emb = qmodel_find(text, "model.embed_tokens.weight");
            json_object_set_new(hdr, extra, json_pack("{s:s, s:[I, I], s:[I, I]}", "dtype", "F32", "shape",
                                                      (json_int_t)emb->t.shape[0], (json_int_t)emb->t.shape[1],
                                                      "data_offsets", (json_int_t)0, (json_int_t)(qt_numel(&emb->t) * 4)));
        }
        if (pass == 0) data = calloc(off ? off : 1, 1);
    }
    if (ok) {
        char *h = json_dumps(hdr, JSON_COMPACT);
        size_t hl = strlen(h);
        uint8_t *file = malloc(8 + hl + off);
        for (int k = 0; k < 8; k++) file[k] = (uint8_t)((uint64_t)hl >> (8 * k));
        memcpy(file + 8, h, hl);
        memcpy(file + 8 + hl, data, off);
        put(dir, "model.safetensors", file, 8 + hl + off);
        free(file);
        free(h);
    }
    free(data);
    json_decref(hdr);
    json_decref(root);
    return ok ? 0 : -1;
}

static void copy_file(const char *from_dir, const char *to_dir, const char *name)
{
    char path[1024], err[256], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/%s", from_dir, name);
    if (q_read_file(path, 1 << 24, &text, &len, err, sizeof err)) fprintf(stderr, "  %s\n", err);
    else put(to_dir, name, text, len);
    free(text);
}

/* Gemma3ForConditionalGeneration's folder, as transformers 5.25 saves it
 * (language_model.model.*, vision_tower.*, multi_modal_projector.*) and as
 * it names the weights in memory (model.language_model.*, lm_head,
 * model.vision_tower.*): its language model loads as gemma3 with the text
 * model's hyperparameters and gives its logits bit for bit; the vision
 * tower is left unbound.  tiny-gemma3-random's logits are checked against
 * transformers by test_forward; the script checked that transformers gives
 * the image-text model the same ones. */
static void test_gemma3_image_text_dir(void)
{
    static const char *const saved[][2] = { { "", "" } };
    static const char *const memory[][2] = {
        { "language_model.model.", "model.language_model." },
        { "language_model.lm_head.", "lm_head." },
        { "vision_tower.", "model.vision_tower." },
        { "multi_modal_projector.", "model.multi_modal_projector." },
    };
    char path[1024], err[512];
    qmodel *text = NULL;
    snprintf(path, sizeof path, "%s", model_dir("tiny-gemma3-random"));
    REQUIRE(qmodel_load(path, &text, err, sizeof err) == 0);
    int32_t ids[40];
    for (int i = 0; i < 40; i++) ids[i] = (int32_t)((i * 37 + 5) % text->hp.n_vocab);
    float *want = cpu_logits(text, ids, 40);
    REQUIRE(want);
    const size_t nl = (size_t)40 * text->hp.n_vocab;
    for (int layout = 0; layout < 2; layout++) {
        const char *d = mkfolder(layout ? "gemma3-mm-memory" : "gemma3-mm-saved");
        copy_file(model_dir("tiny-gemma3-mm"), d, "config.json");
        copy_file(model_dir("tiny-gemma3-random"), d, "tokenizer.json");
        copy_file(model_dir("tiny-gemma3-random"), d, "tokenizer_config.json");
        REQUIRE(put_mm_weights(d, text, layout ? memory : saved, layout ? 4 : 1, NULL) == 0);
        qmodel *m = NULL;
        int rc = qmodel_load(d, &m, err, sizeof err);
        if (rc) fprintf(stderr, "  %s: %s\n", d, err);
        REQUIRE(rc == 0);
        CHECK(!strcmp(qfamily_get(m->hp.family)->name, "gemma3"));
        CHECK_EQ_INT(m->hp.n_layers, text->hp.n_layers);
        CHECK_EQ_INT(m->hp.window, text->hp.window);
        CHECK_EQ_INT(m->hp.window_pattern, text->hp.window_pattern);
        CHECK(m->hp.rope_theta_local == text->hp.rope_theta_local && m->hp.attn_scale == text->hp.attn_scale);
        CHECK(m->hp.tied_embeddings);
        CHECK(qmodel_find(m, layout ? "model.vision_tower.head.probe" : "vision_tower.head.probe") != NULL);
        float *got = cpu_logits(m, ids, 40);
        CHECK(got && !memcmp(got, want, nl * sizeof(float)));
        free(got);
        qmodel_destroy(m);
    }

    /* One tensor under both names: refused, naming it. */
    const char *d = mkfolder("gemma3-mm-twice");
    copy_file(model_dir("tiny-gemma3-mm"), d, "config.json");
    REQUIRE(put_mm_weights(d, text, saved, 1, "model.embed_tokens.weight") == 0);
    CHECK_EQ_INT(load_dir(d, NULL, err, sizeof err), QERR_FORMAT);
    CHECK_STR_CONTAINS(err, "model.embed_tokens.weight");
    CHECK_STR_CONTAINS(err, "twice");
    free(want);
    qmodel_destroy(text);
}

/* The config of an image-text checkpoint: text_config over Gemma3TextConfig's
 * defaults (a text_config as short as gemma-3-4b-it's), the top level's
 * token ids where text_config has none; errors name the key. */
static void test_gemma3_image_text_config(void)
{
    char err[512];
    qmodel *m = qmodel_new();
    static const char HUB[] =
        "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"model_type\": \"gemma3\","
        " \"boi_token_index\": 255999, \"eos_token_id\": [1, 106], \"mm_tokens_per_image\": 256,"
        " \"text_config\": {\"hidden_size\": 2560, \"intermediate_size\": 10240, \"model_type\": \"gemma3_text\","
        " \"num_hidden_layers\": 34, \"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"linear\"},"
        " \"sliding_window\": 1024}, \"vision_config\": {\"hidden_size\": 1152, \"model_type\": \"siglip_vision_model\"}}";
    CHECK_EQ_INT(parse_cfg(m, HUB, err, sizeof err), 0);
    const qhparams *hp = &m->hp;
    CHECK(!strcmp(qfamily_get(hp->family)->name, "gemma3"));
    CHECK_EQ_INT(hp->dim, 2560);
    CHECK_EQ_INT(hp->n_layers, 34);
    CHECK_EQ_INT(hp->n_heads, 8);
    CHECK_EQ_INT(hp->n_kv_heads, 4);
    CHECK_EQ_INT(hp->head_dim, 256);
    CHECK_EQ_INT(hp->n_vocab, 262208);
    CHECK_EQ_INT(hp->max_ctx, 131072);
    CHECK_EQ_INT(hp->window, 1024);
    CHECK_EQ_INT(hp->window_pattern, 6);
    CHECK(hp->rope_theta == 1000000.0f && hp->rope_theta_local == 10000.0f);
    CHECK(hp->rope_scaling == QROPE_SCALE_LINEAR && hp->rope_factor == 8.0f);
    CHECK(fabsf(hp->attn_scale - 1.0f / 16.0f) < 1e-7f);
    CHECK(hp->norm_eps == 1e-6f);
    CHECK_EQ_INT(m->n_eos, 2);
    CHECK(m->eos_ids[0] == 1 && m->eos_ids[1] == 106);
    CHECK_EQ_INT(m->bos_id, 2); /* Gemma3TextConfig's */

    /* Found by class name too. */
    CHECK_EQ_INT(parse_cfg(m, "{\"architectures\": [\"Gemma3ForConditionalGeneration\"], \"text_config\": {}}", err,
                           sizeof err), 0);
    CHECK_EQ_INT(m->hp.dim, 2304);

    static const struct { const char *text, *needle; int rc; } bad[] = {
        { "{\"model_type\": \"gemma3\"}", "text_config", QERR_FORMAT },
        { "{\"model_type\": \"gemma3\", \"text_config\": [1]}", "text_config", QERR_FORMAT },
        { "{\"model_type\": \"gemma3\", \"text_config\": {\"model_type\": \"llama\"}}", "text_config.model_type",
          QERR_UNSUPPORTED },
        { "{\"model_type\": \"gemma3\", \"text_config\": {\"hidden_size\": \"big\"}}", "hidden_size", QERR_FORMAT },
        { "{\"model_type\": \"gemma3\", \"text_config\": {\"num_attention_heads\": 0}}", "num_attention_heads",
          QERR_RANGE },
        { "{\"model_type\": \"gemma3\", \"text_config\": {}, \"eos_token_id\": \"x\"}", "eos_token_id", QERR_FORMAT },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CHECK_EQ_INT(parse_cfg(m, bad[i].text, err, sizeof err), bad[i].rc);
        CHECK_STR_CONTAINS(err, bad[i].needle);
    }
    qmodel_destroy(m);
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* The family table (engine/model/arch.c) reproduces the fingerprints the
 * code before it gave (main 09e5ce9, where each loader knew its families by
 * name): a persistent tier's blocks stay valid across the change.  And a
 * flag no backend computes yet is refused by name, not computed as Llama. */
static void test_families(void)
{
    static const struct { const char *path, *family, *fingerprint; } pin[] = {
        { "models/stories260K.gguf", "llama", "b4cc43bcaf02473f21d77e1b9640746d" },
        { "tests/fixtures/models/stories260K-hf", "llama", "fba4c354ed135476983bd55751a30d9c" },
        { "tests/fixtures/models/tiny-mistral-random", "mistral", "0963439a8e05b9c18d3d4dd0bf70a6b2" },
        { "tests/fixtures/models/tiny-qwen2-random", "qwen2", "8d9aa8419037ee3ecd36f36fe22d1c44" },
        { "tests/fixtures/models/tiny-llama3-random", "llama", "ef00965ecccbe8ca2cd4e32e34b6e212" },
    };
    char path[1024], err[512];
    for (size_t i = 0; i < sizeof pin / sizeof *pin; i++) {
        snprintf(path, sizeof path, "%s/%s", qt_root(), pin[i].path);
        qmodel *m = NULL;
        REQUIRE(qmodel_load(path, &m, err, sizeof err) == 0);
        CHECK(!strcmp(qfamily_get(m->hp.family)->name, pin[i].family));
        if (strcmp(m->fingerprint_hex, pin[i].fingerprint))
            fprintf(stderr, "  %s: fingerprint %s, was %s\n", pin[i].path, m->fingerprint_hex, pin[i].fingerprint);
        CHECK(!strcmp(m->fingerprint_hex, pin[i].fingerprint));
        if (i == 0) {
            qbackend_opts o = { .num_blocks = 4, .block_size = 16, .n_threads = 1 };
            qbackend *be = NULL;
            CHECK_EQ_INT(cpu_backend_create(&m->w, &o, &be, err, sizeof err), 0);
            qbackend_destroy(be);
            qweights w = m->w;
            w.hp.qk_norm = 1; /* the CPU computes it, from weights this model lacks */
            CHECK(cpu_backend_create(&w, &o, &be, err, sizeof err) != 0);
            CHECK_STR_CONTAINS(err, "QK-norm");
            CHECK(!strcmp(qhp_unsupported(&w.hp, 0), "QK-norm")); /* a backend without it refuses by name */
            CHECK(qhp_unsupported(&w.hp, QHP_QK_NORM) == NULL);
            w.hp = m->w.hp;
            w.hp.n_experts = 8;
            CHECK_EQ_INT(cpu_backend_create(&w, &o, &be, err, sizeof err), QERR_UNSUPPORTED);
            CHECK_STR_CONTAINS(err, "mixture-of-experts");
        }
        qmodel_destroy(m);
    }
    char list[128];
    qfamily_list(0, list, sizeof list);
    CHECK(!strcmp(list, "llama, mistral, qwen2, qwen3, gemma2, gemma3_text, phi3, smollm3"));
    qfamily_list(1, list, sizeof list);
    CHECK(!strcmp(list, "llama, qwen2, qwen3, gemma2, gemma3, phi3, smollm3"));
    CHECK(qfamily_by_gguf("mistral", 7) < 0); /* converted as "llama" */
    CHECK(qfamily_by_hf("qwen2", "LlamaForCausalLM") == qfamily_by_gguf("qwen2", 5));
    CHECK(qfamily_by_hf("gemma3", "Qwen2ForCausalLM") < 0); /* model_type decides */
    CHECK(!qfamily_get(-1) && !qfamily_get(1000));
}

int main(void)
{
    snprintf(g_tmp, sizeof g_tmp, "/tmp/quire-test-hf-XXXXXX");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 1;
    }
    QT_RUN(test_stories_dir);
    QT_RUN(test_llama3_dir);
    QT_RUN(test_qwen2_dir);
    QT_RUN(test_qmodel_load_binds);
    QT_RUN(test_config_real);
    QT_RUN(test_config_variants);
    QT_RUN(test_config_errors);
    QT_RUN(test_safetensors_valid);
    QT_RUN(test_safetensors_errors);
    QT_RUN(test_safetensors_truncated);
    QT_RUN(test_dir_errors);
    QT_RUN(test_dir_sharded);
    QT_RUN(test_dir_special_tokens);
    QT_RUN(test_dir_template_bos);
    QT_RUN(test_dir_real_tokenizers);
    QT_RUN(test_families);
    QT_RUN(test_gemma3_image_text_dir);
    QT_RUN(test_gemma3_image_text_config);
    nftw(g_tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    QT_MAIN_END();
}
