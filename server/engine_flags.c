/* engine_flags.c - see engine_flags.h. */
#include "engine_flags.h"

#include "qerr.h"

#define F_(field) offsetof(qeflags, field)
const qopt qeflags_table[QEFLAGS_N] = {
    { NULL, "--device", "NAME", OPT_STR, F_(device), "auto, cpu or cuda (default auto: cuda when a device is visible)" },
    { NULL, "--gpu-mem-util", "F", OPT_FLOAT, F_(gpu_mem_util), "cuda: fraction of device memory to use, 0 < F <= 1 (default 0.9)" },
    { NULL, "--gpu-memory-utilization", "F", OPT_FLOAT, F_(gpu_mem_util), "the same as --gpu-mem-util (vLLM's name)" },
    { NULL, "--tensor-parallel", "N", OPT_INT, F_(tensor_parallel), "split the model among N GPUs, devices 0..N-1 (on the CPU: N groups of threads) (default 1)" },
    { "-t", "--threads", "N", OPT_INT, F_(threads), "CPU threads (default: all cores)" },
    { NULL, "--block-size", "N", OPT_INT, F_(block_size), "tokens per KV-cache block, 1 to 4096 (default 16)" },
    { NULL, "--kv-mem", "MB", OPT_INT, F_(kv_mem), "KV cache budget in MiB (default: 256 on the CPU; cuda: from --gpu-mem-util)" },
    { NULL, "--max-batch-tokens", "N", OPT_INT, F_(max_batch_tokens), "tokens per engine step, prompt chunks included (default 512)" },
    { NULL, "--max-seqs", "N", OPT_INT, F_(max_seqs), "sequences per engine step (default 64)" },
    { NULL, "--max-num-seqs", "N", OPT_INT, F_(max_seqs), "the same as --max-seqs (vLLM's name)" },
    { NULL, "--static-batching", NULL, OPT_FLAG, F_(static_batching), "admit a new batch only when the last has finished (benchmarks)" },
    { NULL, "--preempt", "MODE", OPT_STR, F_(preempt), "when the KV pool runs out: recompute (default) or swap to host memory" },
    { NULL, "--swap-space", "MIB", OPT_INT, F_(swap_space), "--preempt swap: host memory for swapped-out blocks (default 1024)" },
    { NULL, "--spec", "MODE", OPT_STR, F_(spec), "speculative decoding: none (default), ngram (drafts from n-gram lookup in each request's own tokens) or draft (--draft's)" },
    { NULL, "--draft", "PATH", OPT_STR, F_(draft), "speculative decoding with this draft model (GGUF file or HF folder with the model's vocabulary; implies --spec draft)" },
    { NULL, "--spec-k", "K", OPT_INT, F_(spec_k), "--spec: drafts a pass at most, 1 to 16 (default 4; each request's own k follows its acceptance)" },
    { NULL, "--spec-max-batch", "N", OPT_INT, F_(spec_max_batch), "--spec: no drafts in steps decoding N sequences or more (default 32)" },
    { NULL, "--spec-always", NULL, OPT_FLAG, F_(spec_always), "--spec: drafts in every step below --spec-max-batch (default: only while measured faster than none)" },
};
#undef F_

void qeflags_init(qeflags *f)
{
    *f = (qeflags){ .gpu_mem_util = 0.9f, .swap_space = -1 };
}

int qeflags_apply(const qeflags *f, qengine_opts *eo, char *err, size_t errlen)
{
    static const struct { const char *name; size_t off; } counts[] = {
        { "--tensor-parallel", offsetof(qeflags, tensor_parallel) }, { "--threads", offsetof(qeflags, threads) },
        { "--block-size", offsetof(qeflags, block_size) },           { "--kv-mem", offsetof(qeflags, kv_mem) },
        { "--max-batch-tokens", offsetof(qeflags, max_batch_tokens) }, { "--max-seqs", offsetof(qeflags, max_seqs) },
        { "--spec-k", offsetof(qeflags, spec_k) },                     { "--spec-max-batch", offsetof(qeflags, spec_max_batch) },
    };
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        const int v = *(const int *)((const char *)f + counts[i].off);
        if (v < 0) return qerr_set(err, errlen, QERR_INVAL, "%s cannot be negative (%d)", counts[i].name, v);
    }
    qengine_opts_default(eo);
    if (f->device && qdevice_parse(f->device, &eo->device))
        return qerr_set(err, errlen, QERR_INVAL, "--device: '%s' is not auto, cpu or cuda", f->device);
    if (!(f->gpu_mem_util > 0 && f->gpu_mem_util <= 1))
        return qerr_set(err, errlen, QERR_INVAL, "--gpu-mem-util: %g is not in (0, 1]", (double)f->gpu_mem_util);
    if (f->tensor_parallel > 16)
        return qerr_set(err, errlen, QERR_INVAL, "--tensor-parallel: %d is not 1 to 16", f->tensor_parallel);
    if (f->block_size > 4096)
        return qerr_set(err, errlen, QERR_INVAL, "--block-size: %d is not 1 to 4096", f->block_size);
    eo->gpu_mem_util = f->gpu_mem_util;
    eo->tensor_parallel = f->tensor_parallel;
    eo->n_threads = f->threads;
    if (f->block_size) eo->block_size = f->block_size;
    if (f->kv_mem) eo->kv_mem_mb = (size_t)f->kv_mem;
    if (f->max_batch_tokens) eo->max_batch_tokens = f->max_batch_tokens;
    if (f->max_seqs) eo->max_seqs = f->max_seqs;
    eo->static_batching = f->static_batching;
    if (f->preempt && qpreempt_parse(f->preempt, &eo->preempt_mode))
        return qerr_set(err, errlen, QERR_INVAL, "--preempt: '%s' is not recompute or swap", f->preempt);
    if (f->swap_space != -1 && f->swap_space < 1)
        return qerr_set(err, errlen, QERR_INVAL, "--swap-space: %d MiB is not a positive size", f->swap_space);
    if (f->swap_space != -1 && eo->preempt_mode != QPREEMPT_SWAP)
        return qerr_set(err, errlen, QERR_INVAL, "--swap-space needs --preempt swap");
    if (f->swap_space > 0) eo->swap_space_mb = (size_t)f->swap_space;
    if (f->draft) eo->spec_mode = QSPEC_DRAFT;
    if (f->spec && qspec_mode_parse(f->spec, &eo->spec_mode))
        return qerr_set(err, errlen, QERR_INVAL, "--spec: '%s' is not none, ngram or draft", f->spec);
    if ((eo->spec_mode == QSPEC_DRAFT) != (f->draft != NULL))
        return qerr_set(err, errlen, QERR_INVAL, "%s", f->draft ? "--draft goes with --spec draft (or no --spec)"
                                                             : "--spec draft needs --draft PATH");
    if (f->spec_k > QENGINE_MAX_SPEC_K)
        return qerr_set(err, errlen, QERR_INVAL, "--spec-k: %d is not 1 to %d", f->spec_k, QENGINE_MAX_SPEC_K);
    if (f->spec_k) eo->spec_k = f->spec_k;
    if (f->spec_max_batch) eo->spec_max_batch = f->spec_max_batch;
    eo->spec_always = f->spec_always;
    if (eo->spec_always && eo->spec_mode == QSPEC_NONE)
        return qerr_set(err, errlen, QERR_INVAL, "--spec-always goes with --spec or --draft");
    return 0;
}
