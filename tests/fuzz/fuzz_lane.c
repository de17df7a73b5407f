/*
 * fuzz_lane.c - what a verifier reads from a drafter's exchange lane
 * (service/lane.h): a peer that shares the segment may write any bytes into
 * its pipe and any count as its head. The verifier's side reads every
 * message the bytes hold, each decoded as a DraftResponse as the verifier's
 * lane reader decodes it, until it would wait for more (the lane is closed
 * first, so that wait returns at once) or it refuses what it found; a
 * refusal names what is wrong.
 *
 * Input: 4 bytes, the head the peer publishes (the bytes it claims to have
 * written); the rest, the bytes of its pipe from the start.
 */
#include "fuzz.h"

#include "lane.h"
#include "spin.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BODY (TDM_SHM_HEADER + 4096 + 2 * (size_t)TDM_LANE_PIPE_BYTES)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_input in = {data, size};
    const uint32_t head = fuzz_take_u32(&in);
    tdm_busy_poll_set(0);
    tdm_lane *v = NULL;
    tdm_error err = {0};
    FUZZ_CHECK(tdm_lane_create(&v, &err) == TDM_OK, "create: %s", err.msg);
    Tandem__V1__LaneOffer o;
    tdm_lane_offer(v, &o);
    int fd = shm_open(o.name, O_RDWR, 0);
    FUZZ_CHECK(fd >= 0, "the segment %s", o.name);
    uint8_t *seg = mmap(NULL, BODY, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    FUZZ_CHECK(seg != MAP_FAILED, "map %s", o.name);
    tdm_lane_unlink(v);
    /* the drafter-to-verifier pipe: its counters (the second block of the
     * counters' page), its bytes after the verifier-to-drafter pipe */
    uint8_t *body = seg + TDM_SHM_HEADER;
    uint8_t *pipe = body + 4096 + TDM_LANE_PIPE_BYTES;
    const size_t n = in.n < TDM_LANE_PIPE_BYTES ? in.n : TDM_LANE_PIPE_BYTES;
    memcpy(pipe, in.p, n);
    atomic_store((_Atomic uint64_t *)(body + 128), (uint64_t)head);
    tdm_lane_close(v); /* a read that would wait returns instead */
    int msgs = 0;
    for (;;) {
        uint8_t *b = NULL;
        size_t len = 0;
        tdm_status rc = tdm_lane_recv(v, 4096, &b, &len, &err);
        if (rc != TDM_OK) {
            FUZZ_CHECK(!b && err.msg[0], "a refusal without a reason (%d)", rc);
            FUZZ_CHECK(rc == TDM_ERR_UNAVAILABLE || rc == TDM_ERR_INVALID_ARGUMENT ||
                           rc == TDM_ERR_INTERNAL,
                       "refused with %d: %s", rc, err.msg);
            FUZZ_CHECK(rc != TDM_ERR_INTERNAL || head > TDM_LANE_PIPE_BYTES,
                       "a head within the pipe called corrupt: %s", err.msg);
            break;
        }
        FUZZ_CHECK(len <= 4096 && (size_t)msgs * 8 + len <= (size_t)head,
                   "message %d of %zu bytes from %u written", msgs, len, head);
        Tandem__V1__DraftResponse *r = tandem__v1__draft_response__unpack(NULL, len, b);
        if (r)
            tandem__v1__draft_response__free_unpacked(r, NULL);
        free(b);
        msgs++;
    }
    munmap(seg, BODY);
    tdm_lane_destroy(v);
    return 0;
}
