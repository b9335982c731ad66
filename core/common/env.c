#include "env.h"

#include "error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

const char *shmipc__getenv(const char *name)
{
    const char *v = getenv(name);
    return (v != NULL && v[0] != '\0') ? v : NULL;
}

int shmipc__env_number(const char *name, const char *v, unsigned long min, unsigned long max,
                       const char *unit, unsigned long *out)
{
    char *end;
    unsigned long n;
    if (v == NULL)
        return 0;
    errno = 0;
    n = strtoul(v, &end, 10);
    /* strtoul takes "-1" as a huge number: a sign is refused outright. */
    if (errno != 0 || end == v || *end != '\0' || strchr(v, '-') != NULL || n < min || n > max)
        return shmipc__fail(SHMIPC_EINVAL, "%s=%s is not a number of %s in %lu..%lu", name, v, unit,
                            min, max);
    *out = n;
    return 1;
}
