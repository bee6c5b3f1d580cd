/* The simulator's hot loops in C (issue 14: in numpy and Python they were half of `explore`'s sweep), each with
   the Python function it stands in for, which stays the reference and the fallback: the timing sweep (`lp_sweep`),
   the dependency rules (`lp_apply_count`, `lp_apply_fill`), a run's pairs and `links` inputs (`lp_pairs`,
   `lp_link_inputs`), peak memory (`lp_peaks`) and the `ooo` policy's list simulation (`lp_ooo_order`). `layerpipe/schedule/_native.py` builds this file with the
   machine's C compiler and loads it; tests/test_native_kernels.py compares every kernel with its Python version.

   The timing sweep: every op's start and end on `shared` or on `links`, by the same rules as the Python sweep
   `layerpipe.schedule._op_sweep._sweep_first`:

   - processor p runs its ops bounds[p] .. bounds[p+1]-1 in order; op i starts when the op before it on p has ended
     and every input of i is available, and ends dur[i] cycles later;
   - input x of an op (in_src[in_ptr[i] .. in_ptr[i+1]-1]) is an op (x < n: available at its end) or a transfer
     (x >= n, `links` only: available at its arrival);
   - when op i ends at t, its transfers queue on their links in order (send_ptr[i] .. send_ptr[i+1]-1): transfer x
     on link L leaves at d = max(t, link_free[L]), holds the link hold[x - n] cycles (link_free[L] = d + hold) and
     arrives latency cycles after that (d + hold + latency). Each link carries one processor's sends, so this is
     the order the link serves them in.

   Every time is the unique solution of these rules whatever order the processors are walked in (no arbitration:
   a bus is not timed here), so a work list suffices: a processor runs until an input is not yet known, parks on
   it, and is woken when it is. Returns 0 when every op was timed, 1 when some processor is left blocked (a
   deadlock: the caller reports it with the Python sweep), -1 when out of memory. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef LP_SOURCE_SHA
#define LP_SOURCE_SHA "unknown"
#endif

const char *lp_source_sha(void) { return LP_SOURCE_SHA; }

/* Every kernel's scratch goes through these, which report it to Python's tracemalloc (the C API numpy uses for its
   arrays: it takes the GIL itself), so that memory measured with tracemalloc (benchmarks/bench_sim.py's memory per
   op) counts it as it counts numpy's, and which count the bytes held and the most held at once
   (`lp_scratch_peak`). The kernels run one at a time (one thread per process). */
extern int PyTraceMalloc_Track(unsigned int domain, uintptr_t ptr, size_t size);
extern int PyTraceMalloc_Untrack(unsigned int domain, uintptr_t ptr);
#define TRACE_DOMAIN 0x6c70 /* "lp": a domain of its own, as numpy has */

static int64_t scratch_held = 0, scratch_peak = 0;
#define HEADER 16 /* the block's size, kept in front of it (16: any type's alignment) */

static void *lp_malloc(size_t size) {
    char *block = malloc(size + HEADER);
    if (!block) return NULL;
    *(size_t *)block = size;
    scratch_held += (int64_t)size;
    if (scratch_held > scratch_peak) scratch_peak = scratch_held;
    PyTraceMalloc_Track(TRACE_DOMAIN, (uintptr_t)block, size + HEADER);
    return block + HEADER;
}

static void *lp_calloc(size_t count, size_t size) {
    void *p = lp_malloc(count * size);
    if (p) memset(p, 0, count * size);
    return p;
}

static void lp_free(void *p) {
    if (!p) return;
    char *block = (char *)p - HEADER;
    scratch_held -= (int64_t)*(size_t *)block;
    PyTraceMalloc_Untrack(TRACE_DOMAIN, (uintptr_t)block);
    free(block);
}

/* The most scratch bytes held at once since the last reset (reset: start again from what is held now). */
int64_t lp_scratch_peak(int64_t reset) {
    int64_t peak = scratch_peak;
    if (reset) scratch_peak = scratch_held;
    return peak;
}

/* Element i of a signed integer array of `width` bytes (1, 2, 4 or 8): the compiled schedule keeps its CSR arrays
   as narrow as their values allow (int32 producers and words, int8 roles), and they are read as they are. */
static inline int64_t at(const void *array, int64_t width, int64_t i) {
    switch (width) {
    case 1: return ((const int8_t *)array)[i];
    case 2: return ((const int16_t *)array)[i];
    case 4: return ((const int32_t *)array)[i];
    default: return ((const int64_t *)array)[i];
    }
}

/* Push every processor parked on input x onto the work stack. */
static void wake(int64_t x, int64_t *waiter, const int64_t *next_parked, int64_t *stack, int64_t *top) {
    int64_t q = waiter[x];
    while (q >= 0) {
        stack[(*top)++] = q;
        q = next_parked[q];
    }
    waiter[x] = -1;
}

int64_t lp_sweep(int64_t n, int64_t procs, const int64_t *bounds, const int64_t *dur, const void *in_ptr,
                 int64_t ptr_width, const void *in_src, int64_t src_width, int64_t transfers,
                 const int64_t *send_ptr, const int64_t *send_input, const int64_t *send_link, const int64_t *hold,
                 int64_t latency, int64_t links, int64_t *start, int64_t *end) {
    int64_t total = n + transfers;
    int64_t *avail = lp_malloc(sizeof(int64_t) * (size_t)(total > 0 ? total : 1));
    int64_t *waiter = lp_malloc(sizeof(int64_t) * (size_t)(total > 0 ? total : 1));
    int64_t *next_parked = lp_malloc(sizeof(int64_t) * (size_t)(procs > 0 ? procs : 1));
    int64_t *nxt = lp_malloc(sizeof(int64_t) * (size_t)(procs > 0 ? procs : 1));
    int64_t *free_at = lp_malloc(sizeof(int64_t) * (size_t)(procs > 0 ? procs : 1));
    int64_t *stack = lp_malloc(sizeof(int64_t) * (size_t)(procs > 0 ? procs : 1));
    int64_t *link_free = lp_calloc((size_t)(links > 0 ? links : 1), sizeof(int64_t));
    int64_t status = 0;
    if (!avail || !waiter || !next_parked || !nxt || !free_at || !stack || !link_free) {
        status = -1;
        goto done;
    }
    for (int64_t x = 0; x < total; x++) {
        avail[x] = -1;
        waiter[x] = -1;
    }
    int64_t top = 0;
    for (int64_t p = 0; p < procs; p++) {
        nxt[p] = bounds[p];
        free_at[p] = 0;
        stack[top++] = procs - 1 - p; /* processor 0 first, as the Python sweep */
    }
    while (top > 0) {
        int64_t p = stack[--top];
        int64_t i = nxt[p], last = bounds[p + 1], t = free_at[p];
        while (i < last) {
            int64_t s = t, blocked = -1;
            for (int64_t e = at(in_ptr, ptr_width, i), stop = at(in_ptr, ptr_width, i + 1); e < stop; e++) {
                int64_t x = at(in_src, src_width, e), a = avail[x];
                if (a < 0) {
                    blocked = x;
                    break;
                }
                if (a > s) s = a;
            }
            if (blocked >= 0) { /* park on it */
                next_parked[p] = waiter[blocked];
                waiter[blocked] = p;
                break;
            }
            start[i] = s;
            t = s + dur[i];
            avail[i] = t;
            wake(i, waiter, next_parked, stack, &top);
            if (send_ptr) {
                for (int64_t k = send_ptr[i]; k < send_ptr[i + 1]; k++) {
                    int64_t x = send_input[k], link = send_link[k];
                    int64_t d = link_free[link] > t ? link_free[link] : t;
                    d += hold[x - n];
                    link_free[link] = d;
                    avail[x] = d + latency;
                    wake(x, waiter, next_parked, stack, &top);
                }
            }
            i++;
        }
        nxt[p] = i;
        free_at[p] = t;
    }
    for (int64_t p = 0; p < procs; p++) {
        if (nxt[p] < bounds[p + 1]) status = 1;
    }
    if (status == 0) {
        for (int64_t i = 0; i < n; i++) end[i] = avail[i];
    }
done:
    lp_free(avail);
    lp_free(waiter);
    lp_free(next_parked);
    lp_free(nxt);
    lp_free(free_at);
    lp_free(stack);
    lp_free(link_free);
    return status;
}

/* The dependency rules applied to every op (issue 14: `layerpipe.schedule._deps._apply` in numpy was a tenth of
   `explore`'s sweep): the same entries, in the same order, as that function, which stays the reference and the
   fallback.

   Rule row r (rows[r * 11 + c], columns task, src, alt, div, mul, off, cap, mod, phase, words, role: `_deps`'
   `_RULE_COLUMNS`) of consumer op i (task[i] = the row's task; its rows are first_row[task] .. + per_task[task] - 1,
   in order) at iteration it: base = it / div * mul - off; no producer unless base >= 0 and, with use_mod (some
   row's mod is not 1: `_apply` reads the phases only then), it % mod == phase; then
   cap > 0 ? max(0, min(cap, total - base)) : 1 producers, at iterations t = base, base + 1, ...: the op of task
   src at t (index[src * span + t]) where src >= 0 and t < span and it exists, else the op of task alt at t (where
   alt >= 0), else -1 (the caller refuses the arrays). Each entry carries the row's words and role.

   `lp_apply_count` counts each op's entries (counts[i]) and returns their total; `lp_apply_fill` writes them. The
   index is int32 (index32) or int64 (index64): one of the two is NULL. */

#define RULE_COLUMNS 11

static int64_t rule_entries(const int64_t *row, int64_t it, int64_t total, int64_t use_mod, int64_t *base_out) {
    int64_t base = it / row[3] * row[4] - row[5];
    if (base < 0 || (use_mod && it % row[7] != row[8])) return 0;
    *base_out = base;
    if (row[6] > 0) {
        int64_t count = total - base < row[6] ? total - base : row[6];
        return count > 0 ? count : 0;
    }
    return 1;
}

int64_t lp_apply_count(int64_t n, const int64_t *task, const int64_t *iteration, const int64_t *first_row,
                       const int64_t *per_task, const int64_t *rows, int64_t total, int64_t use_mod,
                       int64_t *counts) {
    int64_t entries = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = task[i], here = 0, base;
        for (int64_t r = first_row[k]; r < first_row[k] + per_task[k]; r++)
            here += rule_entries(rows + r * RULE_COLUMNS, iteration[i], total, use_mod, &base);
        counts[i] = here;
        entries += here;
    }
    return entries;
}

static int64_t lookup(const int32_t *index32, const int64_t *index64, int64_t cell) {
    return index32 ? (int64_t)index32[cell] : index64[cell];
}

void lp_apply_fill(int64_t n, const int64_t *task, const int64_t *iteration, const int64_t *first_row,
                   const int64_t *per_task, const int64_t *rows, int64_t total, int64_t use_mod, int64_t span,
                   const int32_t *index32, const int64_t *index64, int64_t *producer, int64_t *words,
                   int64_t *role) {
    int64_t e = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = task[i];
        for (int64_t r = first_row[k]; r < first_row[k] + per_task[k]; r++) {
            const int64_t *row = rows + r * RULE_COLUMNS;
            int64_t base = 0;
            int64_t count = rule_entries(row, iteration[i], total, use_mod, &base);
            for (int64_t j = 0; j < count; j++) {
                int64_t t = base + j, found = -1;
                if (row[1] >= 0 && t < span) found = lookup(index32, index64, row[1] * span + t);
                if (found < 0 && row[2] >= 0 && t < span) found = lookup(index32, index64, row[2] * span + t);
                producer[e] = found;
                words[e] = row[9];
                role[e] = row[10];
                e++;
            }
        }
    }
}

/* The distinct (producer, consumer) pairs of a compiled schedule's dependencies, by producer then consumer, words
   summed per pair (`CompiledSchedule.pairs`, which stays the reference and the fallback). Entries are
   consumer-major (consumer i's are prod_ptr[i] .. prod_ptr[i+1]-1): a counting sort by producer keeps each
   producer's consumers in order, and a pair listed twice sits twice in a row there. Writes the pairs into
   out_producer / out_consumer / out_words (room for every entry) and returns how many there are; -1 when out of
   memory. */
int64_t lp_pairs(int64_t n, const void *prod_ptr, int64_t ptr_width, const void *prod_idx, int64_t idx_width,
                 const void *prod_words, int64_t words_width, int64_t *out_producer, int64_t *out_consumer,
                 int64_t *out_words) {
    int64_t entries = at(prod_ptr, ptr_width, n);
    int64_t *slot_end = lp_calloc((size_t)n + 1, sizeof(int64_t));
    int64_t *slot_consumer = lp_malloc(sizeof(int64_t) * (size_t)(entries > 0 ? entries : 1));
    int64_t *slot_words = lp_malloc(sizeof(int64_t) * (size_t)(entries > 0 ? entries : 1));
    int64_t pairs = -1;
    if (!slot_end || !slot_consumer || !slot_words) goto done;
    for (int64_t e = 0; e < entries; e++) slot_end[at(prod_idx, idx_width, e) + 1]++;
    for (int64_t p = 0; p < n; p++) slot_end[p + 1] += slot_end[p];
    for (int64_t j = 0; j < n; j++) {
        for (int64_t e = at(prod_ptr, ptr_width, j), stop = at(prod_ptr, ptr_width, j + 1); e < stop; e++) {
            int64_t slot = slot_end[at(prod_idx, idx_width, e)]++;
            slot_consumer[slot] = j;
            slot_words[slot] = at(prod_words, words_width, e);
        }
    }
    /* slot_end[p] is now the end of producer p's slots, which begin where p - 1's end. */
    pairs = 0;
    int64_t begin = 0;
    for (int64_t p = 0; p < n; p++) {
        for (int64_t slot = begin; slot < slot_end[p]; slot++) {
            if (slot > begin && slot_consumer[slot] == slot_consumer[slot - 1]) {
                out_words[pairs - 1] += slot_words[slot];
                continue;
            }
            out_producer[pairs] = p;
            out_consumer[pairs] = slot_consumer[slot];
            out_words[pairs] = slot_words[slot];
            pairs++;
        }
        begin = slot_end[p];
    }
done:
    lp_free(slot_end);
    lp_free(slot_consumer);
    lp_free(slot_words);
    return pairs;
}

/* The `links` model's inputs of every op from the pairs (`CompiledSchedule.link_plan`): a pair on two processors
   is transfer k (input n + k, numbered in pair order); op j's inputs are its same-processor producers, then its
   transfers, each in pair order. Writes in_ptr (n + 1), in_src (one per pair) and the pair of each transfer
   (transfer_pair), and returns the number of transfers; -1 when out of memory. */
int64_t lp_link_inputs(int64_t n, int64_t pairs, const int64_t *producer, const int64_t *consumer,
                       const int64_t *proc, int64_t *in_ptr, int64_t *in_src, int64_t *transfer_pair) {
    int64_t *local = lp_calloc((size_t)(n > 0 ? n : 1), sizeof(int64_t)); /* op j's same-processor producers */
    int64_t *next_local = lp_malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    int64_t *next_cross = lp_malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    int64_t transfers = -1;
    if (!local || !next_local || !next_cross) goto done;
    for (int64_t j = 0; j <= n; j++) in_ptr[j] = 0;
    for (int64_t k = 0; k < pairs; k++) {
        in_ptr[consumer[k] + 1]++;
        if (proc[producer[k]] == proc[consumer[k]]) local[consumer[k]]++;
    }
    for (int64_t j = 0; j < n; j++) {
        in_ptr[j + 1] += in_ptr[j];
        next_local[j] = in_ptr[j];
        next_cross[j] = in_ptr[j] + local[j];
    }
    transfers = 0;
    for (int64_t k = 0; k < pairs; k++) {
        int64_t j = consumer[k];
        if (proc[producer[k]] == proc[j]) {
            in_src[next_local[j]++] = producer[k];
        } else {
            transfer_pair[transfers] = k;
            in_src[next_cross[j]++] = n + transfers;
            transfers++;
        }
    }
done:
    lp_free(local);
    lp_free(next_local);
    lp_free(next_cross);
    return transfers;
}

/* Peak memory per processor of a layer-level run (`layerpipe.sim._memory.peak_memory` with its weights taken
   every unit at once, `_weight_changes`, and its activations, `_kept_intervals`, which stay the reference and the
   fallback; see that module for what is counted). Every change is an event (processor, time, words); a
   processor's peak is the largest running sum of its events by time, releases first at equal times (events equal
   in both are equal, so their order is not seen), at least 0.

   Per op: task, start, end, versions (-1: reads no weights). Per task: flags (1: update, 2: forward, 4: backward:
   E, B or I), unit (dense, 0 .. units-1). Per unit: size (words of one version; 0: no weights). Per role code:
   kept (an activation kept for backward). Returns 0, -1 when out of memory, 1 when a table would be too large (the
   caller takes the Python path). */

typedef struct {
    uint64_t key; /* processor * span + time, times 2, + 1 for an allocation: releases first at equal times */
    int64_t words;
} lp_event;

typedef struct {
    lp_event *at;
    int64_t count, room;
} lp_events;

static int add_event(lp_events *ev, uint64_t base, int64_t time, int64_t words) {
    if (words == 0) return 0; /* no change */
    if (ev->count == ev->room) return -1; /* past the room `lp_peaks` counted: cannot happen, refused all the same */
    ev->at[ev->count].key = (base + (uint64_t)time) * 2u + (words > 0 ? 1u : 0u);
    ev->at[ev->count].words = words;
    ev->count++;
    return 0;
}

/* Sort events by key: LSD radix, 11 bits a pass (2048 counters: a run's few thousand events do not pay for more),
   skipping the passes whose digit every key shares. */
#define RADIX_BITS 11
#define RADIX_SIZE (1 << RADIX_BITS)

static int sort_events(lp_event *a, int64_t n) {
    if (n < 2) return 0;
    lp_event *scratch = lp_malloc(sizeof(lp_event) * (size_t)n);
    if (!scratch) return -1;
    int64_t count[RADIX_SIZE];
    uint64_t any = 0, every = ~(uint64_t)0;
    for (int64_t i = 0; i < n; i++) {
        any |= a[i].key;
        every &= a[i].key;
    }
    lp_event *from = a, *to = scratch;
    for (int shift = 0; shift < 64; shift += RADIX_BITS) {
        if ((((any ^ every) >> shift) & (RADIX_SIZE - 1)) == 0) continue;
        for (int d = 0; d < RADIX_SIZE; d++) count[d] = 0;
        for (int64_t i = 0; i < n; i++) count[(from[i].key >> shift) & (RADIX_SIZE - 1)]++;
        int64_t at = 0;
        for (int d = 0; d < RADIX_SIZE; d++) {
            int64_t c = count[d];
            count[d] = at;
            at += c;
        }
        for (int64_t i = 0; i < n; i++) to[count[(from[i].key >> shift) & (RADIX_SIZE - 1)]++] = from[i];
        lp_event *t = from;
        from = to;
        to = t;
    }
    if (from != a)
        for (int64_t i = 0; i < n; i++) a[i] = from[i];
    lp_free(scratch);
    return 0;
}

static int cmp_int64(const void *x, const void *y) {
    int64_t a = *(const int64_t *)x, b = *(const int64_t *)y;
    return (a > b) - (a < b);
}

#define MAX_VERSION_CELLS (1 << 24)

int64_t lp_peaks(int64_t n, int64_t procs, const int64_t *bounds, const int64_t *task, const int64_t *start,
                 const int64_t *end, const int64_t *versions, const int64_t *task_flags, const int64_t *task_unit,
                 int64_t units, const int64_t *unit_size, int64_t ema, int64_t distributed, const void *prod_ptr,
                 int64_t ptr_width, const void *prod_idx, int64_t idx_width, const void *prod_words,
                 int64_t words_width, const void *prod_role, int64_t role_width, const int64_t *role_kept,
                 int64_t *peaks) {
    int64_t status = -1;
    int64_t *proc = lp_malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    int64_t *owner_update = lp_malloc(sizeof(int64_t) * (size_t)(units > 0 ? units : 1));
    int64_t *owner_forward = lp_malloc(sizeof(int64_t) * (size_t)(units > 0 ? units : 1));
    int64_t *owner = lp_malloc(sizeof(int64_t) * (size_t)(units > 0 ? units : 1)); /* its processor, -1: none */
    char *holds = lp_calloc((size_t)(units * procs > 0 ? units * procs : 1), 1);
    char *buffered = lp_calloc((size_t)(units * procs > 0 ? units * procs : 1), 1);
    char *has_backward = lp_calloc((size_t)(units > 0 ? units : 1), 1);
    int64_t *update_at = lp_calloc((size_t)units + 1, sizeof(int64_t));
    int64_t *update_end = lp_malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
    int64_t *fill = lp_malloc(sizeof(int64_t) * (size_t)(units > 0 ? units : 1));
    int64_t *lo = NULL, *hi = NULL;
    lp_events ev = {NULL, 0, 0};
    if (!proc || !owner_update || !owner_forward || !owner || !holds || !buffered || !has_backward || !update_at ||
        !update_end || !fill)
        goto done;
    for (int64_t p = 0; p < procs; p++)
        for (int64_t i = bounds[p]; i < bounds[p + 1]; i++) proc[i] = p;
    int64_t finish = 0, span = 0, top_version = -1;
    for (int64_t i = 0; i < n; i++) {
        if (end[i] + 1 > finish) finish = end[i] + 1;
        if (end[i] + 1 > span) span = end[i] + 1;
        if (start[i] + 1 > span) span = start[i] + 1;
        if (versions[i] > top_version) top_version = versions[i];
    }
    /* Weights. The owner of a unit: the processor of its first update, else of its first forward. */
    int64_t any_owner = 0;
    for (int64_t u = 0; u < units; u++) owner_update[u] = owner_forward[u] = owner[u] = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t u = task_unit[task[i]], flags = task_flags[task[i]];
        if (unit_size[u] <= 0) continue;
        if ((flags & 1) && owner_update[u] < 0) owner_update[u] = i;
        if ((flags & 2) && owner_forward[u] < 0) owner_forward[u] = i;
    }
    for (int64_t u = 0; u < units; u++) {
        int64_t op = owner_update[u] >= 0 ? owner_update[u] : owner_forward[u];
        if (op >= 0) {
            owner[u] = proc[op];
            holds[u * procs + owner[u]] = 1;
            any_owner = 1;
        }
    }
    int64_t cells = (top_version + 1) * units * procs;
    /* Room for every event at once (no growth): 2 per holder and up to 4 per version in use, 2 per kept entry. */
    int64_t kept_entries = 0, entries = at(prod_ptr, ptr_width, n);
    for (int64_t e = 0; e < entries; e++) kept_entries += role_kept[at(prod_role, role_width, e)] != 0;
    ev.room = 2 * kept_entries + (any_owner && cells <= MAX_VERSION_CELLS ? 2 * units * procs + 4 * cells : 0) + 1;
    ev.at = lp_malloc(sizeof(lp_event) * (size_t)ev.room);
    if (!ev.at) goto done;
    if (any_owner) {
        if (cells > MAX_VERSION_CELLS) {
            status = 1;
            goto done;
        }
        lo = lp_malloc(sizeof(int64_t) * (size_t)(cells > 0 ? cells : 1));
        hi = lp_malloc(sizeof(int64_t) * (size_t)(cells > 0 ? cells : 1));
        if (!lo || !hi) goto done;
        for (int64_t k = 0; k < cells; k++) {
            lo[k] = INT64_MAX;
            hi[k] = -1;
        }
        /* Readers: each holds its unit on its processor (distributed) or on the owner's; versions in use per
           (unit, holder, version) over [first start, last end). */
        for (int64_t i = 0; i < n; i++) {
            int64_t u = task_unit[task[i]];
            if (versions[i] < 0 || owner[u] < 0) continue;
            int64_t holder = distributed ? proc[i] : owner[u];
            holds[u * procs + holder] = 1;
            if (task_flags[task[i]] & 4) {
                buffered[u * procs + proc[i]] = 1;
                has_backward[u] = 1;
            }
            int64_t k = (u * procs + holder) * (top_version + 1) + versions[i];
            if (start[i] < lo[k]) lo[k] = start[i];
            if (end[i] > hi[k]) hi[k] = end[i];
        }
        /* Each unit's update ends, sorted: version v is current over [ue[v-1], ue[v]). */
        for (int64_t i = 0; i < n; i++) {
            int64_t u = task_unit[task[i]];
            if ((task_flags[task[i]] & 1) && unit_size[u] > 0) update_at[u + 1]++;
        }
        for (int64_t u = 0; u < units; u++) {
            update_at[u + 1] += update_at[u];
            fill[u] = update_at[u];
        }
        for (int64_t i = 0; i < n; i++) {
            int64_t u = task_unit[task[i]];
            if ((task_flags[task[i]] & 1) && unit_size[u] > 0) update_end[fill[u]++] = end[i];
        }
        for (int64_t u = 0; u < units; u++)
            qsort(update_end + update_at[u], (size_t)(update_at[u + 1] - update_at[u]), sizeof(int64_t), cmp_int64);
        for (int64_t u = 0; u < units; u++) {
            for (int64_t p = 0; p < procs; p++) {
                if (!holds[u * procs + p]) continue;
                uint64_t base = (uint64_t)p * (uint64_t)(span + 1);
                int64_t w = unit_size[u];
                int64_t with_buffer = !distributed || buffered[u * procs + p] || (!has_backward[u] && p == owner[u]);
                int64_t held = w + (ema && with_buffer ? w : 0);
                if (add_event(&ev, base, 0, held) || add_event(&ev, base, finish, -held)) goto done;
                int64_t count = update_at[u + 1] - update_at[u];
                const int64_t *ue = update_end + update_at[u];
                for (int64_t v = 0; v <= top_version; v++) {
                    int64_t k = (u * procs + p) * (top_version + 1) + v;
                    if (hi[k] < 0) continue; /* no reader of this version here */
                    if (hi[k] > lo[k] && (add_event(&ev, base, lo[k], w) || add_event(&ev, base, hi[k], -w)))
                        goto done;
                    if (v <= count) { /* the current version over [since, until) is counted once */
                        int64_t since = v > 0 ? ue[v - 1] : lo[k], until = v < count ? ue[v] : hi[k];
                        int64_t a = lo[k] > since ? lo[k] : since, b = hi[k] < until ? hi[k] : until;
                        if (a < b && (add_event(&ev, base, a, -w) || add_event(&ev, base, b, w))) goto done;
                    }
                }
            }
        }
    }
    /* Activations kept for backward: on the producer's processor from its start when the consumer runs there,
       else on the consumer's from the producer's end; to the consumer's end. */
    for (int64_t j = 0; j < n; j++) {
        for (int64_t e = at(prod_ptr, ptr_width, j), stop = at(prod_ptr, ptr_width, j + 1); e < stop; e++) {
            if (!role_kept[at(prod_role, role_width, e)]) continue;
            int64_t i = at(prod_idx, idx_width, e), where = proc[i], from = start[i];
            int64_t words = at(prod_words, words_width, e);
            if (proc[i] != proc[j]) {
                where = proc[j];
                from = end[i];
            }
            uint64_t base = (uint64_t)where * (uint64_t)(span + 1);
            if (add_event(&ev, base, from, words) || add_event(&ev, base, end[j], -words)) goto done;
        }
    }
    if (sort_events(ev.at, ev.count)) goto done;
    for (int64_t p = 0; p < procs; p++) peaks[p] = 0;
    int64_t running = 0, current_proc = -1;
    for (int64_t k = 0; k < ev.count; k++) {
        int64_t p = (int64_t)((ev.at[k].key >> 1) / (uint64_t)(span + 1));
        if (p != current_proc) {
            current_proc = p;
            running = 0;
        }
        running += ev.at[k].words;
        if (running > peaks[p]) peaks[p] = running;
    }
    status = 0;
done:
    lp_free(proc);
    lp_free(owner_update);
    lp_free(owner_forward);
    lp_free(owner);
    lp_free(holds);
    lp_free(buffered);
    lp_free(has_backward);
    lp_free(update_at);
    lp_free(update_end);
    lp_free(fill);
    lp_free(lo);
    lp_free(hi);
    lp_free(ev.at);
    return status;
}

/* One step's list simulation of the `ooo` policy (`layerpipe.schedule._ooo_order.ooo_order`, which stays the
   reference and the fallback; its docstring gives the rules). Its heaps find, at each decision, the candidate a scan
   over every (kind, stage) gives — the earliest start max(ready, free), then the priority, then the lower
   processor — and this scans: 3 * stages candidates per decision, each a few array reads.

   Stage s is on processor s % procs. Per stage: into_f / into_i (the transfer into F_s from F_{s-1}, into I_s from
   I_{s+1}), dur_f, dur_i, dur_w, update (W_s(m-1) carries it). `left` (per processor, its work left; updated) and
   `cutoff` (has_cutoff: stop once the makespan is known to exceed it). Writes each placement's (processor, kind
   0/1/2 = F/I/W, stage, micro-batch) to `placed` (4 per op, in placement order) and the makespan. Returns 0, 1
   when the cutoff was exceeded, 2 when no op is ready (a dependency cycle), -1 when out of memory. */
int64_t lp_ooo_order(int64_t count, int64_t m, int64_t procs, const int64_t *into_f, const int64_t *into_i,
                     const int64_t *dur_f, const int64_t *dur_i, const int64_t *dur_w, const int64_t *update,
                     int64_t push, int64_t has_cutoff, int64_t cutoff, int64_t *left, int64_t *placed,
                     int64_t *makespan) {
    int64_t cells = count * m, last = count - 1, span = (m > count ? m : count) + 1;
    int64_t gated_push = push && last > 0;
    int64_t *end_f = lp_malloc(sizeof(int64_t) * (size_t)(cells > 0 ? cells : 1));
    int64_t *end_i = lp_malloc(sizeof(int64_t) * (size_t)(cells > 0 ? cells : 1));
    int64_t *end_w = lp_malloc(sizeof(int64_t) * (size_t)(cells > 0 ? cells : 1));
    int64_t *nxt = lp_calloc((size_t)(3 * count > 0 ? 3 * count : 1), sizeof(int64_t)); /* kind * count + s */
    int64_t *free_at = lp_calloc((size_t)(procs > 0 ? procs : 1), sizeof(int64_t));
    int64_t status = -1;
    if (!end_f || !end_i || !end_w || !nxt || !free_at) goto done;
    for (int64_t k = 0; k < cells; k++) end_f[k] = end_i[k] = end_w[k] = -1;
    int64_t most_left = 0;
    for (int64_t p = 0; p < procs; p++)
        if (left[p] > most_left || p == 0) most_left = left[p];
    for (int64_t step = 0; step < 3 * cells; step++) {
        int64_t best_start = 0, best_priority = 0, best_p = -1, best_kind = 0, best_s = 0, best_t = 0;
        for (int64_t s = 0; s < count; s++) {
            int64_t p = s % procs;
            for (int64_t kind = 0; kind < 3; kind++) {
                int64_t t = nxt[kind * count + s];
                if (t >= m) continue;
                int64_t at = s * m + t, r;
                if (kind == 0) { /* F */
                    r = 0;
                    if (s) {
                        r = end_f[at - m];
                        if (r < 0) continue;
                        r += into_f[s];
                    }
                    if (gated_push && s == 0 && t >= procs) {
                        int64_t e = end_w[t - procs];
                        if (e < 0) continue;
                        if (e > r) r = e;
                    }
                } else if (kind == 1) { /* I */
                    r = end_f[at];
                    if (r < 0) continue;
                    if (s != last) {
                        int64_t e = end_i[at + m];
                        if (e < 0) continue;
                        if (e + into_i[s] > r) r = e + into_i[s];
                        if (t) {
                            e = end_w[at - 1];
                            if (e < 0) continue;
                            if (e > r) r = e;
                        }
                    }
                } else { /* W */
                    r = s < last ? end_i[at] : end_i[s * m + m - 1];
                    if (r < 0) continue;
                }
                int64_t priority;
                if (kind == 0) priority = span * span + s * span + t;
                else if (kind == 1 || (s < last && nxt[1 * count + s] == t + 1 && t + 1 < m &&
                                       end_i[(s + 1) * m + t + 1] >= 0))
                    priority = t * span + count - s;
                else priority = 2 * span * span + t * span + s;
                int64_t start = r > free_at[p] ? r : free_at[p];
                if (best_p < 0 || start < best_start || (start == best_start && (priority < best_priority ||
                    (priority == best_priority && p < best_p)))) {
                    best_start = start;
                    best_priority = priority;
                    best_p = p;
                    best_kind = kind;
                    best_s = s;
                    best_t = t;
                }
            }
        }
        if (best_p < 0) {
            status = 2;
            goto done;
        }
        int64_t at = best_s * m + best_t, took;
        if (best_kind == 0) {
            took = dur_f[best_s];
            end_f[at] = best_start + took;
        } else if (best_kind == 1) {
            took = dur_i[best_s];
            end_i[at] = best_start + took;
        } else {
            took = dur_w[best_s] + (best_t == m - 1 ? update[best_s] : 0);
            end_w[at] = best_start + took;
        }
        free_at[best_p] = best_start + took;
        left[best_p] -= took;
        if (has_cutoff) {
            if (free_at[best_p] + left[best_p] > cutoff) {
                status = 1;
                goto done;
            }
            if (best_start + most_left > cutoff) {
                most_left = left[0];
                for (int64_t p = 1; p < procs; p++)
                    if (left[p] > most_left) most_left = left[p];
                if (best_start + most_left > cutoff) {
                    status = 1;
                    goto done;
                }
            }
        }
        placed[4 * step] = best_p;
        placed[4 * step + 1] = best_kind;
        placed[4 * step + 2] = best_s;
        placed[4 * step + 3] = best_t;
        nxt[best_kind * count + best_s]++;
    }
    *makespan = 0;
    for (int64_t p = 0; p < procs; p++)
        if (free_at[p] > *makespan) *makespan = free_at[p];
    status = 0;
done:
    lp_free(end_f);
    lp_free(end_i);
    lp_free(end_w);
    lp_free(nxt);
    lp_free(free_at);
    return status;
}
