/* oai_int.h - what the request-parsing files share (server internal):
 * oai.c, oai_fields.c, oai_tools.c, oai_tokenize.c. */
#ifndef QUIRE_OAI_INT_H
#define QUIRE_OAI_INT_H

#include "oai.h"

/* The field k of o, NULL when absent or null. */
json_t *qoai_field(json_t *o, const char *k);
/* A boolean field: 1 when present (value in *out), 0 when absent, < 0 with
 * *e filled. */
int qoai_flag(json_t *o, const char *k, int *out, qoai_error *e);
/* The body's model (if it names one) checked against lim's names: 0, or
 * 400 (not a string) / 404 model_not_found in *e. */
int qoai_model_check(json_t *o, const qoai_limits *lim, qoai_error *e);

#endif
