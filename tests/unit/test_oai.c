/* test_oai.c - OpenAI-compatible request bodies (server/oai.c) on the real
 * stories260K model: what valid bodies become, and the error every kind of
 * bad body gets (status, param, message). */
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "model.h"
#include "oai.h"
#include "qerr.h"
#include "gram.h"
#include "qtest.h"
#include "tokenizer.h"
#include "util.h"

static qmodel *g_model;
static qtok *g_tok;
static gram_vocab *g_vocab;
static gram_cache *g_cache;
static qoai_failcache *g_fail;
static double g_seconds; /* the grammar's time budget (0: none) */

static int parse(const char *body, qoai_kind kind, int cap, qoai_req *r, qoai_error *e)
{
    const qoai_limits lim = { .max_tokens_cap = cap, .gvocab = g_vocab, .gcache = g_cache, .gfail = g_fail, .grammar_seconds = g_seconds };
    return qoai_parse(body, strlen(body), kind, &lim, g_model, g_tok, r, e);
}

static void test_chat_valid(void)
{
    qoai_req r;
    qoai_error e;
    const char *body = "{\"model\": \"m\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
                       " {\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Once\"},"
                       " {\"type\": \"text\", \"text\": \"upon\"}]}],"
                       " \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, \"top_k\": 40, \"min_p\": 0.05,"
                       " \"seed\": -3, \"n\": 2, \"stop\": [\"a\", \"b\"], \"logprobs\": true, \"top_logprobs\": 3,"
                       " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"user\": \"u\","
                       " \"frequency_penalty\": 0.5, \"presence_penalty\": -0.5}";
    REQUIRE(parse(body, QOAI_CHAT, 0, &r, &e) == 0);
    CHECK(r.p.n_prompt > 4);
    CHECK(r.p.prompt == r.ids);
    CHECK_EQ_INT(r.p.max_tokens, 7);
    CHECK(r.has_max_tokens);
    CHECK(fabsf(r.p.sp.temperature - 0.5f) < 1e-6f);
    CHECK(fabsf(r.p.sp.top_p - 0.9f) < 1e-6f);
    CHECK_EQ_INT(r.p.sp.top_k, 40);
    CHECK(fabsf(r.p.sp.min_p - 0.05f) < 1e-6f);
    CHECK(r.p.sp.seed == (uint64_t)-3);
    CHECK_EQ_INT(r.p.n, 2);
    CHECK_EQ_INT(r.p.n_stop, 2);
    CHECK(r.p.n_stop == 2 && !strcmp(r.p.stop[1], "b"));
    CHECK(r.logprobs && r.p.sp.logprobs);
    CHECK_EQ_INT(r.p.sp.top_logprobs, 3);
    CHECK(r.stream && r.include_usage);
    CHECK(!strcmp(r.model, "m"));
    CHECK(fabsf(r.p.sp.presence_penalty + 0.5f) < 1e-6f);
    /* The text parts were joined by a newline: the same ids as one string. */
    qoai_req r2;
    const char *body2 = "{\"messages\": [{\"role\": \"developer\", \"content\": \"Be brief.\"},"
                        " {\"role\": \"user\", \"content\": \"Once\\nupon\"}], \"max_completion_tokens\": 7}";
    REQUIRE(parse(body2, QOAI_CHAT, 0, &r2, &e) == 0);
    CHECK_EQ_INT(r2.p.n_prompt, r.p.n_prompt);
    CHECK(r2.p.n_prompt == r.p.n_prompt && !memcmp(r2.ids, r.ids, sizeof *r.ids * (size_t)r.p.n_prompt));
    CHECK_EQ_INT(r2.p.max_tokens, 7);
    CHECK(!r2.stream && !r2.logprobs && !strcmp(r2.model, ""));
    qoai_req_free(&r);
    qoai_req_free(&r2);
}

static void test_completion_valid(void)
{
    qoai_req r, r2, r3;
    qoai_error e;
    REQUIRE(parse("{\"prompt\": \"Once upon a time\", \"logprobs\": 2, \"stop\": \".\"}", QOAI_COMPLETION, 0, &r, &e) ==
            0);
    int32_t *want = NULL;
    int n = 0;
    REQUIRE(qtok_encode(g_tok, "Once upon a time", 16, QTOK_ADD_SPECIAL | QTOK_PARSE_SPECIAL, &want, &n) == 0);
    CHECK_EQ_INT(r.p.n_prompt, n);
    CHECK(r.p.n_prompt == n && !memcmp(r.ids, want, sizeof *want * (size_t)n));
    CHECK(r.logprobs && r.p.sp.top_logprobs == 2);
    CHECK(r.p.n_stop == 1 && !strcmp(r.p.stop[0], "."));
    /* No max_tokens: the rest of the context. */
    CHECK(!r.has_max_tokens);
    CHECK_EQ_INT(r.p.max_tokens, g_model->hp.max_ctx - n);
    /* ... or the server's cap, when smaller. */
    REQUIRE(parse("{\"prompt\": [\"Once upon a time\"]}", QOAI_COMPLETION, 10, &r2, &e) == 0);
    CHECK_EQ_INT(r2.p.max_tokens, 10);
    CHECK(r2.p.n_prompt == n && !memcmp(r2.ids, want, sizeof *want * (size_t)n));
    /* Token ids as the prompt. */
    REQUIRE(parse("{\"prompt\": [1, 5, 9], \"max_tokens\": 3}", QOAI_COMPLETION, 0, &r3, &e) == 0);
    CHECK(r3.p.n_prompt == 3 && r3.ids[0] == 1 && r3.ids[2] == 9);
    free(want);
    qoai_req_free(&r);
    qoai_req_free(&r2);
    qoai_req_free(&r3);
}

typedef struct {
    qoai_kind kind;
    const char *body;
    const char *param;   /* expected e.param ("" none) */
    const char *message; /* a part of e.message */
} bad_case;

#define TOOL_F "{\"type\": \"function\", \"function\": {\"name\": \"f\"}}"

static void test_bad_bodies(void)
{
    static const bad_case cases[] = {
        { QOAI_CHAT, "{\"messages\": [", "", "not valid JSON" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", "", "not valid JSON" },
        { QOAI_CHAT, "[1, 2]", "", "must be a JSON object" },
        { QOAI_CHAT, "{\"a\": 1, \"a\": 2, \"messages\": []}", "", "not valid JSON" },
        { QOAI_CHAT, "{}", "messages", "'messages' is required" },
        { QOAI_CHAT, "{\"messages\": []}", "messages", "must not be empty" },
        { QOAI_CHAT, "{\"messages\": {}}", "messages", "must be an array" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "messages[0]", "'role'" },
        { QOAI_CHAT, "{\"messages\": [\"hi\"]}", "messages[0]", "'role'" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "messages[0]", "content must be" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", "messages[0]", "needs 'content'" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {}}]}]}",
          "messages[0]", "only {\"type\": \"text\"" },
        { QOAI_CHAT, "{\"model\": 3, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "model", "a string" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": \"7\"}", "max_tokens",
          "an integer" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 0}", "max_tokens",
          "outside" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 100}", "max_tokens",
          "more than this server allows (50)" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": -1}", "temperature",
          "outside" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": true}", "temperature",
          "a number" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_p\": 1.5}", "top_p", "outside" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_p\": 0}", "top_p",
          "outside (0, 1]" },
        { QOAI_COMPLETION,
          "{\"prompt\": \"x\", \"stop\": [\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"]}",
          "stop", "at most 512 bytes" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_k\": 2.5}", "top_k",
          "an integer" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"seed\": 1.5}", "seed",
          "an integer" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 65}", "n", "outside" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"repetition_penalty\": 0}",
          "repetition_penalty", "above 0" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": 5}", "stop",
          "a string or an array" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": [\"\"]}", "stop",
          "non-empty" },
        { QOAI_CHAT,
          "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": [\"1\", \"2\", \"3\", \"4\", \"5\","
          " \"6\", \"7\", \"8\", \"9\", \"10\", \"11\", \"12\", \"13\", \"14\", \"15\", \"16\", \"17\"]}",
          "stop", "at most 16" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": 3}", "logprobs",
          "true or false" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 3}", "top_logprobs",
          "needs 'logprobs'" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"logprobs\": true, \"top_logprobs\": 21}",
          "top_logprobs", "outside" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream\": \"yes\"}", "stream",
          "true or false" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream_options\": {}}",
          "stream_options", "only allowed when 'stream' is true" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"user\": 1}", "user", "a string" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", "tools",
          "an array" },
        { QOAI_CHAT,
          "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"xml\"}}",
          "response_format", "not one of text, json_object, json_schema" },
        { QOAI_CHAT,
          "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\"}}",
          "response_format", "needs {\"json_schema\"" },
        { QOAI_CHAT,
          "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"response_format\": {\"type\": \"json_schema\", "
          "\"json_schema\": {\"name\": \"n\", \"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"not\": {\"enum\": [1]}}}}}}}",
          "response_format.json_schema.schema", "/properties/a" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"guided_regex\": \"(?=a)\"}", "guided_regex", "lookaround" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"guided_choice\": []}", "guided_choice", "list of 1 to 4096" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"guided_choice\": [\"a\"], \"guided_regex\": \"a\"}", "guided_choice",
          "one of" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"json_schema\": {}, \"structured_outputs\": {\"regex\": \"a\"}}",
          "json_schema", "one of" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"structured_outputs\": {\"grammar\": \"root ::= x\"}}",
          "structured_outputs.grammar", "not supported" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"guided_json\": \"{nope\"}", "guided_json", "not JSON" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"some_future_field\": [1]}", "some_future_field",
          "Unrecognized request argument" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"suffix\": \"y\"}", "suffix", "fill-in-the-middle" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"grammar\": \"root ::= x\"}", "grammar", "not supported" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"messages\": []}", "messages", "/v1/chat/completions" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"a\": 1}}", "logit_bias", "token ids" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 101}}", "logit_bias", "[-100, 100]" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"99999\": 1}}", "logit_bias", "vocabulary" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"stop_token_ids\": [-1]}", "stop_token_ids", "not a token id" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"stop_token_ids\": [99999]}", "stop_token_ids", "vocabulary" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"min_tokens\": 9, \"max_tokens\": 4}", "min_tokens", "at most" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"best_of\": 3}", "best_of", "not supported" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"echo\": true, \"logprobs\": 2}", "echo", "prompt's logprobs" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"priority\": 1}", "priority", "not enabled" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"truncate_prompt_tokens\": 0}", "truncate_prompt_tokens", ">= 1" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"request_id\": \"a b\"}", "request_id", "letters" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"continue_final_message\": true}",
          "continue_final_message", "cannot both be true" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"continue_final_message\": true, "
          "\"add_generation_prompt\": false}", "continue_final_message", "the assistant's" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template_kwargs\": "
          "{\"messages\": []}}", "chat_template_kwargs", "may not set 'messages'" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
          "\"content\": null, \"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": "
          "\"f\", \"arguments\": \"{oops\"}}]}]}", "messages[1].tool_calls[0]", "not JSON" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"prompt\": \"y\"}", "prompt",
          "/v1/completions" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": {}}", "tools", "an array" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": \"required\"}",
          "tool_choice", "needs 'tools'" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [" TOOL_F "], "
          "\"tool_choice\": \"sometimes\"}", "tool_choice", "'sometimes' is none" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [" TOOL_F "], "
          "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"g\"}}}", "tool_choice", "not among" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"code\"}]}",
          "tools[0]", "\"type\": \"function\"" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", "
          "\"function\": {\"name\": \"a b\"}}]}", "tools[0].function.name", "1 to 64" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [" TOOL_F ", " TOOL_F "]}",
          "tools[1].function.name", "two tools are named 'f'" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [" TOOL_F ", {\"type\": "
          "\"function\", \"function\": {\"name\": \"g\", \"parameters\": {\"properties\": {\"q\": {\"type\": \"array\", "
          "\"uniqueItems\": true}}}}}]}", "tools[1].function.parameters", "/properties/q" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [" TOOL_F "], "
          "\"parallel_tool_calls\": 1}", "parallel_tool_calls", "true or false" },
        { QOAI_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [" TOOL_F "], "
          "\"response_format\": {\"type\": \"json_object\"}}", "tool_choice", "cannot be asked for together" },
        { QOAI_COMPLETION, "{}", "prompt", "'prompt' must be" },
        { QOAI_COMPLETION, "{\"prompt\": 5}", "prompt", "'prompt' must be" },
        { QOAI_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", "prompt", "one prompt a request" },
        { QOAI_COMPLETION, "{\"prompt\": [1, 999999]}", "prompt", "not a token id" },
        { QOAI_COMPLETION, "{\"prompt\": [1, \"x\"]}", "prompt", "not a token id" },
        { QOAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": true}", "logprobs", "an integer" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        qoai_req r;
        qoai_error e;
        const int rc = parse(c->body, c->kind, 50, &r, &e);
        if (rc != QERR_INVAL || e.status != 400 || strcmp(e.param, c->param) || !strstr(e.message, c->message))
            fprintf(stderr, "  case %zu (%s): rc %d status %d param '%s' message '%s'\n", i, c->body, rc, e.status,
                    e.param, e.message);
        CHECK_EQ_INT(rc, QERR_INVAL);
        CHECK_EQ_INT(e.status, 400);
        CHECK(!strcmp(e.type, "invalid_request_error"));
        CHECK(!strcmp(e.param, c->param));
        CHECK_STR_CONTAINS(e.message, c->message);
        CHECK(r.body == NULL && r.ids == NULL); /* nothing left to free */
    }
}

/* A prompt longer than the context gets OpenAI's code and wording. */
static void test_context_length(void)
{
    const int n = g_model->hp.max_ctx + 5;
    char *body = malloc((size_t)n * 3 + 64), *w = body;
    REQUIRE(body);
    w += sprintf(w, "{\"prompt\": [");
    for (int i = 0; i < n; i++) w += sprintf(w, i ? ",1" : "1");
    sprintf(w, "]}");
    qoai_req r;
    qoai_error e;
    CHECK_EQ_INT(parse(body, QOAI_COMPLETION, 0, &r, &e), QERR_INVAL);
    CHECK(!strcmp(e.code, "context_length_exceeded"));
    CHECK_STR_CONTAINS(e.message, "maximum context length");
    CHECK(!strcmp(e.param, "prompt"));
    free(body);
    /* A short prompt with a max_tokens that does not fit after it. */
    char b2[96];
    snprintf(b2, sizeof b2, "{\"prompt\": \"Once\", \"max_tokens\": %d}", g_model->hp.max_ctx);
    CHECK_EQ_INT(parse(b2, QOAI_COMPLETION, 0, &r, &e), QERR_INVAL);
    CHECK(!strcmp(e.code, "context_length_exceeded"));
    CHECK_STR_CONTAINS(e.message, "in the completion");
    snprintf(b2, sizeof b2, "{\"prompt\": \"Once\", \"max_tokens\": %d}", g_model->hp.max_ctx - 8);
    CHECK_EQ_INT(parse(b2, QOAI_COMPLETION, 0, &r, &e), 0);
    qoai_req_free(&r);
}

static void test_error_json(void)
{
    qoai_error e;
    CHECK_EQ_INT(qoai_fail(&e, 401, "authentication_error", NULL, "bad key %d", 7), QERR_INVAL);
    json_t *j = qoai_error_json(&e);
    REQUIRE(j);
    char *s = json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT);
    CHECK(s && !strcmp(s, "{\"error\":{\"code\":null,\"message\":\"bad key 7\",\"param\":null,"
                          "\"type\":\"authentication_error\"}}"));
    free(s);
    json_decref(j);
    CHECK_EQ_INT(qoai_fail(&e, 500, "server_error", "x", "boom"), QERR_INTERNAL);
    snprintf(e.code, sizeof e.code, "c");
    j = qoai_error_json(&e);
    s = j ? json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    CHECK(s && !strcmp(s, "{\"error\":{\"code\":\"c\",\"message\":\"boom\",\"param\":\"x\",\"type\":\"server_error\"}}"));
    free(s);
    json_decref(j);
}

static char *dump(json_t *j)
{
    char *s = j ? json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

static void check_dump(json_t *j, const char *want)
{
    char *s = dump(j);
    if (!s || strcmp(s, want)) fprintf(stderr, "  got  %s\n  want %s\n", s ? s : "(null)", want);
    CHECK(s && !strcmp(s, want));
    free(s);
}

static void test_replies(void)
{
    const qoai_reply chat = { QOAI_CHAT, "chatcmpl-1", 1700000000, "m" };
    const qoai_reply cmpl = { QOAI_COMPLETION, "cmpl-1", 1700000000, "m" };
    check_dump(qoai_usage(5, 3, 2, 0, NULL), "{\"completion_tokens\":3,\"prompt_tokens\":5,\"prompt_tokens_details\":"
                                          "{\"cached_tokens\":2},\"total_tokens\":8}");
    check_dump(qoai_usage(9, 1, 8, 5, NULL), "{\"completion_tokens\":1,\"prompt_tokens\":9,\"prompt_tokens_details\":"
                                             "{\"cached_tokens\":8,\"disk_cached_tokens\":5},\"total_tokens\":10}");
    const int spec[3] = { 8, 6, 4 };
    check_dump(qoai_usage(5, 10, 0, 0, spec),
               "{\"completion_tokens\":10,\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":0},"
               "\"speculative\":{\"acceptance_rate\":0.75,\"accepted_tokens\":6,\"drafted_tokens\":8,"
               "\"mean_accepted_length\":2.5,\"passes\":4},\"total_tokens\":15}");
    check_dump(qoai_chunk(&chat, 0, "Hi", 2, NULL, NULL, 1),
               "{\"choices\":[{\"delta\":{\"content\":\"Hi\",\"role\":\"assistant\"},\"finish_reason\":null,"
               "\"index\":0,\"logprobs\":null}],\"created\":1700000000,\"id\":\"chatcmpl-1\",\"model\":\"m\","
               "\"object\":\"chat.completion.chunk\"}");
    check_dump(qoai_chunk(&chat, 1, "", 0, NULL, qoai_finish_reason(QFINISH_LENGTH), 0),
               "{\"choices\":[{\"delta\":{},\"finish_reason\":\"length\",\"index\":1,\"logprobs\":null}],"
               "\"created\":1700000000,\"id\":\"chatcmpl-1\",\"model\":\"m\",\"object\":\"chat.completion.chunk\"}");
    check_dump(qoai_chunk(&cmpl, 0, "a\"b", 3, NULL, qoai_finish_reason(QFINISH_STOP), 0),
               "{\"choices\":[{\"finish_reason\":\"stop\",\"index\":0,\"logprobs\":null,\"text\":\"a\\\"b\"}],"
               "\"created\":1700000000,\"id\":\"cmpl-1\",\"model\":\"m\",\"object\":\"text_completion\"}");
    check_dump(qoai_usage_chunk(&chat, qoai_usage(1, 2, 0, 0, NULL)),
               "{\"choices\":[],\"created\":1700000000,\"id\":\"chatcmpl-1\",\"model\":\"m\",\"object\":"
               "\"chat.completion.chunk\",\"usage\":{\"completion_tokens\":2,\"prompt_tokens\":1,"
               "\"prompt_tokens_details\":{\"cached_tokens\":0},\"total_tokens\":3}}");
    CHECK(!strcmp(qoai_finish_reason(QFINISH_CANCELLED), "abort"));

    /* Logprobs of a token with two alternatives, one of probability 0. */
    int32_t *ids = NULL;
    int n = 0;
    REQUIRE(qtok_encode(g_tok, "Once upon", 9, 0, &ids, &n) == 0 && n >= 2);
    /* A token's text is what it adds after another token ("a"). */
    int32_t *aid = NULL;
    int na = 0;
    REQUIRE(qtok_encode(g_tok, "a", 1, 0, &aid, &na) == 0 && na >= 1);
    char *t0 = NULL, *t1 = NULL, *ta = NULL;
    size_t l0, l1, la;
    int32_t pair0[2] = { aid[na - 1], ids[0] }, pair1[2] = { aid[na - 1], ids[1] };
    REQUIRE(qtok_decode(g_tok, pair0, 1, 0, &ta, &la) == 0);
    REQUIRE(qtok_decode(g_tok, pair0, 2, 0, &t0, &l0) == 0 && qtok_decode(g_tok, pair1, 2, 0, &t1, &l1) == 0);
    memmove(t0, t0 + la, l0 - la + 1), l0 -= la;
    memmove(t1, t1 + la, l1 - la + 1), l1 -= la;
    CHECK(l1 > 0 && t1[0] == ' '); /* " upon": its space kept, as in the text */
    free(aid);
    free(ta);
    qevent ev;
    memset(&ev, 0, sizeof ev);
    ev.token = ids[0];
    ev.logprob = -0.25f;
    ev.n_top = 2;
    ev.top[0] = (qlogprob){ ids[0], -0.25f };
    ev.top[1] = (qlogprob){ ids[1], -INFINITY };
    json_t *acc = NULL;
    REQUIRE(qoai_logprobs_add(&acc, QOAI_CHAT, g_tok, &ev, 0) == 0);
    REQUIRE(qoai_logprobs_add(&acc, QOAI_CHAT, g_tok, &ev, 0) == 0);
    json_t *c0 = json_array_get(json_object_get(acc, "content"), 1);
    CHECK_EQ_INT(json_array_size(json_object_get(acc, "content")), 2);
    CHECK(!strcmp(json_string_value(json_object_get(c0, "token")), t0));
    CHECK_EQ_INT(json_array_size(json_object_get(c0, "bytes")), l0);
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(c0, "bytes"), 0)), (unsigned char)t0[0]);
    CHECK(json_real_value(json_object_get(c0, "logprob")) == -0.25);
    json_t *tops = json_object_get(c0, "top_logprobs");
    CHECK_EQ_INT(json_array_size(tops), 2);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(tops, 1), "token")), t1));
    CHECK(json_real_value(json_object_get(json_array_get(tops, 1), "logprob")) == -9999.0);
    /* The whole chat reply with that logprobs object. */
    qoai_choice ch[2] = { { "Hi", 2, "stop", acc, NULL, NULL, 0 }, { "Yo", 2, "length", NULL, NULL, NULL, 0 } };
    json_t *resp = qoai_response(&chat, ch, 2, qoai_usage(4, 2, 0, 0, NULL));
    REQUIRE(resp);
    CHECK(!strcmp(json_string_value(json_object_get(resp, "object")), "chat.completion"));
    json_t *ch1 = json_array_get(json_object_get(resp, "choices"), 1);
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(ch1, "message"), "content")), "Yo"));
    CHECK(!strcmp(json_string_value(json_object_get(json_object_get(ch1, "message"), "role")), "assistant"));
    CHECK(json_is_null(json_object_get(ch1, "logprobs")));
    CHECK(json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "logprobs") != NULL);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(resp, "usage"), "total_tokens")), 6);
    json_decref(resp);

    /* Completions' layout. */
    acc = NULL;
    REQUIRE(qoai_logprobs_add(&acc, QOAI_COMPLETION, g_tok, &ev, 0) == 0);
    REQUIRE(qoai_logprobs_add(&acc, QOAI_COMPLETION, g_tok, &ev, l0) == 0);
    CHECK(!strcmp(json_string_value(json_array_get(json_object_get(acc, "tokens"), 1)), t0));
    CHECK(json_real_value(json_array_get(json_object_get(acc, "token_logprobs"), 0)) == -0.25);
    json_t *top1 = json_array_get(json_object_get(acc, "top_logprobs"), 1);
    CHECK_EQ_INT(json_object_size(top1), strcmp(t0, t1) ? 2 : 1);
    CHECK(json_real_value(json_object_get(top1, t1)) == (strcmp(t0, t1) ? -9999.0 : -0.25));
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(acc, "text_offset"), 1)), l0);
    qoai_choice c1 = { "x", 1, "stop", acc, NULL, NULL, 0 };
    resp = qoai_response(&cmpl, &c1, 1, qoai_usage(1, 1, 0, 0, NULL));
    REQUIRE(resp);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "text")), "x"));
    json_decref(resp);
    free(ids);
    free(t0);
    free(t1);
}

/* response_format and the guided_* fields become the request's grammar. */
static void test_guided(void)
{
    static const char *const ok[] = {
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_object\"}}",
        "{\"prompt\": \"x\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"p\", "
        "\"schema\": {\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\"}}}, \"strict\": true}}}",
        "{\"prompt\": \"x\", \"guided_json\": {\"enum\": [1, 2]}}",
        "{\"prompt\": \"x\", \"guided_regex\": \"[a-c]{3}\"}",
        "{\"prompt\": \"x\", \"guided_choice\": [\"yes\", \"no\"]}",
    };
    static const char *const takes[] = { "{}", "{\"a\":7}", "2", "abc", "no" };
    static const char *const refuses[] = { "[]", "{\"a\":\"7\"}", "3", "abcd", "maybe" };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        qoai_req r;
        qoai_error e;
        REQUIRE(parse(ok[i], QOAI_COMPLETION, 0, &r, &e) == 0);
        CHECK(r.grammar != NULL && r.p.grammar == r.grammar && r.p.grammar_vocab == g_vocab);
        gram_m *m = gram_m_new(r.grammar);
        CHECK(gram_m_feed(m, (const uint8_t *)takes[i], strlen(takes[i])) == 0 && gram_m_can_end(m));
        gram_m_reset(m);
        CHECK(gram_m_feed(m, (const uint8_t *)refuses[i], strlen(refuses[i])) != 0 || !gram_m_can_end(m));
        gram_m_free(m);
        qoai_req_free(&r);
    }
    /* The same schema again shares the grammar compiled first; another
     * does not. */
    qoai_req r1, r2, r3;
    qoai_error e1;
    REQUIRE(parse(ok[1], QOAI_COMPLETION, 0, &r1, &e1) == 0);
    REQUIRE(parse(ok[1], QOAI_COMPLETION, 0, &r2, &e1) == 0);
    REQUIRE(parse(ok[2], QOAI_COMPLETION, 0, &r3, &e1) == 0);
    CHECK(r1.grammar == r2.grammar && r1.grammar != r3.grammar);
    qoai_req_free(&r1);
    CHECK(r2.grammar != NULL && gram_states(r2.grammar) > 0); /* still alive */
    qoai_req_free(&r2);
    qoai_req_free(&r3);
    /* text is free text; and without a vocabulary, structured output is refused. */
    qoai_req r;
    qoai_error e;
    REQUIRE(parse("{\"prompt\": \"x\", \"response_format\": {\"type\": \"text\"}}", QOAI_COMPLETION, 0, &r, &e) == 0);
    CHECK(r.grammar == NULL);
    qoai_req_free(&r);
    const qoai_limits bare = { 0 };
    CHECK(qoai_parse(ok[0], strlen(ok[0]), QOAI_COMPLETION, &bare, g_model, g_tok, &r, &e) != 0);
    CHECK_STR_CONTAINS(e.message, "tokenizer");
}

/* tools and tool_choice become a grammar of calls; the output is read back
 * as content and tool_calls, the same whether fed whole or byte by byte. */
static void test_tools(void)
{
    static const char *const head = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": ["
                                    "{\"type\": \"function\", \"function\": {\"name\": \"weather\", \"parameters\": "
                                    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, "
                                    "\"required\": [\"city\"], \"additionalProperties\": false}}},"
                                    "{\"type\": \"function\", \"function\": {\"name\": \"now\"}}]";
    static const struct {
        const char *tail;
        int mode;
        const char *takes, *refuses;
    } cases[] = {
        { "}", QOAI_TOOLS_AUTO, "Hi.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", "<tool_call>x" },
        { ", \"tool_choice\": \"required\"}", QOAI_TOOLS_REQUIRED,
          "<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\":\"Oslo\"}}\n</tool_call>\n<tool_call>\n"
          "{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
          "Hi." },
        { ", \"tool_choice\": \"required\", \"parallel_tool_calls\": false}", QOAI_TOOLS_REQUIRED,
          "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
          "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>" },
        { ", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"weather\"}}}", QOAI_TOOLS_NAMED,
          "{\"city\":\"Oslo\"}", "{\"town\":\"Oslo\"}" },
        { ", \"tool_choice\": \"none\"}", QOAI_TOOLS_OFF, NULL, NULL },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[2048];
        snprintf(body, sizeof body, "%s%s", head, cases[i].tail);
        qoai_req r;
        qoai_error e;
        const int rc = parse(body, QOAI_CHAT, 0, &r, &e);
        if (rc) fprintf(stderr, "  case %zu: %s\n", i, e.message);
        REQUIRE(rc == 0);
        CHECK_EQ_INT(r.tool_mode, cases[i].mode);
        CHECK((r.grammar != NULL) == (cases[i].mode != QOAI_TOOLS_OFF));
        if (r.grammar) {
            gram_m *m = gram_m_new(r.grammar);
            CHECK(gram_m_feed(m, (const uint8_t *)cases[i].takes, strlen(cases[i].takes)) == 0 && gram_m_can_end(m));
            gram_m_reset(m);
            CHECK(gram_m_feed(m, (const uint8_t *)cases[i].refuses, strlen(cases[i].refuses)) != 0 ||
                  !gram_m_can_end(m));
            gram_m_free(m);
        }
        qoai_req_free(&r);
    }

    /* Reading back: content first, then two calls, fed whole and byte by byte. */
    const char *out = "Let me see.\n<tool_call>\n{\"name\":\"weather\",\"arguments\":{\"city\":\"a}\\\"b\",\"n\":[1,{}]}}"
                      "\n</tool_call>\n<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>";
    const char *want = "{\"content\":\"Let me see.\\n\",\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":"
                       "\"{\\\"city\\\":\\\"a}\\\\\\\"b\\\",\\\"n\\\":[1,{}]}\",\"name\":\"weather\"},\"id\":\"call_x_0\","
                       "\"type\":\"function\"},{\"function\":{\"arguments\":\"{}\",\"name\":\"now\"},\"id\":\"call_x_1\","
                       "\"type\":\"function\"}]}";
    qoai_calls *whole = qoai_calls_new(QOAI_TOOLS_AUTO, GRAM_TOOLS_HERMES, NULL, "call_x_");
    REQUIRE(whole);
    json_decref(qoai_calls_feed(whole, out, strlen(out), 1));
    CHECK_EQ_INT(qoai_calls_count(whole), 2);
    check_dump(qoai_calls_message(whole), want);
    qoai_calls_free(whole);
    /* Byte by byte: the deltas join into the same content and arguments. */
    qoai_calls *bit = qoai_calls_new(QOAI_TOOLS_AUTO, GRAM_TOOLS_HERMES, NULL, "call_x_");
    REQUIRE(bit);
    char content[256] = "", args[2][256] = { "", "" }, names[2][32] = { "", "" };
    const size_t n = strlen(out);
    for (size_t i = 0; i <= n; i++) {
        json_t *d = qoai_calls_feed(bit, out + i, i < n ? 1 : 0, i == n);
        if (!d) continue;
        json_t *c = json_object_get(d, "content"), *tc = json_object_get(d, "tool_calls");
        if (c) strncat(content, json_string_value(c), sizeof content - strlen(content) - 1);
        CHECK(!c || !strstr(json_string_value(c), "<"));
        size_t k;
        json_t *x;
        json_array_foreach(tc, k, x) {
            const int idx = (int)json_integer_value(json_object_get(x, "index"));
            REQUIRE(idx == 0 || idx == 1);
            json_t *f = json_object_get(x, "function");
            if (json_object_get(f, "name")) snprintf(names[idx], sizeof names[idx], "%s", json_string_value(json_object_get(f, "name")));
            if (json_object_get(f, "arguments"))
                strncat(args[idx], json_string_value(json_object_get(f, "arguments")), sizeof args[idx] - strlen(args[idx]) - 1);
        }
        json_decref(d);
    }
    CHECK(!strcmp(content, "Let me see.\n"));
    CHECK(!strcmp(names[0], "weather") && !strcmp(names[1], "now"));
    CHECK(!strcmp(args[0], "{\"city\":\"a}\\\"b\",\"n\":[1,{}]}"));
    CHECK(!strcmp(args[1], "{}"));
    check_dump(qoai_calls_message(bit), want);
    qoai_calls_free(bit);
    /* A call cut short (a stop string, max_tokens) is not complete; whole ones are. */
    qoai_calls *cut = qoai_calls_new(QOAI_TOOLS_REQUIRED, GRAM_TOOLS_HERMES, NULL, "c");
    json_decref(qoai_calls_feed(cut, out, 60, 1));
    CHECK(qoai_calls_count(cut) == 1 && !qoai_calls_complete(cut));
    qoai_calls_free(cut);
    qoai_calls *whole2 = qoai_calls_new(QOAI_TOOLS_REQUIRED, GRAM_TOOLS_HERMES, NULL, "c");
    json_decref(qoai_calls_feed(whole2, out, strlen(out), 1));
    CHECK(qoai_calls_complete(whole2) && !qoai_calls_failed(whole2));
    qoai_calls_free(whole2);
    /* Many calls in one feed: read in one pass (no recursion, no copies). */
    const char *one = "<tool_call>\n{\"name\":\"now\",\"arguments\":{\"k\":[1]}}\n</tool_call>\n";
    const size_t ol = strlen(one);
    char *many = malloc(ol * 20000 + 1);
    REQUIRE(many);
    for (int i = 0; i < 20000; i++) memcpy(many + (size_t)i * ol, one, ol);
    qoai_calls *mc = qoai_calls_new(QOAI_TOOLS_REQUIRED, GRAM_TOOLS_HERMES, NULL, "c");
    json_decref(qoai_calls_feed(mc, many, ol * 20000 - 1, 1));
    CHECK_EQ_INT(qoai_calls_count(mc), 20000);
    CHECK(qoai_calls_complete(mc));
    qoai_calls_free(mc);
    free(many);
    /* Text only: content, no calls; a text that merely begins like the tag. */
    qoai_calls *txt = qoai_calls_new(QOAI_TOOLS_AUTO, GRAM_TOOLS_HERMES, NULL, "c");
    json_t *d = qoai_calls_feed(txt, "a <tool_", 8, 0);
    check_dump(d, "{\"content\":\"a \"}");
    d = qoai_calls_feed(txt, "x", 1, 1);
    check_dump(d, "{\"content\":\"<tool_x\"}");
    CHECK_EQ_INT(qoai_calls_count(txt), 0);
    check_dump(qoai_calls_message(txt), "{\"content\":\"a <tool_x\",\"role\":\"assistant\"}");
    qoai_calls_free(txt);
    /* Named: the whole output is the arguments. */
    qoai_calls *nm = qoai_calls_new(QOAI_TOOLS_NAMED, GRAM_TOOLS_HERMES, "weather", "id");
    check_dump(qoai_calls_feed(nm, "{\"city\":", 8, 0),
               "{\"tool_calls\":[{\"function\":{\"arguments\":\"{\\\"city\\\":\",\"name\":\"weather\"},\"id\":"
               "\"id0\",\"index\":0,\"type\":\"function\"}]}");
    json_decref(qoai_calls_feed(nm, "\"}\"}", 4, 1));
    check_dump(qoai_calls_message(nm), "{\"content\":null,\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
                                       "{\"arguments\":\"{\\\"city\\\":\\\"}\\\"}\",\"name\":\"weather\"},\"id\":\"id0\","
                                       "\"type\":\"function\"}]}");
    qoai_calls_free(nm);
}

/* Output in form f read back whole and byte by byte: the same message
 * (want), the deltas joining into its content and arguments, and complete
 * as says. */
static void read_back(gram_tools_form f, int mode, const char *out, const char *want, int complete)
{
    qoai_calls *whole = qoai_calls_new(mode, f, NULL, "c");
    REQUIRE(whole);
    json_decref(qoai_calls_feed(whole, out, strlen(out), 1));
    CHECK_EQ_INT(qoai_calls_complete(whole), complete);
    check_dump(qoai_calls_message(whole), want);
    qoai_calls_free(whole);
    qoai_calls *bit = qoai_calls_new(mode, f, NULL, "c");
    REQUIRE(bit);
    json_t *sum = json_pack("{s:s, s:[]}", "content", "", "calls");
    const size_t n = strlen(out);
    for (size_t i = 0; i <= n; i++) {
        json_t *d = qoai_calls_feed(bit, out + i, i < n ? 1 : 0, i == n);
        json_t *c = json_object_get(d, "content"), *tc = json_object_get(d, "tool_calls"), *x;
        char buf[512];
        if (c) {
            snprintf(buf, sizeof buf, "%s%s", json_string_value(json_object_get(sum, "content")), json_string_value(c));
            json_object_set_new(sum, "content", json_string(buf));
        }
        size_t k;
        json_array_foreach(tc, k, x) {
            json_t *calls = json_object_get(sum, "calls");
            const size_t idx = (size_t)json_integer_value(json_object_get(x, "index"));
            if (idx == json_array_size(calls))
                json_array_append_new(calls, json_pack("{s:s, s:s}", "name", "", "arguments", ""));
            REQUIRE(idx < json_array_size(calls));
            json_t *fn = json_object_get(x, "function"), *mine = json_array_get(calls, idx);
            if (json_object_get(fn, "name")) json_object_set(mine, "name", json_object_get(fn, "name"));
            const char *more = json_string_value(json_object_get(fn, "arguments"));
            snprintf(buf, sizeof buf, "%s%s", json_string_value(json_object_get(mine, "arguments")), more ? more : "");
            json_object_set_new(mine, "arguments", json_string(buf));
        }
        json_decref(d);
    }
    json_t *m = qoai_calls_message(bit);
    char *md = dump(json_incref(m));
    CHECK(md && !strcmp(md, want));
    free(md);
    json_t *mc = json_object_get(m, "content"), *mt = json_object_get(m, "tool_calls");
    const char *got = json_string_value(json_object_get(sum, "content"));
    CHECK(json_is_null(mc) ? strspn(got, " \n") == strlen(got) : !strcmp(got, json_string_value(mc)));
    CHECK_EQ_INT((int)json_array_size(json_object_get(sum, "calls")), (int)json_array_size(mt));
    for (size_t k = 0; k < json_array_size(mt); k++) {
        json_t *mf = json_object_get(json_array_get(mt, k), "function");
        json_t *sf = json_array_get(json_object_get(sum, "calls"), k);
        CHECK(json_equal(json_object_get(mf, "name"), json_object_get(sf, "name")));
        CHECK(json_equal(json_object_get(mf, "arguments"), json_object_get(sf, "arguments")));
    }
    json_decref(m);
    json_decref(sum);
    qoai_calls_free(bit);
}

/* Llama 3.x's and Mistral's forms read back; the form each fixture
 * template shows (tests/fixtures/chat_templates). */
static void test_tool_forms(void)
{
    read_back(GRAM_TOOLS_LLAMA3_JSON, QOAI_TOOLS_REQUIRED,
              "{\"name\": \"weather\", \"parameters\": {\"city\":\"a}\\\"b\"}}; {\"name\": \"now\", \"parameters\": {}}",
              "{\"content\":null,\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":"
              "\"{\\\"city\\\":\\\"a}\\\\\\\"b\\\"}\",\"name\":\"weather\"},\"id\":\"c0\",\"type\":\"function\"},"
              "{\"function\":{\"arguments\":\"{}\",\"name\":\"now\"},\"id\":\"c1\",\"type\":\"function\"}]}", 1);
    read_back(GRAM_TOOLS_LLAMA3_JSON, QOAI_TOOLS_AUTO, "Hello {\"name\": \"now\", \"parameters\": {}}",
              "{\"content\":\"Hello {\\\"name\\\": \\\"now\\\", \\\"parameters\\\": {}}\",\"role\":\"assistant\"}", 0);
    read_back(GRAM_TOOLS_LLAMA3_JSON, QOAI_TOOLS_AUTO, "{\"name\": \"now\", \"parameters\": {\"k\"",
              "{\"content\":null,\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{\\\"k\\\"\","
              "\"name\":\"now\"},\"id\":\"c0\",\"type\":\"function\"}]}", 0);
    read_back(GRAM_TOOLS_MISTRAL, QOAI_TOOLS_AUTO,
              "Sure. [TOOL_CALLS] [{\"name\": \"weather\", \"arguments\": {\"city\":\"[Oslo]\"}}, {\"name\": \"now\", "
              "\"arguments\": {}}]",
              "{\"content\":\"Sure. \",\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":"
              "\"{\\\"city\\\":\\\"[Oslo]\\\"}\",\"name\":\"weather\"},\"id\":\"c0\",\"type\":\"function\"},"
              "{\"function\":{\"arguments\":\"{}\",\"name\":\"now\"},\"id\":\"c1\",\"type\":\"function\"}]}", 1);
    read_back(GRAM_TOOLS_MISTRAL, QOAI_TOOLS_AUTO, "a [TOOL_x] b",
              "{\"content\":\"a [TOOL_x] b\",\"role\":\"assistant\"}", 0);
    read_back(GRAM_TOOLS_HERMES, QOAI_TOOLS_REQUIRED,
              "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>",
              "{\"content\":null,\"role\":\"assistant\",\"tool_calls\":[{\"function\":{\"arguments\":\"{}\",\"name\":"
              "\"now\"},\"id\":\"c0\",\"type\":\"function\"}]}", 1);
    /* A head that never ends, fed a byte at a time, is searched once (a
     * reader that searched it again each time would take minutes here). */
    const double t0 = q_now();
    for (int form = 0; form < GRAM_TOOLS_FORMS; form++) {
        qoai_calls *junk = qoai_calls_new(QOAI_TOOLS_REQUIRED, (gram_tools_form)form, NULL, "c");
        REQUIRE(junk);
        const char *open = form == GRAM_TOOLS_MISTRAL ? "[TOOL_CALLS] [" : form == GRAM_TOOLS_HERMES ? "<tool_call>\n" : "{";
        json_decref(qoai_calls_feed(junk, open, strlen(open), 0));
        for (int i = 0; i < 400000; i++) json_decref(qoai_calls_feed(junk, "\"name\": \"x\", " + i % 14, 1, 0));
        json_decref(qoai_calls_feed(junk, "", 0, 1));
        CHECK(qoai_calls_count(junk) == 0 && !qoai_calls_complete(junk));
        qoai_calls_free(junk);
    }
    fprintf(stderr, "  1.2 MB of unending heads read in %.2f s\n", q_now() - t0);
    CHECK(q_now() - t0 < 20);
    /* The templates people serve: the form they show. */
    CHECK_EQ_INT(qoai_tool_form_of(NULL), GRAM_TOOLS_HERMES);
    CHECK_EQ_INT(qoai_tool_form_of("{{ messages[0].content }}"), GRAM_TOOLS_HERMES);
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/chat_templates/tool_conversations.json", qt_root());
    json_t *fx = json_load_file(path, 0, NULL);
    REQUIRE(fx);
    static const struct {
        const char *name;
        gram_tools_form form;
    } want[] = { { "Qwen2.5-Instruct", GRAM_TOOLS_HERMES },
                 { "meta-llama-Llama-3.1-8B-Instruct", GRAM_TOOLS_LLAMA3_JSON },
                 { "Mistral-7B-Instruct-v0.3", GRAM_TOOLS_MISTRAL },
                 { "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", GRAM_TOOLS_HERMES },
                 { "Phi-3-mini-4k-instruct", GRAM_TOOLS_HERMES } };
    int seen = 0;
    size_t i;
    json_t *rec;
    json_array_foreach(json_object_get(fx, "records"), i, rec) {
        const char *nm = json_string_value(json_object_get(rec, "name"));
        for (size_t k = 0; nm && k < sizeof want / sizeof want[0]; k++)
            if (!strcmp(nm, want[k].name)) {
                const int got = qoai_tool_form_of(json_string_value(json_object_get(rec, "template")));
                if (got != (int)want[k].form) fprintf(stderr, "  %s: form %d, want %d\n", nm, got, want[k].form);
                CHECK_EQ_INT(got, want[k].form);
                seen++;
            }
    }
    CHECK(seen >= 5);
    json_decref(fx);
}

/* A structure request that failed to compile is refused again at once,
 * with the same error, without compiling (a hostile schema costs its
 * compile once). */
static void test_failed_grammar_cached(void)
{
    /* 1,500 alternatives of bounded integers and strings: too many states. */
    size_t cap = 1 << 20, n = 0;
    char *body = malloc(cap);
    REQUIRE(body);
    n += (size_t)snprintf(body + n, cap - n, "{\"prompt\": \"x\", \"guided_json\": {\"anyOf\": [");
    for (int i = 0; i < 1500; i++)
        n += (size_t)snprintf(body + n, cap - n,
                              "%s{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", "
                              "\"minimum\": %d, \"maximum\": %d}, \"b\": {\"type\": \"string\", \"maxLength\": %d}}, "
                              "\"required\": [\"a\", \"b\"]}",
                              i ? ", " : "", i, i + 5000, i % 50 + 1);
    snprintf(body + n, cap - n, "]}}");
    qoai_req r;
    qoai_error e1, e2;
    double t0 = q_now();
    const int rc1 = parse(body, QOAI_COMPLETION, 0, &r, &e1);
    const double first = q_now() - t0;
    t0 = q_now();
    const int rc2 = parse(body, QOAI_COMPLETION, 0, &r, &e2);
    const double again = q_now() - t0;
    free(body);
    REQUIRE(rc1 && rc2);
    CHECK_EQ_INT(e1.status, 400);
    CHECK(!strcmp(e1.param, "guided_json") && !strcmp(e1.message, e2.message) && !strcmp(e1.param, e2.param));
    CHECK_STR_CONTAINS(e1.message, "too many states");
    fprintf(stderr, "  failed compile %.3f s, refused again in %.4f s\n", first, again);
    CHECK(again < first / 5);
}

/* A grammar past the time budget (qoai_limits.grammar_seconds) is refused
 * with a 400 that names the budget and its field, for response formats and
 * tools alike; the refusal is cached: the same request is refused again
 * even with no budget, and a request the budget allows is not refused. */
static void test_grammar_time_budget(void)
{
    static const char *const bodies[] = {
        "{\"prompt\": \"x\", \"guided_json\": {\"type\": \"object\", \"properties\": "
        "{\"zip\": {\"type\": \"string\", \"pattern\": \"^[0-9]{5}$\"}}}}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"type\": \"function\", "
        "\"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"properties\": "
        "{\"n\": {\"type\": \"integer\", \"minimum\": 3, \"maximum\": 97}}}}}], \"tool_choice\": \"required\"}",
    };
    static const char *const params[] = { "guided_json", "tools" };
    for (int i = 0; i < 2; i++) {
        const qoai_kind kind = i ? QOAI_CHAT : QOAI_COMPLETION;
        qoai_req r;
        qoai_error e1, e2;
        g_seconds = 1e-9; /* past before the compile begins */
        const int rc1 = parse(bodies[i], kind, 0, &r, &e1);
        REQUIRE(rc1 != 0);
        CHECK_EQ_INT(e1.status, 400);
        CHECK(!strcmp(e1.param, params[i]));
        CHECK_STR_CONTAINS(e1.message, "time budget");
        g_seconds = 0;
        REQUIRE(parse(bodies[i], kind, 0, &r, &e2) != 0); /* cached */
        CHECK(!strcmp(e1.message, e2.message) && !strcmp(e1.param, e2.param));
    }
    /* A minute is plenty for a schema of this size. */
    g_seconds = 60;
    qoai_req r;
    qoai_error e;
    const char *ok = "{\"prompt\": \"x\", \"guided_json\": {\"type\": \"object\", \"properties\": "
                     "{\"zip\": {\"type\": \"string\", \"pattern\": \"^[0-9]{4}$\"}}}}";
    const int rc = parse(ok, QOAI_COMPLETION, 0, &r, &e);
    if (rc) fprintf(stderr, "  %s\n", e.message);
    REQUIRE(rc == 0);
    CHECK(r.grammar != NULL);
    qoai_req_free(&r);
    g_seconds = 0;
}

int main(void)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", qt_root());
    if (qmodel_load(path, &g_model, err, sizeof err) || qtok_for_model(g_model, &g_tok, err, sizeof err)) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return 1;
    }
    g_cache = gram_cache_new(8);
    g_fail = qoai_failcache_new(4);
    if (!g_cache || qengine_grammar_vocab(g_tok, &g_vocab)) {
        fprintf(stderr, "cannot build the grammar vocabulary\n");
        return 1;
    }
    QT_RUN(test_guided);
    QT_RUN(test_tools);
    QT_RUN(test_tool_forms);
    QT_RUN(test_chat_valid);
    QT_RUN(test_completion_valid);
    QT_RUN(test_bad_bodies);
    QT_RUN(test_context_length);
    QT_RUN(test_error_json);
    QT_RUN(test_replies);
    QT_RUN(test_failed_grammar_cached);
    QT_RUN(test_grammar_time_budget);
    gram_vocab_free(g_vocab);
    gram_cache_free(g_cache);
    qoai_failcache_free(g_fail);
    qtok_free(g_tok);
    qmodel_destroy(g_model);
    QT_MAIN_END();
}
