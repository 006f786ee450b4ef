/* bm_delta.h - what changed in a sequence's block table since its reader
 * last looked (issue 15: the step sends only the changed entries).
 *
 * DESIGN
 *   Each sequence keeps tab_clean: its leading table entries unchanged
 *   since the last bm_seq_table_delta(). Entries appended by a reserve or
 *   a lookup land past it and need no mark; every write that replaces an
 *   entry (copy-on-write of a shared tail, swap-out and swap-in, sliding
 *   window release, sink eviction, compaction) or shrinks the table
 *   (truncate, unreserve) lowers it. The reader (the scheduler, one per
 *   sequence) copies entries [from, n_blocks) into its own copy, which is
 *   then equal to the table.
 *
 * Thread: engine thread only (like every blockmgr call).
 */
#ifndef BLOCKMGR_BM_DELTA_H
#define BLOCKMGR_BM_DELTA_H

#include <stdint.h>

#include "blockmgr/blockmgr.h"

/* seq's block table (as bm_seq_table: *n_blocks entries, device ids or,
 * while swapped, CPU ids) and in *from the first entry that may differ
 * from what the previous call returned (0 on the first call; *n_blocks
 * when nothing changed). Entries [0, *from) are as that call returned
 * them. Marks the table clean. NULL (*n_blocks = *from = 0) for an
 * unknown seq. */
const int32_t *bm_seq_table_delta(bm_pool_t *pool, uint64_t seq, uint32_t *n_blocks,
                                  uint32_t *from);

#endif /* BLOCKMGR_BM_DELTA_H */
