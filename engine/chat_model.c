/* chat_model.c - a model's chat template applied to a conversation.
 *
 * The template is the model's own (GGUF tokenizer.chat_template, HF
 * tokenizer_config.json's chat_template or chat_template.jinja), else
 * QCHAT_DEFAULT_TEMPLATE (ChatML), as llama.cpp and vLLM fall back.  The
 * context gets bos_token and eos_token from the tokenizer when the caller did
 * not give them, as HF's apply_chat_template does from the tokenizer's
 * special tokens.
 */
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "model.h"
#include "qerr.h"
#include "tokenizer.h"

int qchat_for_model(const qmodel *m, qchat_tmpl **out, int *is_default, char *err, size_t errlen)
{
    const char *src = m && m->chat_template ? m->chat_template : QCHAT_DEFAULT_TEMPLATE;
    if (is_default) *is_default = !(m && m->chat_template);
    int rc = qchat_compile(src, strlen(src), out, err, errlen);
    if (rc && m && m->chat_template) {
        /* Name the source: the message alone would not say which template. */
        char inner[512];
        snprintf(inner, sizeof inner, "%s", err ? err : "");
        qerr_set(err, errlen, rc, "the model's chat template cannot be used: %s", inner);
    }
    return rc;
}

/* Sets key to token id's text unless the context already has it. */
static int fill_token(json_t *ctx, const char *key, const qtok *tok, int id)
{
    if (json_object_get(ctx, key) || !tok || id < 0) return 0;
    size_t n = 0;
    const char *s = qtok_id_to_token(tok, id, &n);
    if (!s) return 0;
    json_t *v = json_stringn(s, n);
    if (!v || json_object_set_new(ctx, key, v)) return QERR_NOMEM;
    return 0;
}

int qchat_apply(const qchat_tmpl *t, const qmodel *m, const qtok *tok, json_t *ctx, char **out, size_t *len,
                char *err, size_t errlen)
{
    *out = NULL;
    if (!json_is_object(ctx)) return qerr_set(err, errlen, QERR_INVAL, "the chat context must be a JSON object");
    int bos = m && m->bos_id >= 0 ? m->bos_id : tok ? qtok_bos_id(tok) : -1;
    int eos = m && m->n_eos ? m->eos_ids[0] : tok ? qtok_eos_id(tok) : -1;
    if (fill_token(ctx, "bos_token", tok, bos) || fill_token(ctx, "eos_token", tok, eos))
        return qerr_set(err, errlen, QERR_NOMEM, "out of memory");
    return qchat_render(t, ctx, out, len, err, errlen);
}
