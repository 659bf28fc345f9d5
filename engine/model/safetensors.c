/* safetensors.c - the safetensors container, as Hugging Face writes it.
 *
 * A safetensors file is three parts:
 *
 *     [ N: u64 little-endian ][ N bytes of JSON header ][ data region ]
 *
 * The header is one JSON object.  Each key is a tensor name; its value is
 *
 *     { "dtype": "BF16", "shape": [4096, 4096], "data_offsets": [begin, end] }
 *
 * where begin/end are byte offsets relative to the start of the data region
 * (8 + N), end exclusive, and the tensor is dense and row-major in PyTorch
 * order.  One optional key "__metadata__" maps strings to strings (the
 * writer's "format": "pt" and the like); it is ignored.  The writer pads the
 * header with spaces so that the data region starts 8-byte aligned, but the
 * format does not promise that.
 *
 * What is checked, in order, before anything points into the buffer:
 *   1. the file holds the 8-byte length, and N <= 100 MB (a header larger
 *      than that is hostile or broken) and N <= len - 8;
 *   2. the header is valid JSON (jansson), an object, and no name appears
 *      twice (JSON_REJECT_DUPLICATES: jansson would otherwise keep the last);
 *   3. per tensor: dtype is F32, F16 or BF16 (anything else, I8 or F64 say,
 *      is QERR_UNSUPPORTED naming both); shape is an array of 1..4 non-negative
 *      integers (a 0-dim scalar or a 5-dim tensor is QERR_UNSUPPORTED);
 *      data_offsets is two integers with 0 <= begin <= end <= data size, and
 *      end - begin equals numel * dtype size, every product overflow-checked;
 *   4. qmodel_add_tensor repeats the size check and rejects empty dimensions,
 *      over-long names and duplicates across files.
 *
 * Tensors point into buf, which must outlive the model.  A tensor whose
 * bytes are not aligned to its element size (possible when a writer did not
 * pad the header) is copied into an owned, aligned buffer instead, so that
 * kernels may load elements with plain typed pointers.
 *
 * Every error message names the file (`what`) and, where there is one, the
 * tensor.  On error, tensors added before the failure stay in m; the caller
 * destroys the model.
 */
#include "model.h"
#include "util.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000)
/* Tensor names are printed at most this long in messages. */
#define ST_NAME_SHOWN 200

static int st_dtype(const char *s, qdtype *out)
{
    if (!strcmp(s, "F32")) *out = QDT_F32;
    else if (!strcmp(s, "F16")) *out = QDT_F16;
    else if (!strcmp(s, "BF16")) *out = QDT_BF16;
    else return -1;
    return 0;
}

/* Reads a JSON integer in [0, INT64_MAX] into *out; -1 when v is not one. */
static int st_uint(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -1;
    *out = (uint64_t)x;
    return 0;
}

/* Parses one tensor entry and adds it to m.  data/data_len: the data region. */
static int st_tensor(qmodel *m, const char *name, const json_t *e, const uint8_t *data,
                     size_t data_len, const char *what, char *err, size_t errlen)
{
    const int nl = (int)strnlen(name, ST_NAME_SHOWN);
    if (!json_is_object(e))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: tensor '%.*s': entry is not a JSON object",
                        what, nl, name);

    const json_t *jdt = json_object_get(e, "dtype");
    if (!json_is_string(jdt))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: tensor '%.*s': \"dtype\" missing or not a string",
                        what, nl, name);
    qdtype dt;
    if (st_dtype(json_string_value(jdt), &dt))
        return qerr_set(err, errlen, QERR_UNSUPPORTED,
                        "%s: tensor '%.*s': dtype %.32s is not supported (F32, F16, BF16 only)",
                        what, nl, name, json_string_value(jdt));

    const json_t *jshape = json_object_get(e, "shape");
    if (!json_is_array(jshape))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: tensor '%.*s': \"shape\" missing or not an array",
                        what, nl, name);
    size_t ndim = json_array_size(jshape);
    if (ndim == 0 || ndim > QT_MAX_DIMS)
        return qerr_set(err, errlen, QERR_UNSUPPORTED,
                        "%s: tensor '%.*s': %zu dimensions are not supported (1..%d)",
                        what, nl, name, ndim, QT_MAX_DIMS);
    int64_t shape[QT_MAX_DIMS];
    size_t numel = 1;
    for (size_t i = 0; i < ndim; i++) {
        uint64_t d;
        if (st_uint(json_array_get(jshape, i), &d))
            return qerr_set(err, errlen, QERR_FORMAT,
                            "%s: tensor '%.*s': shape entry %zu is not a non-negative integer",
                            what, nl, name, i);
        if (d > SIZE_MAX || q_mul_overflow(numel, (size_t)d, &numel))
            return qerr_set(err, errlen, QERR_FORMAT, "%s: tensor '%.*s': element count overflows",
                            what, nl, name);
        shape[i] = (int64_t)d;
    }
    size_t want;
    if (q_mul_overflow(numel, qdt_size(dt), &want))
        return qerr_set(err, errlen, QERR_FORMAT, "%s: tensor '%.*s': byte size overflows",
                        what, nl, name);

    const json_t *joff = json_object_get(e, "data_offsets");
    uint64_t begin, end;
    if (!json_is_array(joff) || json_array_size(joff) != 2 ||
        st_uint(json_array_get(joff, 0), &begin) || st_uint(json_array_get(joff, 1), &end))
        return qerr_set(err, errlen, QERR_FORMAT,
                        "%s: tensor '%.*s': \"data_offsets\" must be two non-negative integers",
                        what, nl, name);
    if (begin > end || end > data_len)
        return qerr_set(err, errlen, QERR_FORMAT,
                        "%s: tensor '%.*s': data_offsets [%llu, %llu] out of range (data region is %zu bytes)",
                        what, nl, name, (unsigned long long)begin, (unsigned long long)end, data_len);
    size_t nbytes = (size_t)(end - begin);
    if (nbytes != want)
        return qerr_set(err, errlen, QERR_FORMAT,
                        "%s: tensor '%.*s': data_offsets span %zu bytes but shape and dtype %s need %zu",
                        what, nl, name, nbytes, qdt_name(dt), want);

    const uint8_t *p = data + begin;
    if ((uintptr_t)p % qdt_size(dt)) {
        void *copy = q_malloc(nbytes);
        if (!copy)
            return qerr_set(err, errlen, QERR_NOMEM, "%s: tensor '%.*s': out of memory (%zu bytes)",
                            what, nl, name, nbytes);
        memcpy(copy, p, nbytes);
        if (qmodel_take_buffer(m, copy)) {
            free(copy);
            return qerr_set(err, errlen, QERR_NOMEM, "%s: out of memory", what);
        }
        p = copy;
    }

    char sub[256];
    int rc = qmodel_add_tensor(m, name, strlen(name), dt, (int)ndim, shape, p, nbytes, sub, sizeof sub);
    if (rc) return qerr_set(err, errlen, rc, "%s: %s", what, sub);
    return 0;
}

int safetensors_parse(qmodel *m, const void *buf, size_t len, const char *what,
                      char *err, size_t errlen)
{
    const uint8_t *b = buf;
    if (!what) what = "safetensors";
    if (len < 8)
        return qerr_set(err, errlen, QERR_FORMAT, "%s: file of %zu bytes is too short for a safetensors header",
                        what, len);
    uint64_t n = 0;
    for (int i = 0; i < 8; i++) n |= (uint64_t)b[i] << (8 * i);
    if (n > ST_MAX_HEADER)
        return qerr_set(err, errlen, QERR_LIMIT, "%s: header length %llu is over the %llu-byte limit",
                        what, (unsigned long long)n, (unsigned long long)ST_MAX_HEADER);
    if (n > len - 8)
        return qerr_set(err, errlen, QERR_FORMAT, "%s: header length %llu runs past the end of the %zu-byte file",
                        what, (unsigned long long)n, len);

    json_error_t je;
    json_t *root = json_loadb((const char *)b + 8, (size_t)n, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return qerr_set(err, errlen, QERR_FORMAT, "%s: header is not valid JSON (byte %d: %s)",
                        what, je.position, je.text);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = qerr_set(err, errlen, QERR_FORMAT, "%s: header is not a JSON object", what);
        goto out;
    }
    if (json_object_size(root) > (size_t)(QMODEL_MAX_TENSORS - m->n_tensors) + 1) {
        rc = qerr_set(err, errlen, QERR_LIMIT, "%s: %zu tensors exceed the limit of %d", what,
                      json_object_size(root), QMODEL_MAX_TENSORS);
        goto out;
    }

    const uint8_t *data = b + 8 + n;
    size_t data_len = len - 8 - (size_t)n;
    const char *name;
    json_t *e;
    json_object_foreach(root, name, e) {
        if (!strcmp(name, "__metadata__")) continue;
        if ((rc = st_tensor(m, name, e, data, data_len, what, err, errlen))) goto out;
    }
out:
    json_decref(root);
    return rc;
}
