/* Version and error model of the public ABI. */
#include "shmipc.h"

#include "common/error.h"

#define STR_(x) #x
#define STR(x)  STR_(x)

SHMIPC_API int shmipc_version(void)
{
    return SHMIPC_VERSION_HEX;
}

SHMIPC_API const char *shmipc_version_string(void)
{
    return STR(SHMIPC_VERSION_MAJOR) "." STR(SHMIPC_VERSION_MINOR) "." STR(SHMIPC_VERSION_PATCH);
}

SHMIPC_API const char *shmipc_strerror(int code)
{
    switch (code) {
#define ERR_MSG(name, value, msg)                                                                  \
    case (value):                                                                                  \
        return msg;
        SHMIPC_ERRNO_MAP(ERR_MSG)
#undef ERR_MSG
    default:
        return "unknown error";
    }
}

SHMIPC_API const char *shmipc_errname(int code)
{
    switch (code) {
#define ERR_NAME(name, value, msg)                                                                 \
    case (value):                                                                                  \
        return "SHMIPC_" #name;
        SHMIPC_ERRNO_MAP(ERR_NAME)
#undef ERR_NAME
    default:
        return NULL;
    }
}

SHMIPC_API const char *shmipc_error_detail(void)
{
    return shmipc__detail();
}
