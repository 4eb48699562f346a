/* abi_c99: tutti's nccl.h and tutti/tutti.h used from strict C99.
 *
 * Built with -std=c99 -pedantic -Werror against tutti's include/ and linked to
 * libtutti.so. Checks that the version reported by the library equals the
 * header's NCCL_VERSION_CODE, the fixed sizes of the ABI structs, that both
 * initializers compile, and that tuttiGetVersion answers. */
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "nccl.h"
#include "tutti/tutti.h"

#ifndef TUTTI_NCCL_H
#error "this test must be compiled against tutti's nccl.h, not NVIDIA's"
#endif

/* C99 has no static_assert: a negative array size fails the build. */
#define ABI_CHECK(name, cond) typedef char abi_check_##name[(cond) ? 1 : -1]
ABI_CHECK(unique_id_128, sizeof(ncclUniqueId) == 128);
ABI_CHECK(unique_id_bytes, NCCL_UNIQUE_ID_BYTES == 128);
ABI_CHECK(config_size, sizeof(ncclConfig_t) == 80);
ABI_CHECK(config_commname, offsetof(ncclConfig_t, commName) == 48);
ABI_CHECK(siminfo_size, sizeof(ncclSimInfo_t) == 24);
ABI_CHECK(redop_int_sized, sizeof(ncclRedOp_t) == sizeof(int));
ABI_CHECK(stream_is_pointer, sizeof(cudaStream_t) == sizeof(void*));

static int failures = 0;
#define EXPECT(cond)                                                           \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                              \
    }                                                                          \
  } while (0)

int main(void) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
  int version = -1;
  int tversion = -1;
  const char* vs;
  ncclResult_t rc;

  EXPECT(config.size == sizeof(ncclConfig_t));
  EXPECT(config.magic == 0xcafebeefu);
  EXPECT(config.version == NCCL_VERSION_CODE);
  EXPECT(config.blocking == NCCL_CONFIG_UNDEF_INT);
  EXPECT(config.netName == NULL);
  EXPECT(sim.magic == 0x74685283u);
  EXPECT(sim.estimatedTime == NCCL_UNDEF_FLOAT);
  EXPECT(NCCL_VERSION(2, 28, 9) == 22809);
  EXPECT(NCCL_VERSION(2, 8, 4) == 2804);
  EXPECT(ncclMaxRedOp == 0x7fffffff);

  rc = ncclGetVersion(&version);
  EXPECT(rc == ncclSuccess);
  EXPECT(version == NCCL_VERSION_CODE);
  EXPECT(ncclGetVersion(NULL) != ncclSuccess);

  rc = tuttiGetVersion(&tversion);
  EXPECT(rc == ncclSuccess);
  EXPECT(tversion >= 0 && tversion < NCCL_VERSION_CODE);
  vs = tuttiGetVersionString();
  EXPECT(vs != NULL && strlen(vs) > 0);
  EXPECT(tuttiLibraryPath() != NULL);

  EXPECT(ncclGetErrorString(ncclSuccess) != NULL);

  /* A function tutti does not implement yet fails cleanly and says why. */
  {
    ncclWindow_t win = (ncclWindow_t)&config; /* any non-NULL value */
    const char* why;
    EXPECT(ncclCommWindowRegister(NULL, NULL, 0, &win, NCCL_WIN_DEFAULT) == ncclInvalidUsage);
    EXPECT(win == NULL);
    why = ncclGetLastError(NULL);
    EXPECT(why != NULL && strstr(why, "ncclCommWindowRegister") != NULL &&
           strstr(why, "not supported by tutti yet") != NULL);
    EXPECT(pncclCommWindowDeregister(NULL, NULL) == ncclInvalidUsage);
    /* Implemented now: a NULL communicator is an argument error. */
    EXPECT(pncclCommRevoke(NULL, NCCL_REVOKE_DEFAULT) == ncclInvalidArgument);
  }

  /* ncclResetDebugInit works (deprecated, as in NVIDIA's header). */
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
  ncclResetDebugInit();
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

  printf("ncclGetVersion=%d tuttiGetVersion=%d (%s) library=%s\n", version, tversion,
         vs ? vs : "(null)", tuttiLibraryPath() ? tuttiLibraryPath() : "(null)");
  return failures == 0 ? 0 : 1;
}
