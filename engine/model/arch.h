/* arch.h - the model families quire runs: one descriptor row each.
 *
 * A row holds everything that differs between families: the names a family
 * goes by (HF model_type and class name, GGUF general.architecture), its
 * tensors' names in each format, and the feature flags its forward pass
 * needs (biases, norm placement, activation, QK-norm, soft-caps, embedding
 * scale, tied head, MoE shape, the sliding-window rule, the RoPE layout of
 * its GGUF files).  The loaders find a family here and copy its flags into
 * qhparams; qmodel_bind binds its tensor names; the random-weight builder
 * registers them; the backends read only the flags.  No code outside
 * engine/model/ tests a family's name.
 *
 * Adding a family is one row in arch.c, plus whatever kernel a new flag
 * needs (until then the backends refuse the flag by name, qhp_unsupported). */
#ifndef QUIRE_ARCH_H
#define QUIRE_ARCH_H

#include <stddef.h>

#include "backend.h"

/* The tensors a family's layers bind, in the order the random-weight
 * builder registers them (which its fill depends on). */
typedef enum {
    QTN_EMBD, QTN_NORM, QTN_OUTPUT, QTN_ROPE_FREQS,
    QTN_ATTN_NORM, QTN_WQ, QTN_WK, QTN_WV, QTN_BQ, QTN_BK, QTN_BV, QTN_WO,
    QTN_FFN_NORM, QTN_GATE, QTN_UP, QTN_DOWN,
    QTN_Q_NORM, QTN_K_NORM,
    QTN_POST_ATTN_NORM, QTN_POST_FFN_NORM,
    QTN_WQKV, QTN_GATE_UP,          /* fused: q, k, v rows; gate, up rows (Phi-3) */
    QTN_ROPE_LONG, QTN_ROPE_SHORT,  /* LongRoPE's factors (rope_dim / 2 each) */
    QTN_COUNT
} qtn;
#define QTN_FIRST_LAYER QTN_ATTN_NORM
/* Not per layer although after QTN_FIRST_LAYER. */
#define QTN_IS_GLOBAL(i) ((i) < QTN_FIRST_LAYER || (i) == QTN_ROPE_LONG || (i) == QTN_ROPE_SHORT)

/* Names of one format: "%d" stands for the layer; NULL where the format has
 * no such tensor. */
typedef struct {
    const char *name[QTN_COUNT];
} qtensor_names;

/* How an HF config turns the sliding attention window on ("layer_types",
 * where a config has it, then says which layers are local). */
typedef enum {
    QSLIDE_NONE,     /* the family has none */
    QSLIDE_WINDOW,   /* on whenever "sliding_window" is set (Mistral, Gemma) */
    QSLIDE_FLAG,     /* on when "use_sliding_window" is true, for the layers from
                      * "max_window_layers" on (Qwen2, Qwen3) */
    QSLIDE_FLAG_NOPE /* on when "use_sliding_window" is true, for the layers
                      * without RoPE (SmolLM3) */
} qslide_rule;

typedef struct qfamily {
    const char *name;            /* as logs print it */
    const char *hf_model_type;   /* config.json "model_type" */
    const char *hf_class;        /* config.json "architectures"[0] */
    const char *gguf_arch;       /* GGUF general.architecture; NULL: converted as another family */
    int fingerprint_id;          /* hashed into the model fingerprint; equal for the same network */
    int hf_max_ctx;              /* transformers' default max_position_embeddings */
    qslide_rule hf_sliding;
    int gguf_rope_neox;          /* the GGUF converter keeps Q/K for rotate-half RoPE (else it
                                  * permuted them for adjacent pairs) */
    int attn_bias;               /* q/k/v biases always (else as the file has them) */
    int tied_head;               /* the output projection is always the embedding */
    qact act;
    qnorm_place norm_place;
    int qk_norm;
    float attn_softcap, final_softcap;
    int embed_scale;
    int n_experts, n_experts_used;
    int hf_norm_add_one;         /* HF norms scale by (1 + w) (GGUF files hold w + 1) */
    int window_pattern;          /* qhparams.window_pattern where no layer_types says otherwise */
    float rope_local_base;       /* local layers' RoPE base where the config gives none; 0: none */
    int hf_query_scalar;         /* config.json's query_pre_attn_scalar sets the attention scale */
    int nope_interval;           /* qhparams.nope_interval where no "no_rope_layers" says otherwise */
    int hf_tied;                 /* transformers' default tie_word_embeddings */
    float hf_rope_theta;         /* transformers' default rope_theta; 0: 10000 */
    /* llama.cpp scales attention by (dim / n_heads)^-1/2 rather than
     * head_dim^-1/2 for a GGUF with this many layers (Gemma 27B); 0: never. */
    int gguf_wide_scale_layers;
    const qtensor_names *hf_names, *gguf_names;
    /* An image-text checkpoint whose language model is this family (config.json
     * model_type and class; NULL: none): its "text_config" over hf_text_defaults
     * (the text config class's defaults, a JSON object) describes the language
     * model, whose weights lie under "model.language_model." (or, as older
     * checkpoints save them, "language_model.model."); the vision tower is not
     * loaded. */
    const char *hf_mm_type, *hf_mm_class, *hf_text_defaults;
} qfamily;

/* The row of a family index (hp->family); NULL when out of range. */
const qfamily *qfamily_get(int family);
/* The index of the family an HF config names by model_type (preferred) or
 * class name, either may be NULL; -1 when none. */
int qfamily_by_hf(const char *model_type, const char *class_name);
/* The index of the family whose image-text checkpoints an HF config names
 * (hf_mm_type, or hf_mm_class when model_type is NULL); -1 when none. */
int qfamily_by_hf_mm(const char *model_type, const char *class_name);
/* The index of the family a GGUF general.architecture names; -1 when none. */
int qfamily_by_gguf(const char *arch, size_t len);
/* Writes the names a list of families goes by ("llama, mistral, qwen2"),
 * HF model types (gguf = 0) or GGUF architectures (gguf = 1), into out. */
void qfamily_list(int gguf, char *out, size_t cap);
/* Copies a family's feature flags into hp (hp->family included). */
void qfamily_apply(int family, qhparams *hp);
/* The name of an activation as HF's hidden_act writes it. */
const char *qact_hf_name(qact act);

#endif
