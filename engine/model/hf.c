/* hf.c - Hugging Face model folders.
 *
 * A model on the Hugging Face hub is a folder of loose files, each written by
 * a different part of the transformers library:
 *
 *   config.json              the architecture and its hyperparameters
 *   model.safetensors        the weights (safetensors.c), or
 *   model.safetensors.index.json + model-0000k-of-0000n.safetensors
 *                            the weights in shards; "weight_map" names the
 *                            shard of every tensor
 *   generation_config.json   optional: default bos / eos ids for generation
 *   tokenizer.json           optional: the HF tokenizers pipeline (vocabulary,
 *                            merges, pre-tokenizer, decoder, added tokens)
 *   tokenizer_config.json    optional: add_bos_token, the special tokens as
 *                            text, the chat template
 *
 * hf_load_dir() reads them in that order into a qmodel; qmodel_bind()
 * (model.c) then finds the tensors under the HF names.
 *
 * config.json.  model_type names the family (arch.c's rows); without
 * model_type, architectures[0] does.  An image-text checkpoint whose language
 * model is a family here (Gemma 3's) is read as that model: its text_config
 * over the family's text defaults, its weights renamed from under
 * "language_model.model." or "model.language_model." (config_unwrap,
 * hf_unwrap_names); the vision tower is never bound.
 * Every size is a JSON integer in a stated range, every float a finite
 * number; a wrong JSON type is QERR_FORMAT naming the key, a value out of
 * range QERR_RANGE.  Defaults follow transformers: num_key_value_heads =
 * num_attention_heads, head_dim = hidden_size / num_attention_heads (which
 * must then divide), rope_theta 10000, rms_norm_eps 1e-6.  RoPE comes in two
 * layouts: the older top-level rope_theta + rope_scaling {"rope_type" or
 * "type", factor, ...}, and the newer rope_parameters {"rope_theta",
 * "rope_type", factor, ...}.  Types default, llama3 and linear are supported;
 * yarn, dynamic, longrope and the rest are QERR_UNSUPPORTED, as are an
 * activation other than silu and MLP biases: a model quire would compute
 * differently from transformers does not load.  HF checkpoints keep q/k in
 * the layout for rotate-half RoPE, so rope_neox is always 1.  A sliding
 * attention window (Mistral's sliding_window, Qwen2's use_sliding_window)
 * that is shorter than the context caps max_ctx at the window, where full
 * attention and windowed attention still agree.
 *
 * The parsed config is committed to the model only when every check passes,
 * so a failed parse leaves m as it was.
 *
 * Weights.  Each safetensors file is mapped read-only (the mapping belongs to
 * the model) and parsed by safetensors_parse().  The index can name only
 * plain file names: no '/', no "..", so a hostile index cannot reach outside
 * the folder (symlinks inside the folder are followed: the hub cache is made
 * of them).  Each shard is loaded once; every tensor the index lists must be
 * in the shard it names.
 *
 * Special ids.  config.json's bos/eos come first; generation_config.json's
 * bos_token_id replaces, its eos_token_id (an int or a list) adds to the eos
 * set; tokenizer_config.json's bos_token / eos_token strings fill in only
 * what is still unknown, looked up in tokenizer.json.  Every id must be below
 * vocab_size.
 *
 * Vocabulary.  tokenizer.json's model.vocab (piece -> id; for Unigram an
 * array of [piece, score]) and added_tokens fill m->vocab for decoding: an
 * array indexed by id, NULL where no piece has that id.  Ids are bounded by
 * vocab_size or the number of entries, whichever is larger, so a small file
 * cannot ask for a huge table.  A ByteLevel pre-tokenizer or decoder makes it
 * QVOCAB_BPE (GPT-2 bytes-as-characters); byte_fallback, Metaspace or '▁' in
 * the pieces make it QVOCAB_SPM, where <0xXX> pieces are byte tokens.  BOS is
 * prepended when tokenizer_config.json says add_bos_token, else when the
 * vocabulary is SentencePiece-style or tokenizer.json's template starts with
 * a special token (Llama 3 does this, without add_bos_token).
 */
#define _GNU_SOURCE
#include "arch.h"
#include "model.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define HF_MAX_JSON ((size_t)16 << 20)       /* config, generation and tokenizer config */
#define HF_MAX_INDEX ((size_t)64 << 20)
#define HF_MAX_TOKENIZER ((size_t)256 << 20)
#define HF_MAX_CTX (1 << 24)
#define HF_MAX_HEADS 4096
#define HF_MAX_HEAD_DIM 4096
#define HF_MAX_EOS ((int)(sizeof ((qmodel *)0)->eos_ids / sizeof(int)))

/* ---- JSON helpers ------------------------------------------------------- */

/* Each reads obj[key]; absent or null gives the default (or an error when
 * required).  ctx prefixes messages: "config.json" or "config.json:
 * rope_scaling". */
static int js_int(json_t *obj, const char *ctx, const char *key, int required, long long def,
                  long long lo, long long hi, long long *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" is missing", ctx, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" must be an integer", ctx, key);
    long long x = json_integer_value(v);
    if (x < lo || x > hi)
        return qerr_set(err, errlen, QERR_RANGE, "%s: \"%s\" = %lld is out of range (%lld..%lld)",
                        ctx, key, x, lo, hi);
    *out = x;
    return 0;
}

/* A number (integer or real) with lo < x <= hi, also once rounded to float
 * (the fields are floats: 1e-50 passes as a double and becomes 0). */
static int js_num(json_t *obj, const char *ctx, const char *key, int required, double def,
                  double lo, double hi, double *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        if (required) return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" is missing", ctx, key);
        *out = def;
        return 0;
    }
    if (!json_is_number(v))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" must be a number", ctx, key);
    double x = json_number_value(v);
    if (!isfinite(x) || !(x > lo && x <= hi) || !((double)(float)x > lo))
        return qerr_set(err, errlen, QERR_RANGE, "%s: \"%s\" = %g is out of range (above %g, at most %g)",
                        ctx, key, x, lo, hi);
    *out = x;
    return 0;
}

static int js_bool(json_t *obj, const char *ctx, const char *key, int def, int *out,
                   char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" must be true or false", ctx, key);
    *out = json_is_true(v);
    return 0;
}

/* A string or NULL when absent / null. */
static int js_str(json_t *obj, const char *ctx, const char *key, const char **out,
                  char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_string(v))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" must be a string", ctx, key);
    *out = json_string_value(v);
    return 0;
}

/* Adds token ids from obj[key] (an integer, or a list when allow_list) to
 * ids[0..*n), skipping ones already there.  Ids must be in [0, n_vocab). */
static int js_ids(json_t *obj, const char *ctx, const char *key, int allow_list, int n_vocab,
                  int *ids, int *n, int max, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) return 0;
    size_t count = 1;
    if (json_is_array(v)) {
        if (!allow_list)
            return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" must be an integer", ctx, key);
        count = json_array_size(v);
    } else if (!json_is_integer(v)) {
        return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" must be an integer%s", ctx, key,
                        allow_list ? " or a list of integers" : "");
    }
    for (size_t i = 0; i < count; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e))
            return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" entry %zu is not an integer", ctx, key, i);
        long long id = json_integer_value(e);
        if (id < 0 || id >= n_vocab)
            return qerr_set(err, errlen, QERR_RANGE, "%s: \"%s\" = %lld is outside the vocabulary (0..%d)",
                            ctx, key, id, n_vocab - 1);
        int dup = 0;
        for (int k = 0; k < *n; k++) dup |= ids[k] == (int)id;
        if (dup) continue;
        if (*n >= max)
            return qerr_set(err, errlen, QERR_LIMIT, "%s: \"%s\" lists more than %d distinct ids", ctx, key, max);
        ids[(*n)++] = (int)id;
    }
    return 0;
}

/* ---- config.json -------------------------------------------------------- */

typedef struct {
    qhparams hp;
    int bos_id, unk_id, pad_id;
    int n_eos;
    int eos_ids[8];
    float *rope_long, *rope_short; /* LongRoPE's factors (rope_dim / 2 each), or NULL */
} hf_config;

static int config_arch(json_t *c, int *which, char *err, size_t errlen)
{
    const char *mt, *cls = NULL;
    int rc = js_str(c, "config.json", "model_type", &mt, err, errlen);
    if (rc) return rc;
    if (!mt) {
        json_t *a = json_object_get(c, "architectures");
        if (a && !json_is_null(a)) {
            if (!json_is_array(a) || (json_array_size(a) && !json_is_string(json_array_get(a, 0))))
                return qerr_set(err, errlen, QERR_FORMAT, "config.json: \"architectures\" must be a list of strings");
            cls = json_string_value(json_array_get(a, 0));
        }
        if (!cls)
            return qerr_set(err, errlen, QERR_FORMAT,
                            "config.json: neither \"model_type\" nor \"architectures\" is given");
    }
    const int f = qfamily_by_hf(mt, mt ? NULL : cls);
    if (f >= 0) {
        *which = f;
        return 0;
    }
    char known[128];
    qfamily_list(0, known, sizeof known);
    return qerr_set(err, errlen, QERR_UNSUPPORTED, "config.json: %s \"%.64s\" is not supported (%s)",
                    mt ? "model_type" : "architecture", mt ? mt : cls, known);
}

/* The scaling an object of either RoPE layout names ("rope_type" or "type",
 * factor, ...) into hp; none when src is NULL. */
/* A list of n positive numbers into a new float array. */
static int js_floats(json_t *obj, const char *ctx, const char *key, int n, float **out, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_array(v) || json_array_size(v) != (size_t)n)
        return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" must be a list of %d numbers", ctx, key, n);
    float *f = q_mallocn((size_t)n, sizeof *f);
    if (!f) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        const double x = json_number_value(e);
        if (!json_is_number(e) || !(x > 0 && x < 1e6)) {
            free(f);
            return qerr_set(err, errlen, QERR_RANGE, "%s: \"%s\"[%d] must be a number in (0, 1e6)", ctx, key, i);
        }
        f[i] = (float)x;
    }
    *out = f;
    return 0;
}

/* LongRoPE (Phi-3 and Phi-4): long_factor and short_factor (rope_dim / 2
 * numbers each), original_max_position_embeddings (here or at the top
 * level), and the attention factor: attention_factor, else as transformers
 * derives it, sqrt(1 + ln f / ln original) with f = factor or the context
 * over the original one (1 when f <= 1). */
static int rope_longrope(json_t *src, json_t *c, const char *ctx, qhparams *hp, hf_config *o, char *err, size_t errlen)
{
    long long orig = 0;
    double f, af;
    int rc;
    if (!o) return qerr_set(err, errlen, QERR_UNSUPPORTED, "%s: longrope is not supported here", ctx);
    if ((rc = js_int(c, "config.json", "original_max_position_embeddings", 0, 0, 0, HF_MAX_CTX, &orig, err, errlen)) ||
        (rc = js_int(src, ctx, "original_max_position_embeddings", orig == 0, orig, 1, HF_MAX_CTX, &orig, err, errlen)) ||
        (rc = js_num(src, ctx, "factor", 0, (double)hp->max_ctx / (double)orig, 0, 1e6, &f, err, errlen)))
        return rc;
    const double def = f <= 1.0 ? 1.0 : sqrt(1.0 + log(f) / log((double)orig));
    if ((rc = js_num(src, ctx, "attention_factor", 0, def, 0, 100, &af, err, errlen))) return rc;
    free(o->rope_long), free(o->rope_short);
    o->rope_long = o->rope_short = NULL;
    if ((rc = js_floats(src, ctx, "long_factor", hp->rope_dim / 2, &o->rope_long, err, errlen)) ||
        (rc = js_floats(src, ctx, "short_factor", hp->rope_dim / 2, &o->rope_short, err, errlen)))
        return rc;
    hp->rope_scaling = QROPE_SCALE_LONGROPE;
    hp->rope_factor = (float)f;
    hp->rope_orig_ctx = (int)orig;
    hp->rope_mscale = (float)af;
    return 0;
}

static int rope_scaling_of(json_t *src, json_t *c, const char *ctx, qhparams *hp, hf_config *o, char *err,
                           size_t errlen)
{
    double x;
    long long v;
    int rc;
    hp->rope_scaling = QROPE_SCALE_NONE;
    if (!src) return 0;
    const char *type;
    if ((rc = js_str(src, ctx, "rope_type", &type, err, errlen))) return rc;
    if (!type && (rc = js_str(src, ctx, "type", &type, err, errlen))) return rc;
    if (!type || !strcmp(type, "default")) return 0;
    if (!strcmp(type, "longrope")) return rope_longrope(src, c, ctx, hp, o, err, errlen);

    if (!strcmp(type, "linear")) {
        if ((rc = js_num(src, ctx, "factor", 1, 0, 0, 1e6, &x, err, errlen))) return rc;
        hp->rope_scaling = QROPE_SCALE_LINEAR;
        hp->rope_factor = (float)x;
        return 0;
    }
    if (!strcmp(type, "llama3")) {
        double lo, hi;
        if ((rc = js_num(src, ctx, "factor", 1, 0, 0, 1e6, &x, err, errlen)) ||
            (rc = js_num(src, ctx, "low_freq_factor", 1, 0, 0, 1e6, &lo, err, errlen)) ||
            (rc = js_num(src, ctx, "high_freq_factor", 1, 0, 0, 1e6, &hi, err, errlen)) ||
            (rc = js_int(src, ctx, "original_max_position_embeddings", 1, 0, 1, HF_MAX_CTX, &v, err, errlen)))
            return rc;
        if (!(hi > lo))
            return qerr_set(err, errlen, QERR_RANGE, "%s: high_freq_factor %g must exceed low_freq_factor %g",
                            ctx, hi, lo);
        hp->rope_scaling = QROPE_SCALE_LLAMA3;
        hp->rope_factor = (float)x;
        hp->rope_low_freq_factor = (float)lo;
        hp->rope_high_freq_factor = (float)hi;
        hp->rope_orig_ctx = (int)v;
        return 0;
    }
    return qerr_set(err, errlen, QERR_UNSUPPORTED,
                    "%s: rope type \"%.40s\" is not supported (default, llama3, linear, longrope)",
                    ctx, type);
}

/* An object-valued key, or NULL when absent or null. */
static int js_obj(json_t *obj, const char *ctx, const char *key, json_t **out, char *err, size_t errlen)
{
    json_t *v = json_object_get(obj, key);
    *out = NULL;
    if (!v || json_is_null(v)) return 0;
    if (!json_is_object(v)) return qerr_set(err, errlen, QERR_FORMAT, "%s: \"%s\" must be an object", ctx, key);
    *out = v;
    return 0;
}

/* RoPE in three layouts: the older top-level rope_theta + rope_scaling (and
 * Gemma 3's rope_local_base_freq for its local layers), the newer
 * rope_parameters {rope_theta, rope_type, ...}, and rope_parameters per
 * layer type {"full_attention": {...}, "sliding_attention": {...}} (Gemma
 * 3), where the local layers' RoPE must be unscaled. */
static int config_rope(json_t *c, qhparams *hp, hf_config *o, char *err, size_t errlen)
{
    const qfamily *fam = qfamily_get(hp->family);
    double theta, local = hp->rope_theta_local;
    int rc;
    json_t *params, *src, *full = NULL, *slide = NULL;
    if ((rc = js_num(c, "config.json", "rope_theta", 0, fam && fam->hf_rope_theta > 0 ? fam->hf_rope_theta : 10000.0,
                     0, 1e12, &theta, err, errlen)) ||
        (rc = js_num(c, "config.json", "rope_local_base_freq", 0, local, -1, 1e12, &local, err, errlen)) ||
        (rc = js_obj(c, "config.json", "rope_parameters", &params, err, errlen)))
        return rc;
    const char *ctx = "config.json: rope_parameters";
    if (params && ((rc = js_obj(params, ctx, "full_attention", &full, err, errlen)) ||
                   (rc = js_obj(params, ctx, "sliding_attention", &slide, err, errlen))))
        return rc;
    if (full || slide) {
        if (slide) {
            qhparams lp = *hp;
            ctx = "config.json: rope_parameters.sliding_attention";
            if ((rc = js_num(slide, ctx, "rope_theta", 0, local > 0 ? local : theta, 0, 1e12, &local, err, errlen)) ||
                (rc = rope_scaling_of(slide, c, ctx, &lp, NULL, err, errlen)))
                return rc;
            if (lp.rope_scaling != QROPE_SCALE_NONE)
                return qerr_set(err, errlen, QERR_UNSUPPORTED, "%s: scaled RoPE for local layers is not supported", ctx);
        }
        ctx = "config.json: rope_parameters.full_attention";
        src = full;
    } else if (params) {
        src = params;
    } else {
        ctx = "config.json: rope_scaling";
        if ((rc = js_obj(c, "config.json", "rope_scaling", &src, err, errlen))) return rc;
    }
    if (src && src != json_object_get(c, "rope_scaling") &&
        (rc = js_num(src, ctx, "rope_theta", 0, theta, 0, 1e12, &theta, err, errlen)))
        return rc;
    hp->rope_theta = (float)theta;
    hp->rope_theta_local = local > 0 ? (float)local : 0.0f;
    return rope_scaling_of(src, c, ctx, hp, o, err, errlen);
}

/* Which layers attend without RoPE (SmolLM3): "no_rope_layers" (1: RoPE,
 * 0: none, one a layer) where the config lists them, else every
 * "no_rope_layer_interval"-th layer (the family's default); a list other
 * than every n-th layer without RoPE is QERR_UNSUPPORTED. */
static int config_nope(json_t *c, const qfamily *fam, qhparams *hp, char *err, size_t errlen)
{
    static const char F[] = "config.json";
    long long n = 0;
    int rc;
    if (!fam->nope_interval) return 0;
    if ((rc = js_int(c, F, "no_rope_layer_interval", 0, fam->nope_interval, 1, QMODEL_MAX_LAYERS, &n, err, errlen)))
        return rc;
    hp->nope_interval = (int)n;
    json_t *list = json_object_get(c, "no_rope_layers");
    if (!list || json_is_null(list)) return 0;
    if (!json_is_array(list) || json_array_size(list) != (size_t)hp->n_layers)
        return qerr_set(err, errlen, QERR_FORMAT, "config.json: \"no_rope_layers\" must list %d integers (1: RoPE, 0: none)",
                        hp->n_layers);
    hp->nope_interval = 0;
    for (int l = 0; l < hp->n_layers; l++) {
        json_t *v = json_array_get(list, (size_t)l);
        if (!json_is_integer(v) || (json_integer_value(v) != 0 && json_integer_value(v) != 1))
            return qerr_set(err, errlen, QERR_FORMAT, "config.json: no_rope_layers[%d] must be 0 or 1", l);
        if (!json_integer_value(v) && !hp->nope_interval) hp->nope_interval = l + 1; /* the first NoPE layer */
    }
    for (int l = 0; l < hp->n_layers; l++)
        if (json_integer_value(json_array_get(list, (size_t)l)) != qhp_layer_rope(hp, l))
            return qerr_set(err, errlen, QERR_UNSUPPORTED,
                            "config.json: no_rope_layers other than every n-th layer without RoPE are not supported");
    return 0;
}

/* Which layers attend through a window, and its size: "layer_types" where
 * the config lists them ("sliding_attention" / "full_attention"), else the
 * family's rule; an arrangement other than every n-th layer global is
 * QERR_UNSUPPORTED. */
static int config_window(json_t *c, const qfamily *fam, qhparams *hp, char *err, size_t errlen)
{
    static const char F[] = "config.json";
    long long v = 0, first = 0;
    int rc, on = fam->hf_sliding == QSLIDE_WINDOW;
    hp->window = 0;
    const int flag = fam->hf_sliding == QSLIDE_FLAG || fam->hf_sliding == QSLIDE_FLAG_NOPE;
    if (flag &&
        ((rc = js_bool(c, F, "use_sliding_window", 0, &on, err, errlen)) ||
         (rc = js_int(c, F, "max_window_layers", 0, 0, 0, INT_MAX, &first, err, errlen))))
        return rc;
    if (!on || fam->hf_sliding == QSLIDE_NONE) return 0;
    if ((rc = js_int(c, F, "sliding_window", 0, 0, 0, INT_MAX, &v, err, errlen))) return rc;
    if (v <= 0) return 0;
    /* local[l] for each layer, then the pattern that gives it. */
    unsigned char *local = calloc((size_t)hp->n_layers, 1);
    if (!local) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    json_t *types = json_object_get(c, "layer_types");
    if (types && !json_is_null(types)) {
        if (!json_is_array(types) || json_array_size(types) != (size_t)hp->n_layers) {
            free(local);
            return qerr_set(err, errlen, QERR_FORMAT, "config.json: \"layer_types\" must list %d strings", hp->n_layers);
        }
        for (int l = 0; l < hp->n_layers; l++) {
            const char *t = json_string_value(json_array_get(types, (size_t)l));
            if (!t || (strcmp(t, "sliding_attention") && strcmp(t, "full_attention"))) {
                free(local);
                return qerr_set(err, errlen, QERR_UNSUPPORTED,
                                "config.json: layer_types[%d] is not \"sliding_attention\" or \"full_attention\"", l);
            }
            local[l] = !strcmp(t, "sliding_attention");
        }
    } else if (fam->hf_sliding == QSLIDE_FLAG_NOPE) {
        for (int l = 0; l < hp->n_layers; l++) local[l] = !qhp_layer_rope(hp, l);
    } else if (fam->hf_sliding == QSLIDE_FLAG) {
        for (int l = 0; l < hp->n_layers; l++) local[l] = l >= first;
    } else {
        hp->window = (int)v;
        for (int l = 0; l < hp->n_layers; l++) local[l] = qhp_layer_local(hp, l);
    }
    int n_local = 0, first_global = -1;
    for (int l = 0; l < hp->n_layers; l++) {
        n_local += local[l];
        if (!local[l] && first_global < 0) first_global = l;
    }
    hp->window = n_local ? (int)v : 0;
    hp->window_pattern = n_local == hp->n_layers ? 0 : first_global + 1;
    int fits = 1;
    for (int l = 0; l < hp->n_layers; l++) fits &= local[l] == (unsigned char)qhp_layer_local(hp, l);
    free(local);
    if (!fits)
        return qerr_set(err, errlen, QERR_UNSUPPORTED,
                        "config.json: sliding-window layers other than every n-th layer global are not supported");
    return 0;
}

/* A soft-cap: the family's default when absent, none when null. */
static int js_softcap(json_t *c, const char *key, float def, float *out, char *err, size_t errlen)
{
    json_t *v = json_object_get(c, key);
    double x = 0;
    int rc = 0;
    if (!v) x = def;
    else if (!json_is_null(v)) rc = js_num(c, "config.json", key, 1, 0, 0, 1e6, &x, err, errlen);
    *out = (float)x;
    return rc;
}

/* Gemma's: the attention scale from query_pre_attn_scalar (transformers'
 * default 256), the soft-caps. */
static int config_gemma(json_t *c, const qfamily *fam, qhparams *hp, char *err, size_t errlen)
{
    int rc;
    double q = 256;
    if (!fam->hf_query_scalar) return 0;
    if ((rc = js_num(c, "config.json", "query_pre_attn_scalar", 0, 256, 0, 1e9, &q, err, errlen))) return rc;
    hp->attn_scale = (float)(1.0 / sqrt(q));
    if ((rc = js_softcap(c, "attn_logit_softcapping", fam->attn_softcap, &hp->attn_softcap, err, errlen)) ||
        (rc = js_softcap(c, "final_logit_softcapping", fam->final_softcap, &hp->final_softcap, err, errlen)))
        return rc;
    return 0;
}

static int config_parse(json_t *c, hf_config *o, char *err, size_t errlen)
{
    static const char F[] = "config.json";
    qhparams *hp = &o->hp;
    long long v;
    double d;
    int rc, a = 0;

    if (!json_is_object(c)) return qerr_set(err, errlen, QERR_FORMAT, "config.json: not a JSON object");
    if ((rc = config_arch(c, &a, err, errlen))) return rc;
    const qfamily *fam = qfamily_get(a);

    if ((rc = js_int(c, F, "hidden_size", 1, 0, 1, QMODEL_MAX_DIM, &v, err, errlen))) return rc;
    hp->dim = (int)v;
    if ((rc = js_int(c, F, "intermediate_size", 1, 0, 1, QMODEL_MAX_DIM, &v, err, errlen))) return rc;
    hp->ffn_dim = (int)v;
    if ((rc = js_int(c, F, "num_hidden_layers", 1, 0, 1, QMODEL_MAX_LAYERS, &v, err, errlen))) return rc;
    hp->n_layers = (int)v;
    if ((rc = js_int(c, F, "num_attention_heads", 1, 0, 1, HF_MAX_HEADS, &v, err, errlen))) return rc;
    hp->n_heads = (int)v;
    if ((rc = js_int(c, F, "num_key_value_heads", 0, hp->n_heads, 1, hp->n_heads, &v, err, errlen))) return rc;
    hp->n_kv_heads = (int)v;
    if (hp->n_heads % hp->n_kv_heads)
        return qerr_set(err, errlen, QERR_RANGE,
                        "config.json: num_attention_heads %d is not a multiple of num_key_value_heads %d",
                        hp->n_heads, hp->n_kv_heads);
    if ((rc = js_int(c, F, "head_dim", 0, 0, 1, HF_MAX_HEAD_DIM, &v, err, errlen))) return rc;
    if (v == 0) {
        if (hp->dim % hp->n_heads)
            return qerr_set(err, errlen, QERR_RANGE,
                            "config.json: hidden_size %d is not divisible by num_attention_heads %d (and no head_dim)",
                            hp->dim, hp->n_heads);
        v = hp->dim / hp->n_heads;
    }
    if (v % 2)
        return qerr_set(err, errlen, QERR_RANGE, "config.json: head dimension %lld must be even for RoPE", v);
    hp->head_dim = (int)v;
    if ((long long)hp->n_heads * hp->head_dim > QMODEL_MAX_DIM)
        return qerr_set(err, errlen, QERR_RANGE, "config.json: num_attention_heads * head_dim = %lld is over %d",
                        (long long)hp->n_heads * hp->head_dim, QMODEL_MAX_DIM);
    hp->rope_dim = hp->head_dim;
    hp->rope_neox = 1;
    if ((rc = js_int(c, F, "vocab_size", 1, 0, 1, QMODEL_MAX_VOCAB, &v, err, errlen))) return rc;
    hp->n_vocab = (int)v;
    if ((rc = js_int(c, F, "max_position_embeddings", 0, fam->hf_max_ctx, 1, HF_MAX_CTX, &v, err, errlen)))
        return rc;
    hp->max_ctx = (int)v;
    if ((rc = js_num(c, F, "rms_norm_eps", 0, 1e-6, 0, 0.5, &d, err, errlen))) return rc;
    hp->norm_eps = (float)d;
    if ((rc = js_bool(c, F, "tie_word_embeddings", fam->hf_tied, &hp->tied_embeddings, err, errlen))) return rc;
    if ((rc = js_bool(c, F, "attention_bias", 0, &hp->attn_bias, err, errlen))) return rc;
    qfamily_apply(a, hp);
    hp->norm_add_one = fam->hf_norm_add_one;
    if ((rc = js_num(c, F, "partial_rotary_factor", 0, 1.0, 0, 1.0, &d, err, errlen))) return rc;
    hp->rope_dim = (int)(hp->head_dim * d);
    if (hp->rope_dim < 2 || hp->rope_dim % 2)
        return qerr_set(err, errlen, QERR_RANGE, "config.json: partial_rotary_factor %g leaves %d rotated dimensions (even, >= 2)",
                        d, hp->rope_dim);
    if ((rc = config_rope(c, hp, o, err, errlen))) return rc;
    if ((rc = config_nope(c, fam, hp, err, errlen))) return rc;
    if ((rc = config_window(c, fam, hp, err, errlen))) return rc;
    if ((rc = config_gemma(c, fam, hp, err, errlen))) return rc;

    /* Features that would make quire compute something else. */
    const char *act, *key = "hidden_act";
    int mlp_bias;
    if ((rc = js_str(c, F, key, &act, err, errlen))) return rc;
    if (!act && (rc = js_str(c, F, key = "hidden_activation", &act, err, errlen))) return rc;
    if (act && strcmp(act, qact_hf_name(fam->act)))
        return qerr_set(err, errlen, QERR_UNSUPPORTED,
                        "config.json: %s \"%.40s\" is not supported (%s)", key, act, qact_hf_name(fam->act));
    if ((rc = js_bool(c, F, "mlp_bias", 0, &mlp_bias, err, errlen))) return rc;
    if (mlp_bias) return qerr_set(err, errlen, QERR_UNSUPPORTED, "config.json: mlp_bias true is not supported");

    o->n_eos = 0;
    o->bos_id = o->unk_id = o->pad_id = -1;
    if ((rc = js_ids(c, F, "bos_token_id", 0, hp->n_vocab, &o->bos_id, &(int){ 0 }, 1, err, errlen)) ||
        (rc = js_ids(c, F, "eos_token_id", 1, hp->n_vocab, o->eos_ids, &o->n_eos, HF_MAX_EOS, err, errlen)))
        return rc;
    /* unk and pad matter less and are often written carelessly: kept only when valid. */
    json_t *u = json_object_get(c, "unk_token_id"), *p = json_object_get(c, "pad_token_id");
    if (json_is_integer(u) && json_integer_value(u) >= 0 && json_integer_value(u) < hp->n_vocab)
        o->unk_id = (int)json_integer_value(u);
    if (json_is_integer(p) && json_integer_value(p) >= 0 && json_integer_value(p) < hp->n_vocab)
        o->pad_id = (int)json_integer_value(p);
    return 0;
}

/* An image-text checkpoint whose language model is a family here (Gemma 3's
 * Gemma3ForConditionalGeneration, arch.h's hf_mm_type): *text becomes a new
 * object, the family's text defaults overlaid with the top level's token
 * ids and then with "text_config", and *wrapped 1.  Else *text is root
 * (a new reference) and *wrapped 0. */
static int config_unwrap(json_t *root, json_t **text, int *wrapped, char *err, size_t errlen)
{
    *text = NULL;
    *wrapped = 0;
    if (!json_is_object(root)) return qerr_set(err, errlen, QERR_FORMAT, "config.json: not a JSON object");
    const char *mt = json_string_value(json_object_get(root, "model_type")), *cls = NULL;
    json_t *a = json_object_get(root, "architectures");
    if (!json_object_get(root, "model_type") && json_is_array(a)) cls = json_string_value(json_array_get(a, 0));
    const int f = qfamily_by_hf_mm(mt, cls);
    if (f < 0) {
        *text = json_incref(root);
        return 0;
    }
    const qfamily *fam = qfamily_get(f);
    json_t *tc = json_object_get(root, "text_config");
    if (!json_is_object(tc))
        return qerr_set(err, errlen, QERR_FORMAT, "config.json: model_type \"%s\" needs a \"text_config\" object",
                        fam->hf_mm_type);
    const char *tmt = json_string_value(json_object_get(tc, "model_type"));
    if (tmt && strcmp(tmt, fam->hf_model_type))
        return qerr_set(err, errlen, QERR_UNSUPPORTED, "config.json: text_config.model_type \"%.64s\" is not \"%s\"",
                        tmt, fam->hf_model_type);
    json_t *t = json_loads(fam->hf_text_defaults, 0, NULL);
    static const char *const ids[] = { "bos_token_id", "eos_token_id", "pad_token_id" };
    int bad = !t || json_object_set_new(t, "model_type", json_string(fam->hf_model_type));
    for (size_t i = 0; !bad && i < sizeof ids / sizeof ids[0]; i++) {
        json_t *v = json_object_get(root, ids[i]);
        if (v) bad = json_object_set(t, ids[i], v);
    }
    if (bad || json_object_update(t, tc)) {
        json_decref(t);
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    }
    *text = t;
    *wrapped = 1;
    return 0;
}

/* The language model's tensors of an image-text checkpoint under the text
 * model's names: "model.language_model.X" and "language_model.model.X" as
 * "model.X", "language_model.lm_head.X" as "lm_head.X".  The rest (the
 * vision tower, the projector) keep their names and are never bound. */
static int hf_unwrap_names(qmodel *m, char *err, size_t errlen)
{
    static const char *const map[][2] = {
        { "model.language_model.", "model." },
        { "language_model.model.", "model." },
        { "language_model.lm_head.", "lm_head." },
    };
    for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
        int rc = qmodel_rename_prefix(m, map[k][0], map[k][1], err, errlen);
        if (rc) return rc;
    }
    return 0;
}

static int parse_config(qmodel *m, const char *json, size_t len, int *wrapped, char *err, size_t errlen)
{
    json_error_t je;
    json_t *root = json_loadb(json, len, 0, &je), *text;
    if (!root)
        return qerr_set(err, errlen, QERR_FORMAT, "config.json: invalid JSON at line %d, column %d: %s",
                        je.line, je.column, je.text);
    hf_config c;
    memset(&c, 0, sizeof c);
    int rc = config_unwrap(root, &text, wrapped, err, errlen);
    json_decref(root);
    if (rc) return rc;
    rc = config_parse(text, &c, err, errlen);
    json_decref(text);
    if (!rc && c.rope_long) { /* LongRoPE's factors, as tensors under the GGUF converter's names */
        float *lf = c.rope_long, *sf = c.rope_short;
        const int64_t n = c.hp.rope_dim / 2;
        const size_t bytes = (size_t)n * sizeof(float);
        c.rope_long = c.rope_short = NULL;
        if (qmodel_take_buffer(m, lf)) {
            free(lf), free(sf);
            rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        } else if (qmodel_take_buffer(m, sf)) {
            free(sf);
            rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        } else if (!(rc = qmodel_add_tensor(m, "rope_factors_long.weight", 24, QDT_F32, 1, &n, lf, bytes, err, errlen))) {
            rc = qmodel_add_tensor(m, "rope_factors_short.weight", 25, QDT_F32, 1, &n, sf, bytes, err, errlen);
        }
    }
    free(c.rope_long);
    free(c.rope_short);
    if (rc) return rc;
    m->hp = c.hp;
    m->bos_id = c.bos_id;
    if (c.unk_id >= 0) m->unk_id = c.unk_id;
    if (c.pad_id >= 0) m->pad_id = c.pad_id;
    m->n_eos = c.n_eos;
    memcpy(m->eos_ids, c.eos_ids, sizeof c.eos_ids);
    return 0;
}

int hf_parse_config(qmodel *m, const char *json, size_t len, char *err, size_t errlen)
{
    int wrapped;
    return parse_config(m, json, len, &wrapped, err, errlen);
}

/* ---- files -------------------------------------------------------------- */

/* "dir/file", owned by the caller; NULL when out of memory. */
static char *hf_path(const char *dir, const char *file)
{
    size_t a = strlen(dir), b = strlen(file);
    int slash = a > 0 && dir[a - 1] == '/';
    char *p = q_malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    if (!slash) p[a++] = '/';
    memcpy(p + a, file, b + 1);
    return p;
}

static int hf_exists(const char *dir, const char *file)
{
    char *p = hf_path(dir, file);
    struct stat st;
    int ok = p && stat(p, &st) == 0;
    free(p);
    return ok;
}

/* Reads and parses dir/file.  When optional and the file does not exist,
 * returns 0 with *out NULL. */
static int hf_read_json(const char *dir, const char *file, size_t cap, int optional, size_t flags,
                        json_t **out, char *err, size_t errlen)
{
    *out = NULL;
    char *path = hf_path(dir, file), *text = NULL;
    size_t len = 0;
    if (!path) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    struct stat st;
    if (optional && stat(path, &st) < 0 && errno == ENOENT) {
        free(path);
        return 0;
    }
    int rc = q_read_file(path, cap, &text, &len, err, errlen);
    free(path);
    if (rc) return rc;
    json_error_t je;
    *out = json_loadb(text, len, flags, &je);
    free(text);
    if (!*out)
        return qerr_set(err, errlen, QERR_FORMAT, "%s: invalid JSON at line %d, column %d: %s",
                        file, je.line, je.column, je.text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return qerr_set(err, errlen, QERR_FORMAT, "%s: not a JSON object", file);
    }
    return 0;
}

/* Maps dir/file read-only (the model owns the mapping) and parses it. */
static int hf_load_safetensors(qmodel *m, const char *dir, const char *file, char *err, size_t errlen)
{
    char *path = hf_path(dir, file);
    if (!path) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    const void *addr;
    size_t len;
    int rc = qmodel_map_file(m, path, 8, "a safetensors header", &addr, &len, err, errlen);
    free(path);
    if (rc) return rc;
    return safetensors_parse(m, addr, len, file, err, errlen);
}

/* A shard name the index may use: a plain file name in the folder. */
static int hf_plain_name(const char *s)
{
    return s[0] && strlen(s) <= 255 && !strchr(s, '/') && !strstr(s, "..") && strcmp(s, ".");
}

static int hf_load_sharded(qmodel *m, const char *dir, char *err, size_t errlen)
{
    static const char IDX[] = "model.safetensors.index.json";
    json_t *root, *shards = NULL, *where = NULL;
    int rc = hf_read_json(dir, IDX, HF_MAX_INDEX, 0, JSON_DECODE_INT_AS_REAL, &root, err, errlen);
    if (rc) return rc;
    json_t *map = json_object_get(root, "weight_map");
    const char *name, *shard;
    json_t *v;
    if (!json_is_object(map) || json_object_size(map) == 0) {
        rc = qerr_set(err, errlen, QERR_FORMAT, "%s: \"weight_map\" missing, empty or not an object", IDX);
        goto out;
    }
    shards = json_object();
    where = json_object();
    if (!shards || !where) {
        rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        goto out;
    }
    json_object_foreach(map, name, v) {
        if (!json_is_string(v)) {
            rc = qerr_set(err, errlen, QERR_FORMAT, "%s: shard of tensor '%.200s' is not a string", IDX, name);
            goto out;
        }
        if (!hf_plain_name(json_string_value(v))) {
            rc = qerr_set(err, errlen, QERR_FORMAT,
                          "%s: shard \"%.200s\" of tensor '%.200s' is not a plain file name in the folder",
                          IDX, json_string_value(v), name);
            goto out;
        }
        if (json_object_set_new(shards, json_string_value(v), json_true())) {
            rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
            goto out;
        }
    }
    int slots = QMODEL_MAX_FILES - m->n_maps;
    if (json_object_size(shards) > (size_t)slots) {
        rc = qerr_set(err, errlen, QERR_LIMIT, "%s: %zu shards, at most %d can be mapped", IDX,
                      json_object_size(shards), slots);
        goto out;
    }
    json_object_foreach(shards, shard, v) {
        int first = m->n_tensors;
        if ((rc = hf_load_safetensors(m, dir, shard, err, errlen))) goto out;
        for (int i = first; i < m->n_tensors; i++) {
            if (json_object_set_new(where, m->tensors[i].name, json_string(shard))) {
                rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
                goto out;
            }
        }
    }
    json_object_foreach(map, name, v) {
        json_t *w = json_object_get(where, name);
        if (!w || strcmp(json_string_value(w), json_string_value(v))) {
            rc = qerr_set(err, errlen, QERR_FORMAT,
                          "%s: tensor '%.200s' is listed in %.200s, which does not contain it",
                          IDX, name, json_string_value(v));
            goto out;
        }
    }
out:
    json_decref(where);
    json_decref(shards);
    json_decref(root);
    return rc;
}

static int hf_load_weights(qmodel *m, const char *dir, char *err, size_t errlen)
{
    if (hf_exists(dir, "model.safetensors")) return hf_load_safetensors(m, dir, "model.safetensors", err, errlen);
    if (hf_exists(dir, "model.safetensors.index.json")) return hf_load_sharded(m, dir, err, errlen);
    return qerr_set(err, errlen, QERR_NOTFOUND, "%s: no model.safetensors or model.safetensors.index.json", dir);
}

static int hf_generation_config(qmodel *m, const char *dir, char *err, size_t errlen)
{
    static const char F[] = "generation_config.json";
    json_t *g;
    int rc = hf_read_json(dir, F, HF_MAX_JSON, 1, 0, &g, err, errlen);
    if (rc || !g) return rc;
    int bos = -1, n = 0;
    if (!(rc = js_ids(g, F, "bos_token_id", 0, m->hp.n_vocab, &bos, &n, 1, err, errlen)) &&
        !(rc = js_ids(g, F, "eos_token_id", 1, m->hp.n_vocab, m->eos_ids, &m->n_eos, HF_MAX_EOS, err, errlen)) &&
        bos >= 0)
        m->bos_id = bos;
    json_decref(g);
    return rc;
}

/* ---- tokenizer.json ----------------------------------------------------- */

/* Whether node, or a member of its Sequence (under list_key), has the type. */
static int tok_has_type(json_t *node, const char *list_key, const char *type)
{
    if (!json_is_object(node)) return 0;
    const char *t = json_string_value(json_object_get(node, "type"));
    if (t && !strcmp(t, type)) return 1;
    json_t *list = json_object_get(node, list_key), *x;
    size_t i;
    json_array_foreach(list, i, x) if (tok_has_type(x, list_key, type)) return 1;
    return 0;
}

/* Whether the post-processor's template for one sequence starts with a
 * special token (the way tokenizer.json says "prepend BOS"). */
static int tok_template_prepends(json_t *pp)
{
    if (!json_is_object(pp)) return 0;
    const char *t = json_string_value(json_object_get(pp, "type"));
    if (t && !strcmp(t, "TemplateProcessing")) {
        json_t *first = json_array_get(json_object_get(pp, "single"), 0);
        return json_is_object(first) && json_object_get(first, "SpecialToken");
    }
    json_t *x;
    size_t i;
    json_array_foreach(json_object_get(pp, "processors"), i, x) if (tok_template_prepends(x)) return 1;
    return 0;
}

static int tok_is_byte_piece(const char *s)
{
    static const char hex[] = "0123456789abcdefABCDEF";
    return strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' && s[3] && strchr(hex, s[3]) &&
           s[4] && strchr(hex, s[4]);
}

static int tok_set(qvocab *v, long long id, const char *piece, int type)
{
    char *s = q_strdup(piece);
    if (!s) return QERR_NOMEM;
    free(v->tokens[id]);
    v->tokens[id] = s;
    v->types[id] = type;
    return 0;
}

/* Looks a piece up: added tokens first, then the model vocabulary.  -1 when
 * absent. */
static int tok_lookup(json_t *tok, const char *piece)
{
    json_t *a, *vocab = json_object_get(json_object_get(tok, "model"), "vocab");
    size_t i;
    json_array_foreach(json_object_get(tok, "added_tokens"), i, a) {
        const char *c = json_string_value(json_object_get(a, "content"));
        if (c && !strcmp(c, piece)) return (int)json_integer_value(json_object_get(a, "id"));
    }
    if (json_is_object(vocab)) {
        json_t *id = json_object_get(vocab, piece);
        if (json_is_integer(id)) return (int)json_integer_value(id);
    } else {
        json_array_foreach(vocab, i, a) {
            const char *c = json_string_value(json_array_get(a, 0));
            if (c && !strcmp(c, piece)) return (int)i;
        }
    }
    return -1;
}

/* Checks the entries and returns the largest id in *max_id (-1: none). */
static int tok_scan(json_t *vocab, json_t *added, long long *max_id, size_t *entries, int *has_space_mark,
                    char *err, size_t errlen)
{
    static const char F[] = "tokenizer.json";
    const char *piece;
    json_t *e;
    size_t i;
    *max_id = -1;
    *has_space_mark = 0;
    *entries = json_is_object(vocab) ? json_object_size(vocab) : json_array_size(vocab);
    if (json_is_object(vocab)) {
        json_object_foreach(vocab, piece, e) {
            if (!json_is_integer(e))
                return qerr_set(err, errlen, QERR_FORMAT, "%s: id of piece \"%.100s\" is not an integer", F, piece);
            long long id = json_integer_value(e);
            if (id < 0 || id >= QMODEL_MAX_VOCAB)
                return qerr_set(err, errlen, QERR_RANGE, "%s: piece \"%.100s\" has id %lld (0..%d allowed)",
                                F, piece, id, QMODEL_MAX_VOCAB - 1);
            if (id > *max_id) *max_id = id;
            if (!*has_space_mark && strstr(piece, "\xe2\x96\x81")) *has_space_mark = 1;
        }
    } else {
        if (*entries > QMODEL_MAX_VOCAB)
            return qerr_set(err, errlen, QERR_RANGE, "%s: %zu pieces (at most %d)", F, *entries, QMODEL_MAX_VOCAB);
        json_array_foreach(vocab, i, e) {
            if (!json_is_array(e) || !json_is_string(json_array_get(e, 0)) || !json_is_number(json_array_get(e, 1)))
                return qerr_set(err, errlen, QERR_FORMAT, "%s: vocabulary entry %zu is not [piece, score]", F, i);
            if (!*has_space_mark && strstr(json_string_value(json_array_get(e, 0)), "\xe2\x96\x81"))
                *has_space_mark = 1;
        }
        *max_id = (long long)*entries - 1;
    }
    if (added && !json_is_null(added) && !json_is_array(added))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: \"added_tokens\" is not a list", F);
    json_array_foreach(added, i, e) {
        json_t *id = json_object_get(e, "id"), *sp = json_object_get(e, "special");
        if (!json_is_integer(id) || !json_is_string(json_object_get(e, "content")) || (sp && !json_is_boolean(sp)))
            return qerr_set(err, errlen, QERR_FORMAT,
                            "%s: added_tokens entry %zu needs an integer \"id\", a string \"content\""
                            " and a boolean \"special\"",
                            F, i);
        if (json_integer_value(id) < 0 || json_integer_value(id) >= QMODEL_MAX_VOCAB)
            return qerr_set(err, errlen, QERR_RANGE, "%s: added token %zu has id %lld (0..%d allowed)",
                            F, i, (long long)json_integer_value(id), QMODEL_MAX_VOCAB - 1);
        if (json_integer_value(id) > *max_id) *max_id = json_integer_value(id);
        (*entries)++;
    }
    return 0;
}

/* Fills m->vocab from tokenizer.json; returns the parsed tree in *out (the
 * caller frees it) for looking up tokenizer_config.json's special tokens. */
static int hf_tokenizer(qmodel *m, const char *dir, json_t **out, char *err, size_t errlen)
{
    static const char F[] = "tokenizer.json";
    qvocab *voc = &m->vocab;
    *out = NULL;
    if (!hf_exists(dir, F)) return 0;
    if (!(voc->tokenizer_json = hf_path(dir, F))) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    json_t *tok;
    int rc = hf_read_json(dir, F, HF_MAX_TOKENIZER, 0, 0, &tok, err, errlen);
    if (rc) return rc;
    *out = tok;

    json_t *model = json_object_get(tok, "model");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *added = json_object_get(tok, "added_tokens");
    if (!json_is_object(model) || !(json_is_object(vocab) || json_is_array(vocab)))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: \"model\" with a \"vocab\" object or list is missing", F);
    long long max_id;
    size_t entries;
    int space_mark;
    if ((rc = tok_scan(vocab, added, &max_id, &entries, &space_mark, err, errlen))) return rc;
    long long bound = entries > (size_t)m->hp.n_vocab ? (long long)entries : m->hp.n_vocab;
    if (max_id >= bound)
        return qerr_set(err, errlen, QERR_RANGE,
                        "%s: token id %lld is beyond both vocab_size %d and the %zu entries", F, max_id,
                        m->hp.n_vocab, entries);

    const char *mtype = json_string_value(json_object_get(model, "type"));
    json_t *pre = json_object_get(tok, "pre_tokenizer"), *dec = json_object_get(tok, "decoder");
    if (tok_has_type(pre, "pretokenizers", "ByteLevel") || tok_has_type(dec, "decoders", "ByteLevel"))
        voc->kind = QVOCAB_BPE;
    else if ((mtype && !strcmp(mtype, "BPE") && json_is_true(json_object_get(model, "byte_fallback"))) ||
             tok_has_type(pre, "pretokenizers", "Metaspace") || tok_has_type(dec, "decoders", "Metaspace") ||
             space_mark)
        voc->kind = QVOCAB_SPM;
    else
        voc->kind = QVOCAB_NONE;
    m->add_bos = voc->kind == QVOCAB_SPM || tok_template_prepends(json_object_get(tok, "post_processor"));

    size_t n = (size_t)(max_id + 1);
    if (n == 0) return 0;
    if (!(voc->tokens = q_callocn(n, sizeof *voc->tokens)))
        return qerr_set(err, errlen, QERR_NOMEM, "%s: out of memory for %zu tokens", F, n);
    voc->n = (int)n;
    if (!(voc->types = q_mallocn(n, sizeof *voc->types)) ||
        (json_is_array(vocab) && !(voc->scores = q_callocn(n, sizeof *voc->scores))))
        return qerr_set(err, errlen, QERR_NOMEM, "%s: out of memory for %zu tokens", F, n);
    for (size_t i = 0; i < n; i++) voc->types[i] = QTOK_UNUSED;

    const char *piece;
    json_t *e;
    size_t i;
    int byte_ok = voc->kind != QVOCAB_BPE;
    if (json_is_object(vocab)) {
        json_object_foreach(vocab, piece, e) {
            int type = byte_ok && tok_is_byte_piece(piece) ? QTOK_BYTE : QTOK_NORMAL;
            if (tok_set(voc, json_integer_value(e), piece, type)) goto nomem;
        }
    } else {
        json_array_foreach(vocab, i, e) {
            piece = json_string_value(json_array_get(e, 0));
            int type = byte_ok && tok_is_byte_piece(piece) ? QTOK_BYTE : QTOK_NORMAL;
            if (tok_set(voc, (long long)i, piece, type)) goto nomem;
            voc->scores[i] = (float)json_number_value(json_array_get(e, 1));
        }
    }
    json_array_foreach(added, i, e) {
        int type = json_is_true(json_object_get(e, "special")) ? QTOK_CONTROL : QTOK_USER;
        if (tok_set(voc, json_integer_value(json_object_get(e, "id")),
                    json_string_value(json_object_get(e, "content")), type))
            goto nomem;
    }

    /* The unknown token: BPE / WordPiece name it, Unigram gives its id. */
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    json_t *unk_id = json_object_get(model, "unk_id");
    int u = unk ? tok_lookup(tok, unk) : json_is_integer(unk_id) ? (int)json_integer_value(unk_id) : -1;
    if (u >= 0 && u < voc->n && voc->tokens[u]) {
        voc->types[u] = QTOK_UNKNOWN;
        if (m->unk_id < 0 && u < m->hp.n_vocab) m->unk_id = u;
    }
    return 0;
nomem:
    return qerr_set(err, errlen, QERR_NOMEM, "%s: out of memory", F);
}

/* tokenizer_config.json: add_bos_token, and the text of bos / eos when the
 * configs gave no ids. */
static int hf_tokenizer_config(qmodel *m, const char *dir, json_t *tok, char *err, size_t errlen)
{
    static const char F[] = "tokenizer_config.json";
    json_t *c;
    /* model_max_length is often 1e30 written as an integer, which jansson
     * refuses unless integers are read as reals; nothing here needs an int. */
    int rc = hf_read_json(dir, F, HF_MAX_JSON, 1, JSON_DECODE_INT_AS_REAL, &c, err, errlen);
    if (rc || !c) return rc;
    if ((rc = js_bool(c, F, "add_bos_token", m->add_bos, &m->add_bos, err, errlen))) goto out;
    json_t *ab = json_object_get(c, "add_bos_token"), *ae = json_object_get(c, "add_eos_token");
    if (json_is_boolean(ab)) m->cfg_add_bos = json_is_true(ab);
    if (json_is_boolean(ae)) m->cfg_add_eos = json_is_true(ae);
    /* chat_template: a string, or a list of {"name", "template"} of which
     * transformers uses "default". */
    json_t *ct = json_object_get(c, "chat_template");
    if (json_is_array(ct)) {
        size_t i;
        json_t *e, *pick = NULL;
        json_array_foreach(ct, i, e) {
            json_t *nm = json_object_get(e, "name");
            if (json_is_string(nm) && !strcmp(json_string_value(nm), "default")) pick = json_object_get(e, "template");
        }
        ct = pick;
    }
    if (json_is_string(ct) && !m->chat_template &&
        !(m->chat_template = q_strndup(json_string_value(ct), json_string_length(ct)))) {
        rc = qerr_set(err, errlen, QERR_NOMEM, "out of memory");
        goto out;
    }
    static const char *const keys[] = { "bos_token", "eos_token" };
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(c, keys[k]);
        if (json_is_object(v)) v = json_object_get(v, "content");
        if (v && !json_is_null(v) && !json_is_string(v)) {
            rc = qerr_set(err, errlen, QERR_FORMAT,
                          "%s: \"%s\" must be a string or an object with a string \"content\"",
                          F, keys[k]);
            goto out;
        }
        int want = k == 0 ? m->bos_id < 0 : m->n_eos == 0;
        if (!want || !json_is_string(v) || !tok) continue;
        int id = tok_lookup(tok, json_string_value(v));
        if (id < 0 || id >= m->hp.n_vocab) {
            QLOGW("%s: %s \"%.64s\" is not in the vocabulary", F, keys[k], json_string_value(v));
            continue;
        }
        if (k == 0) m->bos_id = id;
        else m->eos_ids[m->n_eos++] = id;
    }
out:
    json_decref(c);
    return rc;
}

/* ---- the folder --------------------------------------------------------- */

static char *hf_basename(const char *dir)
{
    size_t n = strlen(dir), s;
    while (n > 1 && dir[n - 1] == '/') n--;
    for (s = n; s > 0 && dir[s - 1] != '/'; s--) {}
    return s == n ? q_strdup(dir) : q_strndup(dir + s, n - s);
}

/* chat_template.jinja, which newer HF folders use instead of the
 * tokenizer_config.json entry; absent is fine. */
static int hf_chat_template_file(qmodel *m, const char *dir, char *err, size_t errlen)
{
    char *path = hf_path(dir, "chat_template.jinja");
    if (!path) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    if (access(path, F_OK)) {
        free(path);
        return 0;
    }
    char *text = NULL;
    size_t len;
    int rc = q_read_file(path, HF_MAX_JSON, &text, &len, err, errlen);
    free(path);
    if (rc) return rc;
    free(m->chat_template);
    m->chat_template = text;
    return 0;
}

int hf_load_dir(qmodel *m, const char *dir, char *err, size_t errlen)
{
    m->format = QFMT_HF;
    if (!m->name && !(m->name = hf_basename(dir))) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");

    char *path = hf_path(dir, "config.json"), *text = NULL;
    size_t len = 0;
    if (!path) return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    int rc = q_read_file(path, HF_MAX_JSON, &text, &len, err, errlen);
    free(path);
    if (rc) return rc;
    int wrapped = 0;
    rc = parse_config(m, text, len, &wrapped, err, errlen);
    free(text);
    if (rc) return rc;

    if ((rc = hf_load_weights(m, dir, err, errlen))) return rc;
    if (wrapped && (rc = hf_unwrap_names(m, err, errlen))) return rc;
    if ((rc = hf_generation_config(m, dir, err, errlen))) return rc;
    json_t *tok = NULL;
    if ((rc = hf_chat_template_file(m, dir, err, errlen))) return rc;
    if (!(rc = hf_tokenizer(m, dir, &tok, err, errlen))) rc = hf_tokenizer_config(m, dir, tok, err, errlen);
    json_decref(tok);
    return rc;
}

int hf_load_tokenizer_files(qmodel *m, const char *dir, char *err, size_t errlen)
{
    m->format = QFMT_HF;
    json_t *tok = NULL;
    int rc = hf_chat_template_file(m, dir, err, errlen);
    if (!rc) rc = hf_tokenizer(m, dir, &tok, err, errlen);
    if (!rc && m->hp.n_vocab <= 0) m->hp.n_vocab = m->vocab.n;
    if (!rc) rc = hf_tokenizer_config(m, dir, tok, err, errlen);
    json_decref(tok);
    return rc;
}
