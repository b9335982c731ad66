#include "clock.h"

#include <limits.h>
#include <time.h>

uint64_t shmipc__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t shmipc__deadline_ms(uint64_t ms)
{
    return ms == 0 ? 0 : shmipc__now_ns() + ms * 1000000u;
}

uint64_t shmipc__wait_deadline(int64_t ms)
{
    if (ms < 0)
        return 0;
    if (ms == 0)
        return SHMIPC__DEADLINE_NOW;
    return shmipc__deadline_ms((uint64_t)ms);
}

int shmipc__remaining_ms(uint64_t deadline)
{
    if (deadline == 0)
        return -1;
    uint64_t now = shmipc__now_ns();
    if (now >= deadline)
        return 0;
    uint64_t ms = (deadline - now + 999999u) / 1000000u;
    return ms > INT_MAX ? INT_MAX : (int)ms;
}
