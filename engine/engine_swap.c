/* engine_swap.c - preemption and the swap space (engine_int.h): a running
 * request that must give up its blocks is swapped to host memory or
 * dropped to recompute (engine.c's header says when which). */
#include <stdlib.h>
#include <string.h>

#include "engine_int.h"
#include "qerr.h"

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Moves n blocks between the pool and swap slots (block i <-> slots[i]):
 * one batched transfer per run of consecutive slots.  0 or the backend's
 * error. */
static int swap_transfer(qengine *e, const int32_t *blocks, const int32_t *slots, int n, int to_pool)
{
    for (int i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && slots[j] == slots[j - 1] + 1; j++) {
        }
        char *host = e->swap_mem + (size_t)slots[i] * e->block_bytes;
        int rc = to_pool ? qbackend_write_blocks(e->be, blocks + i, j - i, host)
                         : qbackend_read_blocks(e->be, blocks + i, j - i, host);
        if (rc) return rc;
    }
    return 0;
}

/* Swaps running request r out: copies the blocks it holds alone into free
 * slots and releases them (its shared blocks stay referenced).  Returns 0,
 * or 1 when r must be recomputed instead (no block held alone, too few free
 * slots, no memory, a failed transfer), with nothing changed. */
static int swap_out(qengine *e, req *r)
{
    int n = kv_seq_exclusive_blocks(e->pool, &r->kv, e->sw_idx);
    if (n == 0 || n > e->n_slot_free) return 1;
    int32_t *slots = q_mallocn((size_t)n, sizeof *slots);
    if (!slots) return 1;
    for (int i = 0; i < n; i++) slots[i] = e->slot_free[e->n_slot_free - 1 - i];
    qsort(slots, (size_t)n, sizeof *slots, cmp_i32);
    for (int i = 0; i < n; i++) e->sw_blocks[i] = r->kv.blocks[e->sw_idx[i]];
    int rc = swap_transfer(e, e->sw_blocks, slots, n, 0);
    if (!rc) rc = kv_seq_swap_out(e->pool, &r->kv, e->sw_idx, n);
    if (rc) {
        QLOGW("swapping out request %llu failed (%s): recomputing it", (unsigned long long)r->id, qerr_str(rc));
        free(slots);
        return 1;
    }
    e->n_slot_free -= n;
    r->slots = slots;
    r->n_slots = n;
    e->st.swapped_out_blocks += (uint64_t)n;
    return 0;
}

/* Preempts running request r: swapped out (swap mode, when it can be) to
 * the tail of swapped, else its blocks freed and it goes to the front of
 * waiting, to recompute. */
static void preempt(qengine *e, req *r)
{
    rl_remove(&e->running, r);
    r->preempted_now = 1;
    e->st.preemptions++;
    if (e->o.preempt_mode == QPREEMPT_SWAP) {
        if (swap_out(e, r) == 0) {
            rl_push_back(&e->swapped, r);
            e->st.preemptions_swap++;
            return;
        }
        e->st.swap_fallbacks++;
    }
    kv_seq_free(e->pool, &r->kv);
    r->n_computed = 0;
    rl_push_front(&e->waiting, r);
}

/* Resumes swapped request r when its holes and its next token's block fit:
 * fresh blocks, the saved bytes written back, slots freed; r joins running
 * as its newest admission.  Returns 0, 1 when it does not fit (nothing
 * changed), or the backend's error (r then finishes with QFINISH_ERROR). */
int qe_swap_in(qengine *e, req *r)
{
    int next = kv_seq_blocks_needed(e->pool, &r->kv, 1);
    if (next < 0 || r->kv.n_swapped + next > kv_pool_num_allocatable(e->pool)) return 1;
    int n = kv_seq_swap_in(e->pool, &r->kv, e->sw_idx);
    if (n != r->n_slots) return QERR_INTERNAL;  /* invariant 5 */
    for (int i = 0; i < n; i++) e->sw_blocks[i] = r->kv.blocks[e->sw_idx[i]];
    int rc = swap_transfer(e, e->sw_blocks, r->slots, n, 1);
    rl_remove(&e->swapped, r);
    if (rc) {
        qe_finish(e, r, QFINISH_ERROR);
        return rc;
    }
    qe_slots_release(e, r);
    rl_push_back(&e->running, r);
    r->admit_seq = ++e->admit_counter;
    e->st.swap_ins++;
    e->st.swapped_in_blocks += (uint64_t)n;
    return 0;
}

/* Drops swapped request r to recompute: slots and blocks freed, to the
 * front of waiting. */
void qe_unswap(qengine *e, req *r)
{
    rl_remove(&e->swapped, r);
    qe_release_kv(e, r);
    r->n_computed = 0;
    rl_push_front(&e->waiting, r);
    e->st.swap_fallbacks++;
}

/* Drops to recompute the swapped requests other than keep that still hold
 * pool blocks (shared ones they kept).  Returns 1 when it freed any. */
int qe_unswap_holders(qengine *e, const req *keep)
{
    int freed = 0;
    for (req *q = e->swapped.head, *nx; q; q = nx) {
        nx = q->next;
        if (q == keep || q->kv.n_blocks == q->kv.n_swapped) continue;
        qe_unswap(e, q);
        freed = 1;
    }
    return freed;
}

static req *newest_running(qengine *e)
{
    req *best = NULL;
    for (req *r = e->running.head; r; r = r->next)
        if (!best || r->admit_seq > best->admit_seq) best = r;
    return best;
}

/* Readies the slot for r's next token: copy-on-write, then one block if its
 * token opens one.  Preempts newer requests as needed; 0, 1 when r itself
 * was preempted, or a backend error. */
int qe_reserve_decode(qengine *e, req *r)
{
    for (;;) {
        int src, dst, rc = kv_seq_prepare_write(e->pool, &r->kv, &src, &dst);
        if (rc == 1) {
            if ((rc = e->be->ops->copy_block(e->be, src, dst))) return rc;
        } else if (rc == QERR_BUSY) {
            req *v = newest_running(e);
            preempt(e, v);
            if (v == r) return 1;
            continue;
        } else if (rc < 0) {
            return rc;
        }
        rc = kv_seq_append(e->pool, &r->kv, &r->tokens[r->n_tokens - 1], 1);
        if (rc == 0) return 0;
        if (rc != QERR_BUSY) return rc;
        req *v = newest_running(e);
        preempt(e, v);
        if (v == r) return 1;
    }
}

/* Frees the blocks of waiting requests other than keep that hold some (a
 * prompt partly computed): they recompute later.  Breaks the deadlock of a
 * pool held by half-done prompts. */
int qe_reclaim_waiting(qengine *e, const req *keep)
{
    int freed = 0;
    for (req *q = e->waiting.head; q; q = q->next) {
        if (q == keep || q->kv.n_tokens == 0) continue;
        kv_seq_free(e->pool, &q->kv);
        q->n_computed = 0;
        e->st.preemptions++;
        freed = 1;
    }
    return freed;
}
