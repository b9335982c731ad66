/* Version and error model of the public ABI: the version and error table of core/common. */
#include "shmipc.h"

#include "common/error.h"
#include "common/version.h"

SHMIPC_API int shmipc_version(void)
{
    return shmipc__version();
}

SHMIPC_API const char *shmipc_version_string(void)
{
    return shmipc__version_string();
}

SHMIPC_API const char *shmipc_strerror(int code)
{
    return shmipc__strerror(code);
}

SHMIPC_API const char *shmipc_errname(int code)
{
    return shmipc__errname(code);
}

SHMIPC_API const char *shmipc_error_detail(void)
{
    return shmipc__detail();
}
