/* oai_tokenize.c - vLLM's POST /tokenize and /detokenize (oai.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "oai.h"
#include "oai_int.h"
#include "qerr.h"
#include "tokenizer.h"
#include "util.h"

#define INVALID "invalid_request_error"


/* Every field of o is in names (NULL-terminated). */
static int only(json_t *o, const char *const *names, qoai_error *e)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (const char *const *n = names; *n && !ok; n++) ok = !strcmp(*n, k);
        if (!ok) return qoai_fail(e, 400, INVALID, k, "Unrecognized request argument supplied: %s", k);
    }
    return 0;
}

int qoai_tokenize(json_t *o, const qoai_limits *lim, const qmodel *m, const qtok *tok, json_t **out, qoai_error *e)
{
    static const char *const prompt_fields[] = { "model", "prompt", "add_special_tokens", "return_token_strs", NULL };
    static const char *const chat_fields[] = { "model", "messages", "add_special_tokens", "return_token_strs",
                                               "add_generation_prompt", "continue_final_message",
                                               "chat_template_kwargs", "tools", "documents", NULL };
    *out = NULL;
    if (!json_is_object(o)) return qoai_fail(e, 400, INVALID, NULL, "the body must be a JSON object");
    const int chat = json_object_get(o, "messages") != NULL;
    int rc, special = !chat, strs = 0;
    if ((rc = qoai_model_check(o, lim, e)) || (rc = only(o, chat ? chat_fields : prompt_fields, e)) ||
        (rc = qoai_flag(o, "add_special_tokens", &special, e)) < 0 || (rc = qoai_flag(o, "return_token_strs", &strs, e)) < 0)
        return rc;
    if (!tok) return qoai_fail(e, 400, INVALID, NULL, "this model has no tokenizer");
    qoai_req r;
    memset(&r, 0, sizeof r);
    int n = 0;
    if (chat) {
        if (special)
            return qoai_fail(e, 400, INVALID, "add_special_tokens",
                             "'add_special_tokens' true is not supported with messages (the template places BOS)");
        if ((rc = qoai_chat_ids(o, lim, m, tok, &r, &n, e))) {
            free(r.ids);
            return rc;
        }
    } else {
        json_t *pr = qoai_field(o, "prompt");
        if (!json_is_string(pr))
            return qoai_fail(e, 400, INVALID, "prompt", "'prompt' (a string) or 'messages' is required");
        rc = qtok_encode(tok, json_string_value(pr), json_string_length(pr),
                         (special ? QTOK_ADD_SPECIAL : 0) | QTOK_PARSE_SPECIAL, &r.ids, &n);
        if (rc == QERR_NOMEM) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
        if (rc) return qoai_fail(e, 400, INVALID, "prompt", "cannot tokenize 'prompt': %s", qerr_str(rc));
    }
    json_t *ids = json_array(), *ts = strs ? json_array() : json_null();
    for (int i = 0; ids && ts && i < n; i++) {
        json_array_append_new(ids, json_integer(r.ids[i]));
        if (!strs) continue;
        size_t len = 0;
        const char *t = qtok_id_to_token(tok, r.ids[i], &len);
        json_array_append_new(ts, t ? json_stringn(t, len) : json_null());
    }
    free(r.ids);
    free(r.echo_text);
    *out = json_pack("{s:i, s:i, s:o, s:o}", "count", n, "max_model_len", m->hp.max_ctx, "tokens", ids, "token_strs", ts);
    return *out ? 0 : qoai_fail(e, 500, "server_error", NULL, "out of memory");
}

int qoai_detokenize(json_t *o, const qoai_limits *lim, const qmodel *m, const qtok *tok, json_t **out, qoai_error *e)
{
    static const char *const fields[] = { "model", "tokens", NULL };
    *out = NULL;
    if (!json_is_object(o)) return qoai_fail(e, 400, INVALID, NULL, "the body must be a JSON object");
    int rc;
    if ((rc = qoai_model_check(o, lim, e)) || (rc = only(o, fields, e))) return rc;
    if (!tok) return qoai_fail(e, 400, INVALID, NULL, "this model has no tokenizer");
    json_t *a = qoai_field(o, "tokens");
    if (!json_is_array(a)) return qoai_fail(e, 400, INVALID, "tokens", "'tokens' must be an array of token ids");
    const size_t n = json_array_size(a);
    int32_t *ids = q_mallocn(n ? n : 1, sizeof *ids);
    if (!ids) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= m->hp.n_vocab) {
            free(ids);
            return qoai_fail(e, 400, INVALID, "tokens", "tokens[%zu] is not a token id below %d", i, m->hp.n_vocab);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    char *text = NULL;
    size_t len = 0;
    rc = qtok_decode(tok, ids, (int)n, 0, &text, &len);
    free(ids);
    if (rc) return qoai_fail(e, rc == QERR_NOMEM ? 500 : 400, rc == QERR_NOMEM ? "server_error" : INVALID, "tokens",
                             "cannot decode the tokens: %s", qerr_str(rc));
    *out = json_pack("{s:s%}", "prompt", text ? text : "", len);
    free(text);
    return *out ? 0 : qoai_fail(e, 500, "server_error", NULL, "out of memory");
}
