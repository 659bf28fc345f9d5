/* test_reason.c - reasoning split from content (server/oai_reason.c), as
 * vLLM's qwen3 and deepseek_r1 reasoning parsers split it: whole, and fed
 * in every cut (a byte at a time, the tags split anywhere) with the same
 * parts; the prompt's open <think>; the reply objects that carry it. */
#include <string.h>

#include "oai.h"
#include "qtest.h"

typedef struct {
    char r[256], c[256];
    size_t rn, cn;
} parts;

/* Feeds s in pieces of step bytes (0: whole) and collects both parts. */
static parts split(qoai_reason_kind kind, int in_think, const char *s, size_t step)
{
    parts p = { .rn = 0 };
    qoai_reason *q = qoai_reason_new(kind, in_think);
    CHECK(q != NULL);
    if (!q) return p;
    const size_t n = strlen(s);
    if (!step) step = n ? n : 1;
    for (size_t at = 0; at <= n; at += step) {
        const size_t k = at + step <= n ? step : n - at;
        const int last = at + step >= n;
        CHECK_EQ_INT(qoai_reason_feed(q, s + at, k, last), 0);
        size_t l;
        const char *t = qoai_reason_part(q, 0, &l);
        memcpy(p.r + p.rn, t, l), p.rn += l;
        t = qoai_reason_part(q, 1, &l);
        memcpy(p.c + p.cn, t, l), p.cn += l;
        if (last) break;
    }
    qoai_reason_free(q);
    p.r[p.rn] = p.c[p.cn] = 0;
    return p;
}

static void expect(qoai_reason_kind kind, int in_think, const char *s, const char *r, const char *c)
{
    for (size_t step = 0; step <= 9; step++) {
        parts p = split(kind, in_think, s, step);
        if (strcmp(p.r, r) || strcmp(p.c, c))
            fprintf(stderr, "  %s (kind %d, in_think %d, step %zu): reasoning '%s' content '%s'\n", s, kind, in_think,
                    step, p.r, p.c);
        CHECK(!strcmp(p.r, r) && !strcmp(p.c, c));
    }
}

static void test_split(void)
{
    /* qwen3: <think> opens reasoning; without it the output is content. */
    expect(QOAI_REASON_QWEN3, 0, "<think>\nLet me see.\n</think>\n\nIt is 4.", "\nLet me see.\n", "\n\nIt is 4.");
    expect(QOAI_REASON_QWEN3, 0, "It is 4.", "", "It is 4.");
    expect(QOAI_REASON_QWEN3, 0, "<thin", "", "<thin");           /* not the tag after all */
    expect(QOAI_REASON_QWEN3, 0, "x</think>y", "", "x</think>y"); /* content throughout */
    expect(QOAI_REASON_QWEN3, 0, "<think>cut off by max_tokens </thi", "cut off by max_tokens </thi", "");
    expect(QOAI_REASON_QWEN3, 0, "<think></think>", "", "");
    /* The template opened the block in the prompt. */
    expect(QOAI_REASON_QWEN3, 1, "hmm</think>ok", "hmm", "ok");
    expect(QOAI_REASON_QWEN3, 1, "<think>hmm</think>ok", "hmm", "ok");
    /* deepseek_r1: reasoning from the start. */
    expect(QOAI_REASON_DEEPSEEK_R1, 0, "step 1</think>answer", "step 1", "answer");
    expect(QOAI_REASON_DEEPSEEK_R1, 0, "all reasoning", "all reasoning", "");
    /* A second </think> is content. */
    expect(QOAI_REASON_QWEN3, 0, "<think>a</think>b</think>c", "a", "b</think>c");

    CHECK(qoai_reason_new(QOAI_REASON_NONE, 0) == NULL);
    CHECK(qoai_reason_named("qwen3") == QOAI_REASON_QWEN3 && qoai_reason_named("deepseek_r1") == QOAI_REASON_DEEPSEEK_R1);
    CHECK(qoai_reason_named("none") == QOAI_REASON_NONE && (int)qoai_reason_named("bogus") < 0);
    CHECK(qoai_reason_of("{{ x }}</think>") == QOAI_REASON_QWEN3 && qoai_reason_of("{{ x }}") == QOAI_REASON_NONE);
    CHECK(qoai_reason_of(NULL) == QOAI_REASON_NONE);
    const char *p1 = "<|im_start|>assistant\n<think>\n", *p2 = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    CHECK(qoai_prompt_in_think(p1, strlen(p1)) && !qoai_prompt_in_think(p2, strlen(p2)));
    CHECK(!qoai_prompt_in_think("", 0) && qoai_prompt_in_think("<think>", 7));
}

static void test_reply(void)
{
    qoai_reply chat = { QOAI_CHAT, "chatcmpl-1", 1, "m" };
    qoai_choice ch[2] = { { "It is 4.", 8, "stop", NULL, NULL, "Let me see.", 11 },
                          { "", 0, "length", NULL, NULL, "", 0 } };
    json_t *resp = qoai_response(&chat, ch, 2, qoai_usage(4, 2, 0, 0, NULL));
    REQUIRE(resp);
    json_t *m0 = json_object_get(json_array_get(json_object_get(resp, "choices"), 0), "message");
    json_t *m1 = json_object_get(json_array_get(json_object_get(resp, "choices"), 1), "message");
    CHECK(!strcmp(json_string_value(json_object_get(m0, "content")), "It is 4."));
    CHECK(!strcmp(json_string_value(json_object_get(m0, "reasoning_content")), "Let me see."));
    CHECK(!strcmp(json_string_value(json_object_get(m0, "reasoning")), "Let me see."));
    CHECK(json_is_null(json_object_get(m1, "content")) && json_is_null(json_object_get(m1, "reasoning_content")));
    json_decref(resp);
}

int main(void)
{
    QT_RUN(test_split);
    QT_RUN(test_reply);
    QT_MAIN_END();
}
