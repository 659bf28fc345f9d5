/* sched.c - the scheduler: admission, the token budget, prompt chunks,
 * preemption and the swap space.  It decides; engine.c executes the plan
 * (one forward pass) and owns everything else about a request.  In vLLM
 * v1's terms this is the scheduler, kv.c the KV cache manager and its
 * block pool.
 *
 * Requests live in three FIFO lists: `waiting` (prompt not yet fully
 * computed: new, or preempted to recompute), `running` (prompt computed,
 * decoding one token a step) and `swapped` (preempted by swapping, in the
 * order of preemption).  A step's plan is built in two halves, with the
 * engine's draft proposers between them:
 *
 *   sched_decodes  a. every running request gets its next token's slot
 *                     (reserve_decode: copy-on-write first when its last
 *                     block is shared), oldest admission first, while the
 *                     budget and the sequence cap last.  When the pool
 *                     cannot give a block, the most recently admitted
 *                     running request is preempted (preempt).  Recompute
 *                     mode: its blocks are freed and it goes back to the
 *                     front of `waiting` with its output so far, to be
 *                     recomputed later (its sampler keeps its state, so the
 *                     output continues exactly).  Swap mode (swap_out): the
 *                     blocks it holds alone are copied into slots of the
 *                     swap space (host memory, one block a slot) and
 *                     freed, its shared blocks stay referenced, and it
 *                     joins the tail of `swapped`; when the free slots are
 *                     too few (or it holds no block alone) it is recomputed.
 *   (the engine)      drafts for the decodes, from the budget left.
 *   sched_admit    a'. unless this step preempted, swapped requests resume
 *                     (swap_in), oldest preemption first, while their
 *                     blocks and their next token's block fit: fresh
 *                     blocks, the saved bytes written back, and a decode in
 *                     this step.  If nothing runs and the oldest still does
 *                     not fit, partly computed prompts (reclaim_waiting),
 *                     then the other swapped requests that hold blocks
 *                     (unswap_holders), and at last the oldest itself
 *                     (unswap), drop to recompute: the pool cannot stall;
 *                  b. only when nothing is swapped out: waiting requests,
 *                     first come first served, get prompt chunks: first the
 *                     longest cached prefix is taken from the pool
 *                     (kv_seq_match_prefix), then as many of the remaining
 *                     tokens as the budget and the pool allow.  A request
 *                     that cannot get blocks stops admission (no
 *                     overtaking), unless nothing at all is scheduled, in
 *                     which case it fails (it can never fit).
 *
 * The block copies a decision needs (copy-on-write, swapping out and in)
 * are made through the backend as the decision is taken, so that the plan
 * the engine gets is only the batch: sequences, tokens, block tables.
 *
 * Invariants between steps (qengine_check verifies 1, 4 and 5):
 *   1. a request is in exactly one of waiting, running, swapped (or
 *      finished and freed);
 *   2. for a running request, kv.n_tokens == n_computed == n_tokens - 1:
 *      every token but the last sampled one is in the cache;
 *   3. a waiting request's kv holds only computed tokens (n_computed ==
 *      kv.n_tokens <= n_tokens - 1 before its last chunk);
 *   4. blocks are referenced only through requests' kv tables, so with no
 *      live request every block is free or cached;
 *   5. a swapped request's kv holds n_computed tokens with kv.n_swapped
 *      holes, and it owns exactly kv.n_swapped swap slots (slots[k] holds
 *      the bytes of its k-th hole); every other slot is on the free stack.
 * And within a step:
 *   6. the running list is in admission order and preemption takes the
 *      newest, so a request already given its slot is never the victim;
 *   7. a request is in a plan at most once, and its tokens in the plan are
 *      computed by the pass that follows (the engine commits them after).
 */
#include "sched.h"

#include <stdlib.h>
#include <string.h>

#include "engine_int.h"
#include "qerr.h"

/* ---- the swap space ------------------------------------------------------------ */

int sched_init(qsched *s, kv_pool *pool, qbackend *be, const qengine_opts *o, qengine_stats *st,
               void (*fail)(void *, req *), void *fail_ctx, char *err, size_t errlen)
{
    *s = (qsched){ .pool = pool, .be = be, .o = o, .st = st, .fail = fail, .fail_ctx = fail_ctx };
    s->seqs = q_mallocn((size_t)o->max_seqs, sizeof *s->seqs);
    s->dec = q_mallocn((size_t)o->max_seqs, sizeof *s->dec);
    if (!s->seqs || !s->dec) return qerr_set(err, errlen, QERR_NOMEM, "out of memory for the scheduler");
    if (o->preempt_mode != QPREEMPT_SWAP) return 0;
    /* swap_space_mb is set (the engine's default when 0) */
    const int num_blocks = kv_pool_num_blocks(pool);
    s->block_bytes = be->ops->block_bytes(be);
    size_t bytes = o->swap_space_mb * 1048576, slots = s->block_bytes ? bytes / s->block_bytes : 0;
    if (slots < 1)
        return qerr_set(err, errlen, QERR_RANGE, "swap space of %zu MiB holds no KV block (%zu bytes a block)",
                        o->swap_space_mb, s->block_bytes);
    if (slots > INT32_MAX / 2) slots = INT32_MAX / 2;
    s->n_slots = (int)slots;
    s->swap_mem = qbackend_host_alloc(be, slots * s->block_bytes);
    s->slot_free = q_mallocn(slots, sizeof *s->slot_free);
    s->sw_idx = q_mallocn((size_t)num_blocks, sizeof *s->sw_idx);
    s->sw_blocks = q_mallocn((size_t)num_blocks, sizeof *s->sw_blocks);
    if (!s->swap_mem || !s->slot_free || !s->sw_idx || !s->sw_blocks)
        return qerr_set(err, errlen, QERR_NOMEM, "cannot allocate %zu MiB of swap space (%d blocks)",
                        o->swap_space_mb, s->n_slots);
    /* Pushed in reverse so that slot 0 is handed out first. */
    for (int i = 0; i < s->n_slots; i++) s->slot_free[i] = s->n_slots - 1 - i;
    s->n_slot_free = s->n_slots;
    return 0;
}

void sched_free(qsched *s)
{
    free(s->seqs);
    free(s->dec);
    free(s->order);
    free(s->slot_free);
    free(s->sw_idx);
    free(s->sw_blocks);
    if (s->swap_mem) qbackend_host_free(s->be, s->swap_mem);
    s->seqs = NULL, s->dec = s->order = NULL, s->slot_free = NULL, s->sw_idx = s->sw_blocks = NULL, s->swap_mem = NULL;
}

/* Returns r's swap slots to the free stack (in reverse, so that the next
 * swap-out takes them in increasing order: long runs, few transfers). */
void sched_slots_release(qsched *s, req *r)
{
    for (int i = r->n_slots - 1; i >= 0; i--) s->slot_free[s->n_slot_free++] = r->slots[i];
    free(r->slots);
    r->slots = NULL;
    r->n_slots = 0;
}

/* ---- preemption ------------------------------------------------------------------ */

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Moves n blocks between the pool and swap slots (block i <-> slots[i]):
 * one batched transfer per run of consecutive slots.  0 or the backend's
 * error. */
static int swap_transfer(qsched *s, const int32_t *blocks, const int32_t *slots, int n, int to_pool)
{
    for (int i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && slots[j] == slots[j - 1] + 1; j++) {
        }
        char *host = s->swap_mem + (size_t)slots[i] * s->block_bytes;
        int rc = to_pool ? qbackend_write_blocks(s->be, blocks + i, j - i, host)
                         : qbackend_read_blocks(s->be, blocks + i, j - i, host);
        if (rc) return rc;
    }
    return 0;
}

/* Swaps running request r out: copies the blocks it holds alone into free
 * slots and releases them (its shared blocks stay referenced).  Returns 0,
 * or 1 when r must be recomputed instead (no block held alone, too few free
 * slots, no memory, a failed transfer), with nothing changed. */
static int swap_out(qsched *s, req *r)
{
    int n = kv_seq_exclusive_blocks(s->pool, &r->kv, s->sw_idx);
    if (n == 0 || n > s->n_slot_free) return 1;
    int32_t *slots = q_mallocn((size_t)n, sizeof *slots);
    if (!slots) return 1;
    for (int i = 0; i < n; i++) slots[i] = s->slot_free[s->n_slot_free - 1 - i];
    qsort(slots, (size_t)n, sizeof *slots, cmp_i32);
    for (int i = 0; i < n; i++) s->sw_blocks[i] = r->kv.blocks[s->sw_idx[i]];
    int rc = swap_transfer(s, s->sw_blocks, slots, n, 0);
    if (!rc) rc = kv_seq_swap_out(s->pool, &r->kv, s->sw_idx, n);
    if (rc) {
        QLOGW("swapping out request %llu failed (%s): recomputing it", (unsigned long long)r->id, qerr_str(rc));
        free(slots);
        return 1;
    }
    s->n_slot_free -= n;
    r->slots = slots;
    r->n_slots = n;
    s->st->swapped_out_blocks += (uint64_t)n;
    return 0;
}

/* Preempts running request r: swapped out (swap mode, when it can be) to
 * the tail of swapped, else its blocks freed and it goes to the front of
 * waiting, to recompute. */
static void preempt(qsched *s, req *r)
{
    rl_remove(&s->running, r);
    r->preempted_now = 1;
    s->st->preemptions++;
    if (s->o->preempt_mode == QPREEMPT_SWAP) {
        if (swap_out(s, r) == 0) {
            rl_push_back(&s->swapped, r);
            s->st->preemptions_swap++;
            return;
        }
        s->st->swap_fallbacks++;
    }
    kv_seq_free(s->pool, &r->kv);
    r->n_computed = 0;
    rl_push_front(&s->waiting, r);
}

/* Resumes swapped request r when its holes and its next token's block fit:
 * fresh blocks, the saved bytes written back, slots freed; r joins running
 * as its newest admission.  Returns 0, 1 when it does not fit (nothing
 * changed), or the backend's error (r then goes to s->fail: it ends in error). */
static int swap_in(qsched *s, req *r)
{
    int next = kv_seq_blocks_needed(s->pool, &r->kv, 1);
    if (next < 0 || r->kv.n_swapped + next > kv_pool_num_allocatable(s->pool)) return 1;
    int n = kv_seq_swap_in(s->pool, &r->kv, s->sw_idx);
    if (n != r->n_slots) return QERR_INTERNAL;  /* invariant 5 */
    for (int i = 0; i < n; i++) s->sw_blocks[i] = r->kv.blocks[s->sw_idx[i]];
    int rc = swap_transfer(s, s->sw_blocks, r->slots, n, 1);
    rl_remove(&s->swapped, r);
    if (rc) {
        s->fail(s->fail_ctx, r);
        return rc;
    }
    sched_slots_release(s, r);
    rl_push_back(&s->running, r);
    r->admit_seq = ++s->admit_counter;
    s->st->swap_ins++;
    s->st->swapped_in_blocks += (uint64_t)n;
    return 0;
}

/* Drops swapped request r to recompute: slots and blocks freed, to the
 * front of waiting. */
static void unswap(qsched *s, req *r)
{
    rl_remove(&s->swapped, r);
    sched_slots_release(s, r);
    kv_seq_free(s->pool, &r->kv);
    r->n_computed = 0;
    rl_push_front(&s->waiting, r);
    s->st->swap_fallbacks++;
}

/* Drops to recompute the swapped requests other than keep that still hold
 * pool blocks (shared ones they kept).  Returns 1 when it freed any. */
static int unswap_holders(qsched *s, const req *keep)
{
    int freed = 0;
    for (req *q = s->swapped.head, *nx; q; q = nx) {
        nx = q->next;
        if (q == keep || q->kv.n_blocks == q->kv.n_swapped) continue;
        unswap(s, q);
        freed = 1;
    }
    return freed;
}

static req *newest_running(qsched *s)
{
    req *best = NULL;
    for (req *r = s->running.head; r; r = r->next)
        if (!best || r->admit_seq > best->admit_seq) best = r;
    return best;
}

/* Readies the slot for r's next token: copy-on-write, then one block if its
 * token opens one.  Preempts newer requests as needed; 0, 1 when r itself
 * was preempted, or a backend error. */
static int reserve_decode(qsched *s, req *r)
{
    for (;;) {
        int src, dst, rc = kv_seq_prepare_write(s->pool, &r->kv, &src, &dst);
        if (rc == 1) {
            if ((rc = s->be->ops->copy_block(s->be, src, dst))) return rc;
        } else if (rc == QERR_BUSY) {
            req *v = newest_running(s);
            preempt(s, v);
            if (v == r) return 1;
            continue;
        } else if (rc < 0) {
            return rc;
        }
        rc = kv_seq_append(s->pool, &r->kv, &r->tokens[r->n_tokens - 1], 1);
        if (rc == 0) return 0;
        if (rc != QERR_BUSY) return rc;
        req *v = newest_running(s);
        preempt(s, v);
        if (v == r) return 1;
    }
}

/* Frees the blocks of waiting requests other than keep that hold some (a
 * prompt partly computed): they recompute later.  Breaks the deadlock of a
 * pool held by half-done prompts. */
static int reclaim_waiting(qsched *s, const req *keep)
{
    int freed = 0;
    for (req *q = s->waiting.head; q; q = q->next) {
        if (q == keep || q->kv.n_tokens == 0) continue;
        kv_seq_free(s->pool, &q->kv);
        q->n_computed = 0;
        s->st->preemptions++;
        freed = 1;
    }
    return freed;
}

/* ---- the plan ------------------------------------------------------------------- */

static void plan_add(sched_plan *p, req *r, int n_tokens, int sample, int decode)
{
    p->seqs[p->n_seqs++] = (sched_seq){ r, n_tokens, sample, decode };
    p->budget -= n_tokens;
}

int sched_decodes(qsched *s, sched_plan *p)
{
    *p = (sched_plan){ .seqs = s->seqs, .budget = s->o->max_batch_tokens, .dec = s->dec, .n_run = s->running.n };
    /* The running list as the step began (it may hold more than max_seqs:
     * parallel samples join it together); a request preempted by an older
     * one on the way is passed over. */
    if (s->running.n > s->cap_order) {
        req **o = q_reallocn(s->order, (size_t)s->running.n, sizeof *o);
        if (!o) return QERR_NOMEM;
        s->order = o;
        s->cap_order = s->running.n;
    }
    int n_run = 0;
    for (req *q = s->running.head; q; q = q->next) s->order[n_run++] = q, q->preempted_now = 0;
    const uint64_t preempted_before = s->st->preemptions;
    for (int i = 0; i < n_run && p->n_dec < s->o->max_seqs && p->budget > 0; i++) {
        req *q = s->order[i];
        if (q->preempted_now) continue; /* preempted by an older request */
        const int rc = reserve_decode(s, q);
        if (rc < 0) return rc;
        if (rc == 1) continue;
        q->n_draft = 0;
        s->dec[p->n_dec++] = q;
        plan_add(p, q, 1, 1, 1);
    }
    p->preempted = s->st->preemptions != preempted_before;
    return 0;
}

/* a'. Swapped requests resume, oldest preemption first. */
static int resume_swapped(qsched *s, sched_plan *p)
{
    while (s->swapped.head && !p->preempted && p->n_seqs < s->o->max_seqs && p->budget > 0) {
        req *q = s->swapped.head;
        int rc = swap_in(s, q);
        if (rc < 0) return rc;
        if (rc == 1) {
            if (s->running.n > 0) break; /* blocks come back as they finish */
            /* Nothing runs, so nothing will free blocks: take them from
             * partly computed prompts, then from other swapped requests,
             * and at last recompute q itself (which fails it if it can
             * never fit). */
            if (reclaim_waiting(s, NULL) || unswap_holders(s, q)) continue;
            unswap(s, q);
            continue;
        }
        /* Room for its next token was checked: this cannot preempt. */
        rc = reserve_decode(s, q);
        if (rc < 0) return rc;
        if (rc == 1) break;
        q->n_draft = 0;
        plan_add(p, q, 1, 1, 1);
        p->n_resumed++;
    }
    return 0;
}

/* Static batching: a batch is the first max_seqs waiting requests; the next
 * one forms only when every member has finished. */
static void static_batch(qsched *s)
{
    int live_members = 0;
    for (req *q = s->running.head; q; q = q->next) live_members += q->in_batch;
    for (req *q = s->waiting.head; q; q = q->next) live_members += q->in_batch;
    for (req *q = s->swapped.head; q; q = q->next) live_members += q->in_batch;
    if (live_members) return;
    int k = 0;
    for (req *q = s->waiting.head; q && k < s->o->max_seqs; q = q->next, k++) q->in_batch = 1;
}

/* b. Prompt chunks, first come first served.  0 or an error. */
static int admit_prompts(qsched *s, sched_plan *p)
{
    if (s->o->static_batching) static_batch(s);
    /* Nothing is admitted while a swapped request waits to resume. */
    req *r = s->swapped.n ? NULL : s->waiting.head;
    while (r && p->n_seqs < s->o->max_seqs && p->budget > 0) {
        req *nx = r->next;
        if (s->o->static_batching && !r->in_batch) break;
        if (r->tier_wait) { /* its prefix is being read from disk */
            r = nx;
            continue;
        }
        if (r->n_computed == 0 && r->kv.n_tokens == 0 && !s->o->no_prefix_cache) {
            int reused = kv_seq_match_prefix(s->pool, &r->kv, r->tokens, r->n_tokens);
            if (reused > 0) {
                r->n_computed = reused;
                if (!r->admitted_once) r->cached_tokens = reused < r->n_prompt ? reused : r->n_prompt;
                s->st->tokens_reused += (uint64_t)reused;
            }
        }
        int remaining = r->n_tokens - r->n_computed;
        int chunk = remaining < p->budget ? remaining : p->budget;
        /* Shrink the chunk to what the pool can hold now. */
        while (chunk > 0 && kv_seq_can_append(s->pool, &r->kv, chunk) != 1) chunk /= 2;
        if (chunk <= 0) {
            if (p->n_seqs == 0 && s->running.n == 0 && reclaim_waiting(s, r)) continue; /* retry r */
            int need = kv_seq_blocks_needed(s->pool, &r->kv, remaining);
            if (need == QERR_LIMIT || (p->n_seqs == 0 && s->running.n == 0)) {
                /* It can never fit: nothing else holds blocks. */
                rl_remove(&s->waiting, r);
                s->fail(s->fail_ctx, r);
                r = nx;
                continue;
            }
            break; /* wait for blocks; no overtaking */
        }
        int rc = kv_seq_append(s->pool, &r->kv, r->tokens + r->n_computed, chunk);
        if (rc) return rc == QERR_BUSY ? 0 : rc;
        const int completes = r->n_computed + chunk == r->n_tokens;
        plan_add(p, r, chunk, completes, 0);
        s->st->prefill_tokens += (uint64_t)chunk;
        if (completes) {
            rl_remove(&s->waiting, r);
            rl_push_back(&s->running, r);
            r->admit_seq = ++s->admit_counter;
            r->admitted_once = 1;
        }
        r = nx;
    }
    return 0;
}

int sched_admit(qsched *s, sched_plan *p)
{
    const int rc = resume_swapped(s, p);
    return rc ? rc : admit_prompts(s, p);
}
