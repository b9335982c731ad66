/*
 * Runtime knobs. Every SHMIPC_* variable is read through shmipc__getenv() so that
 * scripts/check-knobs.py can find each one and compare the set with docs/runtime-config.md.
 */
#ifndef SHMIPC_CORE_ENV_H
#define SHMIPC_CORE_ENV_H

/* The value of the knob `name`, or NULL when unset or empty. */
const char *shmipc__getenv(const char *name);

/*
 * `v`, the value of the knob `name` (from shmipc__getenv), as a whole number in min..max:
 * 0 with *out untouched when v is NULL, 1 when it was set, or SHMIPC_EINVAL with a detail
 * naming the knob, its value and the range of `unit`s.
 */
int shmipc__env_number(const char *name, const char *v, unsigned long min, unsigned long max,
                       const char *unit, unsigned long *out);

#endif
