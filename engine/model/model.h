/* model.h - one description of a loaded model, whatever file it came from.
 *
 * qmodel_load() looks at the path: a regular file is read as GGUF
 * (engine/model/gguf.c), a folder as a Hugging Face model folder (engine/model/hf.c:
 * config.json, *.safetensors, tokenizer.json, generation_config.json).  A
 * loader fills a qmodel with hyperparameters, a table of named tensors as
 * stored in the file, the vocabulary and the special token ids; then
 * qmodel_bind() (model.c) finds every tensor the architecture needs under the
 * format's names, checks its dtype and shape against the hyperparameters, and
 * computes the model fingerprint.
 *
 * Tensor bytes stay where the loader put them (an mmap of the file, normally):
 * weights are used in their stored dtype, never copied to a wider one.
 *
 * Every check on file contents returns QERR_FORMAT / QERR_UNSUPPORTED /
 * QERR_RANGE with a message naming the problem; nothing a file says can make
 * the loaders crash or attempt an allocation larger than the file itself
 * justifies.
 *
 * engine/model/ is everything about what a model is: this description, the
 * loaders (gguf.c, hf.c, safetensors.c), random weights for tests
 * (model_random.c) and the split for tensor parallelism (shard.*).  It may
 * include kernels/backend.h (the tensors' and hyperparameters' types) and
 * base/; nothing else of the engine.
 */
#ifndef QUIRE_MODEL_H
#define QUIRE_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

/* Limits that reject absurd headers before any allocation. */
#define QMODEL_MAX_LAYERS 1024
#define QMODEL_MAX_DIM (1 << 20)
#define QMODEL_MAX_VOCAB (1 << 22)
#define QMODEL_MAX_TENSORS (1 << 17)
#define QMODEL_MAX_FILES 4096
#define QMODEL_MAX_NAME 256

typedef enum { QFMT_GGUF = 0, QFMT_HF = 1 } qformat;

/* A tensor as named in the file. */
typedef struct {
    char *name;                  /* owned */
    qtensor t;                   /* data points into a mapping or an owned buffer */
} qnamed_tensor;

typedef enum {
    QVOCAB_NONE = 0,
    QVOCAB_SPM = 1,              /* SentencePiece-style pieces, '▁' for space, <0xXX> byte tokens */
    QVOCAB_BPE = 2               /* GPT-2 byte-level BPE */
} qvocab_kind;

/* Token types, as GGUF numbers them. */
enum { QTOK_NORMAL = 1, QTOK_UNKNOWN = 2, QTOK_CONTROL = 3, QTOK_USER = 4, QTOK_UNUSED = 5, QTOK_BYTE = 6 };

typedef struct {
    qvocab_kind kind;
    int n;                       /* entries in tokens (may differ from n_vocab) */
    char **tokens;               /* (n) owned UTF-8 strings; an id absent from the file is NULL */
    float *scores;               /* (n) or NULL */
    int32_t *types;              /* (n) QTOK_*, or NULL */
    char **merges;               /* (n_merges) "a b", owned, or NULL (GGUF gpt2 vocabularies) */
    int n_merges;
    char *pre;                   /* GGUF tokenizer.ggml.pre, or NULL */
    char *tokenizer_json;        /* HF: path of tokenizer.json, or NULL */
} qvocab;

typedef struct qmodel {
    qformat format;
    char *path;                  /* as given to qmodel_load */
    char *name;                  /* general.name or the folder name */
    qhparams hp;
    qweights w;                  /* bound by qmodel_bind */

    int n_tensors;
    qnamed_tensor *tensors;      /* (n_tensors) as in the file */

    qvocab vocab;
    int bos_id, unk_id, pad_id;  /* -1 when absent */
    int n_eos;
    int eos_ids[8];              /* end-of-sequence ids, n_eos of them */
    int add_bos;                 /* prepend BOS to prompts */
    /* tokenizer_config.json's add_bos_token / add_eos_token when it states
     * them (-1: not stated): they override tokenizer.json's template. */
    int cfg_add_bos, cfg_add_eos;

    /* The chat template (Jinja source): GGUF tokenizer.chat_template, or HF
     * tokenizer_config.json's chat_template (the "default" one of a named
     * list) or chat_template.jinja; NULL when the model has none. */
    char *chat_template;

    /* Random weights (qmodel_random): 0 for a model read from a file;
     * QMODEL_RANDOM_HOST when the tensors hold host buffers filled from
     * random_seed; QMODEL_RANDOM_DEVICE when every tensor's data is NULL and
     * the backend fills them (qbackend_opts.random_weights). */
    int random_fill;
    uint64_t random_seed;
    /* qmodel_random_ex: the layers' output projections (o_proj, down_proj)
     * drawn from a range this many times the others' (0: as the others) */
    float random_residual;

    uint8_t fingerprint[16];     /* hash of the architecture, shapes and sampled weight bytes
                                  * (random models: shapes, fill mode and seed) */
    char fingerprint_hex[33];

    /* Storage the tensors point into; released by qmodel_destroy. */
    int n_maps;
    struct qmodel_map { void *addr; size_t len; } *maps;
    uint32_t *name_index;        /* open-addressing hash of tensor names -> index + 1 */
    size_t name_index_cap;
    int n_owned;
    void **owned;                /* heap buffers (e.g. converted tensors) */
} qmodel;

/* Loads a GGUF file or an HF folder.  On success returns 0 and *out, owned
 * by the caller (qmodel_destroy).  On failure returns a QERR_* code with a
 * message in err, and *out is NULL. */
int qmodel_load(const char *path, qmodel **out, char *err, size_t errlen);

/* Parses a GGUF image already in memory (the caller keeps buf alive for the
 * model's lifetime, or passes it to qmodel_take_map).  Fills m's
 * hyperparameters, tensors, vocabulary and special ids; does not bind.
 * Used by qmodel_load and by the fuzz targets. */
int gguf_parse(qmodel *m, const void *buf, size_t len, char *err, size_t errlen);

/* Like gguf_parse, but reads only the metadata and the vocabulary (any
 * architecture, tensors ignored): for vocabulary-only files and tools that
 * need just the tokenizer. */
int gguf_parse_vocab(qmodel *m, const void *buf, size_t len, char *err, size_t errlen);

/* Loads an HF folder's config.json, generation_config.json,
 * tokenizer.json vocabulary and safetensors into m; does not bind. */
int hf_load_dir(qmodel *m, const char *dir, char *err, size_t errlen);

/* Reads only an HF folder's tokenizer.json (vocabulary, path) and
 * tokenizer_config.json (add_bos_token / add_eos_token, special tokens):
 * for folders that hold just tokenizer files. */
int hf_load_tokenizer_files(qmodel *m, const char *dir, char *err, size_t errlen);

/* Parses an HF config.json text into m->hp (and bos/eos ids when given). */
int hf_parse_config(qmodel *m, const char *json, size_t len, char *err, size_t errlen);

/* Parses one safetensors image in memory and appends its tensors to m
 * (the bytes must outlive m).  Used by hf_load_dir and the fuzz targets. */
int safetensors_parse(qmodel *m, const void *buf, size_t len, const char *what,
                      char *err, size_t errlen);

/* Allocates an empty model (all ids -1).  NULL when out of memory. */
qmodel *qmodel_new(void);

/* Appends a named tensor (name copied).  Checks dtype, ndim and that
 * numel * dtype size == nbytes without overflow. */
int qmodel_add_tensor(qmodel *m, const char *name, size_t name_len, qdtype dt, int ndim,
                      const int64_t *shape, const void *data, size_t nbytes,
                      char *err, size_t errlen);

/* Returns the named tensor or NULL. */
const qnamed_tensor *qmodel_find(const qmodel *m, const char *name);
/* Renames every tensor whose name starts with from to start with to
 * instead; QERR_FORMAT (the model then unusable) when two names collide. */
int qmodel_rename_prefix(qmodel *m, const char *from, const char *to, char *err, size_t errlen);

/* Maps a regular file read-only for the model's lifetime (released by
 * qmodel_destroy).  Files shorter than min_len are refused with a message
 * "file of N bytes is too small for <what>". */
int qmodel_map_file(qmodel *m, const char *path, size_t min_len, const char *what, const void **addr,
                    size_t *len, char *err, size_t errlen);

/* Registers storage to release with the model (munmap / free). */
int qmodel_take_map(qmodel *m, void *addr, size_t len);
int qmodel_take_buffer(qmodel *m, void *buf);

/* Checks hyperparameters, binds m->w to the tensors under the format's
 * names, checks every shape and dtype, computes the fingerprint. */
int qmodel_bind(qmodel *m, char *err, size_t errlen);

/* Releases everything; NULL is a no-op. */
void qmodel_destroy(qmodel *m);

/* ---- random weights (model_random.c) ------------------------------------ */

enum { QMODEL_RANDOM_HOST = 1, QMODEL_RANDOM_DEVICE = 2 };

/* Most parameters a random model may have (2 TB of bf16): configs beyond it
 * are QERR_RANGE before anything is allocated. */
#define QMODEL_RANDOM_MAX_PARAMS ((int64_t)1 << 40)

/* Builds a model with real shapes and random weights from an HF config.json
 * (llama, mistral, qwen2: what hf_parse_config accepts), for benchmarks
 * without a checkpoint.  Every tensor is BF16 under its HF name; Qwen2 gets
 * q/k/v biases; tie_word_embeddings leaves out lm_head.
 *
 * host_data = 0: every tensor's data is NULL (a backend with
 * opts.random_weights fills them on the device; the CPU backend refuses
 * such a model).  host_data = 1: the model owns host buffers filled
 * deterministically from seed (the same seed gives the same bytes whatever
 * the thread count): matrices uniform in [-0.035, 0.035] (std ~0.02), norm
 * weights 1 +- 0.02, biases uniform in [-0.02, 0.02].
 *
 * The model is named "random:<config file name>", has no vocabulary
 * (vocab.kind QVOCAB_NONE), takes bos/eos ids from the config, and its
 * fingerprint hashes the shapes, the fill mode and the seed.  Returns 0 and
 * *out (qmodel_destroy), or QERR_IO (unreadable file), QERR_FORMAT (bad
 * JSON), QERR_UNSUPPORTED (architecture), QERR_RANGE (absurd sizes),
 * QERR_NOMEM (host buffers do not fit) with a message; *out is then NULL. */
int qmodel_random(const char *config_path, int host_data, uint64_t seed, qmodel **out, char *err, size_t errlen);
/* The same with the layers' output projections (o_proj, down_proj) drawn
 * from residual times the others' range (0: the same range): below 1 the
 * layers add little to the residual stream, so that the model cut to its
 * first layers (the same seed, a config with fewer layers: each tensor's
 * values depend on its place only) agrees with it more often; speculative
 * decoding's benchmarks set the acceptance they measure at this way.  The
 * backend's fill (host_data 0) draws the same way (random_residual). */
int qmodel_random_ex(const char *config_path, int host_data, uint64_t seed, float residual, qmodel **out, char *err,
                     size_t errlen);

/* Parameters of m's bound weights (tied embeddings counted once).  Cannot fail. */
int64_t qmodel_param_count(const qmodel *m);

#endif
