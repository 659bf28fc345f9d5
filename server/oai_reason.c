/* oai_reason.c - a reasoning model's output split into reasoning and content
 * (see oai.h), as vLLM's qwen3 and deepseek_r1 reasoning parsers split it.
 *
 * A state machine over the text as it comes, so that a streamed reply and a
 * whole one split alike: START until the output shows whether it opens with
 * <think> (held back while it could still be that tag), REASON until
 * </think> (a tail that could be the start of it is held back), then
 * CONTENT to the end.  The tags themselves go to neither part. */
#define _GNU_SOURCE
#include "oai.h"

#include <stdlib.h>
#include <string.h>

#include "buf.h"

static const char OPEN[] = "<think>", CLOSE[] = "</think>";

enum { ST_START, ST_REASON, ST_CONTENT };

struct qoai_reason {
    qoai_reason_kind kind;
    int state;
    int prompt_in_think;
    char *hold;              /* text seen but not yet given to a part */
    size_t n_hold, cap_hold;
    char *out[2];            /* the parts of the last feed: reasoning, content */
    size_t n_out[2], cap_out[2];
    int failed;
};

qoai_reason_kind qoai_reason_named(const char *name)
{
    if (!name || !strcmp(name, "none")) return QOAI_REASON_NONE;
    if (!strcmp(name, "qwen3")) return QOAI_REASON_QWEN3;
    if (!strcmp(name, "deepseek_r1")) return QOAI_REASON_DEEPSEEK_R1;
    return (qoai_reason_kind)-1;
}

qoai_reason_kind qoai_reason_of(const char *tmpl)
{
    return tmpl && strstr(tmpl, CLOSE) ? QOAI_REASON_QWEN3 : QOAI_REASON_NONE;
}

int qoai_prompt_in_think(const char *text, size_t len)
{
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' ' || text[len - 1] == '\r' || text[len - 1] == '\t'))
        len--;
    const size_t k = sizeof OPEN - 1;
    return len >= k && !memcmp(text + len - k, OPEN, k);
}

qoai_reason *qoai_reason_new(qoai_reason_kind kind, int prompt_in_think)
{
    if (kind == QOAI_REASON_NONE) return NULL;
    qoai_reason *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->kind = kind;
    p->prompt_in_think = prompt_in_think;
    p->state = ST_START;
    return p;
}

void qoai_reason_free(qoai_reason *p)
{
    if (!p) return;
    free(p->hold);
    free(p->out[0]);
    free(p->out[1]);
    free(p);
}

static void put(qoai_reason *p, int part, const char *s, size_t n)
{
    if (n && q_append(&p->out[part], &p->n_out[part], &p->cap_out[part], s, n)) p->failed = 1;
}

/* The length of the longest tail of s (n bytes) that is a proper prefix of tag. */
static size_t partial_tail(const char *s, size_t n, const char *tag)
{
    const size_t t = strlen(tag);
    for (size_t k = n < t - 1 ? n : t - 1; k > 0; k--)
        if (!memcmp(s + n - k, tag, k)) return k;
    return 0;
}

int qoai_reason_feed(qoai_reason *p, const char *s, size_t n, int last)
{
    p->n_out[0] = p->n_out[1] = 0;
    if (n && q_append(&p->hold, &p->n_hold, &p->cap_hold, s, n)) return p->failed = 1, QERR_NOMEM;
    const char *h = p->hold;
    size_t left = p->n_hold;
    const size_t ko = sizeof OPEN - 1, kc = sizeof CLOSE - 1;
    for (;;) {
        if (p->state == ST_START) {
            /* Still possibly the opening tag: wait for more. */
            if (!last && left < ko && !memcmp(h, OPEN, left)) break;
            if (left >= ko && !memcmp(h, OPEN, ko)) {
                h += ko, left -= ko;
                p->state = ST_REASON;
            } else {
                p->state = p->kind == QOAI_REASON_DEEPSEEK_R1 || p->prompt_in_think ? ST_REASON : ST_CONTENT;
            }
            continue;
        }
        if (p->state == ST_REASON) {
            const char *e = memmem(h, left, CLOSE, kc);
            if (e) {
                put(p, 0, h, (size_t)(e - h));
                left -= (size_t)(e - h) + kc, h = e + kc;
                p->state = ST_CONTENT;
                continue;
            }
            const size_t keep = last ? 0 : partial_tail(h, left, CLOSE);
            put(p, 0, h, left - keep);
            h += left - keep, left = keep;
            break;
        }
        put(p, 1, h, left);
        h += left, left = 0;
        break;
    }
    memmove(p->hold, h, left);
    p->n_hold = left;
    return p->failed ? QERR_NOMEM : 0;
}

const char *qoai_reason_part(const qoai_reason *p, int content, size_t *len)
{
    *len = p->n_out[content ? 1 : 0];
    return *len ? p->out[content ? 1 : 0] : "";
}
