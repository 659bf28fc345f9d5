/* fuzz_chat.c - libFuzzer target: any bytes as a chat template, compiled
 * and rendered with a small conversation.  Every outcome must be a clean
 * success or error (no crash, hang, leak or sanitizer report); the limits
 * are set low so that a run stays fast. */
#include "chat.h"
#include "util.h"

#include <stdint.h>
#include <stdlib.h>

static json_t *g_ctx;

static const char CONTEXT[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Hi \\u00e9 <b>\"},"
    " {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\","
    "  \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2.5, true, null]}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"call_1\", \"content\": \"{\\\"t\\\": 21}\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": \"Weather\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"n\": 3, \"f\": 2.5}";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    q_set_alloc_limit((size_t)256 << 20);
    qlog_set_level(QLOG_OFF);
    g_ctx = json_loads(CONTEXT, 0, NULL);
    if (!g_ctx) abort(); /* a bug in this file, not in the input */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[256];
    qchat_tmpl *t;
    if (qchat_compile((const char *)data, size, &t, err, sizeof err)) return 0;
    qchat_limits lim = {
        .max_output = (size_t)1 << 20,
        .max_memory = (size_t)32 << 20,
        .max_iterations = 20000,
        .max_call_depth = 32,
        .max_seconds = 2,
    };
    qchat_set_limits(t, &lim);
    qchat_set_time(t, 1721952000);
    char *out = NULL;
    size_t len = 0;
    if (qchat_render(t, g_ctx, &out, &len, err, sizeof err) == 0) {
        /* the output is exactly len bytes plus a terminator */
        if (out[len] != 0) __builtin_trap();
        free(out);
    } else if (out) {
        __builtin_trap();
    }
    qchat_free(t);
    return 0;
}
