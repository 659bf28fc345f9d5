/* opts.c - parses argv and prints --help from a subcommand's table of
 * flags (opts.h), so the two cannot drift apart. */
#include "opts.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void qopt_usage(FILE *f, const qopt *table, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const qopt *g = &table[i];
        char left[64];
        snprintf(left, sizeof left, "%s%s%s%s%s", g->s ? g->s : "", g->s ? ", " : "    ", g->l,
                 g->arg ? " " : "", g->arg ? g->arg : "");
        fprintf(f, "  %-26s %s\n", left, g->help);
    }
}

static int parse_num(const char *cmd, const char *flag, const char *s, qopt_kind kind, void *out)
{
    char *end;
    errno = 0;
    if (kind == OPT_INT) {
        long v = strtol(s, &end, 10);
        if (errno || *end || end == s || v < INT_MIN || v > INT_MAX) goto bad;
        *(int *)out = (int)v;
    } else if (kind == OPT_U64) {
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || *end || end == s || s[0] == '-') goto bad;
        *(uint64_t *)out = v;
    } else {
        float v = strtof(s, &end);
        if (errno || *end || end == s) goto bad;
        *(float *)out = v;
    }
    return 0;
bad:
    fprintf(stderr, "quire %s: %s: invalid number '%s'\n", cmd, flag, s);
    return -1;
}

int qopt_parse(const char *cmd, const qopt *table, size_t n, int argc, char **argv, void *dst)
{
    const qopt_set one = { table, n, 0 };
    return qopt_parse_sets(cmd, &one, 1, argc, argv, dst);
}

void qopt_usage_sets(FILE *f, const qopt_set *sets, size_t n_sets)
{
    for (size_t i = 0; i < n_sets; i++) qopt_usage(f, sets[i].table, sets[i].n);
}

int qopt_parse_sets(const char *cmd, const qopt_set *sets, size_t n_sets, int argc, char **argv, void *dst)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const qopt *g = NULL;
        size_t base = 0;
        for (size_t s = 0; s < n_sets && !g; s++)
            for (size_t k = 0; k < sets[s].n && !g; k++) {
                const qopt *t = &sets[s].table[k];
                if ((t->s && !strcmp(a, t->s)) || !strcmp(a, t->l)) g = t, base = sets[s].off;
            }
        if (!g) {
            fprintf(stderr, "quire %s: unknown option '%s' (see --help)\n", cmd, a);
            return -1;
        }
        void *field = (char *)dst + base + g->off;
        if (g->kind == OPT_FLAG) {
            *(int *)field = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "quire %s: %s needs a value\n", cmd, a);
            return -1;
        }
        const char *v = argv[++i];
        if (g->kind == OPT_STR) *(const char **)field = v;
        else if (parse_num(cmd, a, v, g->kind, field)) return -1;
    }
    return 0;
}
