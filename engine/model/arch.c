/* arch.c - the family table (see arch.h). */
#include "arch.h"

#include <stdio.h>
#include <string.h>

/* The names most families share, by format: the embedding, the final and
 * first norms, the output and down projections (BASE), and q, k, v, gate and
 * up apart, with the per-head q/k norms (SPLIT; they bind only where the
 * family's flags want them). */
#define HF_L "model.layers.%d."
#define HF_BASE                                                                                    \
    [QTN_EMBD] = "model.embed_tokens.weight", [QTN_NORM] = "model.norm.weight",                    \
    [QTN_ATTN_NORM] = HF_L "input_layernorm.weight", [QTN_WO] = HF_L "self_attn.o_proj.weight",    \
    [QTN_DOWN] = HF_L "mlp.down_proj.weight"
#define HF_SPLIT                                                                                   \
    [QTN_WQ] = HF_L "self_attn.q_proj.weight", [QTN_WK] = HF_L "self_attn.k_proj.weight",          \
    [QTN_WV] = HF_L "self_attn.v_proj.weight", [QTN_GATE] = HF_L "mlp.gate_proj.weight",           \
    [QTN_UP] = HF_L "mlp.up_proj.weight", [QTN_Q_NORM] = HF_L "self_attn.q_norm.weight",           \
    [QTN_K_NORM] = HF_L "self_attn.k_norm.weight"
#define GG_BASE                                                                                    \
    [QTN_EMBD] = "token_embd.weight", [QTN_NORM] = "output_norm.weight",                           \
    [QTN_ATTN_NORM] = "blk.%d.attn_norm.weight", [QTN_WO] = "blk.%d.attn_output.weight",           \
    [QTN_DOWN] = "blk.%d.ffn_down.weight"
#define GG_SPLIT                                                                                   \
    [QTN_WQ] = "blk.%d.attn_q.weight", [QTN_WK] = "blk.%d.attn_k.weight",                          \
    [QTN_WV] = "blk.%d.attn_v.weight", [QTN_GATE] = "blk.%d.ffn_gate.weight",                      \
    [QTN_UP] = "blk.%d.ffn_up.weight", [QTN_Q_NORM] = "blk.%d.attn_q_norm.weight",                 \
    [QTN_K_NORM] = "blk.%d.attn_k_norm.weight"

/* Llama's, which Mistral and the Qwens share: q/k/v biases where a file has
 * them, and post_attention_layernorm is the MLP's pre-norm. */
static const qtensor_names llama_hf = { {
    HF_BASE, HF_SPLIT,
    [QTN_OUTPUT] = "lm_head.weight",
    [QTN_BQ] = HF_L "self_attn.q_proj.bias",
    [QTN_BK] = HF_L "self_attn.k_proj.bias",
    [QTN_BV] = HF_L "self_attn.v_proj.bias",
    [QTN_FFN_NORM] = HF_L "post_attention_layernorm.weight",
} };

static const qtensor_names llama_gguf = { {
    GG_BASE, GG_SPLIT,
    [QTN_OUTPUT] = "output.weight",
    [QTN_ROPE_FREQS] = "rope_freqs.weight",
    [QTN_BQ] = "blk.%d.attn_q.bias",
    [QTN_BK] = "blk.%d.attn_k.bias",
    [QTN_BV] = "blk.%d.attn_v.bias",
    [QTN_FFN_NORM] = "blk.%d.ffn_norm.weight",
} };

/* Gemma 2 and 3: a norm after attention and after the MLP as well as before
 * each (HF's post_attention_layernorm is the one after attention here, not
 * the MLP's pre-norm as in Llama), a tied head. */
static const qtensor_names gemma_hf = { {
    HF_BASE, HF_SPLIT,
    [QTN_FFN_NORM] = HF_L "pre_feedforward_layernorm.weight",
    [QTN_POST_ATTN_NORM] = HF_L "post_attention_layernorm.weight",
    [QTN_POST_FFN_NORM] = HF_L "post_feedforward_layernorm.weight",
} };

static const qtensor_names gemma_gguf = { {
    GG_BASE, GG_SPLIT,
    [QTN_FFN_NORM] = "blk.%d.ffn_norm.weight",
    [QTN_POST_ATTN_NORM] = "blk.%d.post_attention_norm.weight",
    [QTN_POST_FFN_NORM] = "blk.%d.post_ffw_norm.weight",
} };

/* Phi-3 and Phi-4: Llama's network with q/k/v and gate/up fused (split at
 * bind), LongRoPE's factors.  The HF loader adds the factors from
 * config.json under the GGUF names. */
static const qtensor_names phi3_hf = { {
    HF_BASE,
    [QTN_OUTPUT] = "lm_head.weight",
    [QTN_WQKV] = HF_L "self_attn.qkv_proj.weight",
    [QTN_FFN_NORM] = HF_L "post_attention_layernorm.weight",
    [QTN_GATE_UP] = HF_L "mlp.gate_up_proj.weight",
    [QTN_ROPE_LONG] = "rope_factors_long.weight",
    [QTN_ROPE_SHORT] = "rope_factors_short.weight",
} };

static const qtensor_names phi3_gguf = { {
    GG_BASE,
    [QTN_OUTPUT] = "output.weight",
    [QTN_WQKV] = "blk.%d.attn_qkv.weight",
    [QTN_FFN_NORM] = "blk.%d.ffn_norm.weight",
    [QTN_GATE_UP] = "blk.%d.ffn_up.weight",
    [QTN_ROPE_LONG] = "rope_factors_long.weight",
    [QTN_ROPE_SHORT] = "rope_factors_short.weight",
} };

/* fingerprint_id: Llama 0 and Qwen2 1 are the values hashed before this
 * table existed (persistent tiers keep matching); Mistral is Llama's network. */
static const qfamily families[] = {
    {
        .name = "llama", .hf_model_type = "llama", .hf_class = "LlamaForCausalLM", .gguf_arch = "llama",
        .fingerprint_id = 0, .hf_max_ctx = 2048, .hf_sliding = QSLIDE_NONE, .gguf_rope_neox = 0,
        .hf_names = &llama_hf, .gguf_names = &llama_gguf,
    },
    {
        /* llama.cpp converts Mistral to a "llama" GGUF. */
        .name = "mistral", .hf_model_type = "mistral", .hf_class = "MistralForCausalLM", .gguf_arch = NULL,
        .fingerprint_id = 0, .hf_max_ctx = 131072, .hf_sliding = QSLIDE_WINDOW, .gguf_rope_neox = 0,
        .hf_names = &llama_hf, .gguf_names = &llama_gguf,
    },
    {
        .name = "qwen2", .hf_model_type = "qwen2", .hf_class = "Qwen2ForCausalLM", .gguf_arch = "qwen2",
        .fingerprint_id = 1, .hf_max_ctx = 32768, .hf_sliding = QSLIDE_FLAG, .gguf_rope_neox = 1,
        .attn_bias = 1, .hf_names = &llama_hf, .gguf_names = &llama_gguf,
    },
    {
        /* Qwen2 with RMSNorm over each head's q and k before RoPE, and no
         * q/k/v biases (unless attention_bias says so). */
        .name = "qwen3", .hf_model_type = "qwen3", .hf_class = "Qwen3ForCausalLM", .gguf_arch = "qwen3",
        .fingerprint_id = 2, .hf_max_ctx = 32768, .hf_sliding = QSLIDE_FLAG, .gguf_rope_neox = 1,
        .qk_norm = 1, .hf_names = &llama_hf, .gguf_names = &llama_gguf,
    },
    {
        /* Gemma 2: GeGLU, sandwich norms, (1 + w) norms, scaled embeddings,
         * soft-capped attention and output logits, query_pre_attn_scalar,
         * local and global layers in turn. */
        .name = "gemma2", .hf_model_type = "gemma2", .hf_class = "Gemma2ForCausalLM", .gguf_arch = "gemma2",
        .fingerprint_id = 3, .hf_max_ctx = 8192, .hf_sliding = QSLIDE_WINDOW, .gguf_rope_neox = 1,
        .tied_head = 1, .act = QACT_GELU_TANH, .norm_place = QNORM_SANDWICH, .attn_softcap = 50.0f,
        .final_softcap = 30.0f, .embed_scale = 1, .hf_norm_add_one = 1, .window_pattern = 2,
        .hf_query_scalar = 1, .gguf_wide_scale_layers = 46, .hf_names = &gemma_hf, .gguf_names = &gemma_gguf,
    },
    {
        /* Gemma 3 (text): Gemma 2 with QK-norm for the soft-caps, five local
         * layers to a global one, and the local layers' own RoPE base. */
        .name = "gemma3", .hf_model_type = "gemma3_text", .hf_class = "Gemma3ForCausalLM", .gguf_arch = "gemma3",
        .fingerprint_id = 4, .hf_max_ctx = 131072, .hf_sliding = QSLIDE_WINDOW, .gguf_rope_neox = 1,
        .tied_head = 1, .act = QACT_GELU_TANH, .norm_place = QNORM_SANDWICH, .qk_norm = 1, .embed_scale = 1,
        .hf_norm_add_one = 1, .window_pattern = 6, .rope_local_base = 10000.0f, .hf_query_scalar = 1,
        .gguf_wide_scale_layers = 62, .hf_names = &gemma_hf, .gguf_names = &gemma_gguf,
        /* Gemma 3 4B, 12B and 27B ship as Gemma3ForConditionalGeneration;
         * their text_config leaves out what Gemma3TextConfig defaults
         * (transformers 5.25). */
        .hf_mm_type = "gemma3", .hf_mm_class = "Gemma3ForConditionalGeneration",
        .hf_text_defaults = "{\"vocab_size\": 262208, \"hidden_size\": 2304, \"intermediate_size\": 9216,"
                            " \"num_hidden_layers\": 26, \"num_attention_heads\": 8, \"num_key_value_heads\": 4,"
                            " \"head_dim\": 256, \"hidden_activation\": \"gelu_pytorch_tanh\","
                            " \"max_position_embeddings\": 131072, \"rms_norm_eps\": 1e-6, \"pad_token_id\": 0,"
                            " \"eos_token_id\": 1, \"bos_token_id\": 2, \"tie_word_embeddings\": true,"
                            " \"rope_theta\": 1000000.0, \"rope_local_base_freq\": 10000.0,"
                            " \"query_pre_attn_scalar\": 256, \"sliding_window\": 4096}",
    },
    {
        /* Phi-3 / Phi-4: fused projections, LongRoPE, partial rotary (Phi-4-mini). */
        .name = "phi3", .hf_model_type = "phi3", .hf_class = "Phi3ForCausalLM", .gguf_arch = "phi3",
        .fingerprint_id = 5, .hf_max_ctx = 4096, .hf_sliding = QSLIDE_WINDOW, .gguf_rope_neox = 1,
        .hf_names = &phi3_hf, .gguf_names = &phi3_gguf,
    },
    {
        /* SmolLM3: Llama's network, tied, with every fourth layer attending
         * without RoPE (llama.cpp fixes the step at 4 for its GGUF files). */
        .name = "smollm3", .hf_model_type = "smollm3", .hf_class = "SmolLM3ForCausalLM", .gguf_arch = "smollm3",
        .fingerprint_id = 6, .hf_max_ctx = 32768, .hf_sliding = QSLIDE_FLAG_NOPE, .gguf_rope_neox = 0,
        .nope_interval = 4, .hf_tied = 1, .hf_rope_theta = 2000000.0f, .hf_names = &llama_hf, .gguf_names = &llama_gguf,
    },
};
#define N_FAMILIES ((int)(sizeof families / sizeof families[0]))

const qfamily *qfamily_get(int family)
{
    return family >= 0 && family < N_FAMILIES ? &families[family] : NULL;
}

int qfamily_by_hf_mm(const char *model_type, const char *class_name)
{
    for (int i = 0; i < N_FAMILIES; i++) {
        const qfamily *f = &families[i];
        if (!f->hf_mm_type) continue;
        if (model_type ? !strcmp(model_type, f->hf_mm_type) : class_name && !strcmp(class_name, f->hf_mm_class))
            return i;
    }
    return -1;
}

int qfamily_by_hf(const char *model_type, const char *class_name)
{
    for (int i = 0; i < N_FAMILIES; i++)
        if (model_type && !strcmp(model_type, families[i].hf_model_type)) return i;
    if (model_type) return -1;
    for (int i = 0; i < N_FAMILIES; i++)
        if (class_name && !strcmp(class_name, families[i].hf_class)) return i;
    return -1;
}

int qfamily_by_gguf(const char *arch, size_t len)
{
    for (int i = 0; i < N_FAMILIES; i++) {
        const char *g = families[i].gguf_arch;
        if (g && strlen(g) == len && !memcmp(g, arch, len)) return i;
    }
    return -1;
}

void qfamily_list(int gguf, char *out, size_t cap)
{
    size_t n = 0;
    if (cap) out[0] = 0;
    for (int i = 0; i < N_FAMILIES; i++) {
        const char *name = gguf ? families[i].gguf_arch : families[i].hf_model_type;
        if (!name || n >= cap) continue;
        int k = snprintf(out + n, cap - n, "%s%s", n ? ", " : "", name);
        if (k > 0) n += (size_t)k;
    }
}

void qfamily_apply(int family, qhparams *hp)
{
    const qfamily *f = qfamily_get(family);
    if (!f) return;
    hp->family = family;
    hp->act = f->act;
    hp->norm_place = f->norm_place;
    hp->qk_norm = f->qk_norm;
    hp->attn_softcap = f->attn_softcap;
    hp->final_softcap = f->final_softcap;
    hp->embed_scale = f->embed_scale;
    hp->n_experts = f->n_experts;
    hp->n_experts_used = f->n_experts_used;
    hp->window_pattern = f->window_pattern;
    hp->rope_theta_local = f->rope_local_base;
    hp->nope_interval = f->nope_interval;
    if (f->attn_bias) hp->attn_bias = 1;
    if (f->tied_head) hp->tied_embeddings = 1;
}

const char *qact_hf_name(qact act)
{
    return act == QACT_GELU_TANH ? "gelu_pytorch_tanh" : "silu";
}
