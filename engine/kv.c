/* kv.c - the KV cache manager: block pool, block tables, prefix cache.
 *
 * WHAT IT DOES
 *
 * The K/V memory of every layer is cut into num_blocks blocks of block_size
 * token slots (PagedAttention).  This module decides which block ids hold
 * which tokens; the backend owns the bytes.  A sequence (kv_seq) maps its
 * logical block i, tokens [i*bs, (i+1)*bs), to a physical block id.  Blocks
 * are reference-counted: a block can sit in several tables at once, because
 * two prompts share a prefix (prefix cache) or because a sequence was forked
 * for parallel sampling.
 *
 * A full block whose K/V has been computed gets a hash,
 *
 *     hash(block i) = H(hash(block i-1), its block_size token ids, model fingerprint)
 *
 * with 16 zero bytes as the parent of block 0.  The hash names the whole
 * prefix up to and including the block, so a prompt's longest cached prefix
 * is found block by block: hash block 0, look it up, hash block 1 with the
 * first hash as parent, and so on until a miss.  The pool keeps a map from
 * hash to block id, and the token ids, parent hash and depth of each hashed
 * block, so that a hit is verified, not trusted: a hash collision would
 * otherwise hand a prompt another prompt's K/V.
 *
 * When a sequence ends, its hashed blocks are not forgotten: at refcount 0
 * they join an LRU list of cached blocks, still in the map, and the next
 * prompt with the same prefix takes them back.  Allocation prefers blocks
 * that hold nothing (the free list) and evicts the least recently released
 * cached block only when there is none.
 *
 * THE LIFE OF A BLOCK
 *
 *     FREE (ref 0, no hash, on the free list)
 *       |  block_alloc: kv_seq_append (a token opens a block),
 *       |  kv_seq_prepare_write (copy-on-write)
 *       v
 *     USED (ref >= 1, fill <= block_size)  <-- kv_seq_fork, match: ref++
 *       |  kv_seq_commit: full and computed -> hashed, in the map
 *       |  (release to ref 0 without a hash: back to FREE)
 *       v
 *     USED + hashed (ref >= 1, in the map, immutable)
 *       |  block_release to ref 0 (kv_seq_free, kv_seq_truncate,
 *       |  kv_seq_prepare_write swapping it out)
 *       v
 *     CACHED (ref 0, in the map, at the LRU tail)
 *       |  kv_seq_match_prefix hit: leaves the LRU, ref 1 -> USED + hashed
 *       |  block_alloc with an empty free list: the LRU head is evicted,
 *       |  leaves the map, and is handed out as a fresh USED block
 *       v
 *     USED (ref 1, fill 0, no hash) ...
 *
 * SWAPPING (preemption by swapping, driven by the engine)
 *
 * A preempted sequence's blocks that it holds alone are copied to host
 * memory by the engine and released by kv_seq_swap_out: they follow the
 * ordinary release path above (FREE, or CACHED when hashed), and the
 * table keeps a hole (KV_SWAPPED_OUT) at their logical index.  Blocks the
 * sequence shares keep its reference: they cannot be evicted or change
 * (invariant 5) while it is out, so nothing of them needs saving.
 * kv_seq_swap_in allocates a fresh block for every hole; the engine writes
 * the saved bytes into them.  A refilled block is unhashed even when it
 * sits below n_hashed: its twin, if still cached, stays canonical (the
 * no-deduplication choice below), and the sequence never writes there.
 *
 * INVARIANTS (kv_pool_check verifies 1, 2, 4, 6, 7; the tests verify 3, 5, 8
 * against their own recount of the tables)
 *
 *  1. Every block is in exactly one state: FREE (on the free stack), USED
 *     (refcount > 0) or CACHED (on the LRU list).  n_free + n_used +
 *     n_cached == num_blocks, and the three counts are kept, not computed.
 *  2. refcount 0 and hashed <=> CACHED; refcount 0 and not hashed <=> FREE.
 *     A cached block is never handed out without leaving the map first.
 *  3. A block's refcount equals the number of table entries holding it, over
 *     all live sequences; one table never holds a block twice.
 *  4. The map holds exactly the hashed blocks, each under its own hash, at
 *     most one block per hash value.  A hashed block is full (fill ==
 *     block_size) and its stored token ids are the ones it was computed for.
 *  5. Hashed blocks are immutable.  Only a table's last block can be
 *     partially filled, and a sequence writes into it in place only when the
 *     refcount is 1 and it has no hash; otherwise kv_seq_prepare_write swaps
 *     in a copy first (copy-on-write).  So a shared block never changes
 *     under another sequence, and a cache hit always means the K/V of
 *     exactly the stored tokens after exactly the verified parent.
 *  6. used_tokens is the sum of fill over USED blocks; FREE blocks have fill
 *     0 and CACHED blocks fill == block_size.
 *  7. The LRU list is doubly linked, head = least recently released, and
 *     holds exactly the CACHED blocks.
 *  8. For a sequence: n_blocks == ceil(n_tokens / bs), n_hashed <= n_tokens /
 *     bs, and s->hash is the hash of block n_hashed - 1 as computed from
 *     s->tokens.  n_swapped counts the KV_SWAPPED_OUT entries; a hole holds
 *     no reference (invariant 3 counts only real entries).  The first
 *     n_dropped entries, and only they, are KV_DROPPED (released out of a
 *     sliding window, no reference either), and n_dropped < n_blocks.  Because kv_seq_free releases blocks last first, a
 *     sequence's deeper blocks are evicted before its first ones: a chain is
 *     found only from its head, so evicting the head first would strand the
 *     rest.
 *
 * CHOICES
 *
 * - No deduplication at commit.  When a block's hash is already in the map
 *   (another sequence computed the same prefix at the same time), the
 *   registered block stays canonical and the new one stays unhashed; it goes
 *   to the free list when released.  Rewriting a table behind the engine
 *   would be a trap for a backend that holds the table across a step.
 * - All-or-nothing: every function that can fail checks and reserves what it
 *   needs (blocks, array capacity) before it changes anything, so an error
 *   leaves the sequence and the pool exactly as they were.  The scheduler
 *   relies on this to preempt and retry.
 * - Appending into a block that must be copied is refused (QERR_INVAL)
 *   rather than copied silently: the copy needs the backend, and only the
 *   engine may call it, so the engine has to see every copy pair.
 * - Utilisation is physical: a block shared by n sequences counts once.  A
 *   block's fill is the most tokens any holder has in it; after a truncation
 *   of a shared block it can overstate the survivor's count until that
 *   sequence writes the block again.
 * - Token ids are stored in the kv_seq (4 bytes per token) so that hashing
 *   at commit, fork and truncation need nothing from the caller, and in the
 *   pool for hashed blocks (block_size ids each) to verify hits.
 */
#include "kv.h"
#include "qerr.h"
#include "buf.h"
#include "util.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define KV_NONE (-1)
#define KV_HASH_SEED 0x6b765f626c6f636bULL /* "kv_block" */

typedef struct {
    int32_t ref;            /* table entries holding the block (invariant 3) */
    int32_t fill;           /* token slots in use */
    int32_t prev, next;     /* LRU links while CACHED */
    int32_t map_next;       /* hash-bucket chain while hashed */
    uint8_t state;          /* kv_block_state */
    uint8_t hashed;
    uint8_t hash[KV_HASH_BYTES];
    uint8_t parent[KV_HASH_BYTES];  /* hash of the block before it in its chain */
    int32_t index;          /* logical index in its chain, while hashed */
    uint32_t gen;           /* allocations of the block so far (kv_pool_block_gen) */
} kv_block;

struct kv_pool {
    int num_blocks;
    int block_size;
    uint8_t fingerprint[KV_HASH_BYTES];
    int hash_bits;              /* 128, or fewer for collision tests */

    kv_block *blocks;           /* (num_blocks) */
    int32_t *tokens;            /* (num_blocks, block_size) ids of hashed blocks */

    int32_t *free_stack;        /* (num_blocks) FREE blocks; top = next handed out */
    int n_free;

    int32_t lru_head, lru_tail; /* CACHED blocks, head evicted first */
    int n_cached;

    int32_t *buckets;           /* (n_buckets) heads of hash chains */
    uint32_t n_buckets;         /* power of two */
    int n_hashed;

    int64_t used_tokens;
    kv_stats st;                /* counters only; gauges are computed */
};

/* ---- hashing -------------------------------------------------------- */

static void block_hash(const kv_pool *p, const uint8_t parent[KV_HASH_BYTES], const int32_t *tok,
                       uint8_t out[KV_HASH_BYTES])
{
    qhash h;
    qhash_init(&h, KV_HASH_SEED);
    qhash_update(&h, parent, KV_HASH_BYTES);
    qhash_update(&h, p->fingerprint, KV_HASH_BYTES);
    /* Token ids as little-endian 32-bit words, in chunks of 64 ids (a
     * multiple of 8 bytes, so the chunking does not change the hash). */
    uint8_t buf[256];
    for (int i = 0; i < p->block_size;) {
        int k = 0;
        for (; k < 64 && i < p->block_size; k++, i++) {
            uint32_t v = (uint32_t)tok[i];
            buf[4 * k] = (uint8_t)v;
            buf[4 * k + 1] = (uint8_t)(v >> 8);
            buf[4 * k + 2] = (uint8_t)(v >> 16);
            buf[4 * k + 3] = (uint8_t)(v >> 24);
        }
        qhash_update(&h, buf, (size_t)k * 4);
    }
    qhash_final(&h, out);
    if (p->hash_bits < 128) {
        int keep = p->hash_bits;
        for (int i = 0; i < KV_HASH_BYTES; i++, keep -= 8) {
            if (keep >= 8) continue;
            out[i] = keep > 0 ? (uint8_t)(out[i] & ((1u << keep) - 1)) : 0;
        }
    }
}

static uint32_t bucket_of(const kv_pool *p, const uint8_t hash[KV_HASH_BYTES])
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)hash[i] << (8 * i);
    return (uint32_t)(v ^ (v >> 32)) & (p->n_buckets - 1);
}

static int map_find(const kv_pool *p, const uint8_t hash[KV_HASH_BYTES])
{
    for (int32_t b = p->buckets[bucket_of(p, hash)]; b != KV_NONE; b = p->blocks[b].map_next)
        if (!memcmp(p->blocks[b].hash, hash, KV_HASH_BYTES)) return b;
    return KV_NONE;
}

/* Registers block b under hash, with its parent and token ids.  The caller
 * has checked that the hash is not in the map and b is not hashed. */
static void map_insert(kv_pool *p, int32_t b, const uint8_t hash[KV_HASH_BYTES],
                       const uint8_t parent[KV_HASH_BYTES], int index, const int32_t *tok)
{
    kv_block *k = &p->blocks[b];
    k->index = index;
    memcpy(k->hash, hash, KV_HASH_BYTES);
    memcpy(k->parent, parent, KV_HASH_BYTES);
    memcpy(p->tokens + (size_t)b * (size_t)p->block_size, tok, sizeof(int32_t) * (size_t)p->block_size);
    uint32_t i = bucket_of(p, hash);
    k->map_next = p->buckets[i];
    p->buckets[i] = b;
    k->hashed = 1;
    p->n_hashed++;
}

static void map_remove(kv_pool *p, int32_t b)
{
    kv_block *k = &p->blocks[b];
    int32_t *link = &p->buckets[bucket_of(p, k->hash)];
    while (*link != KV_NONE && *link != b) link = &p->blocks[*link].map_next;
    if (*link == b) *link = k->map_next;
    k->map_next = KV_NONE;
    k->hashed = 0;
    p->n_hashed--;
}

/* 1 when hashed block b holds exactly tok, as logical block `index`, after
 * parent.  The index is redundant with the hash chain except under a
 * collision; it keeps a block from matching at two depths of one prompt. */
static int block_matches(const kv_pool *p, int32_t b, const uint8_t parent[KV_HASH_BYTES], int index,
                         const int32_t *tok)
{
    return p->blocks[b].index == index && !memcmp(p->blocks[b].parent, parent, KV_HASH_BYTES) &&
           !memcmp(p->tokens + (size_t)b * (size_t)p->block_size, tok, sizeof(int32_t) * (size_t)p->block_size);
}

/* ---- the LRU list ------------------------------------------------------- */

static void lru_push_tail(kv_pool *p, int32_t b)
{
    kv_block *k = &p->blocks[b];
    k->prev = p->lru_tail;
    k->next = KV_NONE;
    if (p->lru_tail != KV_NONE) p->blocks[p->lru_tail].next = b;
    else p->lru_head = b;
    p->lru_tail = b;
    p->n_cached++;
}

static void lru_unlink(kv_pool *p, int32_t b)
{
    kv_block *k = &p->blocks[b];
    if (k->prev != KV_NONE) p->blocks[k->prev].next = k->next;
    else p->lru_head = k->next;
    if (k->next != KV_NONE) p->blocks[k->next].prev = k->prev;
    else p->lru_tail = k->prev;
    k->prev = k->next = KV_NONE;
    p->n_cached--;
}

/* ---- block transitions -------------------------------------------------- */

/* Hands out a block with ref 1 and fill 0: a FREE one if any, else the LRU
 * head, evicted from the map.  The caller has checked that one exists. */
static int32_t block_alloc(kv_pool *p)
{
    int32_t b;
    if (p->n_free > 0) {
        b = p->free_stack[--p->n_free];
    } else {
        b = p->lru_head;
        lru_unlink(p, b);
        map_remove(p, b);
        p->st.evictions++;
    }
    kv_block *k = &p->blocks[b];
    k->state = KV_BLOCK_USED;
    k->ref = 1;
    k->fill = 0;
    k->gen++;
    return b;
}

/* Drops one reference; at 0 the block is cached (hashed) or freed. */
static void block_release(kv_pool *p, int32_t b)
{
    kv_block *k = &p->blocks[b];
    if (--k->ref > 0) return;
    p->used_tokens -= k->fill;
    if (k->hashed) {
        k->state = KV_BLOCK_CACHED;
        lru_push_tail(p, b);
    } else {
        k->state = KV_BLOCK_FREE;
        k->fill = 0;
        p->free_stack[p->n_free++] = b;
    }
}

/* Takes a reference on a hashed block found in the map. */
static void block_revive(kv_pool *p, int32_t b)
{
    kv_block *k = &p->blocks[b];
    if (k->state == KV_BLOCK_CACHED) {
        lru_unlink(p, b);
        k->state = KV_BLOCK_USED;
        p->used_tokens += k->fill;
    }
    k->ref++;
}

/* ---- the pool ----------------------------------------------------------- */

int kv_pool_create(int num_blocks, int block_size, const uint8_t model_fingerprint[KV_HASH_BYTES],
                   kv_pool **out, char *err, size_t errlen)
{
    if (out) *out = NULL;
    if (!out || !model_fingerprint)
        return qerr_set(err, errlen, QERR_INVAL, "kv_pool_create: NULL argument");
    if (num_blocks <= 0 || block_size <= 0)
        return qerr_set(err, errlen, QERR_RANGE, "KV pool needs at least one block of at least one token "
                        "(num_blocks %d, block_size %d)", num_blocks, block_size);
    if (block_size > KV_MAX_BLOCK_SIZE)
        return qerr_set(err, errlen, QERR_RANGE, "KV block_size %d exceeds %d", block_size, KV_MAX_BLOCK_SIZE);
    if ((int64_t)num_blocks * block_size > KV_MAX_POOL_TOKENS)
        return qerr_set(err, errlen, QERR_RANGE, "KV pool of %d blocks of %d tokens exceeds %d token slots",
                        num_blocks, block_size, KV_MAX_POOL_TOKENS);

    kv_pool *p = q_callocn(1, sizeof *p);
    if (!p) goto fail_nomem;
    p->num_blocks = num_blocks;
    p->block_size = block_size;
    memcpy(p->fingerprint, model_fingerprint, KV_HASH_BYTES);
    p->hash_bits = 128;
    p->n_buckets = 16;
    while (p->n_buckets < (uint32_t)num_blocks) p->n_buckets <<= 1;

    p->blocks = q_callocn((size_t)num_blocks, sizeof *p->blocks);
    p->tokens = q_mallocn((size_t)num_blocks * (size_t)block_size, sizeof *p->tokens);
    p->free_stack = q_mallocn((size_t)num_blocks, sizeof *p->free_stack);
    p->buckets = q_mallocn(p->n_buckets, sizeof *p->buckets);
    if (!p->blocks || !p->tokens || !p->free_stack || !p->buckets) goto fail_pool;

    for (uint32_t i = 0; i < p->n_buckets; i++) p->buckets[i] = KV_NONE;
    /* Pushed in reverse so that block 0 is handed out first. */
    for (int b = 0; b < num_blocks; b++) {
        kv_block *k = &p->blocks[b];
        k->prev = k->next = k->map_next = KV_NONE;
        k->state = KV_BLOCK_FREE;
        p->free_stack[b] = num_blocks - 1 - b;
    }
    p->n_free = num_blocks;
    p->lru_head = p->lru_tail = KV_NONE;
    *out = p;
    return 0;

fail_pool:
    kv_pool_destroy(p);
fail_nomem:
    return qerr_set(err, errlen, QERR_NOMEM, "out of memory for a KV pool of %d blocks", num_blocks);
}

void kv_pool_destroy(kv_pool *p)
{
    if (!p) return;
    free(p->buckets);
    free(p->free_stack);
    free(p->tokens);
    free(p->blocks);
    free(p);
}

int kv_pool_num_blocks(const kv_pool *p) { return p->num_blocks; }
int kv_pool_block_size(const kv_pool *p) { return p->block_size; }
int kv_pool_num_free(const kv_pool *p) { return p->n_free; }
int kv_pool_num_cached(const kv_pool *p) { return p->n_cached; }
int kv_pool_num_used(const kv_pool *p) { return p->num_blocks - p->n_free - p->n_cached; }
int kv_pool_num_allocatable(const kv_pool *p) { return p->n_free + p->n_cached; }

void kv_pool_stats(const kv_pool *p, kv_stats *out)
{
    *out = p->st;
    out->num_blocks = p->num_blocks;
    out->block_size = p->block_size;
    out->free_blocks = p->n_free;
    out->cached_blocks = p->n_cached;
    out->used_blocks = kv_pool_num_used(p);
    out->hashed_blocks = p->n_hashed;
    out->used_tokens = p->used_tokens;
    out->utilisation = out->used_blocks ? (double)p->used_tokens / ((double)out->used_blocks * p->block_size) : 0.0;
}

int kv_pool_block_info(const kv_pool *p, int b, kv_block_info *out)
{
    if (b < 0 || b >= p->num_blocks) return QERR_RANGE;
    const kv_block *k = &p->blocks[b];
    memset(out, 0, sizeof *out);
    out->state = (kv_block_state)k->state;
    out->refcount = k->ref;
    out->fill = k->fill;
    out->hashed = k->hashed;
    if (k->hashed) {
        memcpy(out->hash, k->hash, KV_HASH_BYTES);
        out->tokens = p->tokens + (size_t)b * (size_t)p->block_size;
    }
    return 0;
}

uint32_t kv_pool_block_gen(const kv_pool *p, int b)
{
    return b >= 0 && b < p->num_blocks ? p->blocks[b].gen : 0;
}

int kv_pool_set_hash_bits(kv_pool *p, int bits)
{
    if (bits < 1 || bits > 128) return QERR_RANGE;
    if (p->n_hashed) return QERR_BUSY;
    p->hash_bits = bits;
    return 0;
}

#define CHECK_FAIL(...) return qerr_set(err, errlen, QERR_INTERNAL, __VA_ARGS__)

int kv_pool_check(const kv_pool *p, char *err, size_t errlen)
{
    int n = p->num_blocks, bs = p->block_size;
    if (p->n_free < 0 || p->n_cached < 0 || p->n_free + p->n_cached > n)
        CHECK_FAIL("counts out of range: free %d cached %d of %d", p->n_free, p->n_cached, n);

    /* Invariants 1, 2, 6: per-block state against refcount, hash and fill. */
    int n_free = 0, n_used = 0, n_cached = 0, n_hashed = 0;
    int64_t used_tokens = 0;
    for (int b = 0; b < n; b++) {
        const kv_block *k = &p->blocks[b];
        if (k->fill < 0 || k->fill > bs) CHECK_FAIL("block %d: fill %d outside [0, %d]", b, k->fill, bs);
        if (k->hashed) {
            n_hashed++;
            if (k->fill != bs) CHECK_FAIL("block %d: hashed but fill %d", b, k->fill);
        }
        switch (k->state) {
        case KV_BLOCK_FREE:
            n_free++;
            if (k->ref != 0 || k->hashed || k->fill != 0)
                CHECK_FAIL("block %d: free with ref %d hashed %d fill %d", b, k->ref, k->hashed, k->fill);
            break;
        case KV_BLOCK_USED:
            n_used++;
            used_tokens += k->fill;
            if (k->ref <= 0) CHECK_FAIL("block %d: used with ref %d", b, k->ref);
            break;
        case KV_BLOCK_CACHED:
            n_cached++;
            if (k->ref != 0 || !k->hashed) CHECK_FAIL("block %d: cached with ref %d hashed %d", b, k->ref, k->hashed);
            break;
        default:
            CHECK_FAIL("block %d: bad state %d", b, k->state);
        }
    }
    if (n_free != p->n_free || n_cached != p->n_cached || n_free + n_used + n_cached != n)
        CHECK_FAIL("state counts free %d used %d cached %d, kept free %d cached %d, of %d",
                   n_free, n_used, n_cached, p->n_free, p->n_cached, n);
    if (n_hashed != p->n_hashed) CHECK_FAIL("%d hashed blocks, kept %d", n_hashed, p->n_hashed);
    if (used_tokens != p->used_tokens)
        CHECK_FAIL("used tokens %lld, kept %lld", (long long)used_tokens, (long long)p->used_tokens);

    /* The free stack: FREE blocks, each once.  `seen` marks are kept in a
     * scratch array; without memory the structural checks above stand. */
    uint8_t *seen = q_callocn((size_t)n, 1);
    if (seen) {
        for (int i = 0; i < p->n_free; i++) {
            int32_t b = p->free_stack[i];
            if (b < 0 || b >= n || p->blocks[b].state != KV_BLOCK_FREE || seen[b]) {
                free(seen);
                CHECK_FAIL("free stack entry %d: block %d not a unique free block", i, b);
            }
            seen[b] = 1;
        }
    }

    /* Invariant 7: the LRU list, both directions, CACHED blocks only. */
    int len = 0;
    int32_t prev = KV_NONE;
    for (int32_t b = p->lru_head; b != KV_NONE; prev = b, b = p->blocks[b].next) {
        if (b < 0 || b >= n || ++len > p->n_cached) {
            free(seen);
            CHECK_FAIL("LRU list longer than %d or bad id %d", p->n_cached, b);
        }
        if (p->blocks[b].state != KV_BLOCK_CACHED || p->blocks[b].prev != prev) {
            free(seen);
            CHECK_FAIL("LRU entry %d: block %d state %d prev %d, expected prev %d", len, b,
                       p->blocks[b].state, p->blocks[b].prev, prev);
        }
    }
    if (len != p->n_cached || prev != p->lru_tail) {
        free(seen);
        CHECK_FAIL("LRU list of %d ends at %d; kept %d ending at %d", len, prev, p->n_cached, p->lru_tail);
    }

    /* Invariant 4: every chain entry is hashed and in its bucket, each hash
     * once, and the chains hold every hashed block. */
    if (seen) memset(seen, 0, (size_t)n);
    int in_map = 0;
    for (uint32_t i = 0; i < p->n_buckets; i++) {
        for (int32_t b = p->buckets[i]; b != KV_NONE; b = p->blocks[b].map_next) {
            if (b < 0 || b >= n || ++in_map > n_hashed || !p->blocks[b].hashed ||
                bucket_of(p, p->blocks[b].hash) != i || (seen && seen[b])) {
                free(seen);
                CHECK_FAIL("hash bucket %u: bad entry %d", i, b);
            }
            if (seen) seen[b] = 1;
            for (int32_t c = p->blocks[b].map_next; c != KV_NONE && c >= 0 && c < n; c = p->blocks[c].map_next)
                if (!memcmp(p->blocks[c].hash, p->blocks[b].hash, KV_HASH_BYTES)) {
                    free(seen);
                    CHECK_FAIL("blocks %d and %d share a hash in the map", b, c);
                }
        }
    }
    free(seen);
    if (in_map != n_hashed) CHECK_FAIL("%d blocks in the map, %d hashed", in_map, n_hashed);
    return 0;
}

#undef CHECK_FAIL

/* ---- sequences ---------------------------------------------------------- */

void kv_seq_init(kv_seq *s) { memset(s, 0, sizeof *s); }

void kv_seq_free(kv_pool *p, kv_seq *s)
{
    if (!s) return;
    for (int i = s->n_blocks - 1; i >= 0; i--)
        if (s->blocks[i] >= 0) block_release(p, s->blocks[i]); /* not a hole, not dropped */
    free(s->blocks);
    free(s->tokens);
    kv_seq_init(s);
}

/* Grows s's arrays to hold n_blocks blocks and n_tokens tokens.  Changes
 * nothing visible: on failure the old arrays stay. */
static int seq_reserve(kv_seq *s, int n_blocks, int n_tokens)
{
    if (n_blocks > s->cap_blocks) {
        int cap = s->cap_blocks ? s->cap_blocks : 4;
        while (cap < n_blocks) cap = cap > INT_MAX / 2 ? n_blocks : cap * 2;
        int32_t *nb = q_reallocn(s->blocks, (size_t)cap, sizeof *nb);
        if (!nb) return QERR_NOMEM;
        s->blocks = nb;
        s->cap_blocks = cap;
    }
    if (n_tokens > s->cap_tokens) {
        int cap = s->cap_tokens ? s->cap_tokens : 64;
        while (cap < n_tokens) cap = cap > INT_MAX / 2 ? n_tokens : cap * 2;
        int32_t *nt = q_reallocn(s->tokens, (size_t)cap, sizeof *nt);
        if (!nt) return QERR_NOMEM;
        s->tokens = nt;
        s->cap_tokens = cap;
    }
    return 0;
}

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/* 1 when the next token of s goes into its existing last block and s may
 * not write that block in place (shared or hashed: invariant 5). */
static int seq_needs_copy(const kv_pool *p, const kv_seq *s)
{
    if (s->n_tokens % p->block_size == 0 || s->n_blocks == 0) return 0;
    /* A hole is refilled with a fresh block of s's own. */
    if (s->blocks[s->n_blocks - 1] == KV_SWAPPED_OUT) return 0;
    const kv_block *k = &p->blocks[s->blocks[s->n_blocks - 1]];
    return k->ref > 1 || k->hashed;
}

/* Blocks opened by n more tokens, or QERR_LIMIT past the pool's size. */
static int seq_new_blocks(const kv_pool *p, const kv_seq *s, int n)
{
    int64_t total = (int64_t)s->n_tokens + n;
    int64_t nb = ceil_div(total, p->block_size);
    if (nb - s->n_dropped > p->num_blocks) return QERR_LIMIT;
    return (int)(nb - s->n_blocks);
}

int kv_seq_blocks_needed(const kv_pool *p, const kv_seq *s, int n)
{
    if (n < 0) return QERR_INVAL;
    if (n == 0) return 0;
    int nb = seq_new_blocks(p, s, n);
    if (nb < 0) return nb;
    return nb + seq_needs_copy(p, s);
}

int kv_seq_can_append(const kv_pool *p, const kv_seq *s, int n)
{
    int need = kv_seq_blocks_needed(p, s, n);
    return need >= 0 && need <= kv_pool_num_allocatable(p);
}

int kv_seq_append(kv_pool *p, kv_seq *s, const int32_t *tokens, int n)
{
    if (n < 0 || (n > 0 && !tokens) || s->n_swapped) return QERR_INVAL;
    if (n == 0) return 0;
    if (seq_needs_copy(p, s)) return QERR_INVAL;
    /* The size first: a count that can never fit is refused before the ids
     * are read. */
    int nb = seq_new_blocks(p, s, n);
    if (nb < 0) return nb;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0) return QERR_INVAL;
    if (nb > kv_pool_num_allocatable(p)) return QERR_BUSY;
    int total = s->n_tokens + n; /* <= num_blocks * block_size <= KV_MAX_POOL_TOKENS */
    int rc = seq_reserve(s, s->n_blocks + nb, total);
    if (rc) return rc;

    /* Nothing can fail from here on. */
    for (int i = 0; i < nb; i++) s->blocks[s->n_blocks++] = block_alloc(p);
    memcpy(s->tokens + s->n_tokens, tokens, sizeof(int32_t) * (size_t)n);
    /* Set the fill of every block the tokens touched: the old last block
     * (written in place, so s's count is exact) and the new ones. */
    int bs = p->block_size;
    for (int i = s->n_tokens / bs; i < s->n_blocks; i++) {
        kv_block *k = &p->blocks[s->blocks[i]];
        int fill = total - i * bs < bs ? total - i * bs : bs;
        p->used_tokens += fill - k->fill;
        k->fill = fill;
    }
    s->n_tokens = total;
    return 0;
}

int kv_seq_prepare_write(kv_pool *p, kv_seq *s, int *copy_src, int *copy_dst)
{
    if (s->n_swapped) return QERR_INVAL;
    if (!seq_needs_copy(p, s)) return 0;
    if (kv_pool_num_allocatable(p) < 1) return QERR_BUSY;
    int32_t old = s->blocks[s->n_blocks - 1];
    int32_t fresh = block_alloc(p); /* cannot be `old`: old has ref >= 1 */
    int fill = s->n_tokens % p->block_size;
    p->blocks[fresh].fill = fill;
    p->used_tokens += fill;
    s->blocks[s->n_blocks - 1] = fresh;
    block_release(p, old);
    p->st.cow_copies++;
    if (copy_src) *copy_src = old;
    if (copy_dst) *copy_dst = fresh;
    return 1;
}

int kv_seq_commit(kv_pool *p, kv_seq *s, int n_computed)
{
    if (n_computed < 0 || n_computed > s->n_tokens) return QERR_RANGE;
    if (s->n_swapped) return QERR_INVAL;
    int bs = p->block_size, full = n_computed / bs, registered = 0;
    for (int i = s->n_hashed; i < full; i++) {
        const int32_t *tok = s->tokens + (size_t)i * bs;
        uint8_t h[KV_HASH_BYTES];
        block_hash(p, s->hash, tok, h);
        int32_t b = s->blocks[i];
        int32_t e = map_find(p, h);
        if (b < 0) {
            /* Dropped before it was hashed: the chain goes on past it. */
        } else if (e == KV_NONE && !p->blocks[b].hashed) {
            map_insert(p, b, h, s->hash, i, tok);
            registered++;
        } else if (e != KV_NONE && e != b && !block_matches(p, e, s->hash, i, tok)) {
            /* Equal hash, other content: the registered block stays, ours
             * stays unhashed.  Its chain still continues from h. */
            p->st.hash_collisions++;
        }
        /* Otherwise: e == b (a forked sibling registered this very block),
         * or an equal block is canonical already; b stays as it is. */
        memcpy(s->hash, h, KV_HASH_BYTES);
        s->n_hashed = i + 1;
    }
    return registered;
}

int kv_seq_match_prefix(kv_pool *p, kv_seq *s, const int32_t *prompt, int n)
{
    if (s->n_tokens || s->n_blocks || n < 0 || (n > 0 && !prompt)) return QERR_INVAL;
    for (int i = 0; i < n; i++)
        if (prompt[i] < 0) return QERR_INVAL;
    int bs = p->block_size;
    /* Full blocks before the one holding the last token; and no chain can be
     * longer than the pool. */
    int eligible = n > 0 ? (n - 1) / bs : 0;
    int max_blocks = eligible < p->num_blocks ? eligible : p->num_blocks;
    int rc = seq_reserve(s, max_blocks, max_blocks * bs);
    if (rc) return rc;

    uint8_t parent[KV_HASH_BYTES] = {0};
    int hits = 0;
    for (int i = 0; i < max_blocks; i++) {
        const int32_t *tok = prompt + (size_t)i * bs;
        uint8_t h[KV_HASH_BYTES];
        block_hash(p, parent, tok, h);
        int32_t b = map_find(p, h);
        if (b == KV_NONE) break;
        if (!block_matches(p, b, parent, i, tok)) {
            p->st.hash_collisions++;
            break;
        }
        if (p->blocks[b].ref == INT32_MAX) break;
        block_revive(p, b);
        s->blocks[hits++] = b;
        memcpy(parent, h, KV_HASH_BYTES);
    }
    s->n_blocks = s->n_hashed = hits;
    s->n_tokens = hits * bs;
    if (hits) memcpy(s->tokens, prompt, sizeof(int32_t) * (size_t)s->n_tokens);
    memcpy(s->hash, parent, KV_HASH_BYTES);

    p->st.hit_blocks += (uint64_t)hits;
    p->st.miss_blocks += (uint64_t)(eligible - hits);
    p->st.hit_tokens += (uint64_t)s->n_tokens;
    p->st.miss_tokens += (uint64_t)(n - s->n_tokens);
    return s->n_tokens;
}

void kv_chain_hashes(const kv_pool *p, const int32_t *tokens, int n_blocks, uint8_t (*out)[KV_HASH_BYTES])
{
    uint8_t parent[KV_HASH_BYTES] = {0};
    for (int i = 0; i < n_blocks; i++) {
        block_hash(p, parent, tokens + (size_t)i * p->block_size, out[i]);
        memcpy(parent, out[i], KV_HASH_BYTES);
    }
}

int kv_prefix_probe(const kv_pool *p, const int32_t *prompt, int n, int *eligible)
{
    if (n > 0 && !prompt) return QERR_INVAL;
    const int bs = p->block_size;
    int el = n > 0 ? (n - 1) / bs : 0;
    if (el > p->num_blocks) el = p->num_blocks;
    if (eligible) *eligible = el;
    uint8_t parent[KV_HASH_BYTES] = {0};
    int hits = 0;
    for (; hits < el; hits++) {
        const int32_t *tok = prompt + (size_t)hits * bs;
        uint8_t h[KV_HASH_BYTES];
        block_hash(p, parent, tok, h);
        int32_t b = map_find(p, h);
        if (b == KV_NONE || !block_matches(p, b, parent, hits, tok)) break;
        memcpy(parent, h, KV_HASH_BYTES);
    }
    return hits;
}

int kv_seq_import(kv_pool *p, kv_seq *s, const int32_t *tokens, const uint8_t want_hash[KV_HASH_BYTES],
                  int32_t *block)
{
    const int bs = p->block_size;
    if (s->n_swapped || s->n_tokens != s->n_hashed * bs || s->n_blocks != s->n_hashed || !tokens) return QERR_INVAL;
    for (int i = 0; i < bs; i++)
        if (tokens[i] < 0) return QERR_INVAL;
    uint8_t h[KV_HASH_BYTES];
    block_hash(p, s->hash, tokens, h);
    if (want_hash && memcmp(h, want_hash, KV_HASH_BYTES)) return QERR_FORMAT;
    if (kv_pool_num_allocatable(p) < 1) return QERR_BUSY;
    int rc = seq_reserve(s, s->n_blocks + 1, s->n_tokens + bs);
    if (rc) return rc;
    const int32_t b = block_alloc(p);
    p->blocks[b].fill = bs;
    p->used_tokens += bs;
    if (map_find(p, h) == KV_NONE) map_insert(p, b, h, s->hash, s->n_blocks, tokens);
    memcpy(s->tokens + s->n_tokens, tokens, sizeof(int32_t) * (size_t)bs);
    s->blocks[s->n_blocks++] = b;
    s->n_tokens += bs;
    s->n_hashed++;
    memcpy(s->hash, h, KV_HASH_BYTES);
    if (block) *block = b;
    return 0;
}

int kv_seq_fork(kv_pool *p, const kv_seq *src, kv_seq *dst)
{
    if (src == dst || dst->n_tokens || dst->n_blocks || src->n_swapped) return QERR_INVAL;
    for (int i = src->n_dropped; i < src->n_blocks; i++)
        if (p->blocks[src->blocks[i]].ref == INT32_MAX) return QERR_LIMIT;
    int rc = seq_reserve(dst, src->n_blocks, src->n_tokens);
    if (rc) return rc;
    for (int i = 0; i < src->n_blocks; i++) {
        dst->blocks[i] = src->blocks[i];
        if (i >= src->n_dropped) p->blocks[src->blocks[i]].ref++;
    }
    dst->n_dropped = src->n_dropped;
    if (src->n_tokens) memcpy(dst->tokens, src->tokens, sizeof(int32_t) * (size_t)src->n_tokens);
    dst->n_blocks = src->n_blocks;
    dst->n_tokens = src->n_tokens;
    dst->n_hashed = src->n_hashed;
    memcpy(dst->hash, src->hash, KV_HASH_BYTES);
    return 0;
}

int kv_seq_truncate(kv_pool *p, kv_seq *s, int n)
{
    int bs = p->block_size;
    if (s->n_swapped) return QERR_INVAL;
    if (n < 0 || n > s->n_tokens || n < s->n_hashed * bs || (s->n_dropped && n <= s->n_dropped * bs)) return QERR_RANGE;
    int keep = (int)ceil_div(n, bs);
    while (s->n_blocks > keep) block_release(p, s->blocks[--s->n_blocks]);
    if (keep > 0) {
        kv_block *k = &p->blocks[s->blocks[keep - 1]];
        int fill = n - (keep - 1) * bs;
        /* Only a block s owns alone and may write can shrink (see CHOICES). */
        if (k->ref == 1 && !k->hashed) {
            p->used_tokens += fill - k->fill;
            k->fill = fill;
        }
    }
    s->n_tokens = n;
    return 0;
}

int kv_seq_drop_before(kv_pool *p, kv_seq *s, int pos)
{
    if (s->n_swapped) return QERR_INVAL;
    /* Blocks wholly before pos, never the one holding the last token. */
    int upto = pos > 0 ? pos / p->block_size : 0;
    if (upto > s->n_blocks - 1) upto = s->n_blocks - 1;
    int n = 0;
    /* Deepest first, as kv_seq_free releases. */
    for (int i = upto - 1; i >= s->n_dropped; i--, n++) {
        block_release(p, s->blocks[i]);
        s->blocks[i] = KV_DROPPED;
    }
    if (n > 0) s->n_dropped = upto;
    p->st.dropped_blocks += (uint64_t)n;
    return n;
}

/* ---- swapping ------------------------------------------------------------ */

int kv_seq_exclusive_blocks(const kv_pool *p, const kv_seq *s, int32_t *idx)
{
    int n = 0;
    if (s->n_swapped) return 0;
    for (int i = s->n_dropped; i < s->n_blocks; i++)
        if (p->blocks[s->blocks[i]].ref == 1) idx[n++] = i;
    return n;
}

int kv_seq_swap_out(kv_pool *p, kv_seq *s, const int32_t *idx, int n)
{
    if (s->n_swapped || n < 1 || n > s->n_blocks) return QERR_INVAL;
    for (int k = 0; k < n; k++) {
        if (idx[k] < s->n_dropped || idx[k] >= s->n_blocks || (k > 0 && idx[k] <= idx[k - 1])) return QERR_INVAL;
        if (p->blocks[s->blocks[idx[k]]].ref != 1) return QERR_INVAL;
    }
    /* Deepest first, as kv_seq_free does: the LRU then evicts a chain from
     * its tail. */
    for (int k = n - 1; k >= 0; k--) {
        block_release(p, s->blocks[idx[k]]);
        s->blocks[idx[k]] = KV_SWAPPED_OUT;
    }
    s->n_swapped = n;
    return 0;
}

int kv_seq_swap_in(kv_pool *p, kv_seq *s, int32_t *idx)
{
    if (!s->n_swapped) return 0;
    if (s->n_swapped > kv_pool_num_allocatable(p)) return QERR_BUSY;
    int bs = p->block_size, n = 0;
    for (int i = 0; i < s->n_blocks; i++) {
        if (s->blocks[i] != KV_SWAPPED_OUT) continue;
        int32_t b = block_alloc(p);
        int fill = s->n_tokens - i * bs < bs ? s->n_tokens - i * bs : bs;
        p->blocks[b].fill = fill;
        p->used_tokens += fill;
        s->blocks[i] = b;
        idx[n++] = i;
    }
    s->n_swapped = 0;
    return n;
}
