/*
 * Description: shmipc-serve's options (serve/options.c, docs/serve.md "Configuration"): every
 * flag, the config file and its hostile forms (unknown keys, duplicates, long lines, NUL, sizes
 * at and past the limit, missing values, numbers at and past their limits, random bytes),
 * flags over the file, --check (with the Python interpreter when the module is built), the
 * worker command, and the access-log formatter with hostile bytes.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "options.h"
#include "serve/front.h"
#include "shmipc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

extern char **environ;

static char dir[64];

static int setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/shmipc-opt-XXXXXX");
    return mkdtemp(dir) != NULL ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *e;
        char p[512];
        while ((e = readdir(d)) != NULL)
            if (e->d_name[0] != '.') {
                snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
                if (unlink(p) != 0)
                    rmdir(p);
            }
        closedir(d);
    }
    rmdir(dir);
    return 0;
}

/* Writes `len` bytes into dir/name and returns the path (static buffer per call site). */
static const char *write_file(const char *name, const void *data, size_t len)
{
    static char path[8][256];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 256, "%s/%s", dir, name);
    int fd = open(p, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
    return p;
}

static const char *write_text(const char *name, const char *text)
{
    return write_file(name, text, strlen(text));
}

/* Parses the NULL-terminated args (argv[0] added). */
static int parse(shmipc__serve_options *o, char *err, const char *const *args)
{
    const char *argv[64] = {"shmipc-serve"};
    int argc = 1;
    while (args[argc - 1] != NULL)
        argv[argc] = args[argc - 1], argc++;
    assert_int_equal(shmipc__serve_options_init(o), 0);
    return shmipc__serve_options_parse(o, argc, (char *const *)argv, err, SHMIPC__SERVE_ERR_SIZE);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Parsing fails with a message containing `want`. */
static void expect_error(const char *const *args, const char *want)
{
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    int rc = parse(&o, err, args);
    if (rc != SHMIPC_EINVAL || strstr(err, want) == NULL)
        print_message("args[0]=%s: rc %d, message '%s', want '%s'\n", args[0] ? args[0] : "-", rc,
                      err, want);
    assert_int_equal(rc, SHMIPC_EINVAL);
    assert_non_null(strstr(err, want));
    shmipc__serve_options_free(&o);
}

static void test_defaults(void **state)
{
    (void)state;
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    assert_int_equal(parse(&o, err, ARGS("myapp:app")), 0);
    assert_int_equal(o.kind, SHMIPC__SERVE_WSGI);
    assert_string_equal(o.app, "myapp:app");
    assert_string_equal(o.listen, "127.0.0.1:8000");
    assert_int_equal(o.workers, 1);
    assert_int_equal(o.threads, 1);
    assert_int_equal(o.max_requests, 0);
    assert_int_equal(o.timeout_ms, 60000);
    assert_int_equal(o.queue, 1024);
    assert_int_equal(o.graceful_timeout_ms, 30000);
    assert_null(o.access_log);
    assert_int_equal(o.access_log_format, SHMIPC__ACCESS_COMMON);
    assert_string_equal(o.python, "python3");
    assert_null(o.chdir_to);
    assert_null(o.config);
    assert_false(o.check || o.help || o.version);
    shmipc__serve_options_free(&o);
    shmipc__serve_options_free(&o); /* twice: nothing left to free */
    shmipc__serve_options_free(NULL);
    assert_int_equal(shmipc__serve_options_init(NULL), SHMIPC_EINVAL);
    assert_int_equal(shmipc__serve_options_parse(NULL, 1, NULL, err, sizeof err), SHMIPC_EINVAL);
    assert_int_equal(shmipc__serve_options_init(&o), 0);
    assert_int_equal(shmipc__serve_options_parse(&o, 2, NULL, err, sizeof err), SHMIPC_EINVAL);
    assert_int_equal(shmipc__serve_options_parse(&o, -1, NULL, NULL, 0), SHMIPC_EINVAL);
    shmipc__serve_options_free(&o);
    assert_string_equal(shmipc__serve_kind_name(SHMIPC__SERVE_C), "c");
    assert_string_equal(shmipc__serve_kind_name(0), "?");
    assert_non_null(strstr(shmipc__serve_usage(), "--graceful-timeout S"));
}

static void test_every_flag(void **state)
{
    (void)state;
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    assert_int_equal(
        parse(&o, err,
              ARGS("--workers", "4", "--listen=[::1]:9000", "--max-requests", "1000000000",
                   "--timeout", "2.5", "--queue", "0", "--graceful-timeout", "0.001",
                   "--access-log", "-", "--access-log-format", "json", "--python",
                   "/usr/bin/python3", "--chdir", "/tmp", "--threads", "256", "--check", "--wsgi",
                   "pkg.mod:factory.app")),
        0);
    assert_int_equal(o.workers, 4);
    assert_string_equal(o.listen, "[::1]:9000");
    assert_int_equal(o.max_requests, 1000000000);
    assert_int_equal(o.timeout_ms, 2500);
    assert_int_equal(o.queue, 0);
    assert_int_equal(o.graceful_timeout_ms, 1);
    assert_string_equal(o.access_log, "-");
    assert_int_equal(o.access_log_format, SHMIPC__ACCESS_JSON);
    assert_string_equal(o.python, "/usr/bin/python3");
    assert_string_equal(o.chdir_to, "/tmp");
    assert_int_equal(o.threads, 256);
    assert_true(o.check);
    assert_string_equal(o.app, "pkg.mod:factory.app");
    shmipc__serve_options_free(&o);

    /* The other kinds are recorded (they fail at --check, not here). */
    assert_int_equal(parse(&o, err, ARGS("--asgi", "m:a")), 0);
    assert_int_equal(o.kind, SHMIPC__SERVE_ASGI);
    shmipc__serve_options_free(&o);
    assert_int_equal(parse(&o, err, ARGS("--lua", "handler.lua", "--listen", "unix:/tmp/s")), 0);
    assert_int_equal(o.kind, SHMIPC__SERVE_LUA);
    assert_string_equal(o.app, "handler.lua");
    shmipc__serve_options_free(&o);
    assert_int_equal(parse(&o, err, ARGS("--c=./libh.so:handle")), 0);
    assert_int_equal(o.kind, SHMIPC__SERVE_C);
    assert_string_equal(o.app, "./libh.so:handle");
    shmipc__serve_options_free(&o);
    /* "--" ends the options: an APP that starts with a dash is still refused as a name. */
    assert_int_equal(parse(&o, err, ARGS("--workers", "2", "--", "m:a")), 0);
    assert_string_equal(o.app, "m:a");
    shmipc__serve_options_free(&o);
    /* The last value of a repeated flag wins, as with most commands. */
    assert_int_equal(parse(&o, err, ARGS("m:a", "--workers", "2", "--workers", "3")), 0);
    assert_int_equal(o.workers, 3);
    shmipc__serve_options_free(&o);
    /* --help and --version need no APP. */
    assert_int_equal(parse(&o, err, ARGS("--help")), 0);
    assert_true(o.help);
    shmipc__serve_options_free(&o);
    assert_int_equal(parse(&o, err, ARGS("--version")), 0);
    assert_true(o.version);
    shmipc__serve_options_free(&o);
}

/* Regression: port 0 (the kernel picks one; shmipc-serve says which on its "listening on" line)
 * was refused, "the port must be 1 .. 65535". */
static void test_listen_port_0(void **state)
{
    (void)state;
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    const char *ok[] = {"127.0.0.1:0", "[::1]:0", "0.0.0.0:0", "[::]:0"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        assert_int_equal(parse(&o, err, ARGS("m:a", "--listen", ok[i])), 0);
        assert_string_equal(o.listen, ok[i]);
        shmipc__serve_options_free(&o);
    }
    assert_int_equal(parse(&o, err, ARGS("m:a", "--listen", "127.0.0.1:65535")), 0);
    shmipc__serve_options_free(&o);
}

static void test_flag_errors(void **state)
{
    (void)state;
    expect_error(ARGS("m:a", "--workers"), "--workers needs a value");
    expect_error(ARGS("m:a", "--workers", "0"), "--workers: '0' is out of range (1 .. 64)");
    expect_error(ARGS("m:a", "--workers", "1025"), "out of range (1 .. 64)");
    expect_error(ARGS("m:a", "--workers", "4294967297"), "out of range");
    expect_error(ARGS("m:a", "--workers", "18446744073709551616"), "out of range");
    expect_error(ARGS("m:a", "--workers", "99999999999999999999999999999"), "out of range");
    /* --concurrency: an ASGI worker's, 1 .. 256; the other kinds run one request at a time. */
    expect_error(ARGS("--asgi", "m:a", "--concurrency", "0"), "out of range (1 .. 256)");
    expect_error(ARGS("--asgi", "m:a", "--concurrency", "257"), "out of range (1 .. 256)");
    expect_error(ARGS("--asgi", "m:a", "--concurrency", "-1"), "not a number");
    expect_error(ARGS("--asgi", "m:a", "--concurrency", "4x"), "not a number");
    expect_error(ARGS("m:a", "--concurrency", "4"), "--concurrency is for --asgi apps (a wsgi");
    expect_error(ARGS("--lua", "h.lua", "--concurrency", "4"), "--concurrency is for --asgi");
    expect_error(ARGS("--c", "l.so", "--concurrency", "4"), "--concurrency is for --asgi");
    expect_error(ARGS("m:a", "--workers", "-1"), "'-1' is not a number");
    expect_error(ARGS("m:a", "--workers", "+1"), "not a number");
    expect_error(ARGS("m:a", "--workers", " 4"), "not a number");
    expect_error(ARGS("m:a", "--workers", "4x"), "not a number");
    expect_error(ARGS("m:a", "--workers", "0x10"), "not a number");
    expect_error(ARGS("m:a", "--workers="), "not a number");
    expect_error(ARGS("m:a", "--threads", "257"), "out of range (1 .. 256)");
    expect_error(ARGS("m:a", "--queue", "1000001"), "out of range (0 .. 1000000)");
    expect_error(ARGS("m:a", "--max-requests", "1000000001"), "out of range");
    expect_error(ARGS("m:a", "--timeout", "1.2345"), "at most 3 decimals");
    expect_error(ARGS("m:a", "--timeout", "-1"), "not a number of seconds");
    expect_error(ARGS("m:a", "--timeout", "1."), "not a number of seconds");
    expect_error(ARGS("m:a", "--timeout", ".5"), "not a number of seconds");
    expect_error(ARGS("m:a", "--timeout", "1e3"), "not a number of seconds");
    expect_error(ARGS("m:a", "--timeout", "3600.001"), "out of range (0 .. 3600 seconds)");
    expect_error(ARGS("m:a", "--timeout", "99999999999999999999999"), "out of range");
    expect_error(ARGS("m:a", "--graceful-timeout", "0"), "out of range (0.001 .. 86400");
    expect_error(ARGS("m:a", "--listen", "8000"), "expected HOST:PORT");
    expect_error(ARGS("m:a", "--listen", "::1:80"), "brackets");
    expect_error(ARGS("m:a", "--listen", "[::1]:-1"), "port must be 0 .. 65535");
    expect_error(ARGS("m:a", "--listen", "[::1]80"), "expected [IPv6]:PORT");
    expect_error(ARGS("m:a", "--listen", "127.0.0.1:65536"), "port must be 0 .. 65535");
    expect_error(ARGS("m:a", "--listen", "host:"), "port must be");
    expect_error(ARGS("m:a", "--listen", "ho st:80"), "space or control");
    expect_error(ARGS("m:a", "--listen", "unix:"), "unix: needs a path");
    expect_error(ARGS("m:a", "--listen", "unix:@"), "unix: needs a path");
    expect_error(ARGS("m:a", "--listen", ""), "--listen: the value is empty");
    expect_error(ARGS("m:a", "--access-log-format", "xml"), "'xml' is not common or json");
    expect_error(ARGS("m:a", "--python", ""), "--python: the value is empty");
    expect_error(ARGS("m:a", "--bogus"), "unknown option '--bogus'");
    expect_error(ARGS("m:a", "-w", "2"), "unknown option '-w'");
    expect_error(ARGS("m:a", "--check=1"), "--check takes no value");
    expect_error(ARGS("m:a", "n:b"), "unexpected argument 'n:b'");
    expect_error(ARGS("--asgi", "--lua", "f.lua"), "--lua: the application kind was already set "
                                                   "by asgi");
    expect_error(ARGS("--wsgi", "--asgi", "m:a"), "already set by wsgi");
    expect_error(ARGS("m:a", "--lua", "x.lua"), "already given as APP");
    expect_error(ARGS("--lua", "x.lua", "m:a"), "already given by --lua");
    expect_error(ARGS("--c", "lib.so:"), "'lib.so:' is not LIB.so[:SYMBOL]");
    expect_error(ARGS("--c", ":f"), "not LIB.so[:SYMBOL]");
    expect_error(ARGS("--lua", "m:"), "'m:' is not MODULE[:FUNCTION]");
    expect_error(ARGS("--workers", "2"), "no application");
    expect_error(ARGS("notanapp"), "'notanapp' is not module:callable");
    expect_error(ARGS("m:"), "not module:callable");
    expect_error(ARGS(":a"), "not module:callable");
    expect_error(ARGS("a..b:c"), "not module:callable");
    expect_error(ARGS("a:b:c"), "not module:callable");
    expect_error(ARGS("a:b."), "not module:callable");
    expect_error(ARGS("a b:c"), "not module:callable");
    expect_error(ARGS("m:a", "--config"), "--config needs a value");
    expect_error(ARGS("m:a", "--config", "x", "--config", "y"), "--config given twice");
    expect_error(ARGS("m:a", "--config="), "--config: the value is empty");
    /* A huge value is refused, and a control byte in one is shown as '?'. */
    char *big = malloc(5001);
    memset(big, 'a', 5000);
    big[5000] = '\0';
    expect_error(ARGS("m:a", "--python", big), "--python: the value is longer than 4096 bytes");
    free(big);
    expect_error(ARGS("m:a", "--workers", "\x1b[31m"), "'?[31m' is not a number");
}

/*
 * A second APP is refused with a message that quoted the first one raw, so a control byte in it
 * (an escape sequence, a newline) went to the terminal; found by fuzz/serve_options_fuzz.c
 * (fuzz/regressions/serve_options/unexpected-argument-echoes-app-raw). It is shown as '?', as
 * every other value in a message.
 */
static void test_unexpected_argument_echoes_app_raw(void **state)
{
    (void)state;
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    assert_int_equal(parse(&o, err, ARGS("a\x1b[31m:b\n", "x\x07")), SHMIPC_EINVAL);
    assert_string_equal(err, "unexpected argument 'x?' (APP was 'a?[31m:b?')");
    shmipc__serve_options_free(&o);
}

static void test_config_file(void **state)
{
    (void)state;
    const char *f =
        write_text("good.conf", "# shmipc-serve config\n"
                                "\n"
                                "app = myapp:app\r\n"
                                "  workers\t=  2  \n"
                                "listen = 127.0.0.1:9001\n"
                                "threads = 2\n"
                                "max-requests = 500\n"
                                "timeout = 10\n"
                                "queue = 16\n"
                                "graceful-timeout = 5.5\n"
                                "access-log = /tmp/x # not a comment: part of the value\n"
                                "access-log-format = json\n"
                                "python = /usr/bin/python3\n"
                                "chdir = /tmp\n"
                                "wsgi = yes\n"
                                "asgi = false");
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    assert_int_equal(parse(&o, err, ARGS("--config", f)), 0);
    assert_string_equal(o.app, "myapp:app");
    assert_int_equal(o.workers, 2);
    assert_string_equal(o.listen, "127.0.0.1:9001");
    assert_int_equal(o.threads, 2);
    assert_int_equal(o.max_requests, 500);
    assert_int_equal(o.timeout_ms, 10000);
    assert_int_equal(o.queue, 16);
    assert_int_equal(o.graceful_timeout_ms, 5500);
    assert_string_equal(o.access_log, "/tmp/x # not a comment: part of the value");
    assert_int_equal(o.access_log_format, SHMIPC__ACCESS_JSON);
    assert_string_equal(o.config, f);
    assert_int_equal(o.kind, SHMIPC__SERVE_WSGI);
    shmipc__serve_options_free(&o);

    /* Flags override the file, whether they come before or after --config. */
    assert_int_equal(
        parse(&o, err, ARGS("--workers", "3", "--config", f, "--queue", "7", "other:app")), 0);
    assert_int_equal(o.workers, 3);
    assert_int_equal(o.queue, 7);
    assert_string_equal(o.app, "other:app");
    assert_string_equal(o.listen, "127.0.0.1:9001"); /* from the file */
    shmipc__serve_options_free(&o);

    /* The kind: the command line's wins over the file's, with the right app. */
    const char *lua = write_text("lua.conf", "lua = h.lua\nworkers = 2\n");
    assert_int_equal(parse(&o, err, ARGS("--config", lua, "m:a")), 0);
    assert_int_equal(o.kind, SHMIPC__SERVE_WSGI);
    assert_string_equal(o.app, "m:a");
    shmipc__serve_options_free(&o);
    assert_int_equal(parse(&o, err, ARGS("--config", lua, "--asgi", "m:a")), 0);
    assert_int_equal(o.kind, SHMIPC__SERVE_ASGI);
    assert_string_equal(o.app, "m:a");
    shmipc__serve_options_free(&o);
    const char *app = write_text("app.conf", "app = m:a\nasgi = true\n");
    assert_int_equal(parse(&o, err, ARGS("--config", app)), 0);
    assert_int_equal(o.kind, SHMIPC__SERVE_ASGI);
    shmipc__serve_options_free(&o);
    assert_int_equal(parse(&o, err, ARGS("--config", app, "--lua", "x.lua")), 0);
    assert_int_equal(o.kind, SHMIPC__SERVE_LUA);
    assert_string_equal(o.app, "x.lua");
    shmipc__serve_options_free(&o);
    assert_int_equal(parse(&o, err, ARGS("--config", app, "--wsgi")), 0);
    assert_int_equal(o.kind, SHMIPC__SERVE_WSGI);
    assert_string_equal(o.app, "m:a");
    shmipc__serve_options_free(&o);

    /* load_file alone, as the API. */
    assert_int_equal(shmipc__serve_options_init(&o), 0);
    assert_int_equal(shmipc__serve_options_load_file(&o, f, err, sizeof err), 0);
    assert_int_equal(o.workers, 2);
    assert_int_equal(shmipc__serve_options_load_file(&o, NULL, err, sizeof err), SHMIPC_EINVAL);
    assert_int_equal(shmipc__serve_options_load_file(NULL, f, err, sizeof err), SHMIPC_EINVAL);
    shmipc__serve_options_free(&o);

    /* An empty file and a file of comments are fine. */
    assert_int_equal(parse(&o, err, ARGS("--config", write_text("e.conf", ""), "m:a")), 0);
    shmipc__serve_options_free(&o);
    assert_int_equal(parse(&o, err, ARGS("--config", write_text("c.conf", "#\n  # x\n\n"), "m:a")),
                     0);
    shmipc__serve_options_free(&o);
}

/*
 * The config file is read before the other flags, so the command line is scanned for --config
 * first. That scan took every argument for a flag, the value of another flag too, and stopped
 * at the first "--", a value too: "--python --config=F" read F (and set python to
 * "--config=F"), "--chdir --config APP" opened APP as the file, and "--python -- --config F"
 * named F in o->config without reading it. The scan reads the arguments as the parser does.
 */
static void test_config_scan_skips_flag_values(void **state)
{
    (void)state;
    const char *f = write_text("five.conf", "workers = 5\n");
    char inline_arg[300];
    snprintf(inline_arg, sizeof inline_arg, "--config=%s", f);
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];

    assert_int_equal(parse(&o, err, ARGS("--python", inline_arg, "m:a")), 0);
    assert_string_equal(o.python, inline_arg);
    assert_int_equal(o.workers, 1);
    assert_null(o.config);
    shmipc__serve_options_free(&o);

    assert_int_equal(parse(&o, err, ARGS("--chdir", "--config", "m:a")), 0);
    assert_string_equal(o.chdir_to, "--config");
    assert_string_equal(o.app, "m:a");
    assert_null(o.config);
    shmipc__serve_options_free(&o);

    assert_int_equal(parse(&o, err, ARGS("--python", "--", "--config", f, "m:a")), 0);
    assert_string_equal(o.python, "--");
    assert_int_equal(o.workers, 5);
    assert_string_equal(o.config, f);
    shmipc__serve_options_free(&o);

    /* After the "--" that ends the flags, "--config" is an APP, not a flag. */
    expect_error(ARGS("m:a", "--", "--config", f), "unexpected argument '--config'");
    /* A flag's missing value is its own error, not the config file's. */
    expect_error(ARGS("m:a", "--config", f, "--workers"), "--workers needs a value");
}

/*
 * A FIFO as the config file: open() waited for a writer that never came, so the command hung
 * before it could say "not a regular file". It is opened without waiting (the alarm turns a
 * hang into a failure).
 */
static void test_config_fifo_does_not_block(void **state)
{
    (void)state;
    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s/fifo.conf", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    alarm(10);
    expect_error(ARGS("--config", fifo, "m:a"), "fifo.conf: not a regular file");
    alarm(0);
}

/* A config file with `text` fails with "NAME:want". */
static void expect_file_error(const char *text, size_t len, const char *want)
{
    const char *f = write_file("bad.conf", text, len);
    char full[300];
    snprintf(full, sizeof full, "%s%s", f, want);
    expect_error(ARGS("--config", f, "m:a"), want[0] == ':' ? full : want);
}

#define FILE_ERR(text, want) expect_file_error(text, sizeof(text) - 1, want)

/*
 * The file is read into a buffer sized from fstat(), grown as more comes, up to one byte past
 * the limit: a file of exactly 1 MiB whose last line has no newline (its NUL goes one past
 * the file, caught by ASan were the buffer a byte short) is read whole; one byte more is
 * refused; a file that fstat() says is empty but is not (/proc/self/comm, named by
 * prctl(PR_SET_NAME)) is read whole too.
 */
static void test_config_file_size_limit(void **state)
{
    (void)state;
    static const char head[] = "workers = 3\n", tail[] = "queue = 7";
    size_t max = SHMIPC__SERVE_MAX_FILE;
    char *text = malloc(max + 1);
    assert_non_null(text);
    memcpy(text, head, sizeof head - 1);
    memset(text + sizeof head - 1, '\n', max + 1 - (sizeof head - 1));
    memcpy(text + max - (sizeof tail - 1), tail, sizeof tail - 1);
    const char *f = write_file("limit.conf", text, max);
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    int rc = parse(&o, err, ARGS("--config", f, "m:a"));
    if (rc != 0)
        print_message("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(o.workers, 3);
    assert_int_equal(o.queue, 7);
    shmipc__serve_options_free(&o);
    /* One byte more (a blank line before the last): refused, as before the read grew. */
    memcpy(text + max + 1 - (sizeof tail - 1), tail, sizeof tail - 1);
    text[max - (sizeof tail - 1)] = '\n';
    expect_file_error(text, max + 1, "larger than 1048576 bytes");
    free(text);
    /* fstat() says 0 bytes; the 12 there are read all the same. */
    char name[16] = "";
    assert_int_equal(prctl(PR_GET_NAME, name, 0, 0, 0), 0);
    assert_int_equal(prctl(PR_SET_NAME, "workers = 5", 0, 0, 0), 0);
    struct stat st;
    assert_int_equal(stat("/proc/self/comm", &st), 0);
    assert_int_equal(st.st_size, 0);
    rc = parse(&o, err, ARGS("--config", "/proc/self/comm", "m:a"));
    assert_int_equal(prctl(PR_SET_NAME, name, 0, 0, 0), 0);
    if (rc != 0)
        print_message("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(o.workers, 5);
    shmipc__serve_options_free(&o);
}

/*
 * Every --timeout the options take is one the front takes: they took up to 86400 s, and --check
 * said such a file was valid, but the front (and the server's deferral under it) refuses a
 * deadline over an hour, so shmipc-serve started its workers and then exited 1 with
 * "front_new: a deadline, timeout or limit too large".
 */
static void test_timeout_is_one_the_front_takes(void **state)
{
    (void)state;
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    assert_int_equal(parse(&o, err, ARGS("m:a", "--timeout", "3600")), 0);
    assert_int_equal(o.timeout_ms, 3600000);
    const char *const addrs[] = {"unix:@shmipc-opt-timeout"};
    struct shmipc__front_opts fo = {.workers = addrs, .nworkers = 1, .deadline_ms = o.timeout_ms};
    struct shmipc__front *f = NULL;
    assert_int_equal(shmipc__front_new(&fo, &f), 0);
    shmipc__front_free(f);
    shmipc__serve_options_free(&o);
    expect_error(ARGS("m:a", "--timeout", "3600.001"), "out of range (0 .. 3600 seconds)");
    expect_error(ARGS("m:a", "--timeout", "86400"), "out of range (0 .. 3600 seconds)");
    FILE_ERR("timeout = 3601\n", ":1: timeout: '3601' is out of range (0 .. 3600 seconds)");
}

/*
 * Every --workers the options take gets requests: the front routes to at most
 * SHMIPC__FRONT_MAX_WORKERS (64) workers, and the options took up to 1024, so with --workers 66
 * the supervisor ran 66 processes of which two never got a request.
 */
static void test_workers_are_ones_the_front_routes_to(void **state)
{
    (void)state;
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    assert_int_equal(parse(&o, err, ARGS("m:a", "--workers", "64")), 0);
    assert_int_equal(o.workers, SHMIPC__FRONT_MAX_WORKERS);
    shmipc__serve_options_free(&o);
    expect_error(ARGS("m:a", "--workers", "65"), "--workers: '65' is out of range (1 .. 64)");
    expect_error(ARGS("m:a", "--workers", "1024"), "out of range (1 .. 64)");
    FILE_ERR("workers = 65\n", ":1: workers: '65' is out of range (1 .. 64)");
}

/*
 * --listen's host is a numeric address, the only kind the HTTP server binds: a name passed the
 * options and --check (which resolved it with getaddrinfo), and then shmipc-serve started its
 * workers and exited 1 with 'address: "localhost" is not a numeric IPv4 or IPv6 address'.
 */
static void test_listen_host_is_numeric(void **state)
{
    (void)state;
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    const char *ok[] = {"127.0.0.1:80", "0.0.0.0:8000", "[::1]:80", "[::]:80", "[127.0.0.1]:80"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(parse(&o, err, ARGS("m:a", "--listen", ok[i])), 0);
        shmipc__serve_options_free(&o);
    }
    expect_error(ARGS("m:a", "--listen", "localhost:8000"),
                 "--listen: 'localhost:8000': the host is not a numeric IPv4 or IPv6 address");
    expect_error(ARGS("m:a", "--listen", "0:8000"), "not a numeric IPv4 or IPv6 address");
    expect_error(ARGS("m:a", "--listen", "[localhost]:8000"), "not a numeric IPv4 or IPv6");
    expect_error(ARGS("m:a", "--listen", "[::1%lo]:8000"), "not a numeric IPv4 or IPv6");
    FILE_ERR("listen = example.com:80\n", ":1: listen: 'example.com:80': the host is not a");
}

static void test_config_file_hostile(void **state)
{
    (void)state;
    FILE_ERR("workers = 2\nworker = 3\n", ":2: unknown key 'worker' (keys are the long option");
    FILE_ERR("--workers = 3\n", ":1: unknown key '--workers'");
    FILE_ERR("# c\nworkers = 2\n\nworkers = 2\n", ":4: 'workers' again (first set on line 2)");
    FILE_ERR("workers =\n", ":1: 'workers' has no value");
    FILE_ERR("workers = \t \n", ":1: 'workers' has no value");
    FILE_ERR("workers\n", ":1: expected 'key = value'");
    FILE_ERR(" = 3\n", ":1: a value without a key");
    FILE_ERR("workers = 0\n", ":1: workers: '0' is out of range (1 .. 64)");
    FILE_ERR("workers = -1\n", ":1: workers: '-1' is not a number");
    FILE_ERR("workers = 1025\n", ":1: workers: '1025' is out of range");
    FILE_ERR("workers = 99999999999999999999999999\n", "out of range");
    FILE_ERR("queue = 1000001\n", ":1: queue: '1000001' is out of range (0 .. 1000000)");
    FILE_ERR("timeout = 3601\n", ":1: timeout: '3601' is out of range");
    FILE_ERR("graceful-timeout = 0\n", "out of range");
    FILE_ERR("workers = 2 # two\n", "'2 # two' is not a number");
    FILE_ERR("check = true\n", ":1: 'check' is a command-line option only");
    FILE_ERR("config = other.conf\n", "'config' is a command-line option only");
    FILE_ERR("help = true\n", "command-line option only");
    FILE_ERR("wsgi = maybe\n", ":1: wsgi: 'maybe' is not true or false");
    FILE_ERR("asgi = true\nlua = x.lua\n", ":2: lua: the application kind was already set by asgi");
    FILE_ERR("app = m:a\nlua = x.lua\n", ":2: lua: the application was already given as APP");
    FILE_ERR("listen = nope\n", ":1: listen: 'nope': expected HOST:PORT");
    FILE_ERR("workers = 2\nqueue\x00 = 3\n", ":2: a NUL byte");
    FILE_ERR("\x00", ":1: a NUL byte");
    /* A line longer than 8192 bytes; a value of 5000 bytes on a shorter line. */
    char *long_line = malloc(9000);
    memset(long_line, 'a', 8999);
    memcpy(long_line, "python = ", 9);
    long_line[8999] = '\n';
    expect_file_error(long_line, 9000, ":1: the line is longer than 8192 bytes");
    memcpy(long_line + 5009, "\n", 1);
    expect_file_error(long_line, 5010, ":1: python: the value is longer than 4096 bytes");
    free(long_line);
    /* Larger than 1 MiB. */
    size_t huge = (1u << 20) + 10;
    char *h = malloc(huge);
    memset(h, '\n', huge);
    expect_file_error(h, huge, "larger than 1048576 bytes");
    free(h);
    /* Not a file. */
    char missing[300];
    snprintf(missing, sizeof missing, "%s/missing.conf", dir);
    expect_error(ARGS("--config", missing, "m:a"), "missing.conf: cannot open: No such file");
    expect_error(ARGS("--config", dir, "m:a"), ": not a regular file");
    /* A long path is shown whole up to 250 bytes, then cut with "...". */
    char longp[400];
    int k = snprintf(longp, sizeof longp, "%s/", dir);
    memset(longp + k, 'p', 300);
    longp[k + 300] = '\0';
    char want_long[300];
    memcpy(want_long, longp, 252);
    memcpy(want_long + 252, "...: cannot open", 17);
    expect_error(ARGS("--config", longp, "m:a"), want_long);
    /* A file of random bytes, many times: an error or success, never a crash (ASan run). */
    srand(12345);
    unsigned errors = 0;
    for (int round = 0; round < 300; round++) {
        char buf[512];
        size_t n = (size_t)(rand() % (int)sizeof buf);
        for (size_t i = 0; i < n; i++) {
            /* Mostly text that looks like config, with some raw bytes. */
            static const char alphabet[] = "workers=queue2 \n#:-.timeout1app";
            buf[i] = rand() % 8 == 0 ? (char)(rand() % 256)
                                     : alphabet[rand() % (int)(sizeof alphabet - 1)];
        }
        const char *f = write_file("fuzz.conf", buf, n);
        shmipc__serve_options o;
        char err[SHMIPC__SERVE_ERR_SIZE];
        const char *const args[] = {"--config", f, "m:a", NULL};
        int rc = parse(&o, err, args);
        assert_true(rc == 0 || rc == SHMIPC_EINVAL);
        if (rc != 0) {
            errors++;
            assert_true(strlen(err) > 0);
            /* The message is printable: hostile bytes are not echoed raw. */
            for (const char *p = err; *p != '\0'; p++)
                assert_true((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f);
        }
        shmipc__serve_options_free(&o);
    }
    assert_true(errors > 0);
    /* A tiny error buffer gets a cut, terminated message. */
    shmipc__serve_options o;
    char small[8];
    assert_int_equal(shmipc__serve_options_init(&o), 0);
    const char *argv[] = {"shmipc-serve", "--bogus", NULL};
    assert_int_equal(shmipc__serve_options_parse(&o, 2, (char *const *)argv, small, sizeof small),
                     SHMIPC_EINVAL);
    assert_int_equal(strlen(small), 7);
    assert_int_equal(shmipc__serve_options_parse(&o, 2, (char *const *)argv, NULL, 0),
                     SHMIPC_EINVAL);
    shmipc__serve_options_free(&o);
}

static void test_worker_argv(void **state)
{
    (void)state;
    shmipc__serve_options o;
    char err[SHMIPC__SERVE_ERR_SIZE];
    char **argv;
    assert_int_equal(parse(&o, err, ARGS("m:a", "--python", "/opt/py")), 0);
    assert_int_equal(shmipc__serve_worker_argv(&o, &argv, err, sizeof err), 0);
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    const char *want[] = {"/opt/py",      "-m",        "shmipc.serve.worker",
                          "m:a",          "--address", "{address}",
                          "--parent-pid", pid,         NULL};
    for (size_t i = 0; i < 9; i++)
        if (want[i] == NULL)
            assert_null(argv[i]);
        else
            assert_string_equal(argv[i], want[i]);
    shmipc__serve_argv_free(argv);
    shmipc__serve_options_free(&o);
    assert_int_equal(parse(&o, err, ARGS("m:a", "--max-requests", "7")), 0);
    assert_int_equal(shmipc__serve_worker_argv(&o, &argv, err, sizeof err), 0);
    assert_string_equal(argv[8], "--max-requests");
    assert_string_equal(argv[9], "7");
    assert_null(argv[10]);
    shmipc__serve_argv_free(argv);
    shmipc__serve_options_free(&o);
    /* ASGI: the same worker module with --asgi and its concurrency (64 unless said), before
     * --max-requests. */
    assert_int_equal(parse(&o, err, ARGS("--asgi", "m:a", "--max-requests", "3")), 0);
    assert_int_equal(shmipc__serve_worker_argv(&o, &argv, err, sizeof err), 0);
    assert_string_equal(argv[3], "m:a");
    assert_string_equal(argv[8], "--asgi");
    assert_string_equal(argv[9], "--concurrency");
    assert_string_equal(argv[10], "64");
    assert_string_equal(argv[11], "--max-requests");
    assert_string_equal(argv[12], "3");
    assert_null(argv[13]);
    shmipc__serve_argv_free(argv);
    shmipc__serve_options_free(&o);
    assert_int_equal(parse(&o, err, ARGS("--asgi", "m:a", "--concurrency", "256")), 0);
    assert_int_equal(shmipc__serve_worker_argv(&o, &argv, err, sizeof err), 0);
    assert_string_equal(argv[10], "256");
    assert_null(argv[11]);
    shmipc__serve_argv_free(argv);
    shmipc__serve_options_free(&o);
    /* Lua and C: shmipc-serve-worker beside this program, with the kind's flag. */
    const char *const *kinds[] = {ARGS("--lua", "h.lua", "--max-requests", "7"),
                                  ARGS("--c", "l.so")};
    const char *flags[] = {"--lua", "--c"}, *apps[] = {"h.lua", "l.so"};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(parse(&o, err, kinds[i]), 0);
        assert_int_equal(shmipc__serve_worker_argv(&o, &argv, err, sizeof err), 0);
        const char *slash = strrchr(argv[0], '/');
        assert_non_null(slash);
        assert_string_equal(slash, "/shmipc-serve-worker");
        assert_string_equal(argv[1], flags[i]);
        assert_string_equal(argv[2], apps[i]);
        assert_string_equal(argv[3], "--address");
        assert_string_equal(argv[4], "{address}");
        assert_string_equal(argv[5], "--parent-pid");
        if (i == 0) {
            assert_string_equal(argv[7], "--max-requests");
            assert_string_equal(argv[8], "7");
            assert_null(argv[9]);
        } else {
            assert_null(argv[7]);
        }
        shmipc__serve_argv_free(argv);
        /* --check runs that worker with --check: none beside the test program, so an error
         * (exit 2) that names the app, not a crash (tests/python/test_serve_cli.py checks it
         * with the real worker). */
        assert_int_equal(shmipc__serve_check(&o, NULL, 5000, err, sizeof err), SHMIPC_EINVAL);
        assert_non_null(strstr(err, "shmipc-serve-worker"));
        shmipc__serve_options_free(&o);
    }
    assert_int_equal(shmipc__serve_worker_argv(NULL, &argv, err, sizeof err), SHMIPC_EINVAL);
    shmipc__serve_argv_free(NULL);
}

/* ---- --check ---------------------------------------------------------------------------- */

static int python_built(void)
{
    char p[512];
    snprintf(p, sizeof p, "%s/python/shmipc/serve/worker.py", SHMIPC_BUILD_DIR);
    if (access(p, R_OK) != 0)
        return 0;
    snprintf(p, sizeof p, "%s/python/shmipc", SHMIPC_BUILD_DIR);
    DIR *d = opendir(p);
    int found = 0;
    struct dirent *e;
    while (d != NULL && (e = readdir(d)) != NULL)
        found |= strncmp(e->d_name, "_serve.", 7) == 0 && strstr(e->d_name, ".so") != NULL;
    if (d != NULL)
        closedir(d);
    return found;
}

static int check(const char *const *args, char **envp, uint32_t timeout_ms, char *err)
{
    shmipc__serve_options o;
    int rc = parse(&o, err, args);
    if (rc == 0)
        rc = shmipc__serve_check(&o, envp, timeout_ms, err, SHMIPC__SERVE_ERR_SIZE);
    shmipc__serve_options_free(&o);
    return rc;
}

static void expect_check_error(const char *const *args, char **envp, uint32_t timeout_ms,
                               const char *want)
{
    char err[SHMIPC__SERVE_ERR_SIZE];
    int rc = check(args, envp, timeout_ms, err);
    if (rc != SHMIPC_EINVAL || strstr(err, want) == NULL)
        print_message("rc %d, message '%s', want '%s'\n", rc, err, want);
    assert_int_equal(rc, SHMIPC_EINVAL);
    assert_non_null(strstr(err, want));
}

static void test_check_without_python(void **state)
{
    (void)state;
    char err[SHMIPC__SERVE_ERR_SIZE];
    assert_int_equal(shmipc__serve_check(NULL, NULL, 0, err, sizeof err), SHMIPC_EINVAL);
    char nodir[300];
    snprintf(nodir, sizeof nodir, "%s/nodir", dir);
    expect_check_error(ARGS("m:a", "--chdir", nodir), NULL, 1000, "--chdir");
    expect_check_error(ARGS("m:a", "--chdir", write_text("plain", "x")), NULL, 1000,
                       "not a directory");
    expect_check_error(ARGS("m:a", "--python", "/nonexistent/python3"), NULL, 1000,
                       "--python /nonexistent/python3: not found or not executable");
    expect_check_error(ARGS("m:a", "--python", "no-such-python-shmipc"), NULL, 1000,
                       "not found or not executable");
    char log[300];
    snprintf(log, sizeof log, "%s/nodir/access.log", dir);
    expect_check_error(ARGS("m:a", "--python", "/bin/sh", "--access-log", log), NULL, 1000,
                       "its directory cannot be written");
    expect_check_error(ARGS("m:a", "--python", "/bin/sh", "--access-log", dir), NULL, 1000,
                       "cannot be written");
    snprintf(log, sizeof log, "unix:%s/nodir/sock", dir);
    expect_check_error(ARGS("m:a", "--python", "/bin/sh", "--listen", log), NULL, 1000,
                       "the directory does not exist");
    /* An interpreter that is not Python fails the import check with its own words. */
    expect_check_error(ARGS("m:a", "--python", "/bin/false"), NULL, 5000,
                       "APP m:a cannot be loaded by /bin/false: the interpreter failed");
}

static void test_check_imports_the_app(void **state)
{
    (void)state;
    if (!python_built())
        skip();
    char *env[512];
    char pp[600];
    size_t n = 0;
    snprintf(pp, sizeof pp, "PYTHONPATH=%s/python", SHMIPC_BUILD_DIR);
    env[n++] = pp;
    for (char **e = environ; *e != NULL && n < 510; e++)
        if (strncmp(*e, "PYTHONPATH=", 11) != 0)
            env[n++] = *e;
    env[n] = NULL;
    write_text("okapp.py", "def app(environ, start_response):\n    return []\n");
    write_text("boomapp.py", "raise RuntimeError('boom at import')\n");
    write_text("slowapp.py", "import time\ntime.sleep(30)\n");
    write_text("noisyapp.py", "print('x' * 200000)\ndef app(e, s):\n    return []\n");
    write_text("noisybad.py", "print('y' * 200001)\nprint('z' * 333)\nraise ValueError('late')\n");
    char err[SHMIPC__SERVE_ERR_SIZE];
    int rc = check(ARGS("okapp:app", "--chdir", dir, "--python", SHMIPC_PYTHON), env, 30000, err);
    if (rc != 0)
        print_message("%s\n", err);
    assert_int_equal(rc, 0);
    assert_int_equal(
        check(ARGS("noisyapp:app", "--chdir", dir, "--python", SHMIPC_PYTHON), env, 30000, err), 0);
    /* After much output, the message is still the exception's line. */
    expect_check_error(ARGS("noisybad:app", "--chdir", dir, "--python", SHMIPC_PYTHON), env, 30000,
                       "cannot be loaded by " SHMIPC_PYTHON ": ValueError: late");
    expect_check_error(ARGS("nosuchmod:app", "--chdir", dir, "--python", SHMIPC_PYTHON), env, 30000,
                       "ModuleNotFoundError: No module named 'nosuchmod'");
    expect_check_error(ARGS("okapp:nothere", "--chdir", dir, "--python", SHMIPC_PYTHON), env, 30000,
                       "AttributeError");
    expect_check_error(ARGS("boomapp:app", "--chdir", dir, "--python", SHMIPC_PYTHON), env, 30000,
                       "RuntimeError: boom at import");
    expect_check_error(ARGS("slowapp:app", "--chdir", dir, "--python", SHMIPC_PYTHON), env, 500,
                       "importing it took longer than 0.5 s");
    /* A relative --python is taken in --chdir, where the workers run it (posix_spawn after
     * its chdir): --check looked for it in the current directory, and refused a working
     * configuration ("not found") whose interpreter was not there too. */
    char bin[300], py[340], cwd[PATH_MAX];
    snprintf(bin, sizeof bin, "%s/relbin", dir);
    snprintf(py, sizeof py, "%s/py", bin);
    assert_int_equal(mkdir(bin, 0700), 0);
    assert_int_equal(symlink(SHMIPC_PYTHON, py), 0);
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_string_not_equal(cwd, dir);
    rc = check(ARGS("okapp:app", "--chdir", dir, "--python", "relbin/py"), env, 30000, err);
    if (rc != 0)
        print_message("%s\n", err);
    assert_int_equal(rc, 0);
    unlink(py);
    rmdir(bin);
}

/* ---- the access log ------------------------------------------------------------------------ */

static shmipc__access_entry entry(const char *target)
{
    shmipc__access_entry e;
    memset(&e, 0, sizeof e);
    e.remote = "127.0.0.1";
    e.remote_len = 9;
    e.method = "GET";
    e.method_len = 3;
    e.target = target;
    e.target_len = strlen(target);
    e.time_sec = 1700000000; /* 2023-11-14 22:13:20 UTC */
    e.time_nsec = 123456789;
    e.version_minor = 1;
    e.status = 200;
    e.bytes = 13;
    e.duration_us = 1500;
    return e;
}

static void test_access_log_common(void **state)
{
    (void)state;
    char out[1024];
    shmipc__access_entry e = entry("/x?a=1");
    int n = shmipc__access_format(SHMIPC__ACCESS_COMMON, &e, out, sizeof out);
    const char want[] =
        "127.0.0.1 - - [14/Nov/2023:22:13:20 +0000] \"GET /x?a=1 HTTP/1.1\" 200 13\n";
    assert_string_equal(out, want);
    assert_int_equal(n, sizeof want - 1);
    /* Hostile bytes in the target and method cannot break the line or the quotes. */
    static const char bad[] = "/a\"b\\c\x01\n\r\x7f\xff\xc3\xa9 d";
    e = entry("");
    e.target = bad;
    e.target_len = sizeof bad - 1;
    e.method = "G\"T";
    e.remote = NULL;
    e.version_minor = 0;
    e.status = 404;
    e.bytes = 0;
    n = shmipc__access_format(SHMIPC__ACCESS_COMMON, &e, out, sizeof out);
    assert_string_equal(out,
                        "- - - [14/Nov/2023:22:13:20 +0000] \"G\\x22T "
                        "/a\\x22b\\x5Cc\\x01\\x0A\\x0D\\x7F\\xFF\\xC3\\xA9 d HTTP/1.0\" 404 0\n");
    /* One line, one pair of quotes around the request. */
    assert_int_equal(strchr(out, '\n') - out, n - 1);
    int quotes = 0;
    for (char *p = out; *p != '\0'; p++)
        quotes += *p == '"';
    assert_int_equal(quotes, 2);
}

static void test_access_log_json(void **state)
{
    (void)state;
    char out[2048];
    shmipc__access_entry e = entry("/x");
    e.user_agent = "curl/8";
    e.user_agent_len = 6;
    int n = shmipc__access_format(SHMIPC__ACCESS_JSON, &e, out, sizeof out);
    const char want[] = "{\"time\":\"2023-11-14T22:13:20.123Z\",\"remote\":\"127.0.0.1\","
                        "\"method\":\"GET\",\"target\":\"/x\",\"protocol\":\"HTTP/1.1\","
                        "\"status\":200,\"bytes\":13,\"duration_us\":1500,\"referer\":null,"
                        "\"user_agent\":\"curl/8\",\"worker\":null}\n";
    assert_string_equal(out, want);
    assert_int_equal(n, sizeof want - 1);
    /* Quotes, backslash, control bytes and DEL escaped; valid UTF-8 kept (2, 3 and 4 bytes);
     * every byte of invalid UTF-8 becomes U+FFFD: a lone 0xFF, an overlong '/', a surrogate,
     * a cut sequence, a code point past U+10FFFF. */
    static const char bad[] = "\"\\\x01\x1f\x7f"
                              "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                              "\xff|\xc0\xaf|\xed\xa0\x80|\xe2\x82|\xf4\x90\x80\x80|\xc3";
    e = entry("/");
    e.referer = bad;
    e.referer_len = sizeof bad - 1;
    e.remote = "unix:";
    e.remote_len = 5;
    n = shmipc__access_format(SHMIPC__ACCESS_JSON, &e, out, sizeof out);
    assert_true(n > 0);
    assert_non_null(strstr(out, "\"referer\":\"\\\"\\\\\\u0001\\u001f\\u007f"
                                "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"
                                "\\ufffd|\\ufffd\\ufffd|\\ufffd\\ufffd\\ufffd|\\ufffd\\ufffd|"
                                "\\ufffd\\ufffd\\ufffd\\ufffd|\\ufffd\","));
    assert_non_null(strstr(out, "\"remote\":\"unix:\""));
    assert_non_null(strstr(out, "\"user_agent\":null,"));
    for (char *p = out; *p != '\0'; p++)
        assert_true((unsigned char)*p >= 0x20 || *p == '\n');
}

static void test_access_log_limits(void **state)
{
    (void)state;
    /* Worst case: every byte needs the longest escape. The bound holds it. */
    char *worst = malloc(4096);
    for (size_t i = 0; i < 4096; i++)
        worst[i] = (char)(i % 2 ? 0x01 : 0xff);
    shmipc__access_entry e = entry("");
    e.target = e.referer = e.user_agent = e.method = e.remote = e.worker = worst;
    e.target_len = e.referer_len = e.user_agent_len = e.worker_len = 4096;
    e.method_len = 32;
    e.remote_len = 45;
    e.bytes = UINT64_MAX;
    e.duration_us = UINT64_MAX;
    e.status = 999;
    e.version_minor = 9;
    e.time_sec = INT64_MAX; /* gmtime fails: a zero time, not a crash */
    e.time_nsec = -5;
    size_t bound = shmipc__access_format_bound(&e);
    char *out = malloc(bound);
    for (int f = SHMIPC__ACCESS_COMMON; f <= SHMIPC__ACCESS_JSON; f++) {
        int n = shmipc__access_format(f, &e, out, bound);
        assert_true(n > 0 && (size_t)n < bound);
        assert_int_equal(strlen(out), (size_t)n);
        /* Every shorter buffer is refused whole, never overrun (ASan checks the copy). */
        for (size_t cap = 1; cap <= (size_t)n; cap += (cap < 64 ? 1 : 97)) {
            char *small = malloc(cap);
            assert_int_equal(shmipc__access_format(f, &e, small, cap), SHMIPC_EMSGSIZE);
            free(small);
        }
        char *exact = malloc((size_t)n + 1);
        assert_int_equal(shmipc__access_format(f, &e, exact, (size_t)n + 1), n);
        free(exact);
    }
    free(out);
    free(worst);
    char buf[16];
    e = entry("/");
    assert_int_equal(shmipc__access_format(SHMIPC__ACCESS_COMMON, NULL, buf, sizeof buf),
                     SHMIPC_EINVAL);
    assert_int_equal(shmipc__access_format(SHMIPC__ACCESS_COMMON, &e, NULL, 16), SHMIPC_EINVAL);
    assert_int_equal(shmipc__access_format(SHMIPC__ACCESS_COMMON, &e, buf, 0), SHMIPC_EINVAL);
    assert_int_equal(shmipc__access_format(0, &e, buf, sizeof buf), SHMIPC_EINVAL);
    assert_int_equal(shmipc__access_format(3, &e, buf, sizeof buf), SHMIPC_EINVAL);
    assert_int_equal(shmipc__access_format_bound(NULL), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_every_flag),
        cmocka_unit_test(test_flag_errors),
        cmocka_unit_test(test_unexpected_argument_echoes_app_raw),
        cmocka_unit_test(test_config_file),
        cmocka_unit_test(test_config_scan_skips_flag_values),
        cmocka_unit_test(test_config_fifo_does_not_block),
        cmocka_unit_test(test_config_file_size_limit),
        cmocka_unit_test(test_config_file_hostile),
        cmocka_unit_test(test_timeout_is_one_the_front_takes),
        cmocka_unit_test(test_workers_are_ones_the_front_routes_to),
        cmocka_unit_test(test_listen_host_is_numeric),
        cmocka_unit_test(test_worker_argv),
        cmocka_unit_test(test_check_without_python),
        cmocka_unit_test(test_check_imports_the_app),
        cmocka_unit_test(test_listen_port_0),
        cmocka_unit_test(test_access_log_common),
        cmocka_unit_test(test_access_log_json),
        cmocka_unit_test(test_access_log_limits),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
