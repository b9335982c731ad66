#include "env.h"

#include <stdlib.h>

const char *shmipc__getenv(const char *name)
{
    const char *v = getenv(name);
    return (v != NULL && v[0] != '\0') ? v : NULL;
}
