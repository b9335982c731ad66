/*
 * Linked into every cmocka test program (tests/c/meson.build): stdout is line-buffered from the
 * start. The programs run with CMOCKA_TEST_ABORT=1, and abort() flushes nothing: with stdout a
 * pipe (meson's), the "[ OK ]" lines of the cases before the failing one were lost in its log.
 */
#include <stdio.h>

__attribute__((constructor)) static void stdio_lines(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
}
