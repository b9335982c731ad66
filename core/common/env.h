/*
 * Runtime knobs. Every SHMIPC_* variable is read through shmipc__getenv() so that
 * scripts/check-knobs.py can find each one and compare the set with docs/runtime-config.md.
 */
#ifndef SHMIPC_CORE_ENV_H
#define SHMIPC_CORE_ENV_H

/* The value of the knob `name`, or NULL when unset or empty. */
const char *shmipc__getenv(const char *name);

#endif
