// Bad arguments to every implemented function: the right ncclResult_t and a
// message from ncclGetLastError, never a crash.
#include "harness.h"

namespace tutti::test {
namespace {

#define EXPECT_FAILS_WITH(call, code, needle)                                   \
  do {                                                                          \
    ncclResult_t rc_ = (call);                                                  \
    EXPECT_EQ(rc_, code) << #call;                                              \
    std::string err_ = ncclGetLastError(nullptr);                               \
    EXPECT_NE(err_.find(needle), std::string::npos) << #call << " -> " << err_; \
  } while (0)

TEST(BadArguments, WithoutACommunicator) {
  EXPECT_FAILS_WITH(ncclGetVersion(nullptr), ncclInvalidArgument, "version is NULL");
  EXPECT_FAILS_WITH(ncclGetUniqueId(nullptr), ncclInvalidArgument, "uniqueId is NULL");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t c;
  EXPECT_FAILS_WITH(ncclCommInitRank(nullptr, 2, id, 0), ncclInvalidArgument, "NULL");
  EXPECT_FAILS_WITH(ncclCommInitRank(&c, 0, id, 0), ncclInvalidArgument, "nranks");
  EXPECT_FAILS_WITH(ncclCommInitRank(&c, 2, id, 2), ncclInvalidArgument, "invalid rank 2");
  EXPECT_FAILS_WITH(ncclCommInitRank(&c, 2, id, -1), ncclInvalidArgument, "invalid rank -1");
  ncclUniqueId garbage;
  memset(&garbage, 0x5a, sizeof(garbage));
  EXPECT_FAILS_WITH(ncclCommInitRank(&c, 2, garbage, 0), ncclInvalidArgument, "ncclGetUniqueId");
  ncclConfig_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  EXPECT_FAILS_WITH(ncclCommInitRankConfig(&c, 1, id, 0, &cfg), ncclInvalidArgument,
                    "NCCL_CONFIG_INITIALIZER");
  ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
  bad.blocking = 7;
  EXPECT_FAILS_WITH(ncclCommInitRankConfig(&c, 1, id, 0, &bad), ncclInvalidArgument, "blocking");
  EXPECT_FAILS_WITH(ncclCommInitAll(nullptr, 2, nullptr), ncclInvalidArgument, "comms is NULL");
  EXPECT_FAILS_WITH(ncclCommInitAll(&c, 0, nullptr), ncclInvalidArgument, "ndev");
  EXPECT_FAILS_WITH(ncclCommInitRankScalable(&c, 1, 0, 0, &id, nullptr), ncclInvalidArgument,
                    "nId");
  EXPECT_FAILS_WITH(ncclMemAlloc(nullptr, 16), ncclInvalidArgument, "ptr is NULL");
  EXPECT_FAILS_WITH(ncclGroupEnd(), ncclInvalidUsage, "without a matching");
  EXPECT_STREQ(ncclGetErrorString(ncclInvalidArgument),
               "invalid argument (run with NCCL_DEBUG=WARN for details)");
  EXPECT_NE(std::string(ncclGetErrorString(static_cast<ncclResult_t>(99))), "");
}

// ncclMemFree of a pointer ncclMemAlloc did not return, or of one freed
// already, is an error with a message, not heap corruption (the CPU backend
// used to call free() on whatever it was given).
TEST(BadArguments, MemFreeOfAForeignOrFreedPointer) {
  void* p = nullptr;
  ASSERT_EQ(ncclMemAlloc(&p, 1000), ncclSuccess);
  ASSERT_NE(p, nullptr);
  static_cast<char*>(p)[999] = 1;  // usable
  std::vector<char> mine(64);
  EXPECT_FAILS_WITH(ncclMemFree(mine.data()), ncclInvalidArgument, "not allocated");
  EXPECT_FAILS_WITH(ncclMemFree(static_cast<char*>(p) + 8), ncclInvalidArgument,
                    "not allocated");  // inside an allocation, not its start
  EXPECT_EQ(ncclMemFree(p), ncclSuccess);
  EXPECT_FAILS_WITH(ncclMemFree(p), ncclInvalidArgument, "freed already");  // double free
  EXPECT_EQ(ncclMemFree(nullptr), ncclSuccess);
  // A size of 0 gives NULL, which frees as a no-op.
  void* none = reinterpret_cast<void*>(1);
  ASSERT_EQ(ncclMemAlloc(&none, 0), ncclSuccess);
  EXPECT_EQ(none, nullptr);
}

TEST(BadArguments, NullAndDestroyedCommunicators) {
  int v;
  EXPECT_FAILS_WITH(ncclCommCount(nullptr, &v), ncclInvalidArgument, "comm is NULL");
  EXPECT_FAILS_WITH(ncclAllReduce(&v, &v, 1, ncclInt, ncclSum, nullptr, nullptr),
                    ncclInvalidArgument, "comm is NULL");
  ncclComm_t c;
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclCommInitRank(&c, 1, id, 0), ncclSuccess);
  ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
  // A destroyed handle is recognised (the registry no longer knows it).
  EXPECT_FAILS_WITH(ncclAllReduce(&v, &v, 1, ncclInt, ncclSum, c, nullptr), ncclInvalidArgument,
                    "not a valid communicator");
  EXPECT_FAILS_WITH(ncclCommUserRank(c, &v), ncclInvalidArgument, "not a valid communicator");
  EXPECT_FAILS_WITH(ncclCommDestroy(c), ncclInvalidArgument, "not a valid communicator");
  int stackJunk[16] = {};
  EXPECT_FAILS_WITH(ncclCommCount(reinterpret_cast<ncclComm_t>(stackJunk), &v), ncclInvalidArgument,
                    "not a valid communicator");
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclSuccess);
}

TEST(BadArguments, EveryCallOnALiveCommunicator) {
  runRanks(2, [](int r, ncclComm_t comm) {
    std::vector<float> buf(64, 1.0f), out(128, 0.0f);
    auto lastErr = [&] { return std::string(ncclGetLastError(comm)); };
    auto expectFail = [&](ncclResult_t rc, const char* needle, const char* what) {
      EXPECT_EQ(rc, ncclInvalidArgument) << what;
      EXPECT_NE(lastErr().find(needle), std::string::npos) << what << " -> " << lastErr();
    };
    int v;
    expectFail(ncclCommCount(comm, nullptr), "count is NULL", "count");
    expectFail(ncclCommUserRank(comm, nullptr), "rank is NULL", "userrank");
    expectFail(ncclCommCuDevice(comm, nullptr), "device is NULL", "cudevice");
    expectFail(ncclCommGetAsyncError(comm, nullptr), "asyncError is NULL", "async");
    expectFail(ncclAllReduce(buf.data(), out.data(), 8, static_cast<ncclDataType_t>(12), ncclSum,
                             comm, nullptr),
               "invalid datatype 12", "dtype");
    expectFail(ncclAllReduce(buf.data(), out.data(), 8, static_cast<ncclDataType_t>(-1), ncclSum,
                             comm, nullptr),
               "invalid datatype -1", "dtype");
    expectFail(ncclAllReduce(buf.data(), out.data(), 8, ncclFloat, static_cast<ncclRedOp_t>(9),
                             comm, nullptr),
               "invalid reduction op 9", "op");
    expectFail(ncclAllReduce(nullptr, out.data(), 8, ncclFloat, ncclSum, comm, nullptr),
               "sendbuff is NULL", "null send");
    expectFail(ncclReduceScatter(buf.data(), nullptr, 8, ncclFloat, ncclSum, comm, nullptr),
               "recvbuff is NULL", "null recv");
    expectFail(ncclBroadcast(buf.data(), out.data(), 8, ncclFloat, 2, comm, nullptr),
               "invalid root 2", "root");
    expectFail(ncclReduce(buf.data(), out.data(), 8, ncclFloat, ncclSum, -1, comm, nullptr),
               "invalid root -1", "root");
    expectFail(ncclGather(buf.data(), out.data(), 8, ncclFloat, 5, comm, nullptr), "invalid root 5",
               "gather root");
    expectFail(ncclScatter(buf.data(), out.data(), 8, ncclFloat, 3, comm, nullptr),
               "invalid root 3", "scatter root");
    expectFail(ncclSend(buf.data(), 8, ncclFloat, 2, comm, nullptr), "invalid peer 2", "peer");
    expectFail(ncclRecv(out.data(), 8, ncclFloat, -3, comm, nullptr), "invalid peer -3", "peer");
    expectFail(ncclAllGather(buf.data(), out.data(), SIZE_MAX / 2, ncclFloat, comm, nullptr),
               "overflows", "overflow");
    // The element bytes fit; times the 2 ranks' blocks they do not.
    expectFail(ncclAllGather(buf.data(), out.data(), SIZE_MAX / 8 + 1, ncclFloat, comm, nullptr),
               "overflows", "overflow by the rank count");
    expectFail(ncclAllReduce(buf.data(), out.data(), SIZE_MAX / 4 + 1, ncclFloat, ncclSum, comm,
                             nullptr),
               "overflows", "overflow by the element size");
    ncclRedOp_t op;
    float scalar = 2;
    expectFail(ncclRedOpCreatePreMulSum(nullptr, &scalar, ncclFloat, ncclScalarHostImmediate, comm),
               "op is NULL", "premul");
    expectFail(ncclRedOpCreatePreMulSum(&op, nullptr, ncclFloat, ncclScalarHostImmediate, comm),
               "scalar is NULL", "premul");
    expectFail(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat,
                                        static_cast<ncclScalarResidence_t>(7), comm),
               "residence", "premul");
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, comm),
              ncclSuccess);
    expectFail(ncclAllReduce(buf.data(), out.data(), 8, ncclInt32, op, comm, nullptr),
               "created for datatype", "premul dtype");
    expectFail(ncclRedOpDestroy(ncclSum, comm), "built-in", "destroy builtin");
    ASSERT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
    expectFail(ncclRedOpDestroy(op, comm), "not created", "double destroy");
    expectFail(ncclAllReduce(buf.data(), out.data(), 8, ncclFloat, op, comm, nullptr),
               "invalid reduction op", "destroyed op");
    void* h = nullptr;
    expectFail(ncclCommRegister(comm, buf.data(), 64, nullptr), "handle is NULL", "register");
    expectFail(ncclCommDeregister(comm, &v), "not returned by ncclCommRegister", "deregister");
    ASSERT_EQ(ncclCommRegister(comm, buf.data(), 64, &h), ncclSuccess);
    ASSERT_EQ(ncclCommDeregister(comm, h), ncclSuccess);
    expectFail(ncclCommSplit(comm, -5, 0, nullptr, nullptr), "newcomm is NULL", "split");
    // Count 0 with NULL buffers is valid and does nothing.
    EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
    // Every failure above left the communicator usable.
    float x = static_cast<float>(r + 1), y = 0;
    ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(y, 3.0f);
  });
}

TEST(BadArguments, MismatchedCollectivesAreReportedNotHung) {
  setenv("TUTTI_TIMEOUT", "5", 1);
  runRanks(2, [](int r, ncclComm_t comm) {
    std::vector<int32_t> a(2000, 1), b(2000, 0);  // big enough for either count
    // Rank 0 all-reduces 1000 elements, rank 1 2000: a usage error.
    ncclResult_t rc =
        ncclAllReduce(a.data(), b.data(), r == 0 ? 1000 : 2000, ncclInt32, ncclSum, comm, nullptr);
    EXPECT_NE(rc, ncclSuccess);
    EXPECT_NE(std::string(ncclGetLastError(comm)), "");
  });
  unsetenv("TUTTI_TIMEOUT");
}

}  // namespace
}  // namespace tutti::test
