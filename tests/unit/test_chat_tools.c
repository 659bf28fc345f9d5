/* test_chat_tools.c - multi-turn tool conversations through real chat
 * templates, as vLLM hands them to the template and HF transformers renders
 * them.
 *
 * tests/fixtures/chat_templates/tool_conversations.json (made by
 * scripts/gen_tool_chat_fixtures.py with transformers 5.25 and jinja2
 * 3.1.6) holds, for the Qwen2.5, Llama-3.1, Mistral-v0.3, Hermes-2-Pro and
 * Phi-3 templates, conversations as an OpenAI client sends them (the
 * assistant's tool_calls with arguments as JSON text and content null, tool
 * results) and what apply_chat_template rendered after vLLM's
 * preprocessing.  Here the raw messages go through the server's own
 * preprocessing (qoai_messages) and quire's template interpreter, and must
 * give the same bytes (or the template's own error). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "oai.h"
#include "qerr.h"
#include "qtest.h"

static void test_tool_conversations(void)
{
    char path[1024], err[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/chat_templates/tool_conversations.json", qt_root());
    json_error_t je;
    json_t *all = json_load_file(path, 0, &je);
    if (!all) fprintf(stderr, "  cannot read %s: %s\n", path, je.text);
    REQUIRE(all);
    json_t *recs = json_object_get(all, "records");
    REQUIRE(json_array_size(recs) >= 10);
    int matched = 0, errors = 0;
    size_t i;
    json_t *rec;
    json_array_foreach(recs, i, rec) {
        const char *name = json_string_value(json_object_get(rec, "name"));
        const char *conv = json_string_value(json_object_get(rec, "conversation"));
        json_t *src = json_object_get(rec, "template");
        qchat_tmpl *t = NULL;
        int rc = qchat_compile(json_string_value(src), json_string_length(src), &t, err, sizeof err);
        CHECK_EQ_INT(rc, 0);
        if (rc) continue;
        /* The server's preprocessing of the raw messages. */
        json_t *msgs = NULL;
        qoai_error e;
        rc = qoai_messages(json_object_get(rec, "messages"), &msgs, &e);
        if (rc) fprintf(stderr, "  %s / %s: %s\n", name, conv, e.message);
        CHECK_EQ_INT(rc, 0);
        json_t *ctx = json_pack("{s:o, s:O, s:b, s:O, s:O, s:O}", "messages", msgs, "tools",
                                json_object_get(rec, "tools"), "add_generation_prompt", 1, "bos_token",
                                json_object_get(rec, "bos_token"), "eos_token", json_object_get(rec, "eos_token"),
                                "date_string", json_object_get(rec, "date_string"));
        REQUIRE(ctx);
        char *out = NULL;
        size_t len = 0;
        rc = qchat_render(t, ctx, &out, &len, err, sizeof err);
        json_t *want = json_object_get(rec, "expected");
        const char *want_err = json_string_value(json_object_get(rec, "error"));
        int ok;
        if (want_err) {
            ok = rc == QERR_INVAL && !out && strstr(want_err, err) != NULL;
            errors += ok;
        } else {
            ok = rc == 0 && len == json_string_length(want) && !memcmp(out, json_string_value(want), len);
        }
        if (!ok) {
            fprintf(stderr, "  %s / %s differs:\n--- got (%s)\n%s\n--- expected\n%s\n", name, conv, rc ? err : "ok",
                    out ? out : "", want_err ? want_err : json_string_value(want));
        }
        CHECK(ok);
        matched += ok;
        fprintf(stderr, "  %-46s %-10s %s\n", name, conv, ok ? (want_err ? "refused as by HF" : "identical") : "DIFFERS");
        free(out);
        json_decref(ctx);
        qchat_free(t);
    }
    CHECK_EQ_INT(matched, (int)json_array_size(recs));
    CHECK(errors >= 1); /* Llama 3.1 refuses two calls in one message, as its template says */
    json_decref(all);
}

/* The preprocessing itself: arguments parsed, null content as "", the
 * client's array not changed. */
static void test_preprocessing(void)
{
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null, "
                              "\"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": \"f\", "
                              "\"arguments\": \"{\\\"a\\\": [1, 2]}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c\", "
                              "\"content\": null}]",
                              0, NULL);
    REQUIRE(msgs);
    json_t *out = NULL;
    qoai_error e;
    REQUIRE(qoai_messages(msgs, &out, &e) == 0);
    json_t *a = json_array_get(out, 1);
    CHECK(!strcmp(json_string_value(json_object_get(a, "content")), ""));
    json_t *args = json_object_get(json_object_get(json_array_get(json_object_get(a, "tool_calls"), 0), "function"),
                                   "arguments");
    CHECK(json_is_object(args) && json_array_size(json_object_get(args, "a")) == 2);
    CHECK(!strcmp(json_string_value(json_object_get(json_array_get(out, 2), "content")), ""));
    /* The request's own messages keep their text. */
    json_t *orig = json_object_get(json_object_get(json_array_get(json_object_get(json_array_get(msgs, 1), "tool_calls"),
                                                                  0),
                                                   "function"),
                                   "arguments");
    CHECK(json_is_string(orig));
    json_decref(out);
    json_decref(msgs);
}

int main(void)
{
    QT_RUN(test_tool_conversations);
    QT_RUN(test_preprocessing);
    QT_MAIN_END();
}
