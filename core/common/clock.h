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

#endif
