/*
 * Shared-memory mappings: the memfd or /dev/shm file a client creates for the buffer and the
 * queue pair, and the fd or file a server maps from what the client sends (reference §1.5,
 * §2.1). A mapping knows nothing of what lives inside it; buffer.h and queue.h lay that out.
 */
#ifndef SHMIPC_CORE_SHM_MAPPING_H
#define SHMIPC_CORE_SHM_MAPPING_H

#include <stddef.h>
#include <stdint.h>

struct shmipc__guard_slot;

/* Bytes of a shared-memory name, NUL included: the reference keeps every path under 256. */
#define SHMIPC__SHM_NAME_MAX 256

/*
 * One mapped region. `fd` stays open for a memfd (it is sent to the server and may be sealed)
 * and for a received fd; a mapped file is closed right after mmap, as the reference does.
 * `path` is the memfd label or the file path ("" when a received fd came without one).
 */
struct shmipc__mapping {
    void *base;
    size_t size;
    int fd;
    struct shmipc__guard_slot *guard; /* shm/guard.h; NULL when unguarded */
    char path[SHMIPC__SHM_NAME_MAX];
};

/* Sets `m` to the empty mapping (base NULL, fd -1), which shmipc__mapping_unmap() accepts. */
void shmipc__mapping_init(struct shmipc__mapping *m);

/*
 * Client, memfd mode: memfd_create("shmipc" + path), ftruncate to `size`, mmap shared RW. The
 * memory is zero-filled by the kernel. `size` is 1..UINT32_MAX. `m` must be empty; on failure
 * it stays empty.
 */
int shmipc__mapping_create_memfd(struct shmipc__mapping *m, const char *path, size_t size);

/*
 * Client, /dev/shm mode: creates the file `path` (O_EXCL, mode 0600), checks that its file
 * system has `size` bytes free (a tmpfs that runs out raises SIGBUS on first touch instead of
 * failing), ftruncates and maps it. A file this call created is removed again on failure.
 */
int shmipc__mapping_create_file(struct shmipc__mapping *m, const char *path, size_t size);

/*
 * Server, memfd mode: maps a received fd at its full size (fstat), refusing size 0 and sizes
 * above UINT32_MAX, which no offset of the protocol can address. On success `m` owns `fd`; on
 * failure the caller still does. `path` labels the mapping and may be NULL.
 */
int shmipc__mapping_map_fd(struct shmipc__mapping *m, int fd, const char *path);

/*
 * Server, /dev/shm mode: opens the peer's existing regular file `path` read-write (not
 * following a final symlink) and maps it at its full size, with the size rules of
 * shmipc__mapping_map_fd(). The file is left in place; see shmipc__mapping_unlink().
 */
int shmipc__mapping_open_file(struct shmipc__mapping *m, const char *path);

/*
 * Seals a memfd against shrinking and growing, so a peer that maps it can never see a page
 * disappear under it (SIGBUS). Legacy peers neither seal nor check seals; this is for V4.
 */
int shmipc__mapping_seal_size(struct shmipc__mapping *m);

/*
 * 1 when the file under `m` shrank and an access raised SIGBUS: the SIGBUS guard (shm/guard.h)
 * has replaced the mapping with private zero pages, so the memory is no longer shared with
 * the peer and the session that owns it must end.
 */
int shmipc__mapping_damaged(const struct shmipc__mapping *m);

/*
 * The socket the SIGBUS guard shuts down when it hits `m`, so that a thread asleep on the
 * session wakes up and sees the damage. It must stay open until `m` is unmapped.
 */
void shmipc__mapping_set_wake_fd(struct shmipc__mapping *m, int fd);

/* Unmaps and closes whatever `m` holds and leaves it empty. Safe on an empty mapping. */
void shmipc__mapping_unmap(struct shmipc__mapping *m);

/* Removes a /dev/shm file by path; SHMIPC_ENOENT when it is already gone. */
int shmipc__mapping_unlink(const char *path);

/*
 * Process-unique names of the reference: "<prefix>_<pid>_buffer" and
 * "<prefix>_<pid>_queue_<n>". They return the name's length, or SHMIPC_ENAMETOOLONG when it
 * does not fit in `cap` bytes or in SHMIPC__SHM_NAME_MAX.
 */
int shmipc__shm_name_buffer(char *out, size_t cap, const char *prefix, long pid);
int shmipc__shm_name_queue(char *out, size_t cap, const char *prefix, long pid, uint32_t n);

#endif
