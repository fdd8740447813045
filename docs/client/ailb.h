/* ailb client ABI: tag a socket before connect() so that ailb can route it.
 *
 * Without privilege and without a library: ailb's cgroup/setsockopt program consumes these
 * options in the kernel. Call them on a TCP socket BEFORE connect() to a model's VIP.
 *
 *   int fd = socket(AF_INET, SOCK_STREAM, 0);
 *   if (ailb_tag_conversation(fd, "conversation-42", 15) < 0 && errno != ENOPROTOOPT)
 *       perror("ailb_tag_conversation");      // EINVAL: bad length
 *   connect(fd, (struct sockaddr *)&vip, sizeof vip);
 *   getpeername(fd, ...);                      // the backend ailb picked (connect4 rewrote the destination)
 *
 * Errors:
 *   ENOPROTOOPT  ailb is not loaded for this process's cgroup (the kernel does not know the
 *                level): there is no balancer; carry on and connect as usual.
 *   EINVAL       bad option length (conversation 1..128 bytes, memory exactly 4, model 1..64).
 *   connect() -> ECONNREFUSED: the VIP's model has no live backend, or no backend has the
 *                free GPU memory given with AILB_REQUIRED_MEMORY_MB.
 *
 * Must match ailb-common/src/abi.rs. Rust: ailb_common::client (cargo feature `client` of
 * ailb-common) is this header's twin: Tags, tag() and connect(), which reports the backend and
 * whether ailb was loaded (ENOPROTOOPT: Tagging::NoBalancer).
 */
#ifndef AILB_H
#define AILB_H

#include <stddef.h>
#include <stdint.h>
#include <errno.h>
#include <sys/types.h>
#include <sys/socket.h>

/* setsockopt level ("AIL"). */
#define SOL_AILB 0x41494c

/* Conversation id: 1..AILB_MAX_CONVERSATION_LEN raw bytes. Connections of one conversation
 * go to the same backend while it stays live, under its cap and fits the memory hint (affinity;
 * see affinity_wait in the README). */
#define AILB_CONVERSATION 1
/* GPU memory this request needs, in MB: a native-endian uint32_t, length 4. Only backends
 * with at least that much free memory (or unknown free memory) are picked; when none has it
 * free now, the request queues on one that holds it when idle. */
#define AILB_REQUIRED_MEMORY_MB 2
/* Model name, 1..AILB_MAX_MODEL_NAME_LEN bytes, for a VIP shared by several models. */
#define AILB_MODEL 3
/* After connect(): a native-endian uint32_t, 1 = this connection is idle (kept open for a later
 * request with the same tags; it stops counting as in flight at its backend), 0 = busy again.
 * A client that keeps connections for reuse marks them idle while they wait. */
#define AILB_IDLE 4
/* The prompt's prefix keys: 1..AILB_PREFIX_KEYS_MAX native-endian uint64_t, in prompt order,
 * none of them 0 (length a multiple of 8). Chained XXH3 block keys of the prompt, as
 * docs/prefix.md defines them (every k-th block's key and the last). A model with a prefix
 * mode then prefers the backend that holds the longest of these prefixes in its cache, while
 * it is under its load bound and fits the memory hint. */
#define AILB_PREFIX 5
/* Before connect(): a native-endian uint32_t, 1 = the prompt's prefix keys are withheld until the
 * kernel asks for them (for a client whose keys cost much to make, e.g. a tokenized prompt):
 * connect() fails with ENOKEY where the pick would read them (no affinity hit on a model with a
 * prefix mode, or a model that learns from picks), and goes ahead, to the backend the keys would
 * have got, where the conversation's affinity decides. On ENOKEY, connect a fresh socket with
 * AILB_PREFIX. 0 = off. */
#define AILB_PREFIX_ON_REQUEST 6

#define AILB_MAX_CONVERSATION_LEN 128
#define AILB_MAX_MODEL_NAME_LEN 64
#define AILB_PREFIX_KEYS_MAX 16

/* Tags fd with n prefix keys (1..AILB_PREFIX_KEYS_MAX, none 0). Returns 0, or -1 with errno. */
static inline int ailb_tag_prefix(int fd, const uint64_t *keys, size_t n)
{
    size_t i;
    if (n == 0 || n > AILB_PREFIX_KEYS_MAX) {
        errno = EINVAL;
        return -1;
    }
    for (i = 0; i < n; i++) {
        if (keys[i] == 0) {
            errno = EINVAL;
            return -1;
        }
    }
    return setsockopt(fd, SOL_AILB, AILB_PREFIX, keys, (socklen_t)(n * sizeof *keys));
}

/* Withholds fd's prefix keys until the kernel asks (1) or not (0). Returns 0, or -1 with errno. */
static inline int ailb_prefix_on_request(int fd, int on)
{
    uint32_t v = on ? 1 : 0;
    return setsockopt(fd, SOL_AILB, AILB_PREFIX_ON_REQUEST, &v, (socklen_t)sizeof v);
}

/* Tags fd with a conversation id. Returns 0, or -1 with errno set (see above). */
static inline int ailb_tag_conversation(int fd, const void *id, size_t len)
{
    if (len == 0 || len > AILB_MAX_CONVERSATION_LEN) {
        errno = EINVAL;
        return -1;
    }
    return setsockopt(fd, SOL_AILB, AILB_CONVERSATION, id, (socklen_t)len);
}

/* Tags fd with the GPU memory (MB) the request needs. Returns 0, or -1 with errno set. */
static inline int ailb_require_memory_mb(int fd, uint32_t mb)
{
    return setsockopt(fd, SOL_AILB, AILB_REQUIRED_MEMORY_MB, &mb, (socklen_t)sizeof mb);
}

/* Tags fd with a model name (for a shared VIP). Returns 0, or -1 with errno set. */
static inline int ailb_tag_model(int fd, const char *model, size_t len)
{
    if (len == 0 || len > AILB_MAX_MODEL_NAME_LEN) {
        errno = EINVAL;
        return -1;
    }
    return setsockopt(fd, SOL_AILB, AILB_MODEL, model, (socklen_t)len);
}

/* Marks a connected socket idle (1) or busy again (0). Returns 0, or -1 with errno set. */
static inline int ailb_mark_idle(int fd, int idle)
{
    uint32_t v = idle ? 1 : 0;
    return setsockopt(fd, SOL_AILB, AILB_IDLE, &v, (socklen_t)sizeof v);
}

#endif /* AILB_H */
