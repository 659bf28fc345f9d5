/* kv.h - the KV cache manager: block pool, per-sequence block tables,
 * prefix cache (hash chain of full blocks, LRU of cached blocks) and
 * copy-on-write for parallel sampling.
 *
 * The pool hands out block ids; it never touches K/V memory.  The backend
 * owns the bytes (backend.h), and the engine calls the backend's copy_block
 * for the copy pairs this module reports.  Nothing here is thread-safe: the
 * engine thread owns the pool and every kv_seq (DESIGN.md, "Threads").
 *
 * A sequence's life, as the engine drives it:
 *
 *     kv_seq_init(&s);
 *     n = kv_seq_match_prefix(pool, &s, prompt, len);   reuse cached blocks
 *     if (kv_seq_can_append(pool, &s, len - n))
 *         kv_seq_append(pool, &s, prompt + n, len - n);  allocate the rest
 *     ... forward pass over s.blocks ...
 *     kv_seq_commit(pool, &s, s.n_tokens);              hash full blocks
 *     loop: kv_seq_prepare_write (copy pair -> backend copy_block),
 *           kv_seq_append(1 token), forward, kv_seq_commit
 *     kv_seq_free(pool, &s);                            blocks -> free/LRU
 *
 * Preemption by swapping (the engine moves the bytes, backend.h):
 *
 *     n = kv_seq_exclusive_blocks(pool, &s, idx);       blocks s holds alone
 *     ... qbackend_read_blocks(those blocks) -> host slots ...
 *     kv_seq_swap_out(pool, &s, idx, n);                released, holes left
 *     ... later ...
 *     n = kv_seq_swap_in(pool, &s, idx);                fresh blocks in the holes
 *     ... qbackend_write_blocks(host slots -> those blocks) ...
 *
 * kv.c opens with the design: invariants and the life cycle of a block. */
#ifndef QUIRE_KV_H
#define QUIRE_KV_H

#include <stddef.h>
#include <stdint.h>

/* Limits on the pool's geometry.  num_blocks * block_size must not exceed
 * KV_MAX_POOL_TOKENS, so token counts and positions always fit an int. */
#define KV_MAX_BLOCK_SIZE 4096
#define KV_MAX_POOL_TOKENS (1 << 30)
#define KV_HASH_BYTES 16

typedef struct kv_pool kv_pool;

/* One sequence's block table and the token ids behind it.  Callers embed it
 * (in a request) and read its fields; only kv_seq_* functions write them.
 *
 *   blocks[i]  physical block holding tokens [i*block_size, (i+1)*block_size);
 *              pass blocks / n_blocks to the backend as the block table.
 *   n_blocks   always ceil(n_tokens / block_size).
 *   tokens     the token ids whose K/V live (or will live) in the blocks.
 *   n_hashed   leading blocks that are full, computed and hashed
 *              (kv_seq_commit, or reused by kv_seq_match_prefix); they are
 *              immutable, and the sequence cannot be truncated into them.
 *   hash       hash of block n_hashed - 1 (zeros when n_hashed == 0): the
 *              parent of the next block to be hashed.
 *   n_swapped  entries of blocks[] that are KV_SWAPPED_OUT: blocks the
 *              sequence held alone, released by kv_seq_swap_out while their
 *              bytes sit in host memory.  While it is > 0 the sequence is
 *              parked: only kv_seq_swap_in and kv_seq_free accept it.
 *   n_dropped  leading entries of blocks[] that are KV_DROPPED: blocks
 *              released by kv_seq_drop_before because no later token
 *              attends to them (a sliding-window model). */
typedef struct {
    int32_t *blocks;        /* (n_blocks) physical block ids */
    int n_blocks;
    int cap_blocks;
    int32_t *tokens;        /* (n_tokens) token ids, all >= 0 */
    int n_tokens;
    int cap_tokens;
    int n_hashed;
    uint8_t hash[KV_HASH_BYTES];
    int n_swapped;
    int n_dropped;
} kv_seq;

/* A block table entry whose block was swapped out (kv_seq.n_swapped). */
#define KV_SWAPPED_OUT (-1)
/* A block table entry released as out of every layer's window (kv_seq.n_dropped). */
#define KV_DROPPED (-2)

/* Where a block is in its life (see kv.c). */
typedef enum {
    KV_BLOCK_FREE = 0,      /* refcount 0, not hashed: on the free list */
    KV_BLOCK_USED = 1,      /* refcount > 0: in at least one block table */
    KV_BLOCK_CACHED = 2     /* refcount 0, hashed: in the LRU, evictable */
} kv_block_state;

typedef struct {
    kv_block_state state;
    int refcount;           /* block tables holding the block */
    int fill;               /* token slots in use (0 while free) */
    int hashed;             /* registered in the prefix map */
    uint8_t hash[KV_HASH_BYTES];    /* valid when hashed */
    const int32_t *tokens;  /* (block_size) token ids when hashed, else NULL;
                             * owned by the pool, valid until the next call */
} kv_block_info;

/* Counters and gauges.  Gauges (blocks, used_tokens, utilisation) describe
 * the pool now; counters (the rest) accumulate from creation. */
typedef struct {
    int num_blocks;
    int block_size;
    int free_blocks;        /* never used, or released without a hash */
    int used_blocks;        /* refcount > 0 */
    int cached_blocks;      /* refcount 0 and hashed: prefix cache, evictable */
    int hashed_blocks;      /* in the prefix map (used or cached) */
    int64_t used_tokens;    /* token slots holding tokens in used blocks */
    /* used_tokens / (used_blocks * block_size); 0 when no block is used.
     * Physical: a block shared by several sequences counts once. */
    double utilisation;
    uint64_t hit_blocks;    /* kv_seq_match_prefix: full blocks reused */
    uint64_t miss_blocks;   /* eligible full blocks not found */
    uint64_t hit_tokens;    /* prompt tokens reused */
    uint64_t miss_tokens;   /* prompt tokens left to compute */
    uint64_t evictions;     /* cached blocks taken for reuse */
    uint64_t cow_copies;    /* copy pairs reported by kv_seq_prepare_write */
    uint64_t hash_collisions;  /* equal hashes whose tokens or parent differed */
    uint64_t dropped_blocks;   /* released by kv_seq_drop_before (out of the window) */
} kv_stats;

/* ---- the pool ----------------------------------------------------------- */

/* Creates a pool of num_blocks blocks of block_size token slots.  Block
 * hashes include model_fingerprint (16 bytes), so blocks of another model
 * never match.  Returns 0 and *out (the caller owns it; kv_pool_destroy),
 * or QERR_INVAL / QERR_RANGE for bad arguments (sizes <= 0, block_size >
 * KV_MAX_BLOCK_SIZE, num_blocks * block_size > KV_MAX_POOL_TOKENS), or
 * QERR_NOMEM; a message goes to err.  *out is NULL on failure. */
int kv_pool_create(int num_blocks, int block_size, const uint8_t model_fingerprint[KV_HASH_BYTES],
                   kv_pool **out, char *err, size_t errlen);

/* Frees the pool.  Sequences must have been freed (kv_seq_free) first: their
 * block ids mean nothing afterwards.  NULL is a no-op. */
void kv_pool_destroy(kv_pool *p);

/* Geometry and O(1) counts.  Cannot fail. */
int kv_pool_num_blocks(const kv_pool *p);
int kv_pool_block_size(const kv_pool *p);
int kv_pool_num_free(const kv_pool *p);
int kv_pool_num_used(const kv_pool *p);
int kv_pool_num_cached(const kv_pool *p);
/* Blocks an allocation can take now: free + cached (cached are evicted). */
int kv_pool_num_allocatable(const kv_pool *p);

/* Fills *out.  Cannot fail. */
void kv_pool_stats(const kv_pool *p, kv_stats *out);

/* Describes block b (for the persistent tier, metrics and tests).  Returns 0,
 * or QERR_RANGE when b is not a block id. */
int kv_pool_block_info(const kv_pool *p, int b, kv_block_info *out);

/* How many times block b was handed out (0 for a block never used, or
 * not a block id).  It changes exactly when the block may take other
 * contents: whoever keeps bytes of its own beside a block (a draft model's
 * K/V at the same block ids) knows them current while the number it saw
 * when it wrote them stands.  A cached block found again by a prefix match
 * keeps its number.  Cannot fail. */
uint32_t kv_pool_block_gen(const kv_pool *p, int b);

/* Validates every internal invariant of the pool (kv.c lists them): counts,
 * free list, LRU list, hash map, fills.  O(num_blocks).  Returns 0, or
 * QERR_INTERNAL with the first violation in err.  The pool cannot see block
 * tables; callers that can compare kv_pool_block_info().refcount with a
 * recount over their tables. */
int kv_pool_check(const kv_pool *p, char *err, size_t errlen);

/* For tests: keeps only the low `bits` bits (1..128) of every block hash, so
 * that collisions happen and the token comparison that defends against them
 * is exercised.  Returns 0, QERR_RANGE for bits outside 1..128, or QERR_BUSY
 * when any block is hashed already. */
int kv_pool_set_hash_bits(kv_pool *p, int bits);

/* ---- sequences ---------------------------------------------------------- */

/* Makes *s an empty sequence (no blocks, no memory).  Cannot fail. */
void kv_seq_init(kv_seq *s);

/* Releases every block of s, last block first (so that, among one
 * sequence's cached blocks, the deepest is evicted first: a prefix is only
 * found through its first blocks); holes left by kv_seq_swap_out are
 * skipped.  A block whose refcount reaches 0 goes to the LRU of cached
 * blocks when it is hashed, else to the free list.  Frees the arrays and
 * leaves s empty, as after kv_seq_init.  s == NULL is a no-op.  Cannot
 * fail. */
void kv_seq_free(kv_pool *p, kv_seq *s);

/* New blocks that appending n tokens to s takes from the pool: blocks opened
 * by the tokens, plus one when the first token lands in a partially filled
 * block that s may not write in place (see kv_seq_prepare_write).  Returns
 * that count (>= 0), QERR_INVAL when n < 0, or QERR_LIMIT when the sequence
 * would need more blocks than the whole pool has (it can never run).  For a
 * swapped-out sequence the count assumes its holes refilled: it excludes
 * the n_swapped blocks kv_seq_swap_in takes first. */
int kv_seq_blocks_needed(const kv_pool *p, const kv_seq *s, int n);

/* 1 when kv_seq_prepare_write followed by kv_seq_append of n tokens would
 * find enough blocks now, else 0 (also for the errors above). */
int kv_seq_can_append(const kv_pool *p, const kv_seq *s, int n);

/* Appends n token ids to s, allocating a block whenever a token is the first
 * of its block (free blocks first, then the least recently used cached
 * block, which leaves the prefix map).  All or nothing: on any error s and
 * the pool are unchanged.  Returns 0, or
 *   QERR_INVAL   n < 0, tokens NULL with n > 0, a token id < 0, s is
 *                swapped out, or the first token would be written into a
 *                block that is shared or hashed (call kv_seq_prepare_write
 *                first);
 *   QERR_LIMIT   s would exceed the whole pool (can never run);
 *   QERR_BUSY    not enough free + cached blocks now (preempt, retry);
 *   QERR_NOMEM   the table could not grow. */
int kv_seq_append(kv_pool *p, kv_seq *s, const int32_t *tokens, int n);

/* Readies s's last block for writing the next token.  When that block is
 * partially filled and shared (refcount > 1) or hashed (immutable), a fresh
 * block takes its place in s's table: *copy_src and *copy_dst receive the
 * pair whose K/V the engine must copy (backend copy_block) before the next
 * forward pass, and the call returns 1.  Returns 0 (nothing to copy, the
 * outputs are untouched) when the next token opens a new block or the block
 * is s's alone, QERR_BUSY when no block can be allocated (s unchanged),
 * QERR_INVAL when s is swapped out. */
int kv_seq_prepare_write(kv_pool *p, kv_seq *s, int *copy_src, int *copy_dst);

/* Records that the first n_computed tokens of s have their K/V written, and
 * hashes each newly full block: H(parent hash, block_size token ids, model
 * fingerprint).  A block whose hash is not in the prefix map is registered
 * there (with its token ids, to verify later hits).  When an equal block is
 * registered already it stays canonical and s's block is not registered:
 * no deduplication, the table is never rewritten behind the engine's back.
 * Returns the number of blocks newly registered (>= 0), QERR_RANGE when
 * n_computed < 0 or > s->n_tokens, or QERR_INVAL when s is swapped out.
 * Calling it again with the same or a smaller count does nothing. */
int kv_seq_commit(kv_pool *p, kv_seq *s, int n_computed);

/* Finds the longest chain of hashed blocks equal to the prompt's leading
 * full blocks, stopping before the block that holds the prompt's last token
 * (at least one token is always left to compute, for its logits).  Each hit
 * is verified, not trusted: token ids, parent hash and depth must agree
 * (a mismatch counts as a hash collision and ends the match).  Takes a reference on each block
 * found (a cached block leaves the LRU), appends the blocks and their tokens
 * to s (which must be empty) and counts hits and misses.  Returns the number
 * of tokens reused (a multiple of block_size, < n), or QERR_INVAL (s not
 * empty, n < 0, prompt NULL with n > 0, a token id < 0) or QERR_NOMEM, with
 * s and the pool unchanged. */
int kv_seq_match_prefix(kv_pool *p, kv_seq *s, const int32_t *prompt, int n);

/* Makes dst (which must be empty) share all of src's blocks: each refcount
 * goes up by one; tokens and the hash chain are copied.  Writes that follow
 * go through kv_seq_prepare_write (copy-on-write).  Returns 0, QERR_INVAL
 * (dst not empty, dst == src, or src swapped out), QERR_LIMIT (a refcount
 * would overflow) or QERR_NOMEM, with dst and the pool unchanged. */
int kv_seq_fork(kv_pool *p, const kv_seq *src, kv_seq *dst);

/* Drops the tokens of s beyond the first n (rejected draft tokens), freeing
 * blocks no longer needed, last first.  Returns 0, QERR_RANGE when n >
 * s->n_tokens or n would cut into a hashed or dropped block (n < n_hashed *
 * block_size or n_dropped * block_size), or QERR_INVAL when s is swapped
 * out; s is unchanged on error. */
int kv_seq_truncate(kv_pool *p, kv_seq *s, int n);

/* Sliding windows: releases the blocks of s that lie wholly before token
 * position pos (block i with (i + 1) * block_size <= pos), leaving
 * KV_DROPPED at their entries, so that a sequence on a model whose every
 * layer attends only to its last W positions holds about W tokens' blocks
 * however long it grows: the engine passes pos = (the next position to
 * compute) - W + 1.  The block holding s's last token always stays.  A
 * released hashed block is cached (LRU) like any other, so the prefix
 * cache still finds it; an unhashed one is freed.  Backends never read a
 * dropped block (the window excludes it).  Afterwards s cannot be
 * truncated into the dropped blocks.  Returns how many blocks it released
 * (>= 0), or QERR_INVAL when s is swapped out. */
int kv_seq_drop_before(kv_pool *p, kv_seq *s, int pos);

/* ---- the persistent tier ------------------------------------------------- */

/* The chain hashes of the first n_blocks full blocks of tokens (as
 * kv_seq_commit would register them) into out[0..n_blocks).  Cannot fail. */
void kv_chain_hashes(const kv_pool *p, const int32_t *tokens, int n_blocks, uint8_t (*out)[KV_HASH_BYTES]);

/* Of the prompt's full blocks that kv_seq_match_prefix may reuse (those
 * before the block holding its last token, at most the pool's size), how
 * many leading ones are cached in the pool now; the count of such blocks
 * goes to *eligible.  Changes nothing (no reference, no counter).  Returns
 * the count, or QERR_INVAL for a NULL prompt with n > 0. */
int kv_prefix_probe(const kv_pool *p, const int32_t *prompt, int n, int *eligible);

/* Appends to s one full block whose K/V come from elsewhere (the sqlite
 * tier): a fresh block holding tokens (block_size ids), registered in the
 * prefix map as s's next hashed block when its hash is not registered yet.
 * s must hold only hashed blocks (n_tokens == n_hashed * block_size).  The
 * block id goes to *block: the caller writes its bytes before the next
 * forward pass.  When want_hash is not NULL the block's chain hash must
 * equal it (the tokens are what was asked for).  Returns 0, or QERR_INVAL
 * (s not at a block boundary of hashed blocks, swapped out, a token < 0),
 * QERR_FORMAT (hash mismatch), QERR_BUSY (no block can be allocated) or
 * QERR_NOMEM, with s and the pool unchanged. */
int kv_seq_import(kv_pool *p, kv_seq *s, const int32_t *tokens, const uint8_t want_hash[KV_HASH_BYTES],
                  int32_t *block);

/* ---- swapping ----------------------------------------------------------- */

/* Writes to idx (room for s->n_blocks entries) the logical indices, in
 * increasing order, of the blocks s holds alone (refcount 1): the blocks a
 * swap-out moves to host memory.  Shared blocks (prefix-cache hits still
 * used by others, forked siblings) stay in the pool and s keeps its
 * reference, so they cannot be evicted while s is out.  Returns the count
 * (0 for a swapped-out sequence).  Cannot fail. */
int kv_seq_exclusive_blocks(const kv_pool *p, const kv_seq *s, int32_t *idx);

/* Releases the n blocks at logical indices idx (increasing, each held by s
 * alone, as kv_seq_exclusive_blocks lists them), deepest first, and leaves
 * KV_SWAPPED_OUT in their table entries; tokens, hashes and the other
 * blocks stay.  A released hashed block is cached (LRU) like any other.
 * The caller has copied the blocks' bytes out first.  Returns 0, or
 * QERR_INVAL (s swapped out already, n < 1, an index out of order or range,
 * a shared block) with s and the pool unchanged. */
int kv_seq_swap_out(kv_pool *p, kv_seq *s, const int32_t *idx, int n);

/* Fills every hole of s with a freshly allocated block (fill restored from
 * s's token count) and writes their logical indices, increasing, to idx
 * (room for s->n_swapped entries): the blocks whose bytes the caller must
 * write back, in the order kv_seq_swap_out released them.  Returns that
 * count (s is a live sequence again), 0 when s had no hole, or QERR_BUSY
 * when fewer than s->n_swapped blocks can be allocated (s and the pool
 * unchanged). */
int kv_seq_swap_in(kv_pool *p, kv_seq *s, int32_t *idx);

#endif
