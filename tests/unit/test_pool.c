/* test_pool.c - the CPU worker pool runs every task exactly once. */
#include "pool.h"
#include "qtest.h"

typedef struct {
    int counts[1000];
    int max_tid;
    int bad_tid;
} ctx_t;

static void task(void *c, int t, int tid)
{
    ctx_t *x = c;
    __atomic_add_fetch(&x->counts[t], 1, __ATOMIC_RELAXED);
    if (tid < 0 || tid > x->max_tid) __atomic_store_n(&x->bad_tid, 1, __ATOMIC_RELAXED);
}

static void test_every_task_once(void)
{
    for (int threads = 1; threads <= 4; threads++) {
        qpool *p = qpool_create(threads);
        REQUIRE(p);
        CHECK_EQ_INT(qpool_threads(p), threads);
        for (int round = 0; round < 200; round++) {
            static ctx_t c;
            memset(&c, 0, sizeof c);
            c.max_tid = threads - 1;
            int n = (round * 37) % 1000;
            qpool_run(p, n, task, &c);
            int ok = 1;
            for (int i = 0; i < 1000; i++) ok &= c.counts[i] == (i < n);
            CHECK(ok);
            CHECK(!c.bad_tid);
        }
        qpool_destroy(p);
    }
    qpool_destroy(NULL);
    qpool *p = qpool_create(0); /* clamps to 1 */
    CHECK(p && qpool_threads(p) == 1);
    qpool_destroy(p);
}

int main(void)
{
    QT_RUN(test_every_task_once);
    QT_MAIN_END();
}
