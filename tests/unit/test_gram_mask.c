/* test_gram_mask.c - token masks over real vocabularies (grammar/gram.c
 * with engine/text/tok_decode.c's qtok_token_bytes), for the gpt2 (byte-level
 * BPE, 50k) and llama-spm (SentencePiece with byte fallback, 32k)
 * tokenizers of tests/fixtures:
 *   - a token's bytes, concatenated over an encoding, give back the text;
 *   - the mask equals, token for token, what the matcher allows (brute
 *     force) at the start and along an instance;
 *   - an instance is produced token by token from masks alone (longest
 *     allowed token that continues it), and completes;
 *   - rollback by tokens restores the mask. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gram.h"
#include "qerr.h"
#include "qtest.h"
#include "schema.h"
#include "tokenizer.h"
#include "util.h"

static const char *const TOKS[] = { "gpt2", "llama-spm" };

static qtok *load(const char *name)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizers/%s/tokenizer.json", qt_root(), name);
    qtok *t = NULL;
    if (qtok_load_json(path, &t, err, sizeof err)) fprintf(stderr, "  %s: %s\n", path, err);
    return t;
}

/* The grammar vocabulary of t; special tokens skipped. */
static gram_vocab *vocab_of(const qtok *t)
{
    const int n = qtok_vocab_size(t);
    uint8_t **bytes = calloc((size_t)n, sizeof *bytes), *skip = calloc((size_t)n, 1);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    char buf[512];
    for (int i = 0; i < n; i++) {
        const int l = qtok_token_bytes(t, i, buf, sizeof buf);
        skip[i] = l <= 0 || qtok_is_special(t, i);
        if (l > 0) {
            bytes[i] = malloc((size_t)l);
            memcpy(bytes[i], buf, (size_t)l);
            lens[i] = (size_t)l;
        }
    }
    gram_vocab *v = NULL;
    gram_vocab_new(n, (const uint8_t *const *)bytes, lens, skip, &v);
    for (int i = 0; i < n; i++) free(bytes[i]);
    free(bytes);
    free(skip);
    free(lens);
    return v;
}

static void test_token_bytes(void)
{
    static const char *const texts[] = { "{\"name\":\"Zoë \\\"Q\\\"\",\"age\":42}", "Hello, world! 日本語 😀 tabs\tand\nnewlines",
                                         "[1,2.5e-3,true,null]" };
    for (size_t ti = 0; ti < 2; ti++) {
        qtok *t = load(TOKS[ti]);
        REQUIRE(t);
        for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
            int32_t *ids = NULL;
            int n = 0;
            REQUIRE(qtok_encode(t, texts[k], strlen(texts[k]), 0, &ids, &n) == 0);
            char out[1024];
            size_t ol = 0;
            for (int i = 0; i < n; i++) {
                const int l = qtok_token_bytes(t, ids[i], out + ol, sizeof out - ol);
                REQUIRE(l >= 0);
                ol += (size_t)l;
            }
            /* SentencePiece puts a word marker before the first word. */
            const size_t tl = strlen(texts[k]);
            const int same = (ol == tl && !memcmp(out, texts[k], tl)) ||
                             (ol == tl + 1 && out[0] == ' ' && !memcmp(out + 1, texts[k], tl));
            if (!same) fprintf(stderr, "  %s: \"%.*s\" for \"%s\"\n", TOKS[ti], (int)ol, out, texts[k]);
            CHECK(same);
            free(ids);
        }
        char b[8];
        CHECK_EQ_INT(qtok_token_bytes(t, -1, b, sizeof b), QERR_RANGE);
        CHECK_EQ_INT(qtok_token_bytes(t, qtok_vocab_size(t) + 5, b, sizeof b), QERR_RANGE);
        qtok_free(t);
    }
}

/* Schemas and an instance of each, fed token by token from the masks.  The
 * second lists more properties than take a rule per set given: the
 * matcher's sets of members decide, out of the schema's order. */
static const struct {
    const char *schema, *instance;
} CASES[] = {
    { "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
      "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":150},"
      "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bb\"]}}},\"required\":[\"name\"]}",
      "{\"name\":\"Zoë \\\"Q\\\" 日本\",\"age\":42,\"tags\":[\"a\",\"bb\"]}" },
    { "{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"name\":{\"type\":\"string\"},"
      "\"email\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},\"city\":{\"type\":\"string\"},"
      "\"zip\":{\"type\":\"string\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
      "\"parent\":{\"$ref\":\"#\"}},\"required\":[\"id\",\"name\"],\"additionalProperties\":false}",
      "{\"zip\":\"02139\",\"name\":\"Ann\",\"parent\":{\"name\":\"Bo\",\"tags\":[],\"id\":1},\"id\":7,"
      "\"city\":\"Oslo\",\"tags\":[\"x\"],\"age\":3,\"email\":\"a@b\"}" },
};

/* The mask against the matcher token by token: the tokens that differ. */
static int brute_diff(gram_m *m, const gram_vocab *v, const qtok *t, const uint32_t *mask)
{
    int diff = 0;
    char buf[512];
    for (int i = 0; i < gram_vocab_size(v); i++) {
        const int l = qtok_token_bytes(t, i, buf, sizeof buf);
        const int want = l > 0 && !qtok_is_special(t, i) && gram_m_allows(m, (const uint8_t *)buf, (size_t)l);
        const int got = (mask[i / 32] >> (i % 32)) & 1;
        if (want != got && diff++ < 3) fprintf(stderr, "  token %d \"%.*s\": mask %d, matcher %d\n", i, l, buf, got, want);
    }
    return diff;
}

static void test_masks_of(const char *schema, const char *instance, int check_every)
{
    json_t *s = json_loads(schema, 0, NULL);
    gram *g = NULL;
    char err[800];
    REQUIRE(gram_schema_compile(s, &g, err, sizeof err) == 0);
    json_decref(s);
    for (size_t ti = 0; ti < 2; ti++) {
        qtok *t = load(TOKS[ti]);
        REQUIRE(t);
        gram_vocab *v = vocab_of(t);
        REQUIRE(v);
        const int n = gram_vocab_size(v);
        uint32_t *mask = calloc(((size_t)n + 31) / 32, sizeof *mask);
        gram_m *m = gram_m_new(g);
        REQUIRE(m && mask);
        /* Token by token from the masks: the longest allowed token that
         * continues the instance. */
        const size_t il = strlen(instance);
        size_t at = 0;
        int steps = 0, checked = 0, chosen[200];
        double t_mask = 0;
        char buf[512];
        while (at < il && steps < 200) {
            const double t0 = q_now();
            REQUIRE(gram_m_mask(m, v, mask) == 0);
            t_mask += q_now() - t0;
            if (steps % check_every == 0 || steps == 3 || steps == 7) { /* against the matcher, all tokens */
                CHECK_EQ_INT(brute_diff(m, v, t, mask), 0);
                checked++;
            }
            int best = -1, best_len = 0;
            for (int i = 0; i < n; i++) {
                if (!((mask[i / 32] >> (i % 32)) & 1)) continue;
                const int l = qtok_token_bytes(t, i, buf, sizeof buf);
                if (l > best_len && (size_t)l <= il - at && !memcmp(buf, instance + at, (size_t)l)) best = i, best_len = l;
            }
            if (best < 0) {
                fprintf(stderr, "  %s: no allowed token continues at %zu: %s\n", TOKS[ti], at, instance + at);
                break;
            }
            REQUIRE(gram_m_feed_token(m, v, best) == 0);
            chosen[steps] = best;
            at += (size_t)best_len;
            steps++;
        }
        CHECK(at == il);
        CHECK(gram_m_can_end(m) && gram_m_done(m));
        CHECK(checked >= 3);
        /* Once more: the grammar has the token classes of its states now
         * (a new matcher, so no frontier is cached). */
        gram_m *m2 = gram_m_new(g);
        double t_again = 0;
        for (int k = 0; k < steps; k++) {
            const double t0 = q_now();
            REQUIRE(gram_m_mask(m2, v, mask) == 0);
            t_again += q_now() - t0;
            REQUIRE(gram_m_feed_token(m2, v, chosen[k]) == 0);
        }
        gram_m_free(m2);
        fprintf(stderr, "  %s: %d tokens, mask %.0f us a token (first), %.0f us with the classes made\n", TOKS[ti], steps,
                1e6 * t_mask / (steps ? steps : 1), 1e6 * t_again / (steps ? steps : 1));
        /* Rollback by tokens gives the same mask as before. */
        gram_m_reset(m);
        uint32_t *m0 = calloc(((size_t)n + 31) / 32, sizeof *m0);
        REQUIRE(gram_m_mask(m, v, m0) == 0);
        int tok = -1;
        for (int i = 0; i < n && tok < 0; i++) {
            const int l = qtok_token_bytes(t, i, buf, sizeof buf);
            if (l == 1 && buf[0] == '{') tok = i;
        }
        REQUIRE(tok >= 0);
        REQUIRE(gram_m_feed_token(m, v, tok) == 0);
        REQUIRE(gram_m_mask(m, v, mask) == 0);
        CHECK(memcmp(mask, m0, ((size_t)n + 31) / 32 * sizeof *mask) != 0);
        CHECK_EQ_INT(gram_m_rollback(m, 1), 0);
        REQUIRE(gram_m_mask(m, v, mask) == 0);
        CHECK(memcmp(mask, m0, ((size_t)n + 31) / 32 * sizeof *mask) == 0);
        free(m0);
        free(mask);
        gram_m_free(m);
        gram_vocab_free(v);
        qtok_free(t);
    }
    gram_free(g);
}

static void test_masks(void)
{
    test_masks_of(CASES[0].schema, CASES[0].instance, 1000);
    test_masks_of(CASES[1].schema, CASES[1].instance, 4);
}

int main(void)
{
    QT_RUN(test_token_bytes);
    QT_RUN(test_masks);
    QT_MAIN_END();
}
