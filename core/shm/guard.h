/*
 * The SIGBUS guard: a peer that shrinks a file we have mapped (an unsealed memfd it holds, or
 * a /dev/shm file it can open) makes our next access to a page past the new end raise SIGBUS,
 * which kills the process by default. The guard turns that into the end of one session:
 *
 * - every shared mapping is registered here (base and length);
 * - a process-wide SIGBUS handler, installed at the first registration, looks the faulting
 *   address up; when it lies in a registered mapping, the handler replaces the whole mapping
 *   with private zero pages (mmap MAP_FIXED | MAP_ANONYMOUS, one system call), marks it
 *   damaged and returns, so the faulting instruction runs again and finds memory;
 * - the session checks the mark at each turn and at each flush and read, and ends with
 *   SHMIPC_EPROTO ("the peer truncated the shared memory").
 *
 * Zeros are no worse than anything else a hostile peer could write into the memory, and every
 * value read from shared memory is checked before use already. A SIGBUS at any other address
 * goes to the handler that was installed before ours (or kills the process as it would have).
 * SHMIPC_SIGBUS_GUARD=0 keeps the handler from being installed (docs/runtime-config.md). The
 * handler is put back in front at each registration, chaining to whatever was installed since.
 *
 * The registry is a list of fixed-size blocks that only grows; the handler reads it with
 * atomic loads and takes no lock. Its lock is held across fork() (pthread_atfork), so that a
 * fork child can unregister the mappings it inherited (the fork rule, common/proc.h).
 */
#ifndef SHMIPC_CORE_SHM_GUARD_H
#define SHMIPC_CORE_SHM_GUARD_H

#include <stddef.h>

struct shmipc__guard_slot;

/*
 * Registers [base, base + len) (base page-aligned, as mmap returns it). Returns the slot, or
 * NULL when the guard is off (the knob) or could not be installed; a NULL slot is accepted by
 * the other calls and is never damaged.
 */
struct shmipc__guard_slot *shmipc__guard_register(void *base, size_t len);

/*
 * Forgets the slot before its mapping is unmapped, after any handler still using it has
 * finished. NULL is ignored.
 */
void shmipc__guard_unregister(struct shmipc__guard_slot *slot);

/*
 * A socket the handler shuts down when it hits the slot's mapping, so that a thread asleep
 * on the session wakes and sees the damage (-1: none). It must stay open until unregister.
 */
void shmipc__guard_set_wake_fd(struct shmipc__guard_slot *slot, int fd);

/* 1 when a SIGBUS hit the slot's mapping (its pages are now private zeros), else 0. */
int shmipc__guard_damaged(const struct shmipc__guard_slot *slot);

/* 1 when the process-wide handler is installed. */
int shmipc__guard_active(void);

#endif
