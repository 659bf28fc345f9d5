/* fuzz_hf_config.c - libFuzzer target: hf_parse_config() on arbitrary text
 * must return an error or hyperparameters that satisfy every range the
 * loader promises (checked here, so a missed check is a crash). */
#include "model.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    q_set_alloc_limit((size_t)256 << 20);
    qlog_set_level(QLOG_OFF);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    qmodel *m = qmodel_new();
    if (!m) return 0;
    char err[256];
    int rc = hf_parse_config(m, (const char *)data, size, err, sizeof err);
    if (rc == 0) {
        const qhparams *hp = &m->hp;
        int ok = hp->dim >= 1 && hp->dim <= QMODEL_MAX_DIM && hp->ffn_dim >= 1 && hp->ffn_dim <= QMODEL_MAX_DIM &&
                 hp->n_layers >= 1 && hp->n_layers <= QMODEL_MAX_LAYERS && hp->n_heads >= 1 &&
                 hp->n_kv_heads >= 1 && hp->n_heads % hp->n_kv_heads == 0 && hp->head_dim >= 2 &&
                 hp->head_dim % 2 == 0 && (int64_t)hp->n_heads * hp->head_dim <= QMODEL_MAX_DIM &&
                 hp->rope_dim >= 2 && hp->rope_dim % 2 == 0 && hp->rope_dim <= hp->head_dim && hp->n_vocab >= 1 && hp->n_vocab <= QMODEL_MAX_VOCAB &&
                 hp->max_ctx >= 1 && hp->norm_eps > 0 && hp->rope_theta > 0 && m->bos_id < hp->n_vocab &&
                 m->n_eos >= 0 && m->n_eos <= 8;
        for (int i = 0; ok && i < m->n_eos; i++) ok = m->eos_ids[i] >= 0 && m->eos_ids[i] < hp->n_vocab;
        if (hp->rope_scaling != QROPE_SCALE_NONE) ok = ok && hp->rope_factor > 0;
        if (hp->rope_scaling == QROPE_SCALE_LLAMA3)
            ok = ok && hp->rope_orig_ctx > 0 && hp->rope_high_freq_factor > hp->rope_low_freq_factor;
        if (hp->rope_scaling == QROPE_SCALE_LONGROPE)
            ok = ok && hp->rope_orig_ctx > 0 && hp->rope_mscale > 0 && qmodel_find(m, "rope_factors_long.weight") &&
                 qmodel_find(m, "rope_factors_short.weight");
        ok = ok && hp->window >= 0 && hp->window_pattern >= 0 && (!hp->window || hp->window_pattern <= hp->n_layers) &&
             hp->attn_scale >= 0 && hp->attn_softcap >= 0 && hp->final_softcap >= 0 && hp->rope_theta_local >= 0;
        if (!ok) __builtin_trap();
    }
    qmodel_destroy(m);
    return 0;
}
