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
    /*
     * A /dev/shm file's identity, from fstat of the descriptor that was mapped, so that only
     * this very file is ever removed (shmipc__mapping_remove). ino 0: no file to remove.
     */
    uint64_t dev, ino;
    uint32_t dir_len; /* path[0..dir_len) is the trusted directory the file lies beneath */
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
 * above UINT32_MAX, which no offset of the protocol can address, anything but a regular file
 * (SHMIPC_EINVAL), and a regular file that is not shared memory (SHMIPC_EACCES): only a memfd
 * or a tmpfs file will do. On success `m` owns `fd`; on failure the caller still does. `path`
 * labels the mapping and may be NULL.
 */
int shmipc__mapping_map_fd(struct shmipc__mapping *m, int fd, const char *path);

/*
 * Server, /dev/shm mode: opens the file a (possibly hostile) peer named and maps it at its
 * full size, with the size rules of shmipc__mapping_map_fd(). `path` must be `dir` + "/" +
 * a relative name of plain components (no "", "." or ".."); `dir` is trusted (our own
 * configuration) and opened as it is, the rest is resolved beneath it without following any
 * symlink (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS, or a component-by-component
 * O_NOFOLLOW walk where openat2 is missing). The file must be a regular file with one link,
 * on a tmpfs, owned by `owner`, and stay the same inode from the check to the open. Refusals
 * are SHMIPC_EACCES with a detail naming the rule. The file is left in place; its device and
 * inode are kept for shmipc__mapping_remove().
 */
int shmipc__mapping_open_beneath(struct shmipc__mapping *m, const char *dir, const char *path,
                                 uint32_t owner);

/*
 * Where shmipc__mapping_open_beneath() looks for a peer's files: the directory of `prefix`
 * (the configured path prefix) when it is an absolute path, else "/dev/shm". Returns the
 * length written, or SHMIPC_ENAMETOOLONG.
 */
int shmipc__shm_dir_of(const char *prefix, char *out, size_t cap);

/* Tests only: 1 makes name resolution take the openat walk, as without openat2. */
void shmipc__mapping_force_walk(int on);

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

/*
 * Removes the /dev/shm file `m` was made from (by shmipc__mapping_create_file or
 * shmipc__mapping_open_beneath), if its name still refers to the very file that was mapped:
 * the name is resolved beneath the trusted directory again, without following symlinks, its
 * device and inode compared with those kept at mapping time, and only then unlinkat(). A name
 * that now refers to another file is left alone (SHMIPC_EACCES); SHMIPC_ENOENT when it is gone.
 * Call it before shmipc__mapping_unmap(), which forgets the identity.
 */
int shmipc__mapping_remove(const struct shmipc__mapping *m);

/*
 * Removes a file by path, following whatever the path holds; SHMIPC_ENOENT when it is gone.
 * For tests and for cleaning up names of our own: never for a name a peer gave us.
 */
int shmipc__mapping_unlink(const char *path);

/*
 * Process-unique names of the reference: "<prefix>_<pid>_buffer" and
 * "<prefix>_<pid>_queue_<n>". They return the name's length, or SHMIPC_ENAMETOOLONG when it
 * does not fit in `cap` bytes or in SHMIPC__SHM_NAME_MAX.
 */
int shmipc__shm_name_buffer(char *out, size_t cap, const char *prefix, long pid);
int shmipc__shm_name_queue(char *out, size_t cap, const char *prefix, long pid, uint32_t n);

#endif
