/*
 * plugin_error_probe: what an NCCL program sees when its device backend
 * plugin (TUTTI_BACKEND_PLUGIN, set by the caller) cannot be used. Linked
 * against libtutti.so like any user. Prints, one per line:
 *   memalloc_rc=<ncclResult_t of ncclMemAlloc>
 *   memalloc_string=<ncclGetErrorString of it>
 *   memalloc_last=<ncclGetLastError(NULL) after it>
 *   init_rc=, init_string=, init_last=   the same for ncclCommInitRank (1 rank)
 * and exits 0 (the caller judges the values).
 */
#include <nccl.h>
#include <stdio.h>

int main(void) {
  void* p = NULL;
  ncclResult_t rc = ncclMemAlloc(&p, 64);
  printf("memalloc_rc=%d\nmemalloc_string=%s\nmemalloc_last=%s\n", (int)rc, ncclGetErrorString(rc),
         ncclGetLastError(NULL));
  if (rc == ncclSuccess) ncclMemFree(p);
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  rc = ncclGetUniqueId(&id);
  if (rc == ncclSuccess) rc = ncclCommInitRank(&comm, 1, id, 0);
  printf("init_rc=%d\ninit_string=%s\ninit_last=%s\n", (int)rc, ncclGetErrorString(rc),
         ncclGetLastError(NULL));
  if (rc == ncclSuccess) ncclCommDestroy(comm);
  fflush(stdout);
  return 0;
}
