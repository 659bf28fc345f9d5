/* oai_fields.c - the request fields beyond OpenAI's sampling ones (oai.h):
 * which fields a body may carry at all, and vLLM's extensions that shape
 * the output (logit_bias, stop_token_ids, min_tokens,
 * include_stop_str_in_output, skip_special_tokens, echo, best_of,
 * truncate_prompt_tokens, request_id, priority) and llama-server's
 * cache_prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oai.h"
#include "oai_int.h"
#include "qerr.h"
#include "util.h"

#define INVALID "invalid_request_error"


/* ---- which fields a body may carry -------------------------------------------- */

/* Fields of both endpoints, then each endpoint's own. */
static const char *const common_fields[] = {
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed",
    "frequency_penalty", "presence_penalty", "repetition_penalty", "n", "best_of", "stop", "stop_token_ids",
    "include_stop_str_in_output", "min_tokens", "ignore_eos", "logit_bias", "logprobs", "stream", "stream_options",
    "user", "speculative", "response_format", "guided_json", "guided_regex", "guided_choice", "structured_outputs",
    "json_schema", "echo", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
    "request_id", "priority", "cache_prompt", "store", "metadata", "service_tier", NULL,
};
static const char *const chat_fields[] = {
    "messages", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs",
    "add_generation_prompt", "continue_final_message", "documents", NULL,
};
static const char *const completion_fields[] = { "prompt", "add_special_tokens", NULL };

/* Fields other servers take that quire does not, with what to do instead. */
static const struct {
    const char *name, *hint;
} refused[] = {
    { "suffix", "completions with a suffix (fill-in-the-middle) are not supported" },
    { "functions", "'functions' is deprecated by OpenAI and not supported: use 'tools'" },
    { "function_call", "'function_call' is deprecated by OpenAI and not supported: use 'tool_choice'" },
    { "prompt_logprobs", "the prompt's logprobs are not computed" },
    { "use_beam_search", "beam search is not supported" },
    { "length_penalty", "beam search is not supported" },
    { "guided_grammar", "grammars in EBNF/GBNF are not supported: use guided_json, guided_regex or guided_choice" },
    { "grammar", "grammars in EBNF/GBNF are not supported: use json_schema, response_format or guided_regex" },
    { "chat_template", "a request's own chat template is not accepted (as vLLM without "
                       "--trust-request-chat-template): start the server with --chat-template FILE" },
    { "n_predict", "use 'max_tokens'" },
    { "repeat_penalty", "use 'repetition_penalty'" },
};

static int in_list(const char *const *list, const char *k)
{
    for (; *list; list++)
        if (!strcmp(*list, k)) return 1;
    return 0;
}

int qoai_check_fields(json_t *o, qoai_kind kind, const char *const *envelope, qoai_error *e)
{
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        if (in_list(common_fields, k) || in_list(kind == QOAI_CHAT ? chat_fields : completion_fields, k) ||
            (envelope && in_list(envelope, k)))
            continue;
        for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
            if (!strcmp(refused[i].name, k))
                return qoai_fail(e, 400, INVALID, k, "'%s' is not supported: %s", k, refused[i].hint);
        if (in_list(kind == QOAI_CHAT ? completion_fields : chat_fields, k))
            return qoai_fail(e, 400, INVALID, k, "'%s' is a field of %s, not of this endpoint", k,
                             kind == QOAI_CHAT ? "/v1/completions" : "/v1/chat/completions");
        return qoai_fail(e, 400, INVALID, k, "Unrecognized request argument supplied: %s", k);
    }
    return 0;
}

/* ---- output-shaping fields ---------------------------------------------------- */

/* logit_bias: {"<token id>": bias in [-100, 100]} into r->bias / r->p.sp. */
static int logit_bias(json_t *o, qoai_req *r, qoai_error *e)
{
    json_t *lb = qoai_field(o, "logit_bias");
    if (!lb) return 0;
    if (!json_is_object(lb))
        return qoai_fail(e, 400, INVALID, "logit_bias", "'logit_bias' must be an object of token ids to biases");
    const size_t n = json_object_size(lb);
    if (n > QSAMPLE_MAX_LOGIT_BIAS)
        return qoai_fail(e, 400, INVALID, "logit_bias", "'logit_bias' holds at most %d tokens", QSAMPLE_MAX_LOGIT_BIAS);
    if (!n) return 0;
    if (!(r->bias = q_mallocn(n, sizeof *r->bias))) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    const char *k;
    json_t *v;
    int i = 0;
    json_object_foreach(lb, k, v) {
        char *end;
        const long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id > INT32_MAX)
            return qoai_fail(e, 400, INVALID, "logit_bias", "'logit_bias' keys are token ids; '%.40s' is not one", k);
        if (!json_is_number(v) || !(json_number_value(v) >= -QSAMPLE_MAX_BIAS && json_number_value(v) <= QSAMPLE_MAX_BIAS))
            return qoai_fail(e, 400, INVALID, "logit_bias", "logit_bias[%ld] must be a number in [-100, 100]", id);
        for (int j = 0; j < i; j++)
            if (r->bias[j].id == id)
                return qoai_fail(e, 400, INVALID, "logit_bias", "'logit_bias' names token %ld twice", id);
        r->bias[i++] = (qlogit_bias){ (int32_t)id, (float)json_number_value(v) };
    }
    r->p.sp.logit_bias = r->bias;
    r->p.sp.n_logit_bias = i;
    return 0;
}

/* stop_token_ids: token ids that end the output like EOS. */
static int stop_ids(json_t *o, qoai_req *r, qoai_error *e)
{
    json_t *a = qoai_field(o, "stop_token_ids");
    if (!a) return 0;
    if (!json_is_array(a) || json_array_size(a) > QENGINE_MAX_STOP_IDS)
        return qoai_fail(e, 400, INVALID, "stop_token_ids", "'stop_token_ids' must be an array of at most %d token ids",
                         QENGINE_MAX_STOP_IDS);
    const size_t n = json_array_size(a);
    if (!n) return 0;
    if (!(r->stop_ids = q_mallocn(n, sizeof *r->stop_ids))) return qoai_fail(e, 500, "server_error", NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return qoai_fail(e, 400, INVALID, "stop_token_ids", "stop_token_ids[%zu] is not a token id", i);
        r->stop_ids[i] = (int32_t)json_integer_value(v);
    }
    r->p.stop_ids = r->stop_ids;
    r->p.n_stop_ids = (int)n;
    return 0;
}

int qoai_extra_params(json_t *o, qoai_kind kind, qoai_req *r, qoai_error *e)
{
    int rc, b = 0;
    if ((rc = logit_bias(o, r, e)) || (rc = stop_ids(o, r, e))) return rc;
    json_t *v = qoai_field(o, "min_tokens");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > (1 << 24)))
        return qoai_fail(e, 400, INVALID, "min_tokens", "'min_tokens' must be an integer >= 0");
    if (v) r->p.min_tokens = (int)json_integer_value(v);
    if ((rc = qoai_flag(o, "include_stop_str_in_output", &b, e)) < 0) return rc;
    if (rc) r->p.include_stop_str = b;
    if ((rc = qoai_flag(o, "skip_special_tokens", &b, e)) < 0) return rc;
    if (rc) r->p.keep_special = !b;
    if ((rc = qoai_flag(o, "spaces_between_special_tokens", &b, e)) < 0) return rc;
    if (rc && !b)
        return qoai_fail(e, 400, INVALID, "spaces_between_special_tokens",
                         "'spaces_between_special_tokens' false is not supported (special tokens are skipped, or "
                         "kept as their text with skip_special_tokens false)");
    if ((rc = qoai_flag(o, "echo", &b, e)) < 0) return rc;
    r->echo = rc && b;
    if (r->echo && r->logprobs)
        return qoai_fail(e, 400, INVALID, "echo",
                         "'echo' with 'logprobs' needs the prompt's logprobs, which quire does not compute");
    if ((rc = qoai_flag(o, "cache_prompt", &b, e)) < 0) return rc;
    if (rc && !b)
        return qoai_fail(e, 400, INVALID, "cache_prompt",
                         "'cache_prompt' false is not supported: the prefix cache is shared by every request");
    if ((rc = qoai_flag(o, "store", &b, e)) < 0) return rc;
    if (rc && b)
        return qoai_fail(e, 400, INVALID, "store",
                         "'store' true is not supported: keep conversations with quire's sessions (/v1/sessions)");
    v = qoai_field(o, "metadata");
    if (v && !json_is_object(v)) return qoai_fail(e, 400, INVALID, "metadata", "'metadata' must be an object");
    v = qoai_field(o, "service_tier");
    if (v && !(json_is_string(v) && (!strcmp(json_string_value(v), "auto") || !strcmp(json_string_value(v), "default"))))
        return qoai_fail(e, 400, INVALID, "service_tier", "'service_tier' must be auto or default (one tier here)");
    v = qoai_field(o, "priority");
    if (v && !json_is_integer(v)) return qoai_fail(e, 400, INVALID, "priority", "'priority' must be an integer");
    if (v && json_integer_value(v) != 0)
        return qoai_fail(e, 400, INVALID, "priority",
                         "priority scheduling is not enabled: requests run first come, first served ('priority' 0)");
    v = qoai_field(o, "best_of");
    if (v && (!json_is_integer(v) || json_integer_value(v) != (r->p.n > 1 ? r->p.n : 1)))
        return qoai_fail(e, 400, INVALID, "best_of", "'best_of' other than 'n' is not supported (as in vLLM's V1 engine)");
    v = qoai_field(o, "truncate_prompt_tokens");
    if (v && (!json_is_integer(v) || (json_integer_value(v) < 1 && json_integer_value(v) != -1)))
        return qoai_fail(e, 400, INVALID, "truncate_prompt_tokens",
                         "'truncate_prompt_tokens' must be an integer >= 1, or -1 (the model's context)");
    if (v) r->truncate = json_integer_value(v) == -1 ? -1 : (int)(json_integer_value(v) > (1 << 30) ? 1 << 30 : json_integer_value(v));
    v = qoai_field(o, "request_id");
    if (v && (!json_is_string(v) || !json_string_length(v) || json_string_length(v) > 64))
        return qoai_fail(e, 400, INVALID, "request_id", "'request_id' must be a string of 1 to 64 characters");
    for (size_t i = 0; v && i < json_string_length(v); i++) {
        const char c = json_string_value(v)[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
              c == '.'))
            return qoai_fail(e, 400, INVALID, "request_id", "'request_id' may hold letters, digits, '-', '_' and '.'");
    }
    if (v) r->request_id = json_string_value(v);
    if (kind == QOAI_COMPLETION) {
        if ((rc = qoai_flag(o, "add_special_tokens", &b, e)) < 0) return rc;
        r->no_special = rc && !b;
    }
    return 0;
}
