/* Monotonic time and deadlines. A deadline is an absolute CLOCK_MONOTONIC time in ns; 0 = none. */
#ifndef SHMIPC_CORE_CLOCK_H
#define SHMIPC_CORE_CLOCK_H

#include <stdint.h>

uint64_t shmipc__now_ns(void);

/* The deadline `ms` milliseconds from now, or 0 (no deadline) when ms is 0. */
uint64_t shmipc__deadline_ms(uint64_t ms);

/*
 * Milliseconds left until `deadline` for poll(): -1 for no deadline, 0 once it has passed,
 * rounded up so that a wait never ends before the deadline.
 */
int shmipc__remaining_ms(uint64_t deadline);

/*
 * The deadline "already passed": a wait given it looks once at what is pending, without
 * sleeping, and then times out (a timeout of 0 means "do not wait"). Any nonzero time in the
 * past would do; 1 ns after boot is one that no real deadline equals.
 */
#define SHMIPC__DEADLINE_NOW 1u

/*
 * The deadline of a wait of `ms` milliseconds by the API's rule: negative waits forever (0,
 * no deadline), 0 does not wait (SHMIPC__DEADLINE_NOW), a positive value is a deadline.
 */
uint64_t shmipc__wait_deadline(int64_t ms);

#endif
