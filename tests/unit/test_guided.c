/* test_guided.c - guided decoding in the engine (engine.c with
 * grammar/): on the bundled stories260K model, greedy and sampled requests
 * (temperature 1, several seeds, n = 3) under JSON schemas finish with
 * output that the schema's grammar takes whole and that parses as JSON
 * whenever they finish with "stop"; max_tokens that runs out mid-structure
 * finishes with "length"; requests with and without a grammar run in one
 * batch; with n-gram drafts and with the draft model's (stories260K cut
 * to 4 layers), greedy outputs are the same and sampled ones valid. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "gram.h"
#include "model.h"
#include "qtest.h"
#include "schema.h"
#include "tokenizer.h"

static qmodel *g_model, *g_draft;
static qtok *g_tok;
static gram_vocab *g_vocab;

typedef struct {
    char text[4096];
    size_t len;
    qfinish fin;
    int n_tok;
} out_t;

/* Runs requests (one per params) to the end; outputs by request and sample. */
static void run(qengine *e, qreq_params *ps, int n, out_t (*out)[3])
{
    uint64_t ids[64];
    REQUIRE(n <= 64);
    char err[256];
    for (int i = 0; i < n; i++) {
        memset(out[i], 0, sizeof out[i]);
        REQUIRE(qengine_submit(e, &ps[i], &ids[i], err, sizeof err) == 0);
    }
    for (int live = 1, steps = 0; live > 0 && steps < 20000; steps++) {
        live = qengine_step(e);
        qevent ev;
        while (qengine_poll(e, &ev)) {
            for (int i = 0; i < n; i++) {
                if (ids[i] != ev.id || ev.index < 0 || ev.index > 2) continue;
                out_t *o = &out[i][ev.index];
                if (ev.text_len && o->len + ev.text_len < sizeof o->text) {
                    memcpy(o->text + o->len, ev.text, ev.text_len);
                    o->len += ev.text_len;
                }
                if (ev.finish == QFINISH_NONE) o->n_tok++;
                else o->fin = ev.finish;
            }
            qevent_free(&ev);
        }
    }
}

static gram *schema(const char *text)
{
    json_t *s = json_loads(text, JSON_DECODE_ANY, NULL);
    gram *g = NULL;
    char err[800];
    if (!s || gram_schema_compile(s, &g, err, sizeof err)) fprintf(stderr, "  schema: %s\n", s ? err : "bad JSON");
    json_decref(s);
    return g;
}

/* 1 when text is a sentence of g and parses as JSON. */
static int valid(const gram *g, const out_t *o)
{
    gram_m *m = gram_m_new(g);
    const int ok = m && gram_m_feed(m, (const uint8_t *)o->text, o->len) == 0 && gram_m_can_end(m);
    gram_m_free(m);
    json_t *j = json_loadb(o->text, o->len, JSON_DECODE_ANY, NULL);
    json_decref(j);
    return ok && j != NULL;
}

/* The schemas both tests run. */
static const char *const S[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":12},\"age\":{\"type\":\"integer\","
    "\"minimum\":0,\"maximum\":120},\"happy\":{\"type\":\"boolean\"}},\"required\":[\"name\",\"age\",\"happy\"],"
    "\"additionalProperties\":false}",
    "{\"type\":\"array\",\"items\":{\"enum\":[\"red\",\"green\",\"blue\"]},\"minItems\":1,\"maxItems\":4}",
    "{\"type\":\"object\",\"properties\":{\"when\":{\"type\":\"string\",\"format\":\"date\"},\"tags\":{\"type\":\"array\","
    "\"items\":{\"type\":\"string\",\"pattern\":\"^[a-z]{1,5}$\"},\"maxItems\":3}},\"required\":[\"when\",\"tags\"],"
    "\"additionalProperties\":false}",
};

static void test_schemas(void)
{
    qengine_opts o;
    qengine_opts_default(&o);
    o.device = QDEVICE_CPU;
    o.n_threads = 2;
    o.num_blocks = 256;
    qengine *e = NULL;
    char err[256];
    REQUIRE(qengine_create(g_model, g_tok, &o, &e, err, sizeof err) == 0);
    int32_t prompt[8];
    int np = 0;
    int32_t *ids = NULL;
    REQUIRE(qtok_encode(g_tok, "Once", 4, 1, &ids, &np) == 0);
    memcpy(prompt, ids, sizeof *prompt * (size_t)np);
    free(ids);
    int stops = 0, total = 0;
    for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
        gram *g = schema(S[si]);
        REQUIRE(g);
        /* Greedy, three seeds at temperature 1 with n = 3, and free text. */
        qreq_params ps[5];
        for (int i = 0; i < 5; i++) {
            ps[i] = (qreq_params){ .prompt = prompt, .n_prompt = np, .sp = qsample_defaults(), .max_tokens = 300 };
            ps[i].grammar = i < 4 ? g : NULL;
            ps[i].grammar_vocab = i < 4 ? g_vocab : NULL;
            if (i > 0) ps[i].sp.temperature = 1.0f, ps[i].sp.seed = 100 + (uint64_t)i, ps[i].n = 3;
        }
        out_t out[5][3];
        run(e, ps, 5, out);
        for (int i = 0; i < 4; i++)
            for (int k = 0; k < (i ? 3 : 1); k++) {
                const out_t *r = &out[i][k];
                total++;
                CHECK(r->fin == QFINISH_STOP || r->fin == QFINISH_LENGTH);
                if (r->fin != QFINISH_STOP) continue;
                stops++;
                if (!valid(g, r)) fprintf(stderr, "  schema %zu: not valid: %.*s\n", si, (int)r->len, r->text);
                CHECK(valid(g, r));
            }
        CHECK(out[4][0].n_tok > 0); /* free text ran beside them */
        if (si == 0) fprintf(stderr, "  e.g. %.*s\n", (int)out[0][0].len, out[0][0].text);
        gram_free(g);
    }
    fprintf(stderr, "  %d of %d finished with stop, all valid\n", stops, total);
    CHECK(stops >= total / 2);
    /* Every mask was made on the guide thread while the forward pass ran. */
    qengine_stats st;
    qengine_stats_get(e, &st);
    fprintf(stderr, "  %llu masks, %llu of them during the forward pass\n", (unsigned long long)st.masks,
            (unsigned long long)st.masks_overlapped);
    CHECK(st.masks > 100 && st.masks_overlapped == st.masks);
    /* max_tokens runs out inside the structure: "length", not "stop". */
    gram *g = schema(S[0]);
    qreq_params p = { .prompt = prompt, .n_prompt = np, .sp = qsample_defaults(), .max_tokens = 3, .grammar = g,
                      .grammar_vocab = g_vocab };
    out_t out[1][3];
    run(e, &p, 1, out);
    CHECK(out[0][0].fin == QFINISH_LENGTH);
    CHECK(out[0][0].len > 0 && out[0][0].text[0] == '{');
    /* A grammar without its vocabulary is refused. */
    p.grammar_vocab = NULL;
    uint64_t id;
    CHECK(qengine_submit(e, &p, &id, err, sizeof err) == QERR_INVAL);
    gram_free(g);
    char check[256];
    CHECK(qengine_check(e, check, sizeof check) == 0);
    qengine_destroy(e);
}

/* An engine on the CPU: without drafts (spec QSPEC_NONE), or drafting up
 * to k tokens in every step by the proposer spec. */
static qengine *spec_engine(int spec, int k)
{
    qengine_opts o;
    qengine_opts_default(&o);
    o.device = QDEVICE_CPU;
    o.n_threads = 2;
    o.num_blocks = 1024;
    o.spec_mode = spec;
    o.draft = spec == QSPEC_DRAFT ? g_draft : NULL;
    o.spec_k = k;
    o.spec_max_batch = 1000;
    o.spec_always = 1;
    qengine *e = NULL;
    char err[256];
    if (qengine_create(g_model, g_tok, &o, &e, err, sizeof err)) fprintf(stderr, "  create: %s\n", err);
    return e;
}

static int same_out(const out_t *a, const out_t *b)
{
    return a->fin == b->fin && a->len == b->len && !memcmp(a->text, b->text, a->len);
}

/* Drafts under a grammar (drafts it refuses are dropped, each draft row
 * masked), n-gram and the draft model's, k 1, 2, 4 and 8: for 50 prompts
 * (4 of text, 46 of random ids) under each schema, greedy outputs equal
 * those without drafts, batched and (k 4) one at a time; sampled ones stay
 * valid; drafts are made and kept; every block comes back. */
static void test_spec_schemas(void)
{
    static const char *const TEXTS[] = { "Once", "Tom and Tom and", "The list:", "red green blue red" };
    enum { NP = 50, NS = 2, N = NP + NS };
    static int32_t ids[NP][24];
    int32_t *pr[NP];
    int np[NP];
    uint64_t x = 99;
    for (int i = 0; i < NP; i++) {
        if (i < 4) {
            REQUIRE(qtok_encode(g_tok, TEXTS[i], strlen(TEXTS[i]), 1, &pr[i], &np[i]) == 0);
            continue;
        }
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        np[i] = 1 + (int)((x >> 33) % 24);
        ids[i][0] = 1;
        for (int t = 1; t < np[i]; t++) {
            x = x * 6364136223846793005ULL + 1442695040888963407ULL;
            ids[i][t] = 259 + (int32_t)((x >> 33) % 253); /* no byte tokens: no half character before the output */
        }
        pr[i] = ids[i];
    }
    static const int KS[] = { 1, 2, 4, 8 };
    enum { NK = sizeof KS / sizeof KS[0] };
    static out_t a[N][3], b[N][3];
    uint64_t drafted[2] = { 0, 0 }, kept[2] = { 0, 0 };
    for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
        gram *g = schema(S[si]);
        REQUIRE(g);
        /* Greedy from each prompt, and two sampled ones. */
        qreq_params ps[N];
        for (int i = 0; i < N; i++) {
            ps[i] = (qreq_params){ .prompt = pr[i % NP], .n_prompt = np[i % NP], .sp = qsample_defaults(),
                                   .max_tokens = 96, .grammar = g, .grammar_vocab = g_vocab };
            if (i < NP) ps[i].sp.temperature = 0;
            else ps[i].sp.seed = 7 + (uint64_t)i;
        }
        qengine *e0 = spec_engine(QSPEC_NONE, 4);
        REQUIRE(e0);
        run(e0, ps, N, a);
        qengine_destroy(e0);
        for (int p = 0; p < 2; p++) {
            const int spec = p ? QSPEC_DRAFT : QSPEC_NGRAM;
            for (int ki = 0; ki < NK; ki++) {
                qengine *e = spec_engine(spec, KS[ki]);
                REQUIRE(e);
                run(e, ps, N, b);
                int bad = 0;
                for (int i = 0; i < NP; i++)
                    if (!same_out(&a[i][0], &b[i][0]) && !bad++)
                        fprintf(stderr, "  %s, k %d, schema %zu prompt %d: %.*s | %.*s\n", qspec_mode_name(spec), KS[ki], si,
                                i, (int)a[i][0].len, a[i][0].text, (int)b[i][0].len, b[i][0].text);
                CHECK(bad == 0);
                for (int i = 0; i < N; i++)
                    if (b[i][0].fin == QFINISH_STOP) CHECK(valid(g, &b[i][0]));
                /* One at a time (k 4), in the same engine. */
                for (int i = 0; KS[ki] == 4 && i < NP; i++) {
                    out_t one[1][3];
                    run(e, &ps[i], 1, one);
                    CHECK(same_out(&a[i][0], &one[0][0]));
                }
                qengine_stats st;
                qengine_stats_get(e, &st);
                drafted[p] += st.spec_drafted, kept[p] += st.spec_accepted;
                char check[256];
                CHECK(qengine_check(e, check, sizeof check) == 0);
                CHECK(st.kv_used == 0);
                qengine_destroy(e);
            }
        }
        gram_free(g);
    }
    for (int p = 0; p < 2; p++) {
        fprintf(stderr, "  %s: %llu drafted, %llu kept\n", p ? "the draft model's drafts" : "n-gram drafts",
                (unsigned long long)drafted[p], (unsigned long long)kept[p]);
        CHECK(drafted[p] > 0 && kept[p] > 0);
    }
    for (int i = 0; i < 4; i++) free(pr[i]);
}

/* Mistral's [TOOL_CALLS] is a special token: masked in the plain grammar
 * vocabulary, allowed in the one with the marker where the grammar writes
 * "[TOOL_CALLS]", and its text kept by a detokenizer that keeps specials
 * (the serve path for tool requests). */
static void test_special_markers(void)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/tests/fixtures/tokenizers/mistral-v0.3/tokenizer.json", qt_root());
    qtok *tok = NULL;
    REQUIRE(qtok_load_json(path, &tok, err, sizeof err) == 0);
    const int id = qtok_token_to_id(tok, "[TOOL_CALLS]", 12);
    REQUIRE(id > 0 && qtok_is_special(tok, id));
    static const char *const allow[] = { "[TOOL_CALLS]", "<tool_call>", NULL };
    gram_vocab *plain = NULL, *with = NULL;
    int n = -1;
    REQUIRE(qengine_grammar_vocab(tok, &plain) == 0);
    REQUIRE(qengine_grammar_vocab_with(tok, allow, &n, &with) == 0);
    CHECK_EQ_INT(n, 1); /* Mistral has no <tool_call> */
    json_t *p = json_loads("{\"type\":\"object\",\"properties\":{\"c\":{\"type\":\"string\"}},\"required\":[\"c\"]}", 0,
                           NULL);
    const gram_tool tools[1] = { { "f", 1, p } };
    const gram_tools_opts o = { GRAM_TOOLS_MISTRAL, 0, 0, 0 };
    gram *g = NULL;
    REQUIRE(gram_tools_grammar_opts(tools, 1, &o, NULL, &g, err, sizeof err) == 0);
    const int nv = qtok_vocab_size(tok);
    uint32_t *mask = calloc(((size_t)nv + 31) / 32, sizeof *mask);
    gram_m *m = gram_m_new(g);
    REQUIRE(mask && m);
    const int bracket = qtok_token_to_id(tok, "[", 1);
    REQUIRE(gram_m_mask(m, plain, mask) == 0);
    CHECK(!(mask[id / 32] >> (id % 32) & 1));
    CHECK(bracket < 0 || (mask[bracket / 32] >> (bracket % 32) & 1));
    REQUIRE(gram_m_mask(m, with, mask) == 0);
    CHECK(mask[id / 32] >> (id % 32) & 1);
    /* The token then the rest of the call: the grammar takes it. */
    REQUIRE(gram_m_feed_token(m, with, id) == 0);
    static const char rest[] = " [{\"name\": \"f\", \"arguments\": {\"c\":\"x\"}}]";
    CHECK(gram_m_feed(m, (const uint8_t *)rest, sizeof rest - 1) == 0 && gram_m_can_end(m));
    /* Its text: kept when specials are, dropped otherwise. */
    for (int keep = 0; keep < 2; keep++) {
        qdetok *d = qdetok_new(tok, keep ? 0 : QTOK_SKIP_SPECIAL);
        REQUIRE(d);
        const char *t = NULL;
        size_t tl = 0;
        REQUIRE(qdetok_push(d, id, &t, &tl) == 0);
        if (keep) CHECK(tl == 12 && !memcmp(t, "[TOOL_CALLS]", 12));
        else CHECK(tl == 0);
        qdetok_free(d);
    }
    gram_m_free(m);
    gram_free(g);
    free(mask);
    json_decref(p);
    gram_vocab_free(plain);
    gram_vocab_free(with);
    qtok_free(tok);
}

int main(void)
{
    char path[1024], err[256];
    snprintf(path, sizeof path, "%s/models/stories260K.gguf", qt_root());
    if (qmodel_load(path, &g_model, err, sizeof err) || qtok_for_model(g_model, &g_tok, err, sizeof err) ||
        qengine_grammar_vocab(g_tok, &g_vocab)) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return 1;
    }
    snprintf(path, sizeof path, "%s/tests/fixtures/models/stories260K-draft4.gguf", qt_root());
    if (qmodel_load(path, &g_draft, err, sizeof err)) {
        fprintf(stderr, "cannot load %s: %s\n", path, err);
        return 1;
    }
    QT_RUN(test_schemas);
    QT_RUN(test_spec_schemas);
    QT_RUN(test_special_markers);
    gram_vocab_free(g_vocab);
    qtok_free(g_tok);
    qmodel_destroy(g_model);
    qmodel_destroy(g_draft);
    QT_MAIN_END();
}
