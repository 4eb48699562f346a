/*
 * tutti/tutti.h -- tutti's extensions beyond the NCCL API.
 *
 * Contract
 * --------
 * Plain C (C99) and C++. Everything here is exported by libtutti.so and by
 * tutti's libnccl.so.2 under the `tutti` prefix and never by NVIDIA's
 * library, so `dlsym(RTLD_DEFAULT, "tuttiGetVersion") != NULL` is a reliable
 * way for a program to tell that tutti answers its NCCL calls.
 *
 * All functions here are thread-safe, never block and never allocate on the
 * caller's behalf; returned strings are owned by the library and live as long
 * as it stays loaded.
 *
 * Stability: functions are only ever added. A program that wants to use a newer
 * extension while still running on older tutti releases should look it up with
 * dlsym() rather than link it directly.
 */
#ifndef TUTTI_TUTTI_H_
#define TUTTI_TUTTI_H_

#include "../nccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Encodes a tutti release the way tuttiGetVersion reports it, for comparisons:
 *   int v; tuttiGetVersion(&v); if (v >= TUTTI_VERSION(0, 2, 0)) ... */
#define TUTTI_VERSION(major, minor, patch) ((major)*10000 + (minor)*100 + (patch))

/* Stores tutti's own release as major*10000 + minor*100 + patch (0.1.0 ->
 * 100). ncclGetVersion still reports the NCCL API level (22809).
 * Returns ncclInvalidArgument if version is NULL, ncclSuccess otherwise. */
ncclResult_t tuttiGetVersion(int* version);

/* tutti's release as text, e.g. "0.1.0" (may carry a suffix such as
 * "0.2.0-rc1" or a build tag). Never NULL; static storage. */
const char* tuttiGetVersionString(void);

/* Absolute path of the shared object that contains tutti's code in this
 * process (libtutti.so.* or tutti's libnccl.so.2), as found by dladdr(). Useful
 * to confirm which library LD_PRELOAD / LD_LIBRARY_PATH selected and where the
 * plugin directory (<prefix>/lib/tutti) is searched from. Never NULL: "" if the
 * path cannot be determined (e.g. tutti linked statically into the program).
 * Static storage. */
const char* tuttiLibraryPath(void);

/*
 * Reserved for later extensions (each will be documented in docs/api.md):
 *  - communicator introspection (chosen backend, transports per peer, algorithm
 *    selected for a call), statistics and counters;
 *  - compression settings per communicator (fp16/bf16 with scaling, 1-bit with
 *    error feedback, PowerSGD);
 *  - host-memory specific controls (progress-thread placement, inline threshold);
 *  - explicit backend selection and plugin loading.
 * New declarations go below this comment; existing ones never change.
 */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TUTTI_TUTTI_H_ */
