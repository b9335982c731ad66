#include "version.h"

#include "shmipc.h"

#define STR_(x) #x
#define STR(x)  STR_(x)

int shmipc__version(void)
{
    return SHMIPC_VERSION_HEX;
}

const char *shmipc__version_string(void)
{
    return STR(SHMIPC_VERSION_MAJOR) "." STR(SHMIPC_VERSION_MINOR) "." STR(SHMIPC_VERSION_PATCH);
}
